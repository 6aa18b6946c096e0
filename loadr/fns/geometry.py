"""Geometry: :class:`resize`, the crops and :class:`flip`, the same on every frame of
a video."""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from .base import RESIZED_CROP_TRIES, Fn, check_key, check_size, float_range, is_number
from .frames import check_fits, crop_array, frame_size, frames_of, resize_array, target_size

# ---------------------------------------------------------------------------
# Geometry


class resize(Fn):  # noqa: N801
    """Resize (Pillow bilinear): ``size=int`` sets the short side, ``size=(h, w)`` is exact.

    The long side rounds down, as torchvision's ``Resize(int)``. uint8 and
    float32 images; a video's frames each get the same output size.

    Example::

        img = np.zeros((480, 640, 3), np.uint8)
        resize(size=256)({'image': img})['image'].shape   # (256, 341, 3)
    """

    key: str
    size: int | tuple[int, int]        # an int: the short side

    def __init__(self, key: str = 'image', size=None):
        self._keep(key=check_key(key), size=check_size(size, allow_short_side=True))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        frames, rebuild = frames_of(self, self.key, self._get(dp, self.key))
        out = [resize_array(self, self.key, f, *target_size(f.shape[0], f.shape[1], self.size))
               for f in frames]
        return {**dp, self.key: rebuild(out)}

    def plan(self, region, seed: int | None = None) -> None:
        """Do to ``region`` (a :class:`loadr.decode.Region`) what ``__call__`` does to an image."""
        region.resize(*target_size(region.h, region.w, self.size))


class center_crop(Fn):  # noqa: N801
    """Crop the centre ``size`` (int for a square, or (h, w)); the offset rounds as torchvision's.

    An image smaller than the crop is a SpecError (resize it first).

    Example::

        center_crop(size=224)({'image': img})['image'].shape   # (224, 224, 3)
    """

    key: str
    size: tuple[int, int]

    def __init__(self, key: str = 'image', size=None):
        self._keep(key=check_key(key), size=check_size(size, allow_short_side=False))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        frames, rebuild = frames_of(self, self.key, self._get(dp, self.key))
        if not frames:
            return dict(dp)
        hw = frame_size(self, self.key, frames)
        h, w = self.size
        check_fits(self, self.key, hw, self.size)
        top, left = int(round((hw[0] - h) / 2)), int(round((hw[1] - w) / 2))
        return {**dp, self.key: rebuild([crop_array(f, top, left, h, w) for f in frames])}

    def plan(self, region, seed: int | None = None) -> None:
        """Do to ``region`` (a :class:`loadr.decode.Region`) what ``__call__`` does to an image."""
        hw = (region.h, region.w)
        h, w = self.size
        check_fits(self, self.key, hw, self.size)
        region.crop(int(round((hw[0] - h) / 2)), int(round((hw[1] - w) / 2)), h, w)


class random_crop(Fn):  # noqa: N801
    """Crop ``size`` at a position drawn uniformly from every position that fits.

    ``stream``: a name shared with other random_crops that must draw the
    same position (an image and its mask); see the module's docstring.

    Example::

        random_crop(size=(32, 48))(dp, seed=3)['image'].shape   # (32, 48, 3)
    """

    key: str
    size: tuple[int, int]

    def __init__(self, key: str = 'image', size=None, stream: str | None = None):
        self._keep(key=check_key(key), size=check_size(size, allow_short_side=False))
        self._keep_stream(stream)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        rng = self._rng(seed)
        frames, rebuild = frames_of(self, self.key, self._get(dp, self.key))
        if not frames:
            return dict(dp)
        hw = frame_size(self, self.key, frames)
        h, w = self.size
        check_fits(self, self.key, hw, self.size)
        top = int(rng.integers(0, hw[0] - h + 1))
        left = int(rng.integers(0, hw[1] - w + 1))
        return {**dp, self.key: rebuild([crop_array(f, top, left, h, w) for f in frames])}

    def plan(self, region, seed: int | None = None) -> None:
        """Do to ``region`` (a :class:`loadr.decode.Region`) what ``__call__`` does to an image:
        the same draws from the same generator, so the same position."""
        rng = self._rng(seed)
        hw = (region.h, region.w)
        h, w = self.size
        check_fits(self, self.key, hw, self.size)
        top = int(rng.integers(0, hw[0] - h + 1))
        left = int(rng.integers(0, hw[1] - w + 1))
        region.crop(top, left, h, w)


class random_resized_crop(Fn):  # noqa: N801
    """torchvision's RandomResizedCrop: a random area and aspect ratio, resized to ``size``.

    Up to 10 tries draw an area fraction from ``scale`` and a log-uniform
    aspect ratio (w/h) from ``ratio``; the first box that fits is taken at a
    uniform position. If none fits, the centre crop of the whole image
    clamped to ``ratio``. Then a bilinear resize to ``size`` (int: square).

    Two instances draw different boxes (their keys differ: two views of one
    image). ``stream='name'`` on several makes them draw the same box (an
    image and its segmentation mask); see the module's docstring.

    Example::

        random_resized_crop(size=224)(dp, seed=5)['image'].shape   # (224, 224, 3)
        views = [random_resized_crop(key='view1', size=224),
                 random_resized_crop(key='view2', size=224)]       # independent crops
        pair = [random_resized_crop(key='image', size=224, stream='geometry'),
                random_resized_crop(key='mask', size=224, stream='geometry')]   # the same crop
    """

    key: str
    size: tuple[int, int]
    scale: tuple[float, float]
    ratio: tuple[float, float]

    def __init__(self, key: str = 'image', size=None, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 stream: str | None = None):
        self._keep(key=check_key(key), size=check_size(size, allow_short_side=False),
                   scale=float_range(scale, 'scale', upper=1.0),
                   ratio=float_range(ratio, 'ratio'))
        self._keep_stream(stream)

    def box(self, height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        """``(top, left, h, w)`` of the crop for an image of ``height``×``width``."""
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(RESIZED_CROP_TRIES):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        rng = self._rng(seed)
        frames, rebuild = frames_of(self, self.key, self._get(dp, self.key))
        if not frames:
            return dict(dp)
        top, left, h, w = self.box(*frame_size(self, self.key, frames), rng)
        out = [resize_array(self, self.key, crop_array(f, top, left, h, w), *self.size)
               for f in frames]
        return {**dp, self.key: rebuild(out)}

    def plan(self, region, seed: int | None = None) -> None:
        """Do to ``region`` (a :class:`loadr.decode.Region`) what ``__call__`` does to an image:
        :meth:`box` from the same generator, so the same box."""
        region.crop(*self.box(region.h, region.w, self._rng(seed)))
        region.resize(*self.size)


class flip(Fn):  # noqa: N801
    """Flip left-right with probability ``p`` (the whole video or none of it).

    ``stream``: a name shared with other flips that must flip together (an
    image and its mask); see the module's docstring.

    Example::

        flip(p=1.0)({'image': np.array([[1, 2, 3]], np.uint8)}, seed=0)['image']  # [[3, 2, 1]]
    """

    key: str
    p: float

    def __init__(self, key: str = 'image', p: float = 0.5, stream: str | None = None):
        if not is_number(p) or not 0 <= p <= 1:
            raise ConfigError(f'p must be a probability between 0 and 1, got {p!r}')
        self._keep(key=check_key(key), p=float(p))
        self._keep_stream(stream)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        rng = self._rng(seed)
        frames, rebuild = frames_of(self, self.key, self._get(dp, self.key))
        if not rng.random() < self.p:
            return dict(dp)
        return {**dp, self.key: rebuild([_flip_lr(f) for f in frames])}

    def flips(self, seed: int | None) -> bool:
        """Whether the datapoint of ``seed`` is flipped: the draw ``__call__`` makes (the
        fused decode, :mod:`loadr.decode`, flips as it resizes).

        >>> flip(p=1.0).flips(0), flip(p=0.0).flips(0)
        (True, False)
        """
        return bool(self._rng(seed).random() < self.p)


def _flip_lr(frame: np.ndarray) -> np.ndarray:
    if frame.ndim == 3 and frame.flags.c_contiguous:
        # Move whole pixels rather than single channel values: about twice as fast.
        pixels = frame.view(f'V{frame.shape[2] * frame.itemsize}')
        return np.ascontiguousarray(pixels[:, ::-1]).view(frame.dtype).reshape(frame.shape)
    return np.ascontiguousarray(frame[:, ::-1])
