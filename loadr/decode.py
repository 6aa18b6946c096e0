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
4. makes the output with one antialiased bilinear resize of the crop's region
   (:func:`resample`: Pillow's triangle filter in fixed point, vertical pass
   first).

The output has the same shape as the unfused pipeline's and differs from it
in pixels only by the resampling: at least 35 dB PSNR on natural-looking
pictures; on pure noise as low as 25 dB, where the DCT scale and the resize's
sub-pixel box filter high frequencies differently (tests/test_decode.py).
It is a pure function of (bytes, seed), so a batch is the same for any worker
count and across a resume. The list keeps its length: the geometric fns' places
hold pass-throughs, and the stage names (``loader.stats()``) say what ran
there, e.g. ``decode_jpeg+random_resized_crop`` then ``random_resized_crop(fused)``.
A ``flip`` of the same key right after the run is fused too (the resize writes
the columns mirrored instead of the flip copying the image again:
``decode_jpeg+random_resized_crop+flip``, then ``flip(fused)``).

The same bytes on every install. Where loadr's extension ``loadr._jpegregion``
was built (``setup.py``, against the system libjpeg-turbo) it decodes only the
rows and columns the resize reads (:func:`decode_region`) and resizes them in
C. Without it (or with ``LOADR_JPEGREGION=0``) simplejpeg decodes the whole
image at the same DCT scale with the same libjpeg settings (accurate integer
IDCT, fancy upsampling), the same rows and columns are cut from it and numpy
resizes them with the same integer arithmetic (:func:`resize_region`): the
bytes are equal (tests/test_decode.py runs both; a progressive file missing
its last scans, which libjpeg-turbo versions smooth differently, is left to
simplejpeg on both paths). Damaged files fail alike:
the region decoder Huffman-decodes the rows below the region too and reads on
to the end of the image, and both decoders treat libjpeg's warnings (corrupt
data, a premature end) as errors, so a file either decodes to the same pixels
on both paths or fails on both; a failed file runs the unfused fns, whose
error (or lenient Pillow decode) is then the same everywhere.

Anything the fast path does not take (PNG, CMYK, 12-bit, lossless or
arithmetic-coded JPEGs, a mode other than RGB or L, an already decoded array,
frames of different sizes, a crop that does not fit, a file libjpeg refuses,
one above Pillow's pixel limit) runs the original fns one after the other:
the same crop boxes and the same errors as without fusion.

Fusion is on by default. Turn it off for one pipeline with
``decode_jpeg(..., fuse=False)`` (``fuse: false`` in YAML), or everywhere with
the environment variable ``LOADR_FUSE=0`` (set before the loader starts its
workers, which read it too).

Example::

    import loadr.fns as F
    fns = fuse([F.decode_jpeg(), F.random_resized_crop(size=224), F.flip()])
    [getattr(f, 'stats_name', None) for f in fns]
    # ['decode_jpeg+random_resized_crop+flip', 'random_resized_crop(fused)', 'flip(fused)']
"""

from __future__ import annotations

import functools
import io
import math
import os

import numpy as np

from .errors import DecodeError, LoadrError

__all__ = ['fuse', 'Fused', 'FUSE_ENV', 'REGION_ENV', 'fusion_enabled', 'extension',
           'jpeg_size', 'decode_scaled', 'decode_region', 'resize_region', 'resample',
           'resample_weights', 'DCT_SCALES']

FUSE_ENV = 'LOADR_FUSE'
REGION_ENV = 'LOADR_JPEGREGION'
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


def extension():
    """loadr's C extension ``loadr._jpegregion`` (region decoding and resampling), or None
    where it was not built or the environment variable ``LOADR_JPEGREGION`` is ``0`` (the
    fused decode then runs as on an install without it: the same bytes, more CPU).

    >>> extension() is None or hasattr(extension(), 'decode_region')
    True
    """
    if os.environ.get(REGION_ENV, '1').strip().lower() in ('0', 'false', 'no', 'off'):
        return None
    return _jpegregion()


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
    """``(height, width, mode)`` from a JPEG's frame header ('RGB' for 3 components, 'L'
    for 1), or None if the fast path cannot take the file (not a JPEG, 4 components,
    not 8-bit, a frame type other than baseline, extended or progressive Huffman):
    :func:`loadr.codecs.jpeg_header`, parsed by loadr rather than by a decoder's header
    call, so that the choice of path is the same on every install (and no decoder's own
    exception escapes).

    >>> from loadr.codecs import encode_image
    >>> jpeg_size(encode_image(np.zeros((30, 40, 3), np.uint8)))
    (30, 40, 'RGB')
    """
    from .codecs import jpeg_header
    return jpeg_header(data)


def decode_scaled(data: bytes, k: int, mode: str) -> np.ndarray:
    """Decode a JPEG at 1/``k`` of its size (libjpeg's DCT scaling, sides rounded up) in
    ``mode`` ('RGB' or 'L'). Raises :class:`DecodeError` on a file libjpeg finds corrupt
    (simplejpeg's strict mode: a warning is an error, as in :func:`decode_region`).

    >>> from loadr.codecs import encode_image
    >>> decode_scaled(encode_image(np.zeros((30, 40, 3), np.uint8)), 4, 'RGB').shape
    (8, 10, 3)
    """
    head = jpeg_size(data)
    if head is None:
        raise DecodeError('not a JPEG the fused decode takes')
    h, w = head[:2]
    want = (-(-h // k), -(-w // k))
    sj = _simplejpeg()
    if sj is not None:
        try:
            arr = sj.decode_jpeg(data, colorspace='GRAY' if mode == 'L' else 'RGB',
                                 min_height=want[0], min_width=want[1], strict=True)
        except (ValueError, KeyError) as exc:
            raise DecodeError(f'cannot decode JPEG with simplejpeg: {exc!r}') from exc
        arr = arr[:, :, 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr
    else:
        from PIL import Image
        try:
            with Image.open(io.BytesIO(data), formats=('JPEG',)) as img:
                if k > 1:
                    # Pillow's draft takes the largest scale whose size is at least the one
                    # asked: asking for the sides divided (down) by k gives 1/k exactly.
                    img.draft(mode, (max(1, w // k), max(1, h // k)))
                arr = np.asarray(img.convert(mode) if img.mode != mode else img)
        except (OSError, ValueError, SyntaxError) as exc:
            raise DecodeError(f'cannot decode JPEG: {exc}') from exc
    if arr.shape[:2] != want:
        raise DecodeError(f'decoded {arr.shape[:2]} at 1/{k}, not {want}')
    return arr


def resample_weights(size: int, in0: float, in1: float, out: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The fused resize's weights for [``in0``, ``in1``) of ``size`` pixels to ``out``:
    int32 starts (the first of the k pixels each output pixel reads) and int16 weights
    in 14-bit fixed point, out × k. Pillow's antialiased bilinear (``precompute_coeffs``
    in Resample.c: a triangle filter widened by the reduction, normalised per pixel),
    computed with the float operations, in the order, that loadr's extension uses (its
    ``weights``), so both give the same integers. 14 bits (not Pillow's 22) so that the
    extension's loops multiply 16-bit lanes.

    >>> starts, weights = resample_weights(8, 0.0, 8.0, 4)     # halving: 4 taps
    >>> starts.tolist(), weights[1].tolist()
    ([0, 1, 3, 4], [2048, 6144, 6144, 2048])
    """
    if not (0.0 <= in0 < in1 <= size) or out <= 0:
        raise ValueError(f'resample: box {in0}..{in1} of {size} pixels to {out}')
    scale = (in1 - in0) / out
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale                 # bilinear: support 1
    ksize = int(math.ceil(support)) * 2 + 1
    center = in0 + (np.arange(out, dtype=np.float64) + 0.5) * scale
    ss = 1.0 / filterscale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5), size).astype(np.int64)
    n = np.maximum(xmax - xmin, 0)
    taps = []
    ww = np.zeros(out)
    for t in range(ksize):                      # summed in the extension's order
        v = np.abs(((xmin + t).astype(np.float64) - center + 0.5) * ss)
        wt = np.where((t < n) & (v < 1.0), 1.0 - v, 0.0)
        taps.append(wt)
        ww = ww + wt
    pre = np.stack(taps, axis=1)
    pre = np.where(ww[:, None] != 0.0, pre / np.where(ww == 0.0, 1.0, ww)[:, None], pre)
    fixed = np.trunc(0.5 + pre * float(1 << _PRECISION_BITS)).astype(np.int16)
    # Every pixel reads k pixels (the most any reads): near the right edge its start moves
    # left and its weights right by as much, adding only zero terms.
    k = max(1, int(n.max()))
    starts = np.minimum(xmin, size - k)
    shift = xmin - starts
    weights = np.zeros((out, k), np.int16)
    for t in range(min(ksize, k)):
        has = np.nonzero(t < n)[0]
        weights[has, shift[has] + t] = fixed[has, t]
    return starts.astype(np.int32), weights


_PRECISION_BITS = 14


def _resample_numpy(src: np.ndarray, ybox: tuple, xbox: tuple, out: tuple[int, int]
                    ) -> np.ndarray:
    # The extension's resize in integer numpy: the same weights, sums, rounding and
    # clipping, vertical pass first. The horizontal pass runs on the transposed rows, so
    # that each tap, as in the vertical pass, gathers whole rows.
    ys, yw = resample_weights(src.shape[0], ybox[0], ybox[1], out[0])
    xs, xw = resample_weights(src.shape[1], xbox[0], xbox[1], out[1])
    img = src if src.ndim == 3 else src[:, :, None]
    ch = img.shape[2]
    rows = _taps(img.reshape(img.shape[0], -1), ys, yw)
    cols = rows.reshape(out[0], img.shape[1], ch).transpose(1, 0, 2).reshape(img.shape[1], -1)
    res = _taps(np.ascontiguousarray(cols), xs, xw).reshape(out[1], out[0], ch)
    res = np.ascontiguousarray(res.transpose(1, 0, 2))
    return res if src.ndim == 3 else res[:, :, 0]


def _taps(rows: np.ndarray, starts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    # Row i of the result: the rows starts[i] .. starts[i] + k weighted, rounded, clipped.
    acc = np.full((len(starts), rows.shape[1]), 1 << (_PRECISION_BITS - 1), np.int32)
    term = np.empty_like(acc)
    for t in range(weights.shape[1]):
        np.multiply(rows[starts + t], weights[:, t, None], out=term, dtype=np.int32)
        acc += term
    acc >>= _PRECISION_BITS
    return np.minimum(acc, 255, out=acc).astype(np.uint8)


def resample(arr: np.ndarray, ybox: tuple, xbox: tuple, out: tuple[int, int]) -> np.ndarray:
    """[``ybox``) × [``xbox``) (float (start, end) pairs) of ``arr`` (uint8, H×W or H×W×3)
    resized to ``out`` (h, w) with Pillow's antialiased bilinear filter in 14-bit fixed
    point, vertical pass first: in loadr's extension where it is built, else in numpy,
    with the same bytes.

    >>> resample(np.full((10, 20), 7, np.uint8), (0, 10), (0, 20), (5, 5))[0, :3].tolist()
    [7, 7, 7]
    """
    ybox, xbox = (float(ybox[0]), float(ybox[1])), (float(xbox[0]), float(xbox[1]))
    ext = extension()
    if ext is None:
        return _resample_numpy(arr, ybox, xbox, out)
    arr = np.ascontiguousarray(arr)
    ch = 1 if arr.ndim == 2 else arr.shape[2]
    buf = ext.resample(arr, arr.shape[0], arr.shape[1], ch, ybox, xbox, tuple(out))
    return np.frombuffer(buf, np.uint8).reshape(tuple(out) if arr.ndim == 2 else (*out, ch))


def _rect(scaled: tuple[int, int], box: tuple, full: tuple[int, int], out: tuple[int, int]):
    """The rows [top, bottom) and columns [left, right) of the image at its decoded size
    ``scaled`` that the resize of ``box`` reads, and the box in their coordinates: the
    same for the region decode and the whole-image one, so both resize the same pixels
    with the same weights."""
    fy, fx = scaled[0] / full[0], scaled[1] / full[1]
    y, x, h, w = box
    # The resize reads up to max(1, box/out) + 0.5 pixels beyond the box, and libjpeg's
    # fancy upsampling of subsampled chroma makes the outermost row and column of a cut
    # differ from the whole decode: 2 pixels more keep both out of the output.
    my, mx = max(1.0, h * fy / out[0]) + 2, max(1.0, w * fx / out[1]) + 2
    top, left = max(0, math.floor(y * fy - my)), max(0, math.floor(x * fx - mx))
    bottom = min(scaled[0], math.ceil((y + h) * fy + my))
    right = min(scaled[1], math.ceil((x + w) * fx + mx))
    # (y + h) * fy can round past the decoded side (25 * (4 / 25) > 4): clamped, for both.
    return (top, bottom, left, right, (y * fy - top, min((y + h) * fy, bottom) - top),
            (x * fx - left, min((x + w) * fx, right) - left))


def decode_region(data: bytes, k: int, mode: str, box: tuple, full: tuple[int, int],
                  out: tuple[int, int], flip: bool = False) -> np.ndarray | None:
    """The region ``box`` (y, x, h, w in the coordinates of the ``full`` (h, w) image) of a
    JPEG decoded at 1/``k`` in ``mode`` ('RGB' or 'L') and resized to ``out`` (h, w),
    decoding only the rows and columns the resize reads (the rows below them are
    Huffman-decoded and checked, not converted); the same bytes as :func:`resize_region`
    on :func:`decode_scaled`, mirrored left-right if ``flip`` (as the resize writes it). None
    where the extension ``loadr._jpegregion`` is not built.
    Raises :class:`DecodeError` on data libjpeg finds corrupt anywhere in the file.

    >>> from loadr.codecs import encode_image
    >>> data = encode_image(np.zeros((300, 400, 3), np.uint8))
    >>> r = decode_region(data, 2, 'RGB', (10, 20, 200, 300), (300, 400), (50, 60))
    >>> r is None or r.shape == (50, 60, 3)
    True
    """
    ext = extension()
    if ext is None:
        return None
    sh, sw = -(-full[0] // k), -(-full[1] // k)     # libjpeg's size at 1/k: sides rounded up
    top, bottom, left, right, ybox, xbox = _rect((sh, sw), box, full, out)
    channels = 1 if mode == 'L' else 3
    try:
        res = ext.decode_resize(data, k, top, bottom - top, left, right - left, channels,
                                ybox, xbox, tuple(out), flip)
    except ValueError as exc:
        raise DecodeError(str(exc)) from exc
    return np.frombuffer(res, np.uint8).reshape(out if channels == 1 else (*out, 3))


def resize_region(arr: np.ndarray, box: tuple, full: tuple[int, int], out: tuple[int, int],
                  flip: bool = False) -> np.ndarray:
    """The region ``box`` (y, x, h, w in the coordinates of a ``full`` (h, w) image) of
    ``arr`` (that image decoded at some scale), resized to ``out`` (h, w) by
    :func:`resample` (Pillow's antialiased bilinear), reading the rows and columns
    :func:`decode_region` decodes, mirrored left-right if ``flip``: the same bytes.

    >>> resize_region(np.zeros((10, 20), np.uint8), (0, 0, 20, 40), (20, 40), (5, 5)).shape
    (5, 5)
    """
    top, bottom, left, right, ybox, xbox = _rect(arr.shape[:2], box, full, out)
    res = resample(arr[top:bottom, left:right], ybox, xbox, out)
    return np.ascontiguousarray(res[:, ::-1]) if flip else res


# ---------------------------------------------------------------------------
# The fused fn


class Fused:
    """``decode`` then each fn of ``ops``, in one pass over a JPEG's pixels (see the module).

    Called as ``fused(datapoint, seed=s)`` like the fns it replaces; its output
    has the shapes theirs has.
    """

    def __init__(self, decode, ops, flip=None):
        self.decode = decode
        self.ops = list(ops)
        self.flip = flip
        self.key = decode.key
        self.stats_name = '+'.join(['decode_jpeg'] + [type(op).__name__ for op in self.ops]
                                   + ([] if flip is None else ['flip']))

    def __repr__(self) -> str:
        flip = '' if self.flip is None else f', {self.flip!r}'
        return f'Fused({self.decode!r}, {self.ops!r}{flip})'

    def _slow(self, dp: dict, seed):
        dp = self.decode(dp, seed=seed)
        for op in self.ops:
            dp = op(dp, seed=seed)
        return dp if self.flip is None else self.flip(dp, seed=seed)

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        value = dp.get(self.key) if isinstance(dp, dict) else None
        frames: list[bytes] = []
        for f in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(f, (bytes, bytearray, memoryview)):
                return self._slow(dp, seed)
            frames.append(bytes(f))
        if not frames:
            return self._slow(dp, seed)
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
            flip = self.flip is not None and self.flip.flips(seed)
        except LoadrError:
            # A crop that does not fit, a bad seed: the unfused fns raise their own error.
            return self._slow(dp, seed)
        out = (region.h, region.w)
        k = dct_scale(region.box[2], region.box[3], *out)
        pixels = []
        for data in frames:
            try:
                pixels.append(decode_region(data, k, mode, region.box, full, out, flip))
            except DecodeError:
                pixels.append(None)     # a file libjpeg refuses: simplejpeg's or Pillow's turn
            if pixels[-1] is None:
                try:
                    arr = decode_scaled(data, k, mode)
                except DecodeError:
                    return self._slow(dp, seed)     # names the frame and the fn, as always
                pixels[-1] = resize_region(arr, region.box, full, out, flip)
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
    random_resized_crop ...`` run (one key) fused, with a ``flip`` of that key right after
    it; the same length, the same outputs' shapes.

    Returns the list unchanged (a copy) when ``LOADR_FUSE=0``. A decode_jpeg
    with ``fuse=False`` is never fused.

    >>> import loadr.fns as F
    >>> [type(f).__name__ for f in fuse([F.decode_jpeg(), F.center_crop(size=8), F.flip()])]
    ['Fused', 'Done', 'Done']
    """
    from . import fns as F
    fns = list(fns)
    if not fusion_enabled():
        return fns
    out: list = []
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
                # A flip of the same key right after: the resize writes its columns mirrored
                # rather than the flip copying the output once more (the same bytes).
                flip = fns[j] if j < len(fns) and type(fns[j]) is F.flip and \
                    fns[j].key == fn.key else None
                out.append(Fused(fn, ops, flip))
                out.extend(Done(type(op).__name__) for op in ops)
                if flip is not None:
                    out.append(Done('flip'))
                    j += 1
                i = j
                continue
        out.append(fn)
        i += 1
    return out
