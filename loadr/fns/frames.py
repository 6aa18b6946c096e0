"""Images, videos and the pixel operations the image fns share: frames in and out,
sizes, a resize of one frame, a crop."""

from __future__ import annotations

import numpy as np

from ..errors import SpecError
from .base import Fn, pil_image

# ---------------------------------------------------------------------------
# Images, videos and the pixel operations they share


def frames_of(fn: Fn, key: str, value, stack: bool = False):
    """``(frames, rebuild)``: the H×W(×C) arrays in ``value`` and how to put results back.

    ``rebuild`` returns one image for one image, a list for a list (or a
    T×… array when ``stack``), and a T×… array for a T×… array.
    """
    if isinstance(value, np.ndarray):
        if value.ndim in (2, 3):
            return [value], lambda out: out[0]
        if value.ndim == 4:
            return list(value), lambda out: _stack(fn, key, out) if out else value
    elif isinstance(value, (list, tuple)):
        for i, frame in enumerate(value):
            if not isinstance(frame, np.ndarray) or frame.ndim not in (2, 3):
                what = (f'{frame.dtype} array of shape {frame.shape}'
                        if isinstance(frame, np.ndarray) else type(frame).__name__)
                raise SpecError(f'{fn!r}: frame {i} of key {key!r} must be an H×W or H×W×C '
                                f'array, got {what}')
        return list(value), (lambda out: _stack(fn, key, out)) if stack else list
    what = (f'array of shape {value.shape}' if isinstance(value, np.ndarray)
            else type(value).__name__)
    raise SpecError(f'{fn!r}: key {key!r} must be an image (H×W or H×W×C array), a list of '
                    f'frames or a T×H×W×C array, got {what}')


def _stack(fn: Fn, key: str, arrays: list) -> np.ndarray:
    if not arrays:
        return np.zeros((0,), np.float32)
    try:
        return np.stack(arrays)
    except ValueError as exc:
        raise SpecError(f'{fn!r}: the frames of key {key!r} cannot be stacked: {exc}') from None


def frame_size(fn: Fn, key: str, frames: list) -> tuple[int, int]:
    """(H, W) shared by every frame; frames of different sizes cannot share one crop."""
    h, w = frames[0].shape[:2]
    for i, frame in enumerate(frames):
        if frame.shape[:2] != (h, w):
            raise SpecError(f'{fn!r}: frame {i} of key {key!r} is {frame.shape[0]}×{frame.shape[1]}'
                            f' but frame 0 is {h}×{w}; every frame must have the same size')
    return h, w


def _short_side(h: int, w: int, size: int) -> tuple[int, int]:
    """The (h, w) with the short side ``size``; the long side rounds down, as torchvision does."""
    if h <= w:
        return size, max(1, int(size * w / h))
    return max(1, int(size * h / w)), size


def target_size(h: int, w: int, size) -> tuple[int, int]:
    """The (h, w) to resize an ``h``×``w`` image to: ``size`` as (h, w), or an int short side."""
    return _short_side(h, w, size) if isinstance(size, int) else size


def resize_array(fn: Fn, key: str, arr: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear (Pillow, antialiased when shrinking) resize of one uint8 or float32 frame."""
    if arr.shape[:2] == (h, w):
        return arr
    if arr.dtype not in (np.uint8, np.float32):
        raise SpecError(f'{fn!r}: key {key!r} must be a uint8 or float32 image to resize, '
                        f'got {arr.dtype}')
    Image = pil_image()
    bilinear = Image.Resampling.BILINEAR
    arr = np.ascontiguousarray(arr)
    if arr.dtype == np.uint8 and (arr.ndim == 2 or arr.shape[2] == 3):
        return np.asarray(Image.fromarray(arr).resize((w, h), bilinear))
    # Other channel counts go one channel at a time (Pillow would premultiply RGBA's alpha).
    if arr.ndim == 2:
        return np.asarray(Image.fromarray(arr).resize((w, h), bilinear))
    channels = [Image.fromarray(np.ascontiguousarray(arr[:, :, c])).resize((w, h), bilinear)
                for c in range(arr.shape[2])]
    return np.stack([np.asarray(c) for c in channels], axis=-1)


def crop_array(frame: np.ndarray, top: int, left: int, h: int, w: int) -> np.ndarray:
    """The ``h``×``w`` window of ``frame`` at (``top``, ``left``), contiguous."""
    return np.ascontiguousarray(frame[top:top + h, left:left + w])


def check_fits(fn: Fn, key: str, hw: tuple, crop: tuple) -> None:
    """Refuse a ``crop`` (h, w) larger than the image ``hw`` (h, w), naming the key."""
    if crop[0] > hw[0] or crop[1] > hw[1]:
        raise SpecError(f'{fn!r}: key {key!r} is {hw[0]}×{hw[1]} (H×W), smaller than the crop '
                        f'{crop[0]}×{crop[1]}; resize it first (e.g. resize(size=...) before)')
