"""Structure of a datapoint: :class:`select`, :class:`rename`, :class:`pad_sequence`,
:class:`truncate`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError, SpecError
from .base import Fn, check_key, positive_int
from .video import is_scalar_array

# ---------------------------------------------------------------------------
# Structure


class select(Fn):  # noqa: N801
    """Keep only ``keys`` (a list, or one key), in that order; a missing key is an error.

    Example::

        select(['image', 'label'])({'image': 1, 'label': 2, 'path': 'x'})
        # {'image': 1, 'label': 2}
    """

    keys: tuple[str, ...]

    def __init__(self, keys=None):
        if isinstance(keys, str):
            keys = [keys]
        if (not isinstance(keys, (list, tuple)) or not keys
                or not all(isinstance(k, str) and k for k in keys)):
            raise ConfigError(f'keys must be a non-empty list of key names, got {keys!r}')
        if len(set(keys)) != len(keys):
            raise ConfigError(f'keys has a key twice: {keys!r}')
        self._keep(keys=tuple(keys))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        return {k: self._get(dp, k) for k in self.keys}


class rename(Fn):  # noqa: N801
    """Rename keys by ``mapping`` ``{old: new}``; swapping two keys works.

    A missing old key, or a new name that is already a key not being
    renamed, is an error (nothing is overwritten silently).

    Example::

        rename({'frames': 'video'})({'frames': f, 'label': 1})   # {'video': f, 'label': 1}
    """

    mapping: dict[str, str]

    def __init__(self, mapping=None):
        if (not isinstance(mapping, dict) or not mapping
                or not all(isinstance(k, str) and k and isinstance(v, str) and v
                           for k, v in mapping.items())):
            raise ConfigError(f'mapping must be a non-empty dict {{old: new}} of key names, '
                              f'got {mapping!r}')
        if len(set(mapping.values())) != len(mapping):
            raise ConfigError(f'mapping gives two keys the same new name: {mapping!r}')
        self._keep(mapping=dict(mapping))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        for old in self.mapping:
            self._get(dp, old)
        for new in self.mapping.values():
            if new in dp and new not in self.mapping:
                raise SpecError(f'{self!r}: the datapoint already has a key {new!r}')
        return {self.mapping.get(k, k): v for k, v in dp.items()}


class pad_sequence(Fn):  # noqa: N801
    """Pad a list or array along axis 0 to ``length`` with ``value``; add ``<key>_length``.

    An array is padded with ``value`` in its own dtype; a list of arrays
    with arrays like its first item filled with ``value``; any other list
    (or an empty one) with ``value`` itself. ``<key>_length`` holds the true
    length. A sequence longer than ``length`` is an error: put
    ``truncate(key, length)`` before.

    Example::

        pad_sequence('tokens', 4)({'tokens': [5, 6]})
        # {'tokens': [5, 6, 0, 0], 'tokens_length': 2}
    """

    key: str
    length: int
    value: Any

    def __init__(self, key: str | None = None, length: int | None = None, value=0):
        self._keep(key=check_key(key), length=positive_int(length, 'length'), value=value)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        seq = self._get(dp, self.key)
        length_key = f'{self.key}_length'
        if length_key in dp:
            raise SpecError(f'{self!r}: the datapoint already has a key {length_key!r}')
        if not isinstance(seq, (list, tuple, np.ndarray)) or is_scalar_array(seq):
            raise SpecError(f'{self!r}: key {self.key!r} must be a list or an array, '
                            f'got {type(seq).__name__}')
        n = len(seq)
        if n > self.length:
            raise SpecError(f'{self!r}: key {self.key!r} has {n} items, more than {self.length}; '
                            f'put truncate(key={self.key!r}, length={self.length}) before')
        missing = self.length - n
        out: np.ndarray | list
        if isinstance(seq, np.ndarray):
            try:
                pad = np.full((missing, *seq.shape[1:]), self.value, dtype=seq.dtype)
            except (OverflowError, ValueError, TypeError) as exc:
                raise SpecError(f'{self!r}: value {self.value!r} does not fit key {self.key!r} '
                                f'of dtype {seq.dtype}: {exc}') from None
            out = np.concatenate([seq, pad])
        elif n and isinstance(seq[0], np.ndarray):
            out = list(seq) + [np.full_like(seq[0], self.value) for _ in range(missing)]
        else:
            out = list(seq) + [self.value] * missing
        return {**dp, self.key: out, length_key: n}


class truncate(Fn):  # noqa: N801
    """Keep the first ``length`` items of a list, array, string or bytes.

    Example::

        truncate('tokens', 2)({'tokens': [5, 6, 7]})['tokens']   # [5, 6]
    """

    key: str
    length: int

    def __init__(self, key: str | None = None, length: int | None = None):
        self._keep(key=check_key(key), length=positive_int(length, 'length'))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        seq = self._get(dp, self.key)
        if isinstance(seq, tuple):
            seq = list(seq)
        if not isinstance(seq, (list, np.ndarray, str, bytes)) or is_scalar_array(seq):
            raise SpecError(f'{self!r}: key {self.key!r} must be a list, an array, a string or '
                            f'bytes, got {type(seq).__name__}')
        return {**dp, self.key: seq[:self.length]}
