"""The base class of the built-in fns (:class:`Fn`: repr, equality, its own random
stream) and the checks of their arguments."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from ..errors import ConfigError, SpecError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision's RandomResizedCrop gives up drawing after this many tries and crops the centre.
RESIZED_CROP_TRIES = 10


def pil_image():
    """Pillow's ``Image`` module."""
    # Pillow loads on first use so that `import loadr.fns` stays cheap.
    from PIL import Image
    return Image


# ---------------------------------------------------------------------------
# The base class and argument checks


class Fn:
    """Base of the built-in fns: keeps the constructor arguments for repr and equality.

    Subclasses call ``self._keep(...)`` with their (validated) arguments and
    implement ``__call__(datapoint, seed=None) -> datapoint``. ``reads`` is
    True for a fn that also implements ``read(reader, index, seed)``. A
    subclass declares the arguments it keeps as annotated class attributes:
    ``_keep`` sets them on the instance, the annotations say what they are (to
    a reader, and to mypy).

    Example::

        class double(Fn):
            key: str

            def __init__(self, key='x'):
                self._keep(key=key)
            def __call__(self, dp, seed=None):
                return {**dp, self.key: 2 * dp[self.key]}
    """

    reads = False
    stream: str | None          # a random fn's shared-stream name (None: its own stream)

    def _keep(self, **args: Any) -> None:
        self._args = args
        self.__dict__.update(args)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        inner = ', '.join(f'{k}={v!r}' for k, v in self._args.items())
        return f'{type(self).__name__}({inner})'

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self._args == other._args

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def _keep_stream(self, stream) -> None:
        """Record ``stream`` (a random fn's shared-stream name; None: its own stream)."""
        if stream is not None:
            if not isinstance(stream, str) or not stream:
                raise ConfigError(f'stream must be a non-empty string (a name that fns sharing '
                                  f'one random stream give alike), got {stream!r}')
            self._args['stream'] = stream
            self.stream = stream
        else:
            self.stream = None

    def _salt(self) -> int:
        # The class name and the arguments (the key included), or the class name
        # and the stream's name: what makes two fns draw alike or not.
        salt = self.__dict__.get('_salt_value')
        if salt is None:
            name = type(self).__name__
            stream = self.__dict__.get('stream')
            if stream is not None:
                text = f'{name}/stream={stream}'
            else:
                args = getattr(self, '_args', {})
                text = name + '(' + ', '.join(f'{k}={v!r}' for k, v in args.items()) + ')'
            salt = self._salt_value = zlib.crc32(text.encode())
        return salt

    def _rng(self, seed) -> np.random.Generator:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f'{self!r} is random: call it as fn(datapoint, seed=<int >= 0>), '
                              f'got seed={seed!r}')
        return np.random.default_rng([int(seed), self._salt()])

    def _get(self, dp: dict, key: str):
        if not isinstance(dp, dict):
            raise SpecError(f'{self!r}: a datapoint must be a dict, got {type(dp).__name__}')
        try:
            return dp[key]
        except KeyError:
            raise SpecError(f'{self!r}: the datapoint has no key {key!r} '
                            f'(it has {sorted(map(str, dp))})') from None


def is_int(x) -> bool:
    """Whether ``x`` is an int (a numpy integer too), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def is_number(x) -> bool:
    """Whether ``x`` is a real number (numpy ones too), not a bool."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def positive_int(value, name: str) -> int:
    """``value`` as an int >= 1; ConfigError naming ``name`` otherwise."""
    if not is_int(value) or value < 1:
        raise ConfigError(f'{name} must be a positive int, got {value!r}')
    return int(value)


def check_key(value, name: str = 'key') -> str:
    """``value``, a non-empty string (a datapoint key); ConfigError naming ``name`` otherwise."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f'{name} must be a non-empty string, got {value!r}')
    return value


def _pair(value, name: str, of: str = 'positive ints') -> tuple:
    """Two positive ints (h, w) from a tuple or a YAML list."""
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(is_int(v) and v >= 1 for v in value)):
        raise ConfigError(f'{name} must be two {of}, got {value!r}')
    return int(value[0]), int(value[1])


def check_size(value, allow_short_side: bool):
    """An int (the short side, or a square crop) or an exact (h, w)."""
    if is_int(value) and value >= 1:
        return int(value) if allow_short_side else (int(value), int(value))
    if value is None:
        raise ConfigError('size is required: an int or two positive ints (h, w)')
    if is_int(value):
        raise ConfigError(f'size must be a positive int or two positive ints (h, w), got {value!r}')
    return _pair(value, 'size')


def float_range(value, name: str, upper: float | None = None) -> tuple:
    """``(low, high)``: two positive finite numbers, low <= high (<= ``upper``)."""
    ok = (isinstance(value, (tuple, list)) and len(value) == 2
          and all(is_number(v) and math.isfinite(v) and v > 0 for v in value)
          and value[0] <= value[1] and (upper is None or value[1] <= upper))
    if not ok:
        limit = f' and at most {upper}' if upper is not None else ''
        raise ConfigError(f'{name} must be two positive numbers (low, high), low <= high{limit}, '
                          f'got {value!r}')
    return float(value[0]), float(value[1])
