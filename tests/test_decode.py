"""The fused decode (loadr.decode): the same crop boxes, the quality contract, determinism."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

import loadr
import loadr.fns as F
from loadr.decode import (
    Done,
    Fused,
    Region,
    dct_scale,
    decode_region,
    decode_scaled,
    extension,
    fuse,
    jpeg_size,
    resample,
    resample_weights,
    resize_region,
)
from loadr.stats import fn_names

from .loader_helpers import stream_digests


def natural(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A natural-looking picture (not pure noise): smooth colours, luminance detail at every
    scale (amplitude falling with frequency, as in photos), an edge, a little grain."""
    rng = np.random.default_rng(seed)
    bicubic = Image.Resampling.BICUBIC

    def field(cells: int, channels: int) -> np.ndarray:
        ch, cw = max(2, h * cells // max(h, w) + 2), max(2, w * cells // max(h, w) + 2)
        small = rng.integers(0, 256, (ch, cw, channels), dtype=np.uint8)
        big = Image.fromarray(small.squeeze(-1) if channels == 1 else small).resize((w, h), bicubic)
        arr = np.asarray(big, np.float32)
        return arr[:, :, None] if channels == 1 else arr

    img = field(3, 3) * 0.6 + 50
    for octave in range(1, 7):
        img += (field(3 * 2 ** octave, 1) - 128) * (0.5 / octave)
    img[:, w // 3:] *= 0.8                                         # an edge
    for _ in range(12):                                            # objects with hard edges
        y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
        dy, dx = int(rng.integers(2, h // 4 + 3)), int(rng.integers(2, w // 4 + 3))
        img[y:y + dy, x:x + dx] = img[y:y + dy, x:x + dx] * 0.5 + rng.integers(0, 128, 3)
    img += rng.normal(0, 4, (h, w, 1))                             # grain
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(arr: np.ndarray, subsampling: int = 2, progressive: bool = False, quality=90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, 'JPEG', quality=quality, subsampling=subsampling,
                              progressive=progressive)
    return buf.getvalue()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def reference(data: bytes, box: tuple, out: tuple) -> np.ndarray:
    """Full Pillow decode → crop → antialiased bilinear resize: what the contract compares to."""
    top, left, h, w = box
    img = Image.open(io.BytesIO(data)).convert('RGB').crop((left, top, left + w, top + h))
    return np.asarray(img.resize((out[1], out[0]), Image.Resampling.BILINEAR))


def fused_region(data: bytes, box: tuple, out: tuple, region: bool = True) -> np.ndarray:
    """What the fused path makes of a fixed crop box and output size: with loadr._jpegregion
    where it is built (and ``region``), else the whole image at the DCT scale."""
    h, w, _ = jpeg_size(data)
    k = dct_scale(box[2], box[3], *out)
    box = tuple(map(float, box))
    got = decode_region(data, k, 'RGB', box, (h, w), out) if region else None
    return resize_region(decode_scaled(data, k, 'RGB'), box, (h, w), out) if got is None else got


needs_region = pytest.mark.skipif(extension() is None,
                                  reason='loadr._jpegregion is not built (setup.py, libjpeg)')


@pytest.fixture
def without_extension(monkeypatch):
    """The fused decode as on an install without loadr._jpegregion (LOADR_JPEGREGION=0)."""
    def off():
        monkeypatch.setenv('LOADR_JPEGREGION', '0')
        assert extension() is None
    return off


# (image h, w), crop (top, left, h, w), output (h, w)
QUALITY_CASES = [
    ((375, 500), (40, 60, 300, 400), (224, 224)),        # ImageNet-like
    ((1200, 1600), (100, 200, 900, 1200), (224, 224)),   # a photo: 1/4 scale
    ((1200, 1600), (0, 0, 1200, 1600), (112, 112)),      # the whole photo: 1/8 scale
    ((480, 640), (380, 540, 100, 100), (64, 64)),        # a crop at the bottom-right edge
    ((601, 803), (1, 3, 599, 797), (150, 150)),          # odd sizes, odd offsets
    ((100, 90), (0, 0, 100, 90), (224, 224)),            # smaller than the output
    ((2000, 300), (500, 10, 1400, 280), (224, 48)),      # tall, narrow output
]


def noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def grain(h: int, w: int, seed: int = 0) -> np.ndarray:
    """The benchmark's pictures: a smooth colour field and strong grain."""
    from benchmarks.decode import pictures
    return pictures(1, h, w, seed=seed)[0]


# The bounds README states: natural-looking pictures (smooth areas, edges, detail falling
# with frequency, and the benchmark's strong grain) and pure noise, where the DCT scale and
# the resize's sub-pixel box filter the highest frequencies differently.
PSNR_BOUNDS = {natural: 35, grain: 35, noise: 24}


@pytest.mark.parametrize('picture', list(PSNR_BOUNDS), ids=lambda f: f.__name__)
def test_the_fused_output_is_as_close_to_the_unfused_as_readme_says(picture):
    worst = math.inf
    pipelines = [[F.decode_jpeg(), F.random_resized_crop(size=224)],
                 [F.decode_jpeg(), F.resize(size=256), F.center_crop(size=224)]]
    for i, hw in enumerate([(375, 500), (1200, 1600), (333, 251), (601, 803), (100, 90),
                            (2000, 300)]):
        for subsampling in (0, 1, 2):
            # (Pillow cannot write big progressive files of noise: its buffer overflows)
            data = jpeg(picture(*hw, seed=i), subsampling,
                        progressive=i % 2 == 1 and picture is not noise)
            for pipeline in pipelines:
                for seed in range(4):
                    want = run(pipeline, {'image': data}, seed)['image']
                    got = run(fuse(pipeline), {'image': data}, seed)['image']
                    worst = min(worst, psnr(got, want))
    assert worst >= PSNR_BOUNDS[picture], worst
    # ... and against a full Pillow decode, crop and resize of fixed boxes.
    for i, (hw, box, out) in enumerate(QUALITY_CASES):
        data = jpeg(picture(*hw, seed=i))
        got, want = fused_region(data, box, out), reference(data, box, out)
        assert got.shape == want.shape == (*out, 3)
        assert psnr(got, want) >= PSNR_BOUNDS[picture], (hw, box, out, psnr(got, want))


@pytest.fixture(params=['avx2', 'portable'])
def passes(request):
    """The extension's resize passes: its AVX2 ones (where this CPU has AVX2) or its portable
    C ones; the same bytes either way."""
    ext = extension()
    if ext is None:
        yield None
        return
    was = ext.simd(request.param == 'avx2')
    if request.param == 'avx2' and not ext.simd():
        ext.simd(was)
        pytest.skip('this CPU has no AVX2')
    yield request.param
    ext.simd(was)


def test_the_resize_is_the_same_in_c_and_numpy_and_close_to_pillows(without_extension, passes):
    """loadr.decode.resample: the extension's C (its AVX2 passes and its portable ones) and
    its numpy twin give the same bytes (the weights are the same integers), for any box,
    scale, channel count and image edge; and they are Pillow's antialiased bilinear but for
    rounding."""
    rng = np.random.default_rng(0)
    cases = []
    for trial in range(150):
        # Widths past 32 bytes a row and up to many taps: the vector loops and their tails.
        h, w = int(rng.integers(1, 200)), int(rng.integers(1, 200))
        shape = (h, w, 3) if trial % 2 else (h, w)
        arr = rng.integers(0, 256, shape, dtype=np.uint8)
        out = (int(rng.integers(1, 180)), int(rng.integers(1, 180)))
        y0, x0 = rng.uniform(0, h * 0.9), rng.uniform(0, w * 0.9)
        y1, x1 = rng.uniform(y0 + 1e-3, h), rng.uniform(x0 + 1e-3, w)
        if trial % 7 == 0:
            y0, x0, y1, x1 = 0.0, 0.0, float(h), float(w)
        cases.append((arr, (y0, y1), (x0, x1), out))
    ext = extension()
    with_c = [resample(*case) for case in cases] if ext is not None else None
    for arr, _ybox, xbox, out in cases[:20]:
        starts, weights = resample_weights(arr.shape[1], *xbox, out[1])
        assert np.abs(weights.sum(axis=1) - (1 << 14)).max() <= weights.shape[1]
        assert starts.min() >= 0 and starts.max() + weights.shape[1] <= arr.shape[1]
    without_extension()
    for i, (arr, ybox, xbox, out) in enumerate(cases):
        got = resample(arr, ybox, xbox, out)
        assert got.shape == (*out, *arr.shape[2:]) and got.dtype == np.uint8
        if with_c is not None:
            assert np.array_equal(got, with_c[i]), i
        pil = np.asarray(Image.fromarray(arr).resize(
            (out[1], out[0]), Image.Resampling.BILINEAR, box=(xbox[0], ybox[0], xbox[1], ybox[1])))
        assert np.abs(pil.astype(int) - got).max() <= 2, i


@needs_region
def test_the_extensions_weights_are_the_numpy_twins():
    import loadr._jpegregion as jr
    rng = np.random.default_rng(1)
    for _ in range(300):
        size, out = int(rng.integers(1, 3000)), int(rng.integers(1, 400))
        in0 = rng.uniform(0, size * 0.99)
        in1 = rng.uniform(in0 + 1e-6, size)
        starts, weights, k = jr.weights(size, in0, in1, out)
        want_starts, want_weights = resample_weights(size, in0, in1, out)
        assert np.array_equal(np.frombuffer(starts, np.int32), want_starts)
        assert np.array_equal(np.frombuffer(weights, np.int16).reshape(out, k), want_weights)


# rst: 4:2:0 with restart markers every 5 MCUs; gray22: one component sampled 2x2 (an iMCU
# row of two MCU rows: the region decoder then stores every MCU's coefficients).
KINDS = ['444', '422', '420', '440', '411', '441', 'gray', 'rst', 'gray22']


def region_jpeg(hw: tuple, kind: str, progressive: bool, seed: int) -> bytes:
    """A JPEG of ``natural(*hw)`` with chroma subsampling ``kind``."""
    import simplejpeg
    arr = natural(*hw, seed=seed)
    if kind in ('gray', 'gray22'):
        buf = io.BytesIO()
        Image.fromarray(arr).convert('L').save(buf, 'JPEG', quality=90, progressive=progressive)
        data = bytearray(buf.getvalue())
        if kind == 'gray22':    # the same blocks in the same order: the same pixels
            at = data.index(b'\xff\xc2' if progressive else b'\xff\xc0')
            assert data[at + 9] == 1 and data[at + 11] == 0x11
            data[at + 11] = 0x22
        return bytes(data)
    if kind == 'rst':
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, 'JPEG', quality=90, subsampling=2,
                                  progressive=progressive, restart_marker_blocks=5)
        return buf.getvalue()
    if kind == '441':
        return jpeg_441(hw, seed)
    if kind in ('440', '411'):
        data = simplejpeg.encode_jpeg(arr, quality=90, colorsubsampling=kind)
        if progressive:     # (Pillow writes it progressive, as 4:2:0)
            buf = io.BytesIO()
            Image.open(io.BytesIO(data)).save(buf, 'JPEG', quality=90, subsampling='keep',
                                              progressive=True)
            return buf.getvalue()
        return data
    return jpeg(arr, {'444': 0, '422': 1, '420': 2}[kind], progressive)


def jpeg_441(hw: tuple, seed: int = 0) -> bytes:
    """A valid 4:4:1 JPEG (luma sampled 1x4) of about ``hw``: a 4:1:1 file (luma 4x1) has the
    same blocks per MCU in the same order, so its SOF's sampling factors and sides swapped
    give one (of other pixels). No encoder at hand writes 4:4:1."""
    import simplejpeg
    mh, mw = -(-hw[0] // 32), -(-hw[1] // 8)            # 4:4:1 MCUs: 8 wide, 32 tall
    data = bytearray(simplejpeg.encode_jpeg(natural(mh * 8, mw * 32, seed=seed), quality=90,
                                            colorsubsampling='411'))
    at = data.index(b'\xff\xc0')
    assert data[at + 11] == 0x41                          # luma: 4 across, 1 down
    data[at + 5:at + 9] = (mh * 32).to_bytes(2, 'big') + (mw * 8).to_bytes(2, 'big')
    data[at + 11] = 0x14
    return bytes(data)


@needs_region
@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('progressive', [False, True], ids=['baseline', 'progressive'])
def test_a_region_decode_has_the_full_decodes_pixels(kind, progressive):
    from loadr import _jpegregion as jr
    rng = np.random.default_rng(0)
    for i, hw in enumerate([(375, 500), (601, 803), (17, 23), (8, 8)]):
        data = region_jpeg(hw, kind, progressive, i)
        for k in (1, 2, 4, 8):
            for mode in ('RGB', 'L'):
                full = decode_scaled(data, k, mode)        # simplejpeg's whole image
                H, W = full.shape[:2]
                boxes = [(0, H, 0, W), (0, 1, 0, 1), (H - 1, 1, W - 1, 1), (H // 2, H - H // 2,
                                                                            W // 3, W - W // 3)]
                for _ in range(8):
                    top, left = int(rng.integers(0, H)), int(rng.integers(0, W))
                    boxes.append((top, int(rng.integers(1, H - top + 1)),
                                  left, int(rng.integers(1, W - left + 1))))
                for top, h, left, w in boxes:
                    buf, rh, rw, x = jr.decode_region(data, k, top, h, left, w,
                                                      1 if mode == 'L' else 3)
                    assert rh == h and x <= left and left + w <= x + rw <= W
                    got = np.frombuffer(buf, np.uint8).reshape(full[:rh, :rw].shape)
                    want = full[top:top + h, x:x + rw]
                    if kind not in ('444', 'gray', 'gray22') and mode == 'RGB':
                        # Fancy upsampling of subsampled chroma has no neighbour beyond a
                        # cut: its outermost row/column (not an image edge) may differ.
                        # decode_region keeps 2 pixels more than the resize reads.
                        y0, x0 = int(top > 0), int(x > 0)
                        y1, x1 = rh - int(top + h < H), rw - int(x + rw < W)
                        got, want = got[y0:y1, x0:x1], want[y0:y1, x0:x1]
                    assert np.array_equal(got, want), (hw, k, mode, (top, h, left, w))


EQUAL_PIPELINES = [
    [F.decode_jpeg(), F.random_resized_crop(size=224), F.flip()],
    [F.decode_jpeg(), F.resize(size=256), F.center_crop(size=224)],
    [F.decode_jpeg(size=256), F.random_resized_crop(size=(160, 192))],
    [F.decode_jpeg(mode='L'), F.random_crop(size=(20, 30)), F.flip()],
    [F.decode_jpeg(), F.random_resized_crop(size=(48, 40), scale=(0.01, 0.05))],
    [F.decode_jpeg(), F.resize(size=(31, 500)), F.flip(p=1.0)],
]


def fused_outcomes(pipelines, datas, seeds) -> list:
    """The fused pipelines' outputs (or the class and message of their errors)."""
    out = []
    for pipeline in pipelines:
        fused = fuse(pipeline)
        for data in datas:
            for seed in seeds:
                try:
                    out.append(run(fused, {'image': data}, seed)['image'])
                except loadr.errors.LoadrError as exc:
                    out.append((type(exc).__name__, str(exc)))
    return out


def same_outcomes(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        type(x) is type(y) and (np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y)
        for x, y in zip(a, b))


@needs_region
@pytest.mark.parametrize('kind', KINDS)
def test_the_fused_decode_gives_the_same_bytes_with_and_without_the_extension(
        kind, without_extension):
    """The region decoder and the whole-image fallback (simplejpeg at the same DCT scale,
    the same rows and columns cut, the resize in numpy) on many sizes, subsamplings,
    progressive files, crops at the image's edges and every DCT scale: byte for byte."""
    sizes = [(375, 500), (1200, 1600), (333, 251), (17, 23), (8, 8), (1, 1), (601, 803),
             (2000, 300), (97, 1203)]
    datas = [region_jpeg(hw, kind, progressive=i % 2 == 1, seed=i) for i, hw in enumerate(sizes)]
    seeds = range(6)
    with_region = fused_outcomes(EQUAL_PIPELINES, datas, seeds)
    # (a crop larger than the smallest images is the unfused fns' error, on both paths)
    assert sum(isinstance(x, np.ndarray) for x in with_region) > 0.9 * len(with_region)
    # The fixed boxes too: the image's corners and edges, 1-pixel crops, every scale.
    boxes = []
    for data in datas:
        h, w, _ = jpeg_size(data)
        for box, out in [((0, 0, h, w), (max(1, h // 8), max(1, w // 8))),
                         ((h - 1, w - 1, 1, 1), (3, 3)), ((0, w // 2, h, w - w // 2), (7, 5)),
                         ((h // 3, 0, h - h // 3, max(1, w // 4)), (max(1, h // 2), 9))]:
            boxes.append((data, box, out))
    fixed = [fused_region(data, box, out) for data, box, out in boxes]
    without_extension()
    assert same_outcomes(fused_outcomes(EQUAL_PIPELINES, datas, seeds), with_region)
    for (data, box, out), want in zip(boxes, fixed):
        assert np.array_equal(fused_region(data, box, out, region=False), want), (box, out)


@needs_region
def test_batches_are_the_same_with_and_without_the_extension(monkeypatch):
    data = [{'image': region_jpeg((90 + 7 * (i % 5), 120), KINDS[i % len(KINDS)], i % 3 == 0,
                                  seed=i), 'label': i} for i in range(24)]
    fns = [F.decode_jpeg(), F.random_resized_crop(size=32), F.flip()]
    digests = []
    for region in ('1', '0'):
        monkeypatch.setenv('LOADR_JPEGREGION', region)
        with loadr.Loader(data, batch=4, fns=fns, seed=3, workers=2) as loader:
            digests.append(stream_digests(loader, 12))
    assert digests[0] == digests[1]


def damaged(good: bytes, rng) -> bytes:
    """``good`` with bytes flipped, cut short (an EOI put back or not), or a stretch of
    another place spliced in."""
    data = bytearray(good)
    kind = int(rng.integers(0, 4))
    if kind == 0:
        for at in rng.integers(2, len(data), rng.integers(1, 6)):
            data[at] ^= int(rng.integers(1, 256))
    elif kind in (1, 2):
        data = data[:int(rng.integers(2, len(data)))] + (b'\xff\xd9' if kind == 1 else b'')
    else:
        a, b = sorted(rng.integers(2, len(data), 2))
        c = int(rng.integers(2, len(data) - (b - a) + 1))
        data[a:b] = good[c:c + (b - a)]
    return bytes(data)


@needs_region
@pytest.mark.parametrize('kind', ['420', '444', 'gray', '440', 'rst'])
def test_a_damaged_file_has_the_same_outcome_with_and_without_the_extension(
        kind, without_extension):
    """Fuzzed files (damage anywhere: headers, tables, entropy data above, inside and below
    the crop): pixels, the same, on both paths, or the same error. The region path reads
    the rows below its crop too, so damage there fails it as it fails a whole decode."""
    rng = np.random.default_rng({'420': 1, '444': 2, 'gray': 3, '440': 4, 'rst': 5}[kind])
    goods = [region_jpeg((120, 160), kind, progressive, seed=i)
             for i, progressive in enumerate((False, True))]
    datas = [damaged(goods[i % 2], rng) for i in range(150)]
    pipelines = [[F.decode_jpeg(), F.random_resized_crop(size=24, scale=(0.05, 0.2))]]
    with_region = fused_outcomes(pipelines, datas, [0, 1])
    failed = sum(not isinstance(x, np.ndarray) for x in with_region)
    assert 0 < failed < len(with_region)
    without_extension()
    assert same_outcomes(fused_outcomes(pipelines, datas, [0, 1]), with_region)


@needs_region
def test_damage_below_the_crop_fails_the_region_decode_as_a_whole_decode():
    from loadr import _jpegregion as jr
    data = jpeg(natural(375, 500))
    for bad in (b'', b'\xff\xd8\xff\xe0 not really', data[:len(data) // 2]):
        with pytest.raises(ValueError):
            jr.decode_region(bad, 1, 300, 10, 0, 10, 3)     # rows the half file lacks
    with pytest.raises(ValueError, match='outside'):
        jr.decode_region(data, 2, 180, 10, 0, 10, 3)
    # Cut short below the region, with or without an EOI marker: never converted there, but
    # Huffman-decoded, so the region decoder refuses it as simplejpeg does (until now it
    # decoded the region, and the same sample failed only on installs without it).
    for cut in (data[:len(data) - 200], data[:len(data) - 200] + b'\xff\xd9'):
        with pytest.raises(loadr.errors.DecodeError, match='Premature end|Corrupt'):
            decode_region(cut, 1, 'RGB', (0., 0., 50., 50.), (375, 500), (20, 20))
        with pytest.raises(loadr.errors.DecodeError):
            decode_scaled(cut, 1, 'RGB')
        # stopping after the region's last row (the old behaviour) decodes it
        jr.decode_region(cut, 1, 0, 50, 0, 50, 3, False)
    pipeline = [F.decode_jpeg(), F.random_resized_crop(size=32)]
    for bad in (data[:len(data) - 200], data[:len(data) // 2]):
        with pytest.raises(loadr.errors.DecodeError, match='decode_jpeg'):
            run(fuse(pipeline), {'image': bad}, 0)
    # The fused pipeline takes the region path.
    fused = run(fuse(pipeline), {'image': data}, 3)['image']
    region = Region(375, 500)
    pipeline[1].plan(region, 3)
    k = dct_scale(region.box[2], region.box[3], region.h, region.w)
    want = decode_region(data, k, 'RGB', region.box, (375, 500), (region.h, region.w))
    assert np.array_equal(fused, want)


@needs_region
def test_the_extension_checks_its_arguments_in_64_bits():
    """Values past 2^32 (or negative) cannot wrap around past the region's or the resize's
    checks: each is a ValueError (or OverflowError past 2^63), never a read outside."""
    from loadr import _jpegregion as jr
    data = jpeg(natural(64, 80))
    big = 1 << 32
    for args in [(0, big + 10, 0, 10), (big - 5, 10, 0, 10), (0, 10, big + 1, 10),
                 (0, 10, 0, big + 80), (-1, 10, 0, 10), (0, -10, 0, 10), (0, 10, -(big - 5), 10),
                 (big - 1, big - 1, 0, 1), (60, 5, 0, 10), (0, 64, 75, 6)]:
        with pytest.raises(ValueError):
            jr.decode_region(data, 1, *args, 3)
        with pytest.raises(ValueError):
            jr.decode_resize(data, 1, *args, 3, (0.0, 1.0), (0.0, 1.0), (4, 4))
    with pytest.raises(OverflowError):
        jr.decode_region(data, 1, 1 << 64, 10, 0, 10, 3)
    img = np.zeros((10, 12, 3), np.uint8)
    for args in [(img, 10, 12, 3, (0.0, 10.0), (0.0, 12.0), (big + 2, 4)),
                 (img, 10, 12, 3, (0.0, 10.0), (0.0, 13.0), (4, 4)),
                 (img, 10, 12, 3, (-1.0, 10.0), (0.0, 12.0), (4, 4)),
                 (img, 10, 12, 3, (5.0, 5.0), (0.0, 12.0), (4, 4)),
                 (img, 10, 12, 3, (0.0, float('nan')), (0.0, 12.0), (4, 4)),
                 (img, 11, 12, 3, (0.0, 10.0), (0.0, 12.0), (4, 4)),
                 (img, big + 10, 12, 3, (0.0, 10.0), (0.0, 12.0), (4, 4)),
                 (img, 10, 12, 3, (0.0, 10.0), (0.0, 12.0), (-(big - 4), 4))]:
        with pytest.raises(ValueError):
            jr.resample(*args)
    # The resize's box, checked against the region actually asked for, not the decoded one.
    with pytest.raises(ValueError):
        jr.decode_resize(data, 1, 0, 8, 8, 8, 3, (0.0, 8.0), (0.0, 9.0), (4, 4))


def test_a_441_jpeg_takes_the_fast_path_on_every_install(monkeypatch):
    """A valid 4:4:1 file (luma 1x4): simplejpeg's header call raises KeyError on it; the
    fused decode reads the header itself, and decodes it fused, alike with and without the
    extension, with no foreign exception."""
    data = jpeg_441((96, 64))
    with Image.open(io.BytesIO(data)) as img:
        img.load()          # a valid file: Pillow decodes it without a word
        assert img.size == (64, 96)
    assert jpeg_size(data) == (96, 64, 'RGB')
    assert decode_scaled(data, 2, 'RGB').shape == (48, 32, 3)
    pipeline = [F.decode_jpeg(), F.random_resized_crop(size=24)]
    outs = []
    for region in ('1', '0'):
        monkeypatch.setenv('LOADR_JPEGREGION', region)
        outs.append([run(fuse(pipeline), {'image': data}, seed)['image'] for seed in range(5)])
        for seed in range(5):
            want = run(pipeline, {'image': data}, seed)['image']
            assert psnr(outs[-1][seed], want) >= 30
    assert all(np.array_equal(a, b) for a, b in zip(*outs))


def test_the_header_parse_decides_the_path_alike_everywhere():
    good = jpeg(natural(30, 40))
    assert jpeg_size(good) == (30, 40, 'RGB')
    gray = io.BytesIO()
    Image.fromarray(natural(30, 40)).convert('L').save(gray, 'JPEG')
    assert jpeg_size(gray.getvalue()) == (30, 40, 'L')
    cmyk = io.BytesIO()
    Image.fromarray(natural(30, 40)).convert('CMYK').save(cmyk, 'JPEG')
    assert jpeg_size(cmyk.getvalue()) is None
    at = good.index(b'\xff\xc0')
    for bad in (b'', b'\xff\xd8', good[:at], good[:at] + b'\xff\xc0\x00',
                good[:at + 1] + b'\xc3' + good[at + 2:],              # lossless
                good[:at + 1] + b'\xc9' + good[at + 2:],              # arithmetic coding
                good[:at + 4] + b'\x0c' + good[at + 5:],              # 12-bit samples
                good[:at + 5] + b'\x00\x00' + good[at + 7:]):         # height 0
        assert jpeg_size(bad) is None, bad[:at + 10]


@needs_region
@pytest.mark.parametrize('progressive', [False, True])
def test_damaged_files_give_pixels_or_a_value_error_never_a_crash(progressive):
    """Bytes flipped, cut or spliced anywhere in a JPEG (headers, tables, entropy data):
    the region decoder returns a region of the asked size or raises ValueError; the
    process never crashes, and nothing is written outside the buffer it returns."""
    from loadr import _jpegregion as jr
    rng = np.random.default_rng(7)
    good = jpeg(natural(120, 160), progressive=progressive)
    raised = 0
    for trial in range(300):
        data = bytearray(good)
        kind = trial % 3
        if kind == 0:                       # a few bytes flipped
            for at in rng.integers(2, len(data), rng.integers(1, 6)):
                data[at] ^= int(rng.integers(1, 256))
        elif kind == 1:                     # cut short, then the EOI put back
            data = data[:int(rng.integers(2, len(data)))] + b'\xff\xd9'
        else:                               # a stretch of another place spliced in
            a, b = sorted(rng.integers(2, len(data), 2))
            c = int(rng.integers(2, len(data) - (b - a) + 1))
            data[a:b] = good[c:c + (b - a)]
        denom = int(rng.choice([1, 2, 4, 8]))
        sh, sw = -(-120 // denom), -(-160 // denom)
        top, left = int(rng.integers(0, sh)), int(rng.integers(0, sw))
        h, w = int(rng.integers(1, sh - top + 1)), int(rng.integers(1, sw - left + 1))
        try:
            buf, oh, ow, x = jr.decode_region(bytes(data), denom, top, h, left, w, 3)
        except ValueError:
            raised += 1
            continue
        # A header damaged into other sizes can decode: the shape is what it says.
        assert len(buf) == oh * ow * 3 and 0 <= x and oh == h, (trial, oh, h)
    assert 0 < raised < 300


def test_the_scale_is_the_largest_that_keeps_the_output_resolution():
    assert dct_scale(1200, 1600, 224, 224) == 4
    assert dct_scale(1800, 1800, 224, 224) == 8
    assert dct_scale(447, 1000, 224, 224) == 1
    assert dct_scale(448, 1000, 224, 224) == 2
    data = jpeg(natural(1200, 1600))
    assert decode_scaled(data, 4, 'RGB').shape == (300, 400, 3)
    assert decode_scaled(data, 8, 'L').shape == (150, 200)


PIPELINES = [
    [F.decode_jpeg(), F.random_resized_crop(size=224), F.flip()],
    [F.decode_jpeg(), F.resize(size=256), F.center_crop(size=224), F.flip()],
    [F.decode_jpeg(size=256), F.random_resized_crop(size=(160, 192))],
    [F.decode_jpeg(mode='L'), F.random_crop(size=(90, 120))],
]


def run(fns, dp, seed):
    for fn in fns:
        dp = fn(dp, seed=seed)
    return dp


@pytest.mark.parametrize('pipeline', PIPELINES, ids=lambda p: '-'.join(type(f).__name__ for f in p))
def test_fused_pipeline_matches_the_unfused_one(pipeline):
    fused = fuse(pipeline)
    assert len(fused) == len(pipeline) and isinstance(fused[0], Fused)
    for i, hw in enumerate([(375, 500), (1200, 1600), (333, 251)]):
        data = jpeg(natural(*hw, seed=i))
        for seed in range(6):
            want = run(pipeline, {'image': data, 'label': 3}, seed)
            got = run(fused, {'image': data, 'label': 3}, seed)
            assert got.keys() == want.keys() and got['label'] == 3
            assert got['image'].shape == want['image'].shape
            assert got['image'].dtype == np.uint8
            assert psnr(got['image'], want['image']) >= 35


def test_the_crop_box_is_the_unfused_one():
    # At scale 1 over whole pixels, the fused resize reads the pixels the unfused
    # crop kept (only the resize's edge taps differ): close outputs, seed by seed.
    pipeline = [F.decode_jpeg(), F.random_resized_crop(size=(40, 30), scale=(0.02, 0.05))]
    data = jpeg(natural(300, 400))
    for seed in range(20):
        want = run(pipeline, {'image': data}, seed)['image']
        got = run(fuse(pipeline), {'image': data}, seed)['image']
        assert psnr(got, want) > 40, seed
    rrc = pipeline[1]
    region = Region(300, 400)
    rrc.plan(region, 7)
    top, left, h, w = rrc.box(300, 400, rrc._rng(7))
    assert region.box == (top, left, h, w) and (region.h, region.w) == (40, 30)


def test_what_the_fast_path_cannot_take_runs_the_unfused_fns():
    pipeline = [F.decode_jpeg(), F.random_resized_crop(size=32), F.flip(p=1.0)]
    buf = io.BytesIO()
    Image.fromarray(natural(60, 80)).save(buf, 'PNG')
    cmyk = io.BytesIO()
    Image.fromarray(natural(60, 80)).convert('CMYK').save(cmyk, 'JPEG')
    for data in (buf.getvalue(), cmyk.getvalue(), natural(60, 80)):
        for seed in range(3):
            want = run(pipeline, {'image': data}, seed)['image']
            assert np.array_equal(run(fuse(pipeline), {'image': data}, seed)['image'], want)
    # Above Pillow's pixel limit: Pillow's DecompressionBombError, as unfused.
    big = jpeg(natural(60, 80))
    import PIL.Image
    limit, PIL.Image.MAX_IMAGE_PIXELS = PIL.Image.MAX_IMAGE_PIXELS, 1000
    try:
        with pytest.raises(loadr.errors.DecodeError, match='decode_jpeg'):
            run(fuse(pipeline), {'image': big}, 0)
    finally:
        PIL.Image.MAX_IMAGE_PIXELS = limit
    # the unfused fns' own errors, too
    small = [F.decode_jpeg(), F.center_crop(size=100)]
    with pytest.raises(loadr.errors.SpecError, match='smaller than the crop'):
        run(fuse(small), {'image': jpeg(natural(60, 80))}, 0)
    with pytest.raises(loadr.errors.DecodeError, match='decode_jpeg'):
        run(fuse(pipeline), {'image': b'\xff\xd8\xff\xe0 not really'}, 0)


def test_video_frames_get_one_crop():
    frames = [jpeg(natural(120, 160, seed=i)) for i in range(4)]
    pipeline = [F.decode_jpeg(key='frames'), F.random_resized_crop(key='frames', size=64)]
    got = run(fuse(pipeline), {'frames': frames}, 5)['frames']
    want = run(pipeline, {'frames': frames}, 5)['frames']
    assert isinstance(got, list) and len(got) == 4
    for g, w in zip(got, want):
        assert psnr(g, w) >= 35


@pytest.mark.parametrize('region', [True, False], ids=['extension', 'fallback'])
@pytest.mark.parametrize('mode', ['RGB', 'L'])
def test_a_flip_right_after_the_crop_is_fused_and_flips_as_the_flip_fn(region, mode,
                                                                        without_extension):
    """The resize writes its columns mirrored: the bytes of the flip fn on the fused output,
    flipped on the seeds the flip fn draws, and the flip's place a pass-through."""
    if region and extension() is None:
        pytest.skip('loadr._jpegregion is not built (setup.py, libjpeg)')
    if not region:
        without_extension()
    data = jpeg(natural(97, 131, seed=4))
    crop = [F.decode_jpeg(mode=mode), F.random_resized_crop(size=(24, 40))]
    flip = F.flip(stream='pair')
    fused = fuse([*crop, flip])
    assert fn_names(fused) == ['decode_jpeg+random_resized_crop+flip',
                               'random_resized_crop(fused)', 'flip(fused)']
    flipped = 0
    for seed in range(12):
        want = run([*fuse(crop), flip], {'image': data}, seed)['image']
        got = run(fused, {'image': data}, seed)['image']
        assert got.flags.c_contiguous and np.array_equal(got, want), seed
        flipped += flip.flips(seed)
    assert 0 < flipped < 12
    # Another key's flip stays a fn of its own.
    assert fn_names(fuse([*crop, F.flip(key='mask')]))[2] == 'flip'


def test_fusion_takes_only_adjacent_fns_of_the_same_key_and_can_be_turned_off(monkeypatch):
    names = lambda fns: [type(f).__name__ for f in fuse(fns)]   # noqa: E731
    assert names([F.decode_jpeg(), F.flip(), F.center_crop(size=8)]) == \
        ['decode_jpeg', 'flip', 'center_crop']
    assert names([F.decode_jpeg(), F.center_crop(key='mask', size=8)]) == \
        ['decode_jpeg', 'center_crop']
    assert names([F.decode_jpeg(fuse=False), F.center_crop(size=8)]) == \
        ['decode_jpeg', 'center_crop']
    assert names([F.decode_jpeg(), F.resize(size=9), F.center_crop(size=8), F.normalize()]) == \
        ['Fused', 'Done', 'Done', 'normalize']
    assert repr(F.decode_jpeg()) == "decode_jpeg(key='image', size=None, mode='RGB', " \
        "backend='pillow')"
    monkeypatch.setenv('LOADR_FUSE', '0')
    assert names([F.decode_jpeg(), F.center_crop(size=8)]) == ['decode_jpeg', 'center_crop']


def test_stage_names_say_the_fused_path_ran(monkeypatch):
    fns = [F.decode_jpeg(), F.random_resized_crop(size=16), F.flip()]
    # Named as they run: the Loader names fuse(fns).
    assert fn_names(fuse(fns)) == ['decode_jpeg+random_resized_crop+flip',
                                   'random_resized_crop(fused)', 'flip(fused)']
    data = [{'image': jpeg(natural(40, 50, seed=i))} for i in range(8)]
    with loadr.Loader(data, batch=4, fns=fns, seed=0, workers=0) as loader:
        next(iter(loader))
        assert 'decode_jpeg+random_resized_crop+flip' in loader.stats().stages()
    monkeypatch.setenv('LOADR_FUSE', '0')
    assert fn_names(fuse(fns)) == ['decode_jpeg', 'random_resized_crop', 'flip']
    assert isinstance(Done('x')({'a': 1}), dict)


def test_batches_are_the_same_for_any_worker_count_and_across_a_resume():
    data = [{'image': jpeg(natural(90 + 7 * (i % 5), 120, seed=i), subsampling=i % 3),
             'label': i} for i in range(24)]
    fns = [F.decode_jpeg(), F.random_resized_crop(size=32), F.flip()]
    digests = []
    for workers in (0, 2):
        with loadr.Loader(data, batch=4, fns=fns, seed=3, workers=workers) as loader:
            digests.append(stream_digests(loader, 12))
    assert digests[0] == digests[1]
    assert len(set(digests[0])) > 6
    with loadr.Loader(data, batch=4, fns=fns, seed=3, workers=2) as loader:
        loader.load({'step': 4 * 5, 'seed': 3})
        assert stream_digests(loader, 7) == digests[0][5:]


def test_damaged_images_are_skipped_alike_for_any_worker_count():
    """A JPEG cut in half and one with its entropy data scrambled, under
    on_error='skip' through the fused (region) path: replaced alike for workers 0 and
    2; under on_error='raise' the error is a DecodeError naming the fn, chained to one
    naming the dataset index."""
    data = [{'image': jpeg(natural(90, 120, seed=i)), 'label': i} for i in range(16)]
    data[3]['image'] = data[3]['image'][:len(data[3]['image']) // 2]
    scrambled = bytearray(data[9]['image'])
    scrambled[700:900] = bytes(200)
    data[9]['image'] = bytes(scrambled)
    fns = [F.decode_jpeg(), F.random_resized_crop(size=32), F.flip()]
    digests, errors = [], []
    for workers in (0, 2):
        with loadr.Loader(data, batch=4, fns=fns, seed=3, workers=workers, on_error='skip',
                          max_error_fraction=0.5) as loader:
            digests.append(stream_digests(loader, 8))
            errors.append(loader.errors)
    assert digests[0] == digests[1] and errors[0] == errors[1] >= 2, errors
    with loadr.Loader(data, batch=4, fns=fns, seed=3, workers=2) as loader:
        with pytest.raises(loadr.errors.LoadrError, match='decode_jpeg') as info:
            stream_digests(loader, 8)
    # The fn's own error, chained to the WorkerError that says where (the dataset index).
    assert info.value.loadr_index in (3, 9), info.value
    assert f'dataset index {info.value.loadr_index}' in str(info.value.__cause__)


def test_gulp_video_frames_are_decoded_fused_and_deterministically(local_data):
    reader = loadr.open(local_data / 'gulp', decode_images=False)
    fns = [F.sample_frames(key='frames', num=3, mode='tsn'), F.decode_jpeg(key='frames'),
           F.random_resized_crop(key='frames', size=24), F.flip(key='frames'),
           F.select(['frames'])]
    digests = []
    for workers in (0, 2):
        with loadr.Loader(reader, batch=2, fns=fns, seed=5, workers=workers) as loader:
            digests.append(stream_digests(loader, 6))
            batch = next(iter(loader))
            assert batch['frames'].shape == (2, 3, 24, 24, 3)
            assert 'decode_jpeg+random_resized_crop+flip' in loader.stats().stages()
    assert digests[0] == digests[1]
    # The fixture's frames are noise (the quality contract is test_video_frames_get_one_crop's,
    # on natural frames): here the clips have the unfused pipeline's shapes.
    for index in range(3):
        want = run(fns[1:], fns[0].read(reader, index, seed=index), index)['frames']
        got = run(fuse(fns)[1:], fns[0].read(reader, index, seed=index), index)['frames']
        assert [g.shape for g in got] == [w.shape for w in want]


def test_a_yaml_pipeline_is_fused_and_fuse_false_keeps_it_apart(tmp_path, local_data):
    rel = local_data / 'bag'

    def stages(decode_args: str):
        path = tmp_path / 'p.yaml'
        path.write_text(f'reader: {{path: {rel}, decode_images: false}}\n'
                        f'fns:\n  - decode_jpeg: {decode_args}\n'
                        f'  - random_resized_crop: {{size: 16}}\n  - select: [image]\n'
                        f'loader: {{batch: 2, workers: 0}}\n', encoding='utf-8')
        with loadr.pipeline(path) as loader:
            assert next(iter(loader))['image'].shape == (2, 16, 16, 3)
            return set(loader.stats().stages())

    assert 'decode_jpeg+random_resized_crop' in stages('{key: image}')
    off = stages('{key: image, fuse: false}')
    assert 'decode_jpeg' in off and 'random_resized_crop' in off


def test_a_441_jpeg_decodes_unfused_with_either_backend():
    data = jpeg_441((96, 64))
    for backend in ('pillow', 'simplejpeg'):
        for size in (None, 40):
            out = F.decode_jpeg(backend=backend, size=size)({'image': data})['image']
            assert out.shape[2] == 3 and out.shape[:2] == ((96, 64) if size is None else (60, 40))


def test_a_crop_to_the_images_edge_at_a_dct_scale_decodes(without_extension):
    """At 1/k the image's side times (scaled side / side) can round past the scaled side
    (25 × 4/25 > 4 by 1e-15): the resize's box is clamped to the decoded rows, on both
    paths, rather than refused."""
    pipelines = [[F.decode_jpeg(), F.resize(size=(2, 3))],
                 [F.decode_jpeg(), F.resize(size=(3, 2))],
                 [F.decode_jpeg(), F.random_resized_crop(size=2, scale=(0.9, 1.0))]]
    datas = [jpeg(natural(h, w, seed=h)) for h, w in [(25, 29), (50, 51), (58, 25), (29, 58)]]
    outs = []
    for region in (True, False):
        if not region:
            without_extension()
        outs.append(fused_outcomes(pipelines, datas, range(3)))
        assert all(isinstance(x, np.ndarray) for x in outs[-1]), outs[-1]
    assert same_outcomes(*outs)


@needs_region
@pytest.mark.parametrize('kind', ['420', '444', 'gray'])
def test_a_progressive_file_without_its_last_scans_gives_the_same_bytes(kind, without_extension):
    """A progressive JPEG cut at a scan's end (a valid file, decoded without a warning from
    the scans it has) is decoded with libjpeg's inter-block smoothing, which differs between
    libjpeg-turbo versions (the system's and simplejpeg's): the region decoder leaves it to
    the whole-image decoder, so both paths give simplejpeg's pixels."""
    from loadr import _jpegregion as jr
    good = region_jpeg((189, 229), kind, progressive=True, seed=1)
    scans = [i for i in range(len(good) - 1) if good[i:i + 2] == b'\xff\xda']
    assert len(scans) > 3
    cuts = [good[:at] + b'\xff\xd9' for at in scans[1:]]
    for cut in cuts:
        with pytest.raises(ValueError, match='progressive scans incomplete'):
            jr.decode_region(cut, 1, 0, 10, 0, 10, 3 if kind != 'gray' else 1)
    jr.decode_region(good, 1, 0, 10, 0, 10, 3)
    pipelines = [[F.decode_jpeg(), F.random_resized_crop(size=48)],
                 [F.decode_jpeg(), F.resize(size=64)]]
    with_region = fused_outcomes(pipelines, cuts, range(3))
    assert all(isinstance(x, np.ndarray) for x in with_region)
    without_extension()
    assert same_outcomes(fused_outcomes(pipelines, cuts, range(3)), with_region)


@needs_region
@pytest.mark.parametrize('workers', [0, 2])
def test_under_skip_the_same_samples_come_with_and_without_the_extension(monkeypatch, workers):
    """Files cut short low down. With an EOI put back, crops above the cut were decoded by
    the region path, while without it the unfused (lenient) Pillow decode made other
    pixels: now both paths leave such files to the unfused fns. Without an EOI, Pillow
    refuses them: skipped alike."""
    data = [{'image': jpeg(natural(120, 160, seed=i)), 'label': i} for i in range(16)]
    for i in (2, 5, 11):
        good = data[i]['image']
        data[i]['image'] = good[:len(good) - len(good) // 6] + (b'\xff\xd9' if i < 11 else b'')
    fns = [F.decode_jpeg(), F.random_resized_crop(size=24, scale=(0.02, 0.1)), F.flip()]
    runs = []
    for region in ('1', '0'):
        monkeypatch.setenv('LOADR_JPEGREGION', region)
        with loadr.Loader(data, batch=4, fns=fns, seed=3, workers=workers, on_error='skip',
                          max_error_fraction=0.5) as loader:
            runs.append((stream_digests(loader, 8), loader.errors))
    assert runs[0] == runs[1] and runs[0][1] >= 1, runs
    # The same samples for any worker count (the skip test's other half, workers=0, is
    # the reference both runs are held to).
    if workers:
        monkeypatch.setenv('LOADR_JPEGREGION', '1')
        with loadr.Loader(data, batch=4, fns=fns, seed=3, workers=0, on_error='skip',
                          max_error_fraction=0.5) as loader:
            assert (stream_digests(loader, 8), loader.errors) == runs[0]
