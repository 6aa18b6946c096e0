"""Ready transforms for a loader's ``fns`` pipeline.

Every fn is a small picklable object called as ``fn(datapoint, seed=s)``; it
returns a new dict and never changes the one it was given. The output is a
pure function of (datapoint, seed): a random fn draws only from its own
generator ``numpy.random.default_rng([seed, salt])``, never from a global RNG
or the clock. The salt is a CRC32 of the fn's name and arguments, so two fns
given the same seed draw independently: a flip and a crop, and also two
``random_resized_crop`` s of two keys (two views of one image, SimCLR-style).
Fns that must draw the same numbers on purpose (an image and its mask get
the same crop) name one stream: ``stream='pair'`` on both makes every fn of
that class with that name draw alike, whatever its key. The seed itself,
what a fn of your own receives, is the sample's seed, unsalted.

Image fns take an H×W or H×W×C array, a list of such frames (a video), or a
T×H×W×C array; a video gets the SAME crop and flip on every frame. An array
of 4 dimensions is a stack of frames; one of 2 or 3 is a single image.

From YAML each fn is named by its short name (``flip``) or by an import path
(``'mypackage.transforms:jitter'``); :func:`resolve` turns either into the
factory.

Example::

    import loadr.fns as F
    fns = [F.decode_jpeg(size=256), F.random_resized_crop(size=224), F.flip(),
           F.normalize(mean='imagenet', std='imagenet', layout='CHW')]
    dp = {'image': jpeg_bytes, 'label': 3}
    for fn in fns:
        dp = fn(dp, seed=17)
"""

from __future__ import annotations

import difflib
import importlib
import io
import math
import os
import sys
import zlib
from typing import Any, Callable

import numpy as np

from .errors import ConfigError, DecodeError, SpecError

__all__ = [
    'Fn', 'REGISTRY', 'resolve',
    'decode_jpeg', 'resize', 'center_crop', 'random_crop', 'random_resized_crop', 'flip',
    'normalize', 'to_float', 'sample_frames', 'label_to_index', 'one_hot',
    'select', 'rename', 'pad_sequence', 'truncate',
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision's RandomResizedCrop gives up drawing after this many tries and crops the centre.
RESIZED_CROP_TRIES = 10


def _pil():
    # Pillow loads on first use so that `import loadr.fns` stays cheap.
    from PIL import Image
    return Image


# ---------------------------------------------------------------------------
# The base class and argument checks


class Fn:
    """Base of the built-in fns: keeps the constructor arguments for repr and equality.

    Subclasses call ``self._keep(...)`` with their (validated) arguments and
    implement ``__call__(datapoint, seed=None) -> datapoint``. ``reads`` is
    True for a fn that also implements ``read(reader, index, seed)``.

    Example::

        class double(Fn):
            def __init__(self, key='x'):
                self._keep(key=key)
            def __call__(self, dp, seed=None):
                return {**dp, 'x': 2 * dp['x']}
    """

    reads = False

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


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _positive_int(value, name: str) -> int:
    if not _is_int(value) or value < 1:
        raise ConfigError(f'{name} must be a positive int, got {value!r}')
    return int(value)


def _key(value, name: str = 'key') -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f'{name} must be a non-empty string, got {value!r}')
    return value


def _pair(value, name: str, of: str = 'positive ints') -> tuple:
    """Two positive ints (h, w) from a tuple or a YAML list."""
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(_is_int(v) and v >= 1 for v in value)):
        raise ConfigError(f'{name} must be two {of}, got {value!r}')
    return int(value[0]), int(value[1])


def _size(value, allow_short_side: bool):
    """An int (the short side, or a square crop) or an exact (h, w)."""
    if _is_int(value) and value >= 1:
        return int(value) if allow_short_side else (int(value), int(value))
    if value is None:
        raise ConfigError('size is required: an int or two positive ints (h, w)')
    if _is_int(value):
        raise ConfigError(f'size must be a positive int or two positive ints (h, w), got {value!r}')
    return _pair(value, 'size')


def _float_range(value, name: str, upper: float | None = None) -> tuple:
    ok = (isinstance(value, (tuple, list)) and len(value) == 2
          and all(_is_number(v) and math.isfinite(v) and v > 0 for v in value)
          and value[0] <= value[1] and (upper is None or value[1] <= upper))
    if not ok:
        limit = f' and at most {upper}' if upper is not None else ''
        raise ConfigError(f'{name} must be two positive numbers (low, high), low <= high{limit}, '
                          f'got {value!r}')
    return float(value[0]), float(value[1])


# ---------------------------------------------------------------------------
# Images, videos and the pixel operations they share


def _frames(fn: Fn, key: str, value, stack: bool = False):
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


def _frame_size(fn: Fn, key: str, frames: list) -> tuple[int, int]:
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


def _target(h: int, w: int, size) -> tuple[int, int]:
    return _short_side(h, w, size) if isinstance(size, int) else size


def _resize_array(fn: Fn, key: str, arr: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear (Pillow, antialiased when shrinking) resize of one uint8 or float32 frame."""
    if arr.shape[:2] == (h, w):
        return arr
    if arr.dtype not in (np.uint8, np.float32):
        raise SpecError(f'{fn!r}: key {key!r} must be a uint8 or float32 image to resize, '
                        f'got {arr.dtype}')
    Image = _pil()
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


def _crop(frame: np.ndarray, top: int, left: int, h: int, w: int) -> np.ndarray:
    return np.ascontiguousarray(frame[top:top + h, left:left + w])


def _check_fits(fn: Fn, key: str, hw: tuple, crop: tuple) -> None:
    if crop[0] > hw[0] or crop[1] > hw[1]:
        raise SpecError(f'{fn!r}: key {key!r} is {hw[0]}×{hw[1]} (H×W), smaller than the crop '
                        f'{crop[0]}×{crop[1]}; resize it first (e.g. resize(size=...) before)')


# ---------------------------------------------------------------------------
# Decoding


_DECODE_MODES = (None, 'RGB', 'L', 'RGBA', 'YCbCr')


def _simplejpeg():
    try:
        import simplejpeg
    except ImportError as exc:
        raise ConfigError("decode_jpeg(backend='simplejpeg') needs simplejpeg: "
                          "pip install simplejpeg") from exc
    return simplejpeg


# The fns are lowercase classes: in a pipeline they read as functions, and
# their class names are their YAML names.
class decode_jpeg(Fn):  # noqa: N801
    """JPEG bytes (or a list of them, e.g. video frames) to uint8 arrays.

    ``size=None`` decodes at full size. ``size=int`` resizes so the short
    side is ``size`` (long side rounded down, as torchvision); ``size=(h, w)``
    resizes to exactly that. With a size, libjpeg first scales down by DCT
    while decoding (Pillow's draft mode: by 1/2, 1/4 or 1/8, never below the
    target on either side), then a bilinear resize makes the exact size.
    ``mode='RGB'`` gives H×W×3, ``'L'`` H×W, ``None`` the file's own mode.
    ``backend='simplejpeg'`` decodes with simplejpeg (optional; its DCT
    scaling also has the finer steps 7/8 … 1/8). An ndarray value is already
    decoded and passes through, resized if ``size`` is given. PNG bytes also
    decode (the pillow backend; without the DCT shortcut).

    In a Loader, a decode_jpeg followed by ``resize``, ``center_crop``,
    ``random_crop`` or ``random_resized_crop`` of the same key is fused with
    them: the JPEG is decoded only as finely as their output needs (see
    :mod:`loadr.decode`). ``fuse=False`` (or ``LOADR_FUSE=0``) keeps them apart.

    Example::

        decode_jpeg(size=256)({'image': jpeg_bytes})['image'].shape   # (256, 341, 3)
    """

    def __init__(self, key: str = 'image', size=None, mode: str | None = 'RGB',
                 backend: str = 'pillow', fuse: bool = True):
        if not isinstance(fuse, bool):
            raise ConfigError(f'fuse must be True or False, got {fuse!r}')
        if size is not None:
            size = _size(size, allow_short_side=True)
        if backend not in ('pillow', 'simplejpeg'):
            raise ConfigError(f"backend must be 'pillow' or 'simplejpeg', got {backend!r}")
        allowed = _DECODE_MODES if backend == 'pillow' else (None, 'RGB', 'L')
        if mode not in allowed:
            raise ConfigError(f'mode must be one of {allowed} for backend {backend!r}, '
                              f'got {mode!r}')
        if backend == 'simplejpeg':
            _simplejpeg()
        self._keep(key=_key(key), size=size, mode=mode, backend=backend)
        # Kept out of _args unless off: a default decode_jpeg's repr (and so a saved
        # state's fn names) stays what it was.
        if not fuse:
            self._args['fuse'] = False
        self.fuse = fuse

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        value = self._get(dp, self.key)
        if isinstance(value, np.ndarray) and value.ndim >= 2:
            frames, rebuild = _frames(self, self.key, value)  # already decoded
            return {**dp, self.key: rebuild([self._one(f, None) for f in frames])}
        if isinstance(value, (list, tuple)):
            out = [self._one(v, i) for i, v in enumerate(value)]
        else:
            out = self._one(value, None)
        return {**dp, self.key: out}

    def _one(self, value, frame: int | None) -> np.ndarray:
        if isinstance(value, np.ndarray) and value.ndim in (2, 3):
            if self.size is None:
                return value
            h, w = _target(value.shape[0], value.shape[1], self.size)
            return _resize_array(self, self.key, value, h, w)
        if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
            value = value.tobytes()  # encoded bytes that came back as an array
        if not isinstance(value, (bytes, bytearray, memoryview)):
            where = '' if frame is None else f' (frame {frame})'
            raise SpecError(f'{self!r}: key {self.key!r}{where} must hold JPEG bytes or an image '
                            f'array, got {type(value).__name__}')
        try:
            if self.backend == 'simplejpeg':
                return self._simplejpeg(bytes(value))
            return self._pillow(bytes(value))
        except DecodeError as exc:
            where = '' if frame is None else f' (frame {frame})'
            raise DecodeError(f'{self!r}: key {self.key!r}{where}: {exc.message}') from exc

    def _pillow(self, data: bytes) -> np.ndarray:
        from .codecs import IMAGE_FORMATS, decode_image, image_problem
        if self.size is None:
            return decode_image(data, mode=self.mode)
        Image = _pil()
        try:
            # Opening only parses the header; the target size comes from the
            # full-size dimensions so that draft or not, the shape is the same.
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
                full_w, full_h = img.size
        except (OSError, ValueError, SyntaxError, KeyError, Image.DecompressionBombError) as exc:
            # decode_image gives the full account of a bad or foreign image
            decode_image(data, mode=self.mode)
            raise DecodeError(f'cannot decode image: {image_problem(data, exc)}') from exc
        h, w = _target(full_h, full_w, self.size)
        arr = decode_image(data, mode=self.mode, draft=(w, h))
        return _resize_array(self, self.key, arr, h, w)

    def _simplejpeg(self, data: bytes) -> np.ndarray:
        simplejpeg = _simplejpeg()
        try:
            full_h, full_w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            gray = self.mode == 'L' or (self.mode is None and colorspace.upper() == 'GRAY')
            options = {'colorspace': 'GRAY' if gray else 'RGB'}
            if self.size is not None:
                h, w = _target(full_h, full_w, self.size)
                options.update(min_height=h, min_width=w)
            arr = simplejpeg.decode_jpeg(data, **options)
        except ValueError as exc:
            raise DecodeError(f'cannot decode JPEG with simplejpeg: {exc}') from exc
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        if self.size is not None:
            arr = _resize_array(self, self.key, arr, h, w)
        return arr


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

    def __init__(self, key: str = 'image', size=None):
        self._keep(key=_key(key), size=_size(size, allow_short_side=True))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        frames, rebuild = _frames(self, self.key, self._get(dp, self.key))
        out = [_resize_array(self, self.key, f, *_target(f.shape[0], f.shape[1], self.size))
               for f in frames]
        return {**dp, self.key: rebuild(out)}

    def plan(self, region, seed: int | None = None) -> None:
        """Do to ``region`` (a :class:`loadr.decode.Region`) what ``__call__`` does to an image."""
        region.resize(*_target(region.h, region.w, self.size))


class center_crop(Fn):  # noqa: N801
    """Crop the centre ``size`` (int for a square, or (h, w)); the offset rounds as torchvision's.

    An image smaller than the crop is a SpecError (resize it first).

    Example::

        center_crop(size=224)({'image': img})['image'].shape   # (224, 224, 3)
    """

    def __init__(self, key: str = 'image', size=None):
        self._keep(key=_key(key), size=_size(size, allow_short_side=False))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        frames, rebuild = _frames(self, self.key, self._get(dp, self.key))
        if not frames:
            return dict(dp)
        hw = _frame_size(self, self.key, frames)
        h, w = self.size
        _check_fits(self, self.key, hw, self.size)
        top, left = int(round((hw[0] - h) / 2)), int(round((hw[1] - w) / 2))
        return {**dp, self.key: rebuild([_crop(f, top, left, h, w) for f in frames])}

    def plan(self, region, seed: int | None = None) -> None:
        """Do to ``region`` (a :class:`loadr.decode.Region`) what ``__call__`` does to an image."""
        hw = (region.h, region.w)
        h, w = self.size
        _check_fits(self, self.key, hw, self.size)
        region.crop(int(round((hw[0] - h) / 2)), int(round((hw[1] - w) / 2)), h, w)


class random_crop(Fn):  # noqa: N801
    """Crop ``size`` at a position drawn uniformly from every position that fits.

    ``stream``: a name shared with other random_crops that must draw the
    same position (an image and its mask); see the module's docstring.

    Example::

        random_crop(size=(32, 48))(dp, seed=3)['image'].shape   # (32, 48, 3)
    """

    def __init__(self, key: str = 'image', size=None, stream: str | None = None):
        self._keep(key=_key(key), size=_size(size, allow_short_side=False))
        self._keep_stream(stream)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        rng = self._rng(seed)
        frames, rebuild = _frames(self, self.key, self._get(dp, self.key))
        if not frames:
            return dict(dp)
        hw = _frame_size(self, self.key, frames)
        h, w = self.size
        _check_fits(self, self.key, hw, self.size)
        top = int(rng.integers(0, hw[0] - h + 1))
        left = int(rng.integers(0, hw[1] - w + 1))
        return {**dp, self.key: rebuild([_crop(f, top, left, h, w) for f in frames])}

    def plan(self, region, seed: int | None = None) -> None:
        """Do to ``region`` (a :class:`loadr.decode.Region`) what ``__call__`` does to an image:
        the same draws from the same generator, so the same position."""
        rng = self._rng(seed)
        hw = (region.h, region.w)
        h, w = self.size
        _check_fits(self, self.key, hw, self.size)
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

    def __init__(self, key: str = 'image', size=None, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 stream: str | None = None):
        self._keep(key=_key(key), size=_size(size, allow_short_side=False),
                   scale=_float_range(scale, 'scale', upper=1.0),
                   ratio=_float_range(ratio, 'ratio'))
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
        frames, rebuild = _frames(self, self.key, self._get(dp, self.key))
        if not frames:
            return dict(dp)
        top, left, h, w = self.box(*_frame_size(self, self.key, frames), rng)
        out = [_resize_array(self, self.key, _crop(f, top, left, h, w), *self.size) for f in frames]
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

    def __init__(self, key: str = 'image', p: float = 0.5, stream: str | None = None):
        if not _is_number(p) or not 0 <= p <= 1:
            raise ConfigError(f'p must be a probability between 0 and 1, got {p!r}')
        self._keep(key=_key(key), p=float(p))
        self._keep_stream(stream)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        rng = self._rng(seed)
        frames, rebuild = _frames(self, self.key, self._get(dp, self.key))
        if not rng.random() < self.p:
            return dict(dp)
        return {**dp, self.key: rebuild([_flip_lr(f) for f in frames])}


def _flip_lr(frame: np.ndarray) -> np.ndarray:
    if frame.ndim == 3 and frame.flags.c_contiguous:
        # Move whole pixels rather than single channel values: about twice as fast.
        pixels = frame.view(f'V{frame.shape[2] * frame.itemsize}')
        return np.ascontiguousarray(pixels[:, ::-1]).view(frame.dtype).reshape(frame.shape)
    return np.ascontiguousarray(frame[:, ::-1])


# ---------------------------------------------------------------------------
# Pixel values


def _channel_values(value, name: str) -> tuple:
    if value == 'imagenet':
        return IMAGENET_MEAN if name == 'mean' else IMAGENET_STD
    if _is_number(value):
        value = (value,)
    if (not isinstance(value, (tuple, list)) or not value
            or not all(_is_number(v) and math.isfinite(v) for v in value)):
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

    def __init__(self, key: str = 'image', mean='imagenet', std='imagenet', layout: str = 'HWC'):
        mean_v, std_v = _channel_values(mean, 'mean'), _channel_values(std, 'std')
        if any(s <= 0 for s in std_v):
            raise ConfigError(f'std must be positive, got {std!r}')
        if layout not in ('HWC', 'CHW'):
            raise ConfigError(f"layout must be 'HWC' or 'CHW', got {layout!r}")
        self._keep(key=_key(key), mean=mean if isinstance(mean, str) else mean_v,
                   std=std if isinstance(std, str) else std_v, layout=layout)
        mean64, std64 = np.asarray(mean_v, np.float64), np.asarray(std_v, np.float64)
        # (x - mean) / std as x * scale - offset: two passes over the pixels instead of four.
        self._scale_int = (1 / (255 * std64)).astype(np.float32)
        self._scale_float = (1 / std64).astype(np.float32)
        self._offset = (mean64 / std64).astype(np.float32)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        frames, rebuild = _frames(self, self.key, self._get(dp, self.key), stack=True)
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

    def __init__(self, key: str = 'image', scale: float = 1 / 255):
        if not _is_number(scale) or not math.isfinite(scale):
            raise ConfigError(f'scale must be a finite number, got {scale!r}')
        self._keep(key=_key(key), scale=float(scale))

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

    def __init__(self, key: str = 'frames', num: int = 8, mode: str = 'uniform', stride: int = 1,
                 train: bool = True, short: str = 'loop', stream: str | None = None):
        if mode not in self.MODES:
            raise ConfigError(f'mode must be one of {self.MODES}, got {mode!r}')
        if not isinstance(train, bool):
            raise ConfigError(f'train must be True or False, got {train!r}')
        if short not in ('loop', 'clamp'):
            raise ConfigError(f"short must be 'loop' or 'clamp', got {short!r}")
        self._keep(key=_key(key), num=_positive_int(num, 'num'), mode=mode,
                   stride=_positive_int(stride, 'stride'), train=train, short=short)
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
        if not isinstance(value, (list, tuple, np.ndarray)) or _is_scalar_array(value):
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
        mask = {k: True for k in available if k != self.key}
        mask[self.key] = wanted
        dp = reader[index, mask]
        got = dp.get(self.key) if isinstance(dp, dict) else None
        if got is None or len(got) != len(wanted):
            raise SpecError(f'{self!r}: asked the reader for {len(wanted)} frames of key '
                            f'{self.key!r}, got {0 if got is None else len(got)}', index=index)
        slot = {p: j for j, p in enumerate(wanted)}
        return {**dp, self.key: _pick(got, [slot[p] for p in chosen])}


def _is_scalar_array(value) -> bool:
    return isinstance(value, np.ndarray) and value.ndim == 0


def _pick(seq, positions: list[int]):
    if isinstance(seq, np.ndarray):
        return seq[np.asarray(positions, dtype=np.intp)]
    return [seq[p] for p in positions]


# ---------------------------------------------------------------------------
# Labels


def _load_mapping(path) -> dict:
    from .jsonfiles import read_json
    return read_json(path, 'the label mapping', dict, '{label: index}')


class label_to_index(Fn):  # noqa: N801
    """Map a label (or a list of labels) to its int index.

    ``mapping`` is a dict ``{label: index}`` or the path of a JSON file such
    as gulp's ``label2idx.json`` (read once, here). ``mapping=None`` accepts
    labels that are already integers and turns them into Python ints.

    Example::

        label_to_index(mapping={'cat': 0, 'dog': 1})({'label': 'dog'})['label']   # 1
    """

    def __init__(self, key: str = 'label', mapping=None):
        if isinstance(mapping, (str, os.PathLike)):
            table, shown = _load_mapping(mapping), os.fspath(mapping)
        elif isinstance(mapping, dict) or mapping is None:
            table, shown = mapping, mapping
        else:
            raise ConfigError(f'mapping must be None, a dict or the path of a JSON file, '
                              f'got {type(mapping).__name__}')
        if table is not None:
            bad = [k for k, v in table.items() if not _is_int(v)]
            if bad:
                raise ConfigError(f'mapping values must be ints; label {bad[0]!r} maps to '
                                  f'{table[bad[0]]!r}')
            table = {k: int(v) for k, v in table.items()}
        self._keep(key=_key(key), mapping=shown)
        self._table = table

    def __repr__(self) -> str:
        mapping = self.mapping
        if isinstance(mapping, dict) and len(mapping) > 6:
            mapping = f'<{len(mapping)} labels>'
            return f'{type(self).__name__}(key={self.key!r}, mapping={mapping})'
        return super().__repr__()

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        value = self._get(dp, self.key)
        if isinstance(value, (list, tuple)):
            return {**dp, self.key: [self._one(v) for v in value]}
        return {**dp, self.key: self._one(value)}

    def _one(self, label) -> int:
        if self._table is None:
            if _is_int(label):
                return int(label)
            raise SpecError(f'{self!r}: label {label!r} of key {self.key!r} is not an int; '
                            f'pass mapping= (a dict or a label2idx.json path)')
        try:
            return self._table[label]
        except (KeyError, TypeError):
            raise SpecError(f'{self!r}: label {label!r} of key {self.key!r} is not in the mapping '
                            f'({len(self._table)} labels)') from None


class one_hot(Fn):  # noqa: N801
    """An int label to a float32 vector of ``num_classes`` with a 1 at the label.

    Example::

        one_hot(num_classes=4)({'label': 2})['label']   # [0., 0., 1., 0.]
    """

    def __init__(self, key: str = 'label', num_classes: int | None = None):
        self._keep(key=_key(key), num_classes=_positive_int(num_classes, 'num_classes'))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        label = self._get(dp, self.key)
        if isinstance(label, np.ndarray) and label.ndim == 0:
            label = label[()]
        if not _is_int(label) or not 0 <= label < self.num_classes:
            raise SpecError(f'{self!r}: key {self.key!r} must be an int label in '
                            f'[0, {self.num_classes}), got {label!r}')
        out = np.zeros(self.num_classes, np.float32)
        out[int(label)] = 1
        return {**dp, self.key: out}


# ---------------------------------------------------------------------------
# Structure


class select(Fn):  # noqa: N801
    """Keep only ``keys`` (a list, or one key), in that order; a missing key is an error.

    Example::

        select(['image', 'label'])({'image': 1, 'label': 2, 'path': 'x'})
        # {'image': 1, 'label': 2}
    """

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

    def __init__(self, key: str = None, length: int | None = None, value=0):
        self._keep(key=_key(key), length=_positive_int(length, 'length'), value=value)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        seq = self._get(dp, self.key)
        length_key = f'{self.key}_length'
        if length_key in dp:
            raise SpecError(f'{self!r}: the datapoint already has a key {length_key!r}')
        if not isinstance(seq, (list, tuple, np.ndarray)) or _is_scalar_array(seq):
            raise SpecError(f'{self!r}: key {self.key!r} must be a list or an array, '
                            f'got {type(seq).__name__}')
        n = len(seq)
        if n > self.length:
            raise SpecError(f'{self!r}: key {self.key!r} has {n} items, more than {self.length}; '
                            f'put truncate(key={self.key!r}, length={self.length}) before')
        missing = self.length - n
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

    def __init__(self, key: str = None, length: int | None = None):
        self._keep(key=_key(key), length=_positive_int(length, 'length'))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        seq = self._get(dp, self.key)
        if isinstance(seq, tuple):
            seq = list(seq)
        if not isinstance(seq, (list, np.ndarray, str, bytes)) or _is_scalar_array(seq):
            raise SpecError(f'{self!r}: key {self.key!r} must be a list, an array, a string or '
                            f'bytes, got {type(seq).__name__}')
        return {**dp, self.key: seq[:self.length]}


# ---------------------------------------------------------------------------
# Names


REGISTRY: dict[str, Callable[..., Fn]] = {fn.__name__: fn for fn in (
    decode_jpeg, resize, center_crop, random_crop, random_resized_crop, flip, normalize,
    to_float, sample_frames, label_to_index, one_hot, select, rename, pad_sequence, truncate,
)}


def resolve(name: str, search=()) -> Callable:
    """The factory for a short name (``'flip'``) or an import path (``'pkg.module:function'``).

    The path is imported with importlib (never evaluated); an unknown name
    or a path that does not import is a ConfigError naming it. ``search``
    lists folders to look in first (a pipeline gives its YAML file's folder
    and the current directory): see :func:`_import_module`.

    >>> resolve('flip')(p=1.0)
    flip(key='image', p=1.0)
    """
    if not isinstance(name, str):
        raise ConfigError(f'a fn name must be a string, got {type(name).__name__}')
    if name in REGISTRY:
        return REGISTRY[name]
    if ':' not in name:
        close = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f'; did you mean {close[0]!r}?' if close else '.'
        raise ConfigError(f"unknown fn {name!r}{hint} Built-ins: {', '.join(REGISTRY)}; or give an "
                          f"import path 'package.module:function'")
    module_name, _, attr = name.partition(':')
    parts = module_name.split('.') + attr.split('.')
    if not all(p.isidentifier() for p in parts):
        raise ConfigError(f"fn {name!r} is not an import path 'package.module:function'")
    try:
        obj = _import_module(module_name, search)
    except Exception as exc:  # the user's module may fail to import in any way
        looked = ''
        if isinstance(exc, ImportError) and search:
            folders = ', '.join(dict.fromkeys(os.path.abspath(d) for d in search))
            looked = (f' (looked in {folders} and on sys.path; set PYTHONPATH for a module '
                      f'elsewhere)')
        raise ConfigError(f'fn {name!r}: cannot import {module_name!r}: '
                          f'{type(exc).__name__}: {exc}{looked}') from exc
    for part in attr.split('.'):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f'fn {name!r}: {module_name!r} has no {attr!r}') from None
    if not callable(obj):
        raise ConfigError(f'fn {name!r} is a {type(obj).__name__}, not something callable')
    return obj


def _import_module(module_name: str, search=()):
    """``importlib.import_module(module_name)``, looking in the ``search`` folders first.

    The folders go on ``sys.path`` only while importing. A folder the module
    was found in stays at the end of ``sys.path`` afterwards, where it
    shadows nothing: the module's own later imports, and worker processes
    started by spawn (which copy ``sys.path``), must find it again.

    >>> _import_module("json").__name__
    'json'
    """
    on_path = {os.path.abspath(p or os.curdir) for p in sys.path}
    extra = [d for d in dict.fromkeys(os.path.abspath(d) for d in search) if d not in on_path]
    if not extra:
        return importlib.import_module(module_name)
    sys.path[:0] = extra
    try:
        module = importlib.import_module(module_name)
    finally:
        for folder in extra:
            sys.path.remove(folder)
    top = sys.modules.get(module_name.partition('.')[0], module)
    files = [getattr(top, '__file__', None), *getattr(top, '__path__', ())]
    for folder in extra:
        if any(f and os.path.abspath(f).startswith(folder + os.sep) for f in files):
            sys.path.append(folder)
    return module
