"""The fused decode (loadr.decode): the same crop boxes, the quality contract, determinism."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

import loadr
import loadr.fns as F
from loadr.decode import (Done, Fused, Region, _jpegregion, dct_scale, decode_region,
                          decode_scaled, fuse, jpeg_size, resize_region)
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


needs_region = pytest.mark.skipif(_jpegregion() is None,
                                  reason='loadr._jpegregion is not built (setup.py, libjpeg)')


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


@pytest.mark.parametrize('subsampling', [0, 1, 2], ids=['444', '422', '420'])
@pytest.mark.parametrize('progressive', [False, True], ids=['baseline', 'progressive'])
def test_fused_output_is_within_35_db_of_full_decode_crop_resize(subsampling, progressive):
    for i, (hw, box, out) in enumerate(QUALITY_CASES):
        data = jpeg(natural(*hw, seed=i), subsampling, progressive)
        got, want = fused_region(data, box, out), reference(data, box, out)
        assert got.shape == want.shape == (*out, 3)
        assert psnr(got, want) >= 35, (hw, box, out, psnr(got, want))


@needs_region
@pytest.mark.parametrize('subsampling', [0, 1, 2], ids=['444', '422', '420'])
@pytest.mark.parametrize('progressive', [False, True], ids=['baseline', 'progressive'])
def test_the_region_path_is_the_whole_image_path_within_1(subsampling, progressive):
    # The same decoded pixels (test_a_region_decode_has_the_full_decodes_pixels); Pillow's
    # resize weights, computed from the box's coordinates in the region rather than in the
    # whole image, round differently now and then: 1 at most.
    for i, (hw, box, out) in enumerate(QUALITY_CASES):
        data = jpeg(natural(*hw, seed=i), subsampling, progressive)
        got, whole = fused_region(data, box, out), fused_region(data, box, out, region=False)
        assert got.shape == whole.shape == (*out, 3)
        assert np.abs(got.astype(int) - whole).max() <= 1, (hw, box, out)


def region_jpeg(hw: tuple, kind: str, progressive: bool, seed: int) -> bytes:
    arr = natural(*hw, seed=seed)
    if kind == 'gray':
        buf = io.BytesIO()
        Image.fromarray(arr).convert('L').save(buf, 'JPEG', quality=90, progressive=progressive)
        return buf.getvalue()
    return jpeg(arr, {'444': 0, '422': 1, '420': 2}[kind], progressive)


@needs_region
@pytest.mark.parametrize('kind', ['444', '422', '420', 'gray'])
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
                    if kind in ('422', '420') and mode == 'RGB':
                        # Fancy upsampling of subsampled chroma has no neighbour beyond a
                        # cut: its outermost row/column (not an image edge) may differ.
                        # decode_region keeps 2 pixels more than the resize reads.
                        y0, x0 = int(top > 0), int(x > 0)
                        y1, x1 = rh - int(top + h < H), rw - int(x + rw < W)
                        got, want = got[y0:y1, x0:x1], want[y0:y1, x0:x1]
                    assert np.array_equal(got, want), (hw, k, mode, (top, h, left, w))


@needs_region
def test_files_the_region_decoder_refuses_decode_as_without_it():
    from loadr import _jpegregion as jr
    data = jpeg(natural(375, 500))
    for bad in (b'', b'\xff\xd8\xff\xe0 not really', data[:len(data) // 2]):
        with pytest.raises(ValueError):
            jr.decode_region(bad, 1, 300, 10, 0, 10, 3)     # rows the half file lacks
    with pytest.raises(ValueError, match='outside'):
        jr.decode_region(data, 2, 180, 10, 0, 10, 3)
    # Cut short below the region: never read there, so decode_region leaves the file to the
    # whole-image decoders, and the fused pipeline raises the unfused decode_jpeg's error.
    cut = data[:len(data) - 200]
    assert decode_region(cut, 1, 'RGB', (0., 0., 50., 50.), (375, 500), (20, 20)) is None
    pipeline = [F.decode_jpeg(), F.random_resized_crop(size=32)]
    for bad in (cut, data[:len(data) // 2]):
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
    assert fn_names(fuse(fns)) == ['decode_jpeg+random_resized_crop',
                                   'random_resized_crop(fused)', 'flip']
    data = [{'image': jpeg(natural(40, 50, seed=i))} for i in range(8)]
    with loadr.Loader(data, batch=4, fns=fns, seed=0, workers=0) as loader:
        next(iter(loader))
        assert 'decode_jpeg+random_resized_crop' in loader.stats().stages()
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
            assert 'decode_jpeg+random_resized_crop' in loader.stats().stages()
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
