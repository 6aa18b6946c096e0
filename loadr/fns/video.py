"""Frames of a video: :class:`sample_frames` (uniform, random, TSN), also reading
only the frames it picks."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, SpecError
from .base import Fn, check_key, positive_int

# ---------------------------------------------------------------------------
# Frames of a video


class sample_frames(Fn):  # noqa: N801
    """Pick ``num`` frames of the video in ``dp[key]`` (a list or a T×… array).

    Modes, for a video of ``n`` frames:

    - ``'uniform'``: ``num`` evenly spaced positions from the first frame to
      the last, ``round(i * (n - 1) / (num - 1))`` (one frame: the middle).
      No randomness.
    - ``'random_clip'``: ``num`` frames ``stride`` apart from a random start.
      A video shorter than the clip (``(num - 1) * stride + 1`` frames) is
      looped when ``short='loop'`` (positions wrap around modulo ``n``, from a
      random start) or clamped when ``short='clamp'`` (from frame 0, every
      position past the end becomes the last frame). ``train=False`` takes
      the middle clip (start 0 when looping or clamping).
    - ``'tsn'``: the video is cut into ``num`` equal segments
      ``[i * n // num, (i + 1) * n // num)`` and one random frame is taken
      from each; ``train=False`` takes each segment's middle frame
      ``(lo + hi) // 2``. Empty segments (``n < num``) take frame
      ``i * n // num``.

    ``read(reader, index, seed)`` gives the same datapoint as
    ``self(reader[index], seed)`` but reads only the chosen frames; the
    Loader calls it in place of both when this fn comes first. ``stream``: a
    name shared with other sample_frames that must pick the same frames (see
    the module's docstring).

    Example::

        sample_frames(num=4, mode='tsn')({'frames': list(range(40))}, seed=1)['frames']
    """

    reads = True
    MODES = ('uniform', 'random_clip', 'tsn')

    key: str
    num: int
    mode: str
    stride: int
    train: bool
    short: str

    def __init__(self, key: str = 'frames', num: int = 8, mode: str = 'uniform', stride: int = 1,
                 train: bool = True, short: str = 'loop', stream: str | None = None):
        if mode not in self.MODES:
            raise ConfigError(f'mode must be one of {self.MODES}, got {mode!r}')
        if not isinstance(train, bool):
            raise ConfigError(f'train must be True or False, got {train!r}')
        if short not in ('loop', 'clamp'):
            raise ConfigError(f"short must be 'loop' or 'clamp', got {short!r}")
        self._keep(key=check_key(key), num=positive_int(num, 'num'), mode=mode,
                   stride=positive_int(stride, 'stride'), train=train, short=short)
        self._keep_stream(stream)

    def positions(self, n: int, seed: int | None = None) -> list[int]:
        """The frame positions (in ``[0, n)``, in clip order) chosen for a video of ``n`` frames.

        >>> sample_frames(num=3).positions(9)
        [0, 4, 8]
        """
        if n < 1:
            raise SpecError(f'{self!r}: key {self.key!r} has no frames to sample')
        num = self.num
        if self.mode == 'uniform':
            if num == 1:
                return [(n - 1) // 2]
            # round-half-up of i * (n - 1) / (num - 1), in integers.
            return [(2 * i * (n - 1) + num - 1) // (2 * (num - 1)) for i in range(num)]
        if self.mode == 'random_clip':
            span = (num - 1) * self.stride + 1
            if n >= span:
                if self.train:
                    start = int(self._rng(seed).integers(0, n - span + 1))
                else:
                    start = (n - span) // 2
                return [start + i * self.stride for i in range(num)]
            if self.short == 'clamp':
                return [min(i * self.stride, n - 1) for i in range(num)]
            start = int(self._rng(seed).integers(0, n)) if self.train else 0
            return [(start + i * self.stride) % n for i in range(num)]
        bounds = [(i * n // num, (i + 1) * n // num) for i in range(num)]
        if not self.train:
            return [(lo + hi) // 2 if hi > lo else lo for lo, hi in bounds]
        rng = self._rng(seed)
        # One draw per segment, even an empty one, so a segment's frame does
        # not depend on whether an earlier segment was empty.
        draws = rng.random(num)
        return [lo + int(d * (hi - lo)) if hi > lo else lo for (lo, hi), d in zip(bounds, draws)]

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        value = self._get(dp, self.key)
        if not isinstance(value, (list, tuple, np.ndarray)) or is_scalar_array(value):
            raise SpecError(f'{self!r}: key {self.key!r} must be a list of frames or a T×… '
                            f'array, got {type(value).__name__}')
        return {**dp, self.key: _pick(value, self.positions(len(value), seed))}

    def read(self, reader, index: int, seed: int | None = None) -> dict:
        """``self(reader[index], seed)``, reading only the chosen frames from disk.

        Example::

            dp = sample_frames(num=8, mode='tsn').read(loadr.open('data/gulp'), 3, seed=11)
        """
        available = reader.available(index)
        frames = available.get(self.key)
        if frames is None:
            raise SpecError(f'{self!r}: the datapoint has no key {self.key!r} '
                            f'(it has {sorted(map(str, available))})', index=index)
        if not isinstance(frames, range):
            raise SpecError(f'{self!r}: key {self.key!r} is not a sequence in this dataset '
                            f'(available says {frames!r})', index=index)
        chosen = self.positions(len(frames), seed)
        # Ask for each frame once, in file order; repeats come back from the copy.
        wanted = sorted(set(chosen))
        mask: dict[str, bool | list[int]] = {k: True for k in available if k != self.key}
        mask[self.key] = wanted
        dp = reader[index, mask]
        got = dp.get(self.key) if isinstance(dp, dict) else None
        if got is None or len(got) != len(wanted):
            raise SpecError(f'{self!r}: asked the reader for {len(wanted)} frames of key '
                            f'{self.key!r}, got {0 if got is None else len(got)}', index=index)
        slot = {p: j for j, p in enumerate(wanted)}
        return {**dp, self.key: _pick(got, [slot[p] for p in chosen])}


def is_scalar_array(value) -> bool:
    """Whether ``value`` is a numpy array of no dimension (one number)."""
    return isinstance(value, np.ndarray) and value.ndim == 0


def _pick(seq, positions: list[int]):
    if isinstance(seq, np.ndarray):
        return seq[np.asarray(positions, dtype=np.intp)]
    return [seq[p] for p in positions]


# loadr.fns gives its fn classes the module `loadr.fns` (their public path), where
# doctest would not look for this module's examples: name them here.
__test__ = {'sample_frames.positions': sample_frames.positions}
