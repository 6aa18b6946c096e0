"""Fused decode: a JPEG decoded only as finely as the crop and resize after it need.

A pipeline such as ``decode_jpeg → random_resized_crop(224) → flip`` throws
most of a decoded JPEG away. :func:`fuse` finds such runs (a
:class:`~loadr.fns.decode_jpeg` followed by ``resize``, ``center_crop``,
``random_crop`` or ``random_resized_crop`` of the same key) and replaces
them by one fn that

1. reads the image size from the JPEG header,
2. runs each geometric fn's ``plan`` on the size alone: the very crop boxes
   its ``__call__`` would draw from the sample's seed (``random_resized_crop``'s
   box stays the same pure function of (seed, image size)),
3. decodes at the largest DCT scale (1, 1/2, 1/4, 1/8) that still gives at
   least the output resolution over the crop, and
4. makes the output with one antialiased bilinear resize of the crop's region.

The output has the same shape as the unfused pipeline's and differs from it
in pixels only by the resampling (PSNR well above 35 dB, tests/test_decode.py).
It is a pure function of (bytes, seed), so a batch is the same for any worker
count and across a resume. The list keeps its length: the geometric fns' places
hold pass-throughs, and the stage names (``loader.stats()``) say what ran
there, e.g. ``decode_jpeg+random_resized_crop`` then ``random_resized_crop(fused)``.

The decoder is loadr's own extension ``loadr._jpegregion`` where it was built
(``setup.py``, against the system libjpeg-turbo): it decodes only the rows and
columns the resize reads (:func:`decode_region`). Without it (or on a file it
refuses) simplejpeg (libjpeg-turbo, bundled in its wheel) decodes the whole
image at the DCT scale, else Pillow's draft mode (the libjpeg-turbo in Pillow's
wheel). The three give the same decoded pixels; the resized output of the
region path differs from the others' by at most 1 (Pillow's resize weights,
computed from the box's coordinates in the region rather than in the image,
round differently now and then).
Anything the fast path does not take (PNG, CMYK, a mode other than RGB or L,
an already decoded array, frames of different sizes, a crop that does not
fit, a file simplejpeg will not decode, one above Pillow's pixel limit)
runs the original fns one after the other: the same crop boxes and the same
errors as without fusion.

Fusion is on by default. Turn it off for one pipeline with
``decode_jpeg(..., fuse=False)`` (``fuse: false`` in YAML), or everywhere with
the environment variable ``LOADR_FUSE=0`` (set before the loader starts its
workers, which read it too).

Example::

    import loadr.fns as F
    fns = fuse([F.decode_jpeg(), F.random_resized_crop(size=224), F.flip()])
    [getattr(f, 'stats_name', None) for f in fns]
    # ['decode_jpeg+random_resized_crop', 'random_resized_crop(fused)', None]
"""

from __future__ import annotations

import functools
import io
import math
import os

import numpy as np

from .errors import DecodeError, LoadrError

__all__ = ['fuse', 'Fused', 'FUSE_ENV', 'fusion_enabled', 'jpeg_size', 'decode_scaled',
           'decode_region', 'resize_region', 'DCT_SCALES']

FUSE_ENV = 'LOADR_FUSE'
# libjpeg-turbo's SIMD IDCTs: the fast scales (the M/8 in between use generic C code).
DCT_SCALES = (8, 4, 2, 1)
# The fns whose work depends only on the image size and the seed (the ones with a plan).
FUSABLE = ('resize', 'center_crop', 'random_crop', 'random_resized_crop')


def fusion_enabled() -> bool:
    """False when the environment variable ``LOADR_FUSE`` is ``0``, ``false``, ``no`` or
    ``off``.

    >>> fusion_enabled() in (True, False)
    True
    """
    return os.environ.get(FUSE_ENV, '1').strip().lower() not in ('0', 'false', 'no', 'off')


def _simplejpeg():
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


@functools.cache
def _jpegregion():
    # loadr's optional C extension (setup.py): absent where libjpeg-turbo's header was not.
    # Cached: where it is absent, a failed import per sample would search the path each time.
    try:
        import loadr._jpegregion as module
    except ImportError:
        return None
    return module


# ---------------------------------------------------------------------------
# The geometry: where in the source image the output comes from


class Region:
    """A virtual image of ``h``×``w`` pixels that covers ``box`` (y, x, h, w) of the source.

    The geometric fns' ``plan`` methods change it as their ``__call__`` would
    change an image: a resize changes only the pixel count, a crop the covered box.

    >>> r = Region(100, 200)
    >>> r.resize(50, 100); r.crop(10, 20, 25, 50); r.box, (r.h, r.w)
    ((20.0, 40.0, 50.0, 100.0), (25, 50))
    """

    __slots__ = ('h', 'w', 'box')

    def __init__(self, h: int, w: int):
        self.h, self.w = h, w
        self.box = (0.0, 0.0, float(h), float(w))

    def resize(self, h: int, w: int) -> None:
        self.h, self.w = h, w

    def crop(self, top: int, left: int, h: int, w: int) -> None:
        y, x, bh, bw = self.box
        sy, sx = bh / self.h, bw / self.w
        self.box = (y + top * sy, x + left * sx, h * sy, w * sx)
        self.h, self.w = h, w


def dct_scale(box_h: float, box_w: float, out_h: int, out_w: int) -> int:
    """The largest reduction 8, 4, 2 or 1 that keeps a ``box_h``×``box_w`` region at least
    ``out_h``×``out_w`` pixels.

    >>> dct_scale(300, 300, 224, 224), dct_scale(1000, 900, 224, 224), dct_scale(100, 90, 224, 224)
    (1, 4, 1)
    """
    for k in DCT_SCALES:
        if box_h / k >= out_h and box_w / k >= out_w:
            return k
    return 1


# ---------------------------------------------------------------------------
# Decoding


def jpeg_size(data: bytes) -> tuple[int, int, str] | None:
    """``(height, width, colour space)`` from a JPEG header, or None if the fast path cannot
    take the file (not a JPEG, a colour space other than YCbCr/RGB/grayscale).

    >>> from loadr.codecs import encode_image
    >>> jpeg_size(encode_image(np.zeros((30, 40, 3), np.uint8)))
    (30, 40, 'RGB')
    """
    if data[:3] != b'\xff\xd8\xff':
        return None
    sj = _simplejpeg()
    if sj is not None:
        try:
            h, w, colorspace, _ = sj.decode_jpeg_header(data)
        except ValueError:
            return None
        colorspace = colorspace.upper()
        if colorspace not in ('YCBCR', 'RGB', 'GRAY'):
            return None
        return h, w, 'L' if colorspace == 'GRAY' else 'RGB'
    from PIL import Image
    try:
        with Image.open(io.BytesIO(data), formats=('JPEG',)) as img:
            if img.mode not in ('RGB', 'L'):
                return None
            return img.size[1], img.size[0], img.mode
    except Exception:   # anything Pillow cannot parse goes the slow way, which explains it
        return None


def decode_scaled(data: bytes, k: int, mode: str) -> np.ndarray:
    """Decode a JPEG at 1/``k`` of its size (libjpeg's DCT scaling, sides rounded up) in
    ``mode`` ('RGB' or 'L').

    >>> from loadr.codecs import encode_image
    >>> decode_scaled(encode_image(np.zeros((30, 40, 3), np.uint8)), 4, 'RGB').shape
    (8, 10, 3)
    """
    sj = _simplejpeg()
    if sj is not None:
        h, w, _, _ = sj.decode_jpeg_header(data)
        try:
            arr = sj.decode_jpeg(data, colorspace='GRAY' if mode == 'L' else 'RGB',
                                 min_height=-(-h // k), min_width=-(-w // k))
        except ValueError as exc:
            raise DecodeError(f'cannot decode JPEG with simplejpeg: {exc}') from exc
        return arr[:, :, 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr
    from PIL import Image
    try:
        with Image.open(io.BytesIO(data), formats=('JPEG',)) as img:
            w, h = img.size
            if k > 1:
                img.draft(mode, (-(-w // k), -(-h // k)))
            if img.mode != mode:
                img = img.convert(mode)
            return np.asarray(img)
    except (OSError, ValueError, SyntaxError) as exc:
        raise DecodeError(f'cannot decode JPEG: {exc}') from exc


def decode_region(data: bytes, k: int, mode: str, box: tuple, full: tuple[int, int],
                  out: tuple[int, int]) -> np.ndarray | None:
    """The region ``box`` (y, x, h, w in the coordinates of the ``full`` (h, w) image) of a
    JPEG decoded at 1/``k`` in ``mode`` ('RGB' or 'L') and resized to ``out`` (h, w) as
    :func:`resize_region` does, decoding only the rows and columns the resize reads; None
    where the extension ``loadr._jpegregion`` is not built, or the file does not end with
    an EOI marker. Raises :class:`DecodeError` on data libjpeg finds corrupt (it would
    only warn).

    >>> from loadr.codecs import encode_image
    >>> data = encode_image(np.zeros((300, 400, 3), np.uint8))
    >>> r = decode_region(data, 2, 'RGB', (10, 20, 200, 300), (300, 400), (50, 60))
    >>> r is None or r.shape == (50, 60, 3)
    True
    """
    jr = _jpegregion()
    # The rows below the region are never read: a file cut short there would decode without
    # an error that the whole-image decoders (and the unfused decode_jpeg) raise.
    if jr is None or data[-2:] != b'\xff\xd9':
        return None
    from PIL import Image
    sh, sw = -(-full[0] // k), -(-full[1] // k)     # libjpeg's size at 1/k: sides rounded up
    fy, fx = sh / full[0], sw / full[1]
    y, x, h, w = box
    # Pillow's antialiased bilinear reads up to max(1, box/out) + 0.5 pixels beyond the box,
    # and libjpeg's fancy upsampling of subsampled chroma makes the outermost row and column
    # of a cut differ from the full decode: 2 pixels more keep both out of the output.
    my, mx = max(1.0, h * fy / out[0]) + 2, max(1.0, w * fx / out[1]) + 2
    top, left = max(0, math.floor(y * fy - my)), max(0, math.floor(x * fx - mx))
    bottom = min(sh, math.ceil((y + h) * fy + my))
    right = min(sw, math.ceil((x + w) * fx + mx))
    try:
        buf, rh, rw, x0 = jr.decode_region(data, k, top, bottom - top, left, right - left,
                                           1 if mode == 'L' else 3)
    except ValueError as exc:
        raise DecodeError(str(exc)) from exc
    # The region's columns start at x0 <= left: libjpeg widens a crop to iMCU boundaries.
    img = Image.frombuffer(mode, (rw, rh), buf, 'raw', mode, 0, 1)
    pil_box = (x * fx - x0, y * fy - top, (x + w) * fx - x0, (y + h) * fy - top)
    if out == (rh, rw) and pil_box == (0, 0, rw, rh):
        return np.asarray(img)
    return np.asarray(img.resize((out[1], out[0]), Image.Resampling.BILINEAR, box=pil_box))


def resize_region(arr: np.ndarray, box: tuple, full: tuple[int, int], out: tuple[int, int]
                  ) -> np.ndarray:
    """The region ``box`` (y, x, h, w in the coordinates of a ``full`` (h, w) image) of
    ``arr`` (that image decoded at some scale), resized to ``out`` (h, w): Pillow's
    antialiased bilinear, as :class:`~loadr.fns.resize`.

    >>> resize_region(np.zeros((10, 20), np.uint8), (0, 0, 20, 40), (20, 40), (5, 5)).shape
    (5, 5)
    """
    from PIL import Image
    fy, fx = arr.shape[0] / full[0], arr.shape[1] / full[1]
    y, x, h, w = box
    pil_box = (x * fx, y * fy, (x + w) * fx, (y + h) * fy)
    if (out == arr.shape[:2] and pil_box == (0, 0, arr.shape[1], arr.shape[0])):
        return arr
    img = Image.fromarray(arr)
    return np.asarray(img.resize((out[1], out[0]), Image.Resampling.BILINEAR, box=pil_box))


# ---------------------------------------------------------------------------
# The fused fn


class Fused:
    """``decode`` then each fn of ``ops``, in one pass over a JPEG's pixels (see the module).

    Called as ``fused(datapoint, seed=s)`` like the fns it replaces; its output
    has the shapes theirs has.
    """

    def __init__(self, decode, ops):
        self.decode = decode
        self.ops = list(ops)
        self.key = decode.key
        self.stats_name = '+'.join(['decode_jpeg'] + [type(op).__name__ for op in self.ops])

    def __repr__(self) -> str:
        return f'Fused({self.decode!r}, {self.ops!r})'

    def _slow(self, dp: dict, seed):
        dp = self.decode(dp, seed=seed)
        for op in self.ops:
            dp = op(dp, seed=seed)
        return dp

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        value = dp.get(self.key) if isinstance(dp, dict) else None
        frames = value if isinstance(value, (list, tuple)) else [value]
        if not frames or not all(isinstance(f, (bytes, bytearray, memoryview)) for f in frames):
            return self._slow(dp, seed)
        frames = [bytes(f) for f in frames]
        heads = [jpeg_size(f) for f in frames]
        first = heads[0]
        if first is None or any(h != first for h in heads):
            return self._slow(dp, seed)
        mode = self.decode.mode
        mode = first[2] if mode is None else mode
        if mode not in ('RGB', 'L'):
            return self._slow(dp, seed)
        full = first[:2]
        if full[0] * full[1] > _pixel_limit():
            return self._slow(dp, seed)     # Pillow refuses it as a decompression bomb
        region = Region(*full)
        try:
            if self.decode.size is not None:
                region.resize(*_target(full, self.decode.size))
            for op in self.ops:
                op.plan(region, seed)
        except LoadrError:
            # A crop that does not fit, a bad seed: the unfused fns raise their own error.
            return self._slow(dp, seed)
        out = (region.h, region.w)
        k = dct_scale(region.box[2], region.box[3], *out)
        pixels = []
        for data in frames:
            try:
                pixels.append(decode_region(data, k, mode, region.box, full, out))
            except DecodeError:
                pixels.append(None)     # a file libjpeg refuses: simplejpeg's or Pillow's turn
            if pixels[-1] is None:
                try:
                    arr = decode_scaled(data, k, mode)
                except DecodeError:
                    return self._slow(dp, seed)     # names the frame and the fn, as always
                pixels[-1] = resize_region(arr, region.box, full, out)
        return {**dp, self.key: pixels if isinstance(value, (list, tuple)) else pixels[0]}


def _pixel_limit() -> float:
    # Pillow's own bound (twice MAX_IMAGE_PIXELS raises DecompressionBombError): the fast
    # path takes nothing the unfused decode would refuse.
    from PIL import Image
    limit = Image.MAX_IMAGE_PIXELS
    return math.inf if limit is None else 2 * limit


def _target(full: tuple[int, int], size) -> tuple[int, int]:
    from .fns.frames import target_size as target
    return target(full[0], full[1], size)


class Done:
    """The place of a fn that a :class:`Fused` before it already ran: passes the datapoint on.

    >>> Done('flip').stats_name
    'flip(fused)'
    """

    def __init__(self, name: str):
        self.stats_name = f'{name}(fused)'

    def __repr__(self) -> str:
        return f'Done({self.stats_name!r})'

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        return dp


def fuse(fns) -> list:
    """``fns`` with each ``decode_jpeg → resize | center_crop | random_crop |
    random_resized_crop ...`` run (one key) fused; the same length, the same outputs' shapes.

    Returns the list unchanged (a copy) when ``LOADR_FUSE=0``. A decode_jpeg
    with ``fuse=False`` is never fused.

    >>> import loadr.fns as F
    >>> [type(f).__name__ for f in fuse([F.decode_jpeg(), F.center_crop(size=8), F.flip()])]
    ['Fused', 'Done', 'flip']
    """
    from . import fns as F
    fns = list(fns)
    if not fusion_enabled():
        return fns
    out = []
    i = 0
    while i < len(fns):
        fn = fns[i]
        if type(fn) is F.decode_jpeg and fn.fuse:
            ops = []
            j = i + 1
            fusable = tuple(getattr(F, name) for name in FUSABLE)
            # The exact classes: a subclass may change what __call__ does.
            while j < len(fns) and type(fns[j]) in fusable and fns[j].key == fn.key:
                ops.append(fns[j])
                j += 1
            if ops:
                out.append(Fused(fn, ops))
                out.extend(Done(type(op).__name__) for op in ops)
                i = j
                continue
        out.append(fn)
        i += 1
    return out
