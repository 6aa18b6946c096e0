"""Decoding: :class:`decode_jpeg` (simplejpeg, or Pillow for what it cannot read)."""

from __future__ import annotations

import io

import numpy as np

from ..errors import ConfigError, DecodeError, SpecError
from .base import Fn, check_key, check_size, pil_image
from .frames import frames_of, resize_array, target_size

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

    key: str
    size: int | tuple[int, int] | None       # an int: the short side; None: full size
    mode: str | None
    backend: str
    fuse: bool

    def __init__(self, key: str = 'image', size=None, mode: str | None = 'RGB',
                 backend: str = 'pillow', fuse: bool = True):
        if not isinstance(fuse, bool):
            raise ConfigError(f'fuse must be True or False, got {fuse!r}')
        if size is not None:
            size = check_size(size, allow_short_side=True)
        if backend not in ('pillow', 'simplejpeg'):
            raise ConfigError(f"backend must be 'pillow' or 'simplejpeg', got {backend!r}")
        allowed = _DECODE_MODES if backend == 'pillow' else (None, 'RGB', 'L')
        if mode not in allowed:
            raise ConfigError(f'mode must be one of {allowed} for backend {backend!r}, '
                              f'got {mode!r}')
        if backend == 'simplejpeg':
            _simplejpeg()
        self._keep(key=check_key(key), size=size, mode=mode, backend=backend)
        # Kept out of _args unless off: a default decode_jpeg's repr (and so a saved
        # state's fn names) stays what it was.
        if not fuse:
            self._args['fuse'] = False
        self.fuse = fuse

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        value = self._get(dp, self.key)
        if isinstance(value, np.ndarray) and value.ndim >= 2:
            frames, rebuild = frames_of(self, self.key, value)  # already decoded
            return {**dp, self.key: rebuild([self._one(f, None) for f in frames])}
        out: np.ndarray | list[np.ndarray]
        if isinstance(value, (list, tuple)):
            out = [self._one(v, i) for i, v in enumerate(value)]
        else:
            out = self._one(value, None)
        return {**dp, self.key: out}

    def _one(self, value, frame: int | None) -> np.ndarray:
        if isinstance(value, np.ndarray) and value.ndim in (2, 3):
            if self.size is None:
                return value
            h, w = target_size(value.shape[0], value.shape[1], self.size)
            return resize_array(self, self.key, value, h, w)
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
        from ..codecs import IMAGE_FORMATS, decode_image, image_problem
        if self.size is None:
            return decode_image(data, mode=self.mode)
        Image = pil_image()
        try:
            # Opening only parses the header; the target size comes from the
            # full-size dimensions so that draft or not, the shape is the same.
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
                full_w, full_h = img.size
        except (OSError, ValueError, SyntaxError, KeyError, Image.DecompressionBombError) as exc:
            # decode_image gives the full account of a bad or foreign image
            decode_image(data, mode=self.mode)
            raise DecodeError(f'cannot decode image: {image_problem(data, exc)}') from exc
        h, w = target_size(full_h, full_w, self.size)
        arr = decode_image(data, mode=self.mode, draft=(w, h))
        return resize_array(self, self.key, arr, h, w)

    def _simplejpeg(self, data: bytes) -> np.ndarray:
        simplejpeg = _simplejpeg()
        try:
            full_h, full_w, colorspace = _header(simplejpeg, data)
            gray = self.mode == 'L' or (self.mode is None and colorspace.upper() == 'GRAY')
            options: dict[str, str | int] = {'colorspace': 'GRAY' if gray else 'RGB'}
            if self.size is not None:
                h, w = target_size(full_h, full_w, self.size)
                options.update(min_height=h, min_width=w)
            arr = simplejpeg.decode_jpeg(data, **options)
        except (ValueError, KeyError) as exc:
            raise DecodeError(f'cannot decode JPEG with simplejpeg: {exc!r}') from exc
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        if self.size is not None:
            arr = resize_array(self, self.key, arr, h, w)
        return arr


def _header(simplejpeg, data: bytes) -> tuple[int, int, str]:
    # simplejpeg's header call raises KeyError on valid files whose chroma subsampling has
    # no TurboJPEG name (4:4:1): loadr's own parse of the frame header answers for those.
    try:
        return simplejpeg.decode_jpeg_header(data)[:3]
    except KeyError:
        from ..codecs import jpeg_header
        head = jpeg_header(data)
        if head is None:
            raise
        return head[0], head[1], 'GRAY' if head[2] == 'L' else 'YCbCr'
