"""Pixel values: :class:`normalize` and :class:`to_float`."""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError, SpecError
from .base import IMAGENET_MEAN, IMAGENET_STD, Fn, check_key, is_number
from .frames import frames_of

# ---------------------------------------------------------------------------
# Pixel values


def _channel_values(value, name: str) -> tuple:
    if value == 'imagenet':
        return IMAGENET_MEAN if name == 'mean' else IMAGENET_STD
    if is_number(value):
        value = (value,)
    if (not isinstance(value, (tuple, list)) or not value
            or not all(is_number(v) and math.isfinite(v) for v in value)):
        raise ConfigError(f"{name} must be 'imagenet', a number or a list of numbers (one per "
                          f'channel), got {value!r}')
    return tuple(float(v) for v in value)


class normalize(Fn):
    """``(x - mean) / std`` per channel, as float32; integer pixels are first divided by 255.

    (Computed as ``x * (1 / std) - mean / std``, equal up to float32 rounding.)

    So ``mean``/``std`` are on the 0..1 scale (``'imagenet'`` is
    0.485, 0.456, 0.406 / 0.229, 0.224, 0.225) whether the image is uint8 or
    already a 0..1 float. ``layout='CHW'`` moves channels first (an H×W
    image becomes 1×H×W). A video list becomes a T×… array.

    Example::

        normalize(mean='imagenet', std='imagenet', layout='CHW')({'image': img})['image'].shape
        # (3, 224, 224)
    """

    key: str
    mean: str | tuple[float, ...]        # a name ('imagenet') or values
    std: str | tuple[float, ...]
    layout: str

    def __init__(self, key: str = 'image', mean='imagenet', std='imagenet', layout: str = 'HWC'):
        mean_v, std_v = _channel_values(mean, 'mean'), _channel_values(std, 'std')
        if any(s <= 0 for s in std_v):
            raise ConfigError(f'std must be positive, got {std!r}')
        if layout not in ('HWC', 'CHW'):
            raise ConfigError(f"layout must be 'HWC' or 'CHW', got {layout!r}")
        self._keep(key=check_key(key), mean=mean if isinstance(mean, str) else mean_v,
                   std=std if isinstance(std, str) else std_v, layout=layout)
        mean64, std64 = np.asarray(mean_v, np.float64), np.asarray(std_v, np.float64)
        # (x - mean) / std as x * scale - offset: two passes over the pixels instead of four.
        self._scale_int = (1 / (255 * std64)).astype(np.float32)
        self._scale_float = (1 / std64).astype(np.float32)
        self._offset = (mean64 / std64).astype(np.float32)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        frames, rebuild = frames_of(self, self.key, self._get(dp, self.key), stack=True)
        return {**dp, self.key: rebuild([self._one(f) for f in frames])}

    def _one(self, frame: np.ndarray) -> np.ndarray:
        channels = 1 if frame.ndim == 2 else frame.shape[2]
        if len(self._offset) not in (1, channels) or len(self._scale_int) not in (1, channels):
            raise SpecError(f'{self!r}: key {self.key!r} has {channels} channel(s) but mean/std '
                            f'have {len(self._offset)}/{len(self._scale_int)}')
        if not np.issubdtype(frame.dtype, np.number):
            raise SpecError(f'{self!r}: key {self.key!r} must hold numbers, got {frame.dtype}')
        integer = not np.issubdtype(frame.dtype, np.floating)
        scale, offset = (self._scale_int if integer else self._scale_float), self._offset
        if frame.ndim == 2:
            scale, offset = scale[0], offset[0]
            if self.layout == 'CHW':
                frame = frame[None]
        elif self.layout == 'CHW':
            # Transpose while the pixels are still small (uint8), then work in place.
            frame = frame.transpose(2, 0, 1)
            scale, offset = scale.reshape(-1, 1, 1), offset.reshape(-1, 1, 1)
        else:
            # numpy broadcasts a row of W*C values much faster than C values per pixel.
            width = frame.shape[1]
            scale = np.tile(np.broadcast_to(scale, (channels,)), width)
            offset = np.tile(np.broadcast_to(offset, (channels,)), width)
        x = np.ascontiguousarray(frame).astype(np.float32)   # a new array: safe to change
        rows = x.reshape(x.shape[0], -1) if x.ndim == 3 and self.layout == 'HWC' else x
        rows *= scale
        rows -= offset
        return x


class to_float(Fn):  # noqa: N801
    """``x * scale`` as float32 (default 1/255: uint8 pixels to 0..1); a video list is stacked.

    Example::

        to_float()({'image': np.array([0, 255], np.uint8)})['image']   # [0., 1.]
    """

    key: str
    scale: float

    def __init__(self, key: str = 'image', scale: float = 1 / 255):
        if not is_number(scale) or not math.isfinite(scale):
            raise ConfigError(f'scale must be a finite number, got {scale!r}')
        self._keep(key=check_key(key), scale=float(scale))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        value = self._get(dp, self.key)
        if isinstance(value, (list, tuple)):
            try:
                value = np.stack([np.asarray(v) for v in value])
            except ValueError as exc:
                raise SpecError(f'{self!r}: the items of key {self.key!r} cannot be stacked: '
                                f'{exc}') from None
        value = np.asarray(value)
        if not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
            raise SpecError(f'{self!r}: key {self.key!r} must hold numbers, got {value.dtype}')
        return {**dp, self.key: value.astype(np.float32) * np.float32(self.scale)}
