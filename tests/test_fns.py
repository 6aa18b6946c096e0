"""Tests for loadr.fns: exact outputs, determinism, randomness, pickling, videos, names."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import sys

import numpy as np
import pytest
from PIL import Image

import loadr.fns as F
from loadr.codecs import decode_image, encode_image
from loadr.errors import ConfigError, DecodeError, SpecError
from tests.readers.common import assert_equal

BILINEAR = Image.Resampling.BILINEAR


def smooth_image(h, w, c=3, seed=0):
    """A smooth uint8 image (gradients and a bump) with a little noise, like a photo."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    chans = [64 + 60 * ys / h + 50 * xs / w + 60 * np.exp(-((ys - h * (0.3 + 0.2 * k)) ** 2
                                                              + (xs - w / 2) ** 2) / (h * w / 8))
             for k in range(c)]
    img = np.stack(chans, -1) + rng.integers(-3, 4, (h, w, c))
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img[:, :, 0] if c == 1 else img


def arange_image(h, w, c=3, dtype=np.uint8):
    return (np.arange(h * w * c) % 251).astype(dtype).reshape(h, w, c)


def video(t, h, w, c=3):
    """Frames that differ by a constant: frame i is frame 0 plus i (so crops can be compared)."""
    base = (np.arange(h * w * c) % 200).astype(np.uint8).reshape(h, w, c)
    return [base + np.uint8(i) for i in range(t)]


def pil_resize(arr, h, w):
    return np.asarray(Image.fromarray(arr).resize((w, h), BILINEAR))


@pytest.fixture(scope='module')
def jpeg():
    """A 400×520 q90 JPEG: big enough for draft mode to scale by 4 when asked for 96."""
    return encode_image(smooth_image(400, 520), quality=90)


# ----------------------------------------------------------------------------- decode_jpeg

def test_decode_jpeg_full_size_matches_codec(jpeg):
    out = F.decode_jpeg()({'image': jpeg, 'label': 1})
    assert out['label'] == 1
    assert_equal(out['image'], decode_image(jpeg, mode='RGB'))
    assert out['image'].shape == (400, 520, 3) and out['image'].dtype == np.uint8


def test_decode_jpeg_modes_and_frame_lists(jpeg):
    gray = F.decode_jpeg(mode='L')({'image': jpeg})['image']
    assert gray.shape == (400, 520)
    small = encode_image(smooth_image(20, 30, c=1))
    native = F.decode_jpeg(mode=None)({'image': small})['image']
    assert native.shape == (20, 30)
    frames = [encode_image(f) for f in video(3, 16, 24)]
    out = F.decode_jpeg(key='frames')({'frames': frames})['frames']
    assert isinstance(out, list) and len(out) == 3
    for data, arr in zip(frames, out):
        assert_equal(arr, decode_image(data, mode='RGB'))


def test_decode_jpeg_draft_is_exactly_the_documented_algorithm(jpeg):
    # short side 96 of 400×520 -> 96×124; libjpeg scales by 1/4 (100×130) then bilinear.
    out = F.decode_jpeg(size=96)({'image': jpeg})['image']
    assert out.shape == (96, 124, 3)
    with Image.open(io.BytesIO(jpeg)) as img:
        img.draft('RGB', (124, 96))
        assert img.size == (130, 100)   # the DCT scaling really happened
        expected = np.asarray(img.convert('RGB').resize((124, 96), BILINEAR))
    assert_equal(out, expected)


@pytest.mark.parametrize('size, shape', [(96, (96, 124, 3)), ((64, 80), (64, 80, 3)),
                                         (200, (200, 260, 3)), (300, (300, 390, 3))])
def test_decode_jpeg_draft_close_to_full_decode_and_resize(jpeg, size, shape):
    drafted = F.decode_jpeg(size=size)({'image': jpeg})['image']
    full = F.resize(size=size)(F.decode_jpeg()({'image': jpeg}))['image']
    assert drafted.shape == full.shape == shape
    diff = np.abs(drafted.astype(int) - full.astype(int))
    assert diff.mean() < 1.5, diff.mean()


def test_decode_jpeg_passes_decoded_arrays_through(jpeg):
    img = smooth_image(40, 60)
    assert F.decode_jpeg()({'image': img})['image'] is img
    out = F.decode_jpeg(size=(20, 30))({'image': img})['image']
    assert_equal(out, pil_resize(img, 20, 30))
    stack = np.stack(video(2, 40, 60))
    out = F.decode_jpeg(size=20)({'image': stack})['image']
    assert out.shape == (2, 20, 30, 3)
    assert_equal(out[1], pil_resize(stack[1], 20, 30))
    # Encoded bytes that arrive as a uint8 vector still decode.
    vec = np.frombuffer(jpeg, np.uint8)
    assert_equal(F.decode_jpeg()({'image': vec})['image'], decode_image(jpeg, mode='RGB'))


def test_decode_jpeg_errors_name_the_key(jpeg):
    with pytest.raises(DecodeError, match=r"key 'frames' \(frame 1\): cannot decode"):
        F.decode_jpeg(key='frames')({'frames': [jpeg, b'not a jpeg']})
    with pytest.raises(DecodeError, match="key 'image'"):
        F.decode_jpeg(size=10)({'image': jpeg[:50]})
    with pytest.raises(SpecError, match="key 'image' must hold JPEG bytes or an image array, got"):
        F.decode_jpeg()({'image': 5})
    with pytest.raises(SpecError, match="has no key 'image'"):
        F.decode_jpeg()({'jpeg': jpeg})


def test_decode_jpeg_hands_only_jpeg_and_png_to_pillow():
    # A PCX Pillow could decode: refused, with or without a target size, so an
    # untrusted value never reaches the other Pillow parsers.
    buf = io.BytesIO()
    Image.new('RGB', (16, 16), 'red').save(buf, 'PCX')
    for fn in (F.decode_jpeg(), F.decode_jpeg(size=8)):
        with pytest.raises(DecodeError, match='not a JPEG or PNG file'):
            fn({'image': buf.getvalue()})


def test_decode_jpeg_simplejpeg_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, 'simplejpeg', None)   # import simplejpeg now fails
    with pytest.raises(ConfigError, match='pip install simplejpeg'):
        F.decode_jpeg(backend='simplejpeg')


def test_decode_jpeg_simplejpeg_backend(jpeg):
    simplejpeg = pytest.importorskip('simplejpeg')
    out = F.decode_jpeg(backend='simplejpeg')({'image': jpeg})['image']
    assert_equal(out, simplejpeg.decode_jpeg(jpeg, colorspace='RGB'))
    gray = F.decode_jpeg(backend='simplejpeg', mode='L')({'image': jpeg})['image']
    assert gray.shape == (400, 520)
    small = F.decode_jpeg(backend='simplejpeg', size=96)({'image': jpeg})['image']
    reference = F.decode_jpeg(size=96)({'image': jpeg})['image']
    assert small.shape == reference.shape == (96, 124, 3)
    assert np.abs(small.astype(int) - reference.astype(int)).mean() < 2
    with pytest.raises(DecodeError, match="key 'image'"):
        F.decode_jpeg(backend='simplejpeg')({'image': b'\xff\xd8 nonsense'})


# ----------------------------------------------------------------------------- geometry

def test_resize_short_side_and_exact():
    img = smooth_image(48, 64)
    out = F.resize(size=24)({'image': img})['image']
    assert out.shape == (24, 32, 3)
    assert_equal(out, pil_resize(img, 24, 32))
    assert F.resize(size=20)({'image': smooth_image(64, 48)})['image'].shape == (26, 20, 3)
    # The long side rounds down, as torchvision's Resize(int): 480×640 -> 256×341.
    assert F.resize(size=256)({'image': np.zeros((480, 640, 3), np.uint8)})['image'].shape \
        == (256, 341, 3)
    assert_equal(F.resize(size=(10, 30))({'image': img})['image'], pil_resize(img, 10, 30))
    gray = smooth_image(48, 64, c=1)
    assert_equal(F.resize(size=(12, 16))({'image': gray})['image'], pil_resize(gray, 12, 16))


def test_resize_float_and_four_channels_go_per_channel():
    img = arange_image(8, 10, c=4)
    out = F.resize(size=(4, 5))({'image': img})['image']
    assert out.shape == (4, 5, 4)
    for c in range(4):
        assert_equal(out[:, :, c], pil_resize(np.ascontiguousarray(img[:, :, c]), 4, 5))
    fl = img[:, :, :3].astype(np.float32) / 7
    out = F.resize(size=(4, 5))({'image': fl})['image']
    assert out.dtype == np.float32 and out.shape == (4, 5, 3)
    expected = Image.fromarray(np.ascontiguousarray(fl[:, :, 1])).resize((5, 4), BILINEAR)
    expected = np.asarray(expected)
    assert_equal(out[:, :, 1], expected)
    with pytest.raises(SpecError, match="uint8 or float32 image to resize, got int16"):
        F.resize(size=3)({'image': img.astype(np.int16)})


def test_center_crop_exact():
    img = arange_image(7, 9)
    out = F.center_crop(size=(3, 4))({'image': img})['image']
    # offsets round((7-3)/2) = 2 and round((9-4)/2) = round(2.5) = 2, as torchvision
    assert_equal(out, img[2:5, 2:6])
    assert out.flags.c_contiguous
    assert_equal(F.center_crop(size=5)({'image': img[:, :, 0]})['image'], img[1:6, 2:7, 0])
    with pytest.raises(SpecError, match=r"is 7×9 \(H×W\), smaller than the crop 8×8"):
        F.center_crop(size=8)({'image': img})


def test_random_crop_is_a_crop_and_covers_every_position():
    img = arange_image(6, 9)
    fn = F.random_crop(size=(4, 5))
    seen = set()
    for seed in range(300):
        out = fn({'image': img}, seed=seed)['image']
        assert out.shape == (4, 5, 3)
        hits = [(t, left) for t in range(3) for left in range(5)
                if np.array_equal(out, img[t:t + 4, left:left + 5])]
        assert len(hits) == 1
        seen.add(hits[0])
    assert seen == {(t, lab) for t in range(3) for lab in range(5)}
    with pytest.raises(SpecError, match='smaller than the crop'):
        F.random_crop(size=10)({'image': img}, seed=0)


def test_random_resized_crop_boxes_follow_scale_and_ratio():
    fn = F.random_resized_crop(size=8, scale=(0.25, 0.5), ratio=(0.5, 2.0))
    areas, ratios, tops = [], [], set()
    for seed in range(400):
        top, left, h, w = fn.box(100, 120, np.random.default_rng(seed))
        assert 0 <= top <= 100 - h and 0 <= left <= 120 - w
        areas.append(h * w / (100 * 120))
        ratios.append(w / h)
        tops.add(top // 10)
    assert 0.23 < min(areas) and max(areas) < 0.52
    assert 0.45 < min(ratios) and max(ratios) < 2.1
    assert min(ratios) < 0.7 and max(ratios) > 1.5        # the whole ratio range is used
    assert len(tops) >= 6                                  # positions spread over the image
    out = fn({'image': smooth_image(100, 120)}, seed=3)['image']
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8


def test_random_resized_crop_falls_back_to_the_centre():
    # Area 1 with w/h >= 2 never fits a square image: torchvision's fallback crop.
    fn = F.random_resized_crop(size=(4, 8), scale=(1.0, 1.0), ratio=(2.0, 3.0))
    assert fn.box(20, 20, np.random.default_rng(0)) == (5, 0, 10, 20)
    img = arange_image(20, 20)
    assert_equal(fn({'image': img}, seed=9)['image'], pil_resize(img[5:15], 4, 8))
    whole = F.random_resized_crop(size=6, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert_equal(whole({'image': img}, seed=1)['image'], pil_resize(img, 6, 6))


def test_flip_exact_and_probability():
    img = arange_image(3, 4)
    assert_equal(F.flip(p=1.0)({'image': img}, seed=0)['image'], img[:, ::-1].copy())
    assert F.flip(p=0.0)({'image': img}, seed=0)['image'] is img
    assert_equal(F.flip(p=1)({'image': img[:, :, 0]}, seed=0)['image'], img[:, ::-1, 0].copy())
    assert_equal(F.flip(p=1)({'image': img[:, 1:]}, seed=0)['image'], img[:, :0:-1].copy())
    fl = arange_image(3, 4, c=2, dtype=np.float32)
    assert_equal(F.flip(p=1)({'image': fl}, seed=0)['image'], fl[:, ::-1].copy())
    fn = F.flip(p=0.3)
    flips = [not np.array_equal(fn({'image': img}, seed=s)['image'], img) for s in range(2000)]
    assert 0.26 < np.mean(flips) < 0.34


# ----------------------------------------------------------------------------- videos

VIDEO_GEOMETRY = [F.random_crop(key='v', size=(5, 6)), F.random_resized_crop(key='v', size=4),
                  F.flip(key='v'), F.center_crop(key='v', size=5), F.resize(key='v', size=(3, 4))]


@pytest.mark.parametrize('fn', VIDEO_GEOMETRY, ids=repr)
@pytest.mark.parametrize('as_array', [False, True], ids=['list', 'TxHxWxC'])
def test_video_frames_get_the_same_crop_and_flip(fn, as_array):
    frames = video(4, 9, 11)
    value = np.stack(frames) if as_array else frames
    flipped = set()
    for seed in range(8):
        out = fn({'v': value}, seed=seed)['v']
        assert isinstance(out, np.ndarray if as_array else list) and len(out) == 4
        # Frame i is frame 0 plus i; after one shared geometry it still is (resize: nearly).
        for i in range(4):
            diff = out[i].astype(int) - out[0].astype(int)
            assert np.abs(diff - i).max() <= (1 if isinstance(fn, F.resize) else 0), (seed, i)
        # Each frame got what the same seed does to that frame alone.
        assert_equal(fn({'v': frames[2]}, seed=seed)['v'], out[2])
        flipped.add(out[0][0, 0, 0] != frames[0][0, 0, 0])
    if isinstance(fn, F.flip):
        assert flipped == {True, False}


def test_video_frames_of_different_sizes_are_refused():
    frames = [np.zeros((8, 8, 3), np.uint8), np.zeros((8, 9, 3), np.uint8)]
    with pytest.raises(SpecError, match=r'frame 1 .* is 8×9 but frame 0 is 8×8'):
        F.random_crop(key='v', size=4)({'v': frames}, seed=0)
    with pytest.raises(SpecError, match="frame 0 of key 'v' must be an H×W or H×W×C array, got"):
        F.flip(key='v')({'v': ['x']}, seed=0)


# ----------------------------------------------------------------------------- pixel values

def test_normalize_exact_values_and_layouts():
    img = arange_image(2, 3)
    mean, std = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])
    expected = (img.astype(np.float32) / np.float32(255) - mean) / std
    out = F.normalize(mean='imagenet', std='imagenet')({'image': img})['image']
    assert out.dtype == np.float32 and out.shape == (2, 3, 3)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    chw = F.normalize(layout='CHW')({'image': img})['image']
    assert chw.shape == (3, 2, 3) and chw.flags.c_contiguous
    np.testing.assert_allclose(chw, expected.transpose(2, 0, 1), rtol=1e-6, atol=1e-6)
    # Float input is taken as already on the 0..1 scale.
    fl = img.astype(np.float32) / 255
    np.testing.assert_allclose(F.normalize(mean=[0.5], std=[0.25])({'image': fl})['image'],
                               (fl - 0.5) / 0.25, rtol=1e-6, atol=1e-6)
    gray = F.normalize(mean=0.5, std=0.5, layout='CHW')({'image': img[:, :, 0]})['image']
    assert gray.shape == (1, 2, 3)
    np.testing.assert_allclose(gray, ((img[:, :, 0] / 255 - 0.5) / 0.5)[None], rtol=1e-6, atol=1e-6)


def test_normalize_video_list_becomes_a_stack():
    frames = video(3, 4, 5)
    out = F.normalize(key='v', layout='CHW')({'v': frames})['v']
    assert out.shape == (3, 3, 4, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out[2], F.normalize(layout='CHW')({'image': frames[2]})['image'])
    with pytest.raises(SpecError, match='has 4 channel'):
        F.normalize()({'image': arange_image(2, 2, c=4)})


def test_to_float():
    out = F.to_float()({'image': np.array([[0, 51, 255]], np.uint8)})['image']
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.0, 0.2, 1.0]], rtol=1e-6)
    frames = video(2, 2, 2)
    out = F.to_float(key='v', scale=2)({'v': frames})['v']
    assert_equal(out, np.stack(frames).astype(np.float32) * 2)
    with pytest.raises(SpecError, match="must hold numbers, got <U1"):
        F.to_float()({'image': np.array(['a'])})


# ----------------------------------------------------------------------------- sample_frames

def test_sample_frames_uniform_positions():
    assert F.sample_frames(num=3).positions(9) == [0, 4, 8]
    assert F.sample_frames(num=4).positions(10) == [0, 3, 6, 9]
    assert F.sample_frames(num=5).positions(3) == [0, 1, 1, 2, 2]      # halves round up
    assert F.sample_frames(num=1).positions(10) == [4]
    assert F.sample_frames(num=8).positions(1) == [0] * 8
    out = F.sample_frames(num=3)({'frames': list('abcdefghi')})
    assert out['frames'] == ['a', 'e', 'i']


def test_sample_frames_random_clip():
    fn = F.sample_frames(num=4, mode='random_clip', stride=2)
    starts = set()
    for seed in range(200):
        pos = fn.positions(20, seed)
        assert pos == [pos[0] + 2 * i for i in range(4)] and 0 <= pos[0] <= 13
        starts.add(pos[0])
    assert starts == set(range(14))
    assert F.sample_frames(num=4, mode='random_clip', stride=2, train=False).positions(20) \
        == [6, 8, 10, 12]
    # Too short for a clip of span 7: loop from a random start, or clamp from 0.
    looped = {tuple(fn.positions(5, s)) for s in range(100)}
    assert looped == {tuple((s + 2 * i) % 5 for i in range(4)) for s in range(5)}
    clamp = F.sample_frames(num=4, mode='random_clip', stride=2, short='clamp')
    assert clamp.positions(5, 0) == [0, 2, 4, 4]


def test_sample_frames_tsn():
    fn = F.sample_frames(num=4, mode='tsn')
    seen = [set() for _ in range(4)]
    for seed in range(200):
        pos = fn.positions(22, seed)
        bounds = [(0, 5), (5, 11), (11, 16), (16, 22)]
        for i, (p, (lo, hi)) in enumerate(zip(pos, bounds)):
            assert lo <= p < hi
            seen[i].add(p)
    assert [len(s) for s in seen] == [5, 6, 5, 6]
    assert F.sample_frames(num=4, mode='tsn', train=False).positions(22) == [2, 8, 13, 19]
    assert F.sample_frames(num=4, mode='tsn').positions(2, 5) == [0, 0, 1, 1]
    stack = np.arange(22 * 2).reshape(22, 2)
    out = fn({'frames': stack}, seed=7)['frames']
    assert_equal(out, stack[fn.positions(22, 7)])


def test_sample_frames_errors():
    with pytest.raises(SpecError, match='has no frames'):
        F.sample_frames()({'frames': []})
    with pytest.raises(SpecError, match="key 'frames' must be a list of frames"):
        F.sample_frames()({'frames': 3})
    with pytest.raises(ConfigError, match='is random: call it as fn'):
        F.sample_frames(mode='tsn').positions(10)


class Spy:
    """A Reader-protocol wrapper that records every mask it is asked for."""

    def __init__(self, reader):
        self.reader, self.masks = reader, []

    def __len__(self):
        return len(self.reader)

    def available(self, index):
        return self.reader.available(index)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            self.masks.append(key[1])
        return self.reader[key]


class ListReader:
    """The smallest Reader: videos as lists of small frames, masks honoured."""

    def __init__(self, lengths):
        self.videos = [[np.full((2, 2), 10 * v + i, np.uint8) for i in range(n)]
                       for v, n in enumerate(lengths)]

    def __len__(self):
        return len(self.videos)

    def available(self, index):
        return {'frames': range(len(self.videos[index])), 'label': True}

    def __getitem__(self, key):
        index, mask = key if isinstance(key, tuple) else (key, {'frames': True, 'label': True})
        frames = self.videos[index]
        out = {}
        if mask.get('label'):
            out['label'] = index
        if mask.get('frames') is True:
            out['frames'] = list(frames)
        elif 'frames' in mask:
            out['frames'] = [frames[p] for p in mask['frames']]
        return out


@pytest.fixture(scope='module')
def gulp_reader(tmp_path_factory):
    """A real gulp dataset: videos of 1, 3, 7 and 30 frames, frame i of video v all v*8+i."""
    try:
        from loadr.readers.gulp import GulpReader, GulpWriter
    except ImportError as exc:  # pragma: no cover - only while the gulp module is missing
        pytest.skip(f'gulp reader not available: {exc}')
    path = tmp_path_factory.mktemp('gulp') / 'videos'
    with GulpWriter(path, videos_per_chunk=2) as w:
        for v, n in enumerate([1, 3, 7, 30]):
            w.append(f'v{v}', {'label': v}, [np.full((8, 8, 3), v * 8 + i, np.uint8)
                                              for i in range(n)])
    return GulpReader(path)


SAMPLERS = [F.sample_frames(num=4), F.sample_frames(num=5, mode='random_clip', stride=2),
            F.sample_frames(num=3, mode='random_clip', short='clamp'),
            F.sample_frames(num=4, mode='tsn'), F.sample_frames(num=4, mode='tsn', train=False)]


@pytest.mark.parametrize('fn', SAMPLERS, ids=repr)
@pytest.mark.parametrize('real', [True, False], ids=['gulp', 'list-reader'])
def test_sample_frames_read_equals_call_and_reads_only_chosen_frames(fn, real, request):
    reader = request.getfixturevalue('gulp_reader') if real else ListReader([1, 3, 7, 30])
    assert fn.reads is True and F.flip.reads is False
    for index in range(len(reader)):
        n = len(reader.available(index)['frames'])
        for seed in (0, 1, 12345, 2 ** 63 + 5):
            spy = Spy(reader)
            via_read = fn.read(spy, index, seed)
            assert_equal(via_read, fn(reader[index], seed=seed), f'index {index} seed {seed}')
            chosen = fn.positions(n, seed)
            others = {k: True for k in reader.available(index) if k != 'frames'}
            assert spy.masks == [{**others, 'frames': sorted(set(chosen))}]


def test_sample_frames_read_refuses_a_key_that_is_not_a_sequence():
    with pytest.raises(SpecError, match="key 'label' is not a sequence"):
        F.sample_frames(key='label').read(ListReader([3]), 0, 0)
    with pytest.raises(SpecError, match="has no key 'video'"):
        F.sample_frames(key='video').read(ListReader([3]), 0, 0)


# ----------------------------------------------------------------------------- labels

def test_label_to_index(tmp_path):
    path = tmp_path / 'label2idx.json'
    path.write_text(json.dumps({'cat': 0, 'dog': 1, 'café': 2}))
    for mapping in ({'cat': 0, 'dog': 1, 'café': 2}, str(path), path):
        fn = F.label_to_index(mapping=mapping)
        assert fn({'label': 'café'}) == {'label': 2}
        assert fn({'label': ['dog', 'cat']}) == {'label': [1, 0]}
    with pytest.raises(SpecError,
                       match=r"label 'cow' of key 'label' is not in the mapping \(3 lab"):
        fn({'label': 'cow'})
    plain = F.label_to_index()
    out = plain({'label': np.int64(4)})
    assert out == {'label': 4} and type(out['label']) is int
    with pytest.raises(SpecError, match="pass mapping="):
        plain({'label': 'cat'})


def test_label_to_index_bad_mappings(tmp_path):
    with pytest.raises(ConfigError, match='cannot read the label mapping') as err:
        F.label_to_index(mapping=str(tmp_path / 'missing.json'))
    assert err.value.path == str(tmp_path / 'missing.json')
    (tmp_path / 'bad.json').write_text('{"cat": 0,')
    with pytest.raises(ConfigError, match='not valid JSON'):
        F.label_to_index(mapping=str(tmp_path / 'bad.json'))
    (tmp_path / 'list.json').write_text('[1, 2]')
    with pytest.raises(ConfigError, match='must be a JSON object'):
        F.label_to_index(mapping=str(tmp_path / 'list.json'))
    with pytest.raises(ConfigError, match="label 'cat' maps to '0'"):
        F.label_to_index(mapping={'cat': '0'})


def test_one_hot():
    out = F.one_hot(num_classes=4)({'label': 2})['label']
    assert_equal(out, np.array([0, 0, 1, 0], np.float32))
    assert_equal(F.one_hot(num_classes=3)({'label': np.int64(0)})['label'],
                 np.array([1, 0, 0], np.float32))
    with pytest.raises(SpecError, match=r"int label in \[0, 4\), got 4"):
        F.one_hot(num_classes=4)({'label': 4})
    with pytest.raises(SpecError, match="got 'cat'"):
        F.one_hot(num_classes=4)({'label': 'cat'})


# ----------------------------------------------------------------------------- structure

def test_select_and_rename():
    dp = {'image': 1, 'label': 2, 'path': 'x'}
    assert list(F.select(['label', 'image'])(dp).items()) == [('label', 2), ('image', 1)]
    assert F.select('path')(dp) == {'path': 'x'}
    with pytest.raises(SpecError, match=r"no key 'idx' \(it has \['image', 'label', 'path'\]\)"):
        F.select(['idx'])(dp)
    assert F.rename({'image': 'x'})(dp) == {'x': 1, 'label': 2, 'path': 'x'}
    swapped = F.rename({'image': 'label', 'label': 'image'})(dp)
    assert swapped == {'label': 1, 'image': 2, 'path': 'x'}
    with pytest.raises(SpecError, match="already has a key 'path'"):
        F.rename({'image': 'path'})(dp)
    with pytest.raises(SpecError, match="has no key 'frames'"):
        F.rename({'frames': 'video'})(dp)


def test_pad_sequence_and_truncate():
    arr = np.arange(6, dtype=np.int16).reshape(3, 2)
    out = F.pad_sequence('x', 5, value=-1)({'x': arr})
    assert_equal(out['x'], np.array([[0, 1], [2, 3], [4, 5], [-1, -1], [-1, -1]], np.int16))
    assert out['x_length'] == 3
    assert F.pad_sequence('t', 4)({'t': [5, 6]}) == {'t': [5, 6, 0, 0], 't_length': 2}
    frames = F.pad_sequence('f', 3)({'f': video(1, 2, 2)})['f']
    assert len(frames) == 3
    assert_equal(frames[1], np.zeros((2, 2, 3), np.uint8))
    assert_equal(frames[2], np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(SpecError, match="has 3 items, more than 2; put truncate"):
        F.pad_sequence('x', 2)({'x': arr})
    with pytest.raises(SpecError, match="already has a key 'x_length'"):
        F.pad_sequence('x', 4)({'x': arr, 'x_length': 1})
    with pytest.raises(SpecError, match='does not fit key'):
        F.pad_sequence('x', 4, value=-1)({'x': arr.astype(np.uint8)})
    assert_equal(F.truncate('x', 2)({'x': arr})['x'], arr[:2])
    assert F.truncate('t', 2)({'t': (1, 2, 3)}) == {'t': [1, 2]}
    assert F.truncate('s', 3)({'s': 'abcdef'}) == {'s': 'abc'}
    with pytest.raises(SpecError, match="key 's' must be a list, an array"):
        F.truncate('s', 3)({'s': 5})


# ----------------------------------------------------------------------------- every built-in

def every_fn():
    """One instance of every built-in with the datapoint it works on."""
    img = smooth_image(24, 32)
    data = encode_image(img)
    return [
        (F.decode_jpeg(size=16), {'image': data}),
        (F.resize(size=(12, 10)), {'image': img}),
        (F.center_crop(size=8), {'image': img}),
        (F.random_crop(size=(8, 9)), {'image': img}),
        (F.random_resized_crop(size=8), {'image': img}),
        (F.flip(), {'image': img}),
        (F.normalize(layout='CHW'), {'image': img}),
        (F.to_float(), {'image': img}),
        (F.sample_frames(num=3, mode='tsn'), {'frames': video(10, 2, 2)}),
        (F.label_to_index(mapping={'a': 0, 'b': 1}), {'label': 'b'}),
        (F.one_hot(num_classes=3), {'label': 1}),
        (F.select(['image']), {'image': img, 'y': 1}),
        (F.rename({'image': 'x'}), {'image': img}),
        (F.pad_sequence('t', 4), {'t': [1, 2]}),
        (F.truncate('t', 1), {'t': [1, 2]}),
    ]


def test_every_builtin_is_listed():
    assert sorted(type(fn).__name__ for fn, _ in every_fn()) == sorted(F.REGISTRY)


@pytest.mark.parametrize('fn, dp', every_fn(), ids=lambda x: repr(x)[:40])
def test_pickle_round_trip_repr_and_purity(fn, dp):
    copy = pickle.loads(pickle.dumps(fn))
    assert copy == fn and repr(copy) == repr(fn)
    assert repr(fn).startswith(type(fn).__name__ + '(')
    assert eval(repr(fn), {**vars(F)}) == fn   # repr shows every argument
    before = pickle.dumps(dp)
    out = fn(dp, seed=11)
    assert pickle.dumps(dp) == before, 'the input datapoint was changed'
    assert_equal(copy(dp, seed=11), out)
    assert_equal(fn(dp, seed=11), out)         # same seed, same bytes


RANDOM_FNS = [(F.random_crop(size=(8, 9)), 'image'), (F.random_resized_crop(size=8), 'image'),
              (F.flip(), 'image'), (F.sample_frames(num=3, mode='random_clip'), 'frames'),
              (F.sample_frames(num=3, mode='tsn'), 'frames')]


@pytest.mark.parametrize('fn, key', RANDOM_FNS, ids=lambda x: repr(x)[:40])
def test_random_fns_depend_on_the_seed_only(fn, key):
    dp = {'image': smooth_image(24, 32), 'frames': list(range(40))}
    outs = [pickle.dumps(fn(dp, seed=s)[key]) for s in range(40)]
    assert outs == [pickle.dumps(fn(dp, seed=s)[key]) for s in range(40)]
    assert len(set(outs)) >= (2 if isinstance(fn, F.flip) else 15)
    with pytest.raises(ConfigError, match=r'is random: call it as fn\(datapoint, seed=<int >= 0'):
        fn(dp)
    with pytest.raises(ConfigError, match='got seed=-1'):
        fn(dp, seed=-1)


def test_two_fns_given_one_seed_draw_independently():
    # From one unsalted stream, flip's first draw u (flip when u < 0.5) would also be the
    # crop's area fraction 0.08 + 0.92 u: small crops would always come flipped.
    img = arange_image(6, 6)
    crop = F.random_resized_crop(size=4)
    agree = []
    for s in range(400):
        flipped = not np.array_equal(F.flip()({'image': img}, seed=s)['image'], img)
        top, left, h, w = crop.box(100, 100, crop._rng(s))
        agree.append(flipped == (h * w / 100 ** 2 < 0.08 + 0.92 * 0.5))
    assert 0.4 < np.mean(agree) < 0.6


def test_two_instances_of_one_random_fn_draw_independently():
    # SimCLR: two views of one image, each with its own random_resized_crop (and flip).
    img = smooth_image(40, 48)
    crops = [F.random_resized_crop(key='view1', size=8), F.random_resized_crop(key='view2', size=8)]
    flips = [F.flip(key='view1'), F.flip(key='view2')]
    same_box = same_flip = 0
    for s in range(200):
        same_box += crops[0].box(40, 48, crops[0]._rng(s)) == crops[1].box(40, 48, crops[1]._rng(s))
        same_flip += (flips[0]._rng(s).random() < 0.5) == (flips[1]._rng(s).random() < 0.5)
        dp = {'view1': img, 'view2': img}
        for fn in crops:
            dp = fn(dp, seed=s)
        if s < 20:
            assert not np.array_equal(dp['view1'], dp['view2'])
    assert same_box == 0 and 60 < same_flip < 140          # agree by chance: about half
    # Other arguments count too: two crops of one key with different sizes.
    a, b = F.random_crop(size=4), F.random_crop(size=5)
    assert [a._rng(s).integers(0, 1 << 30) for s in range(5)] != \
        [b._rng(s).integers(0, 1 << 30) for s in range(5)]


@pytest.mark.parametrize('make', [
    lambda key, stream: F.random_resized_crop(key=key, size=8, stream=stream),
    lambda key, stream: F.random_crop(key=key, size=(5, 6), stream=stream),
    lambda key, stream: F.flip(key=key, stream=stream),
    lambda key, stream: F.sample_frames(key=key, num=3, mode='tsn', stream=stream),
])
def test_a_named_stream_makes_fns_draw_alike_on_purpose(make):
    # An image and its mask must get the same crop and flip.
    image, mask = smooth_image(24, 32), smooth_image(24, 32, seed=1)
    if isinstance(make('x', None), F.sample_frames):
        image, mask = list(range(30)), list(range(100, 130))
    on_image, on_mask = make('image', 'geometry'), make('mask', 'geometry')
    assert 'geometry' in repr(on_image) and on_image != make('image', None)
    same = 0
    for s in range(30):
        dp = on_mask(on_image({'image': image, 'mask': mask}, seed=s), seed=s)
        alone = make('image', 'geometry')({'image': mask}, seed=s)['image']
        assert_equal(dp['mask'], alone)           # the mask got what the image would have got
        same += pickle.dumps(dp['image']) == pickle.dumps(make('image', None)(
            {'image': image}, seed=s)['image'])
    assert same < 30                              # a named stream is not the default one
    with pytest.raises(ConfigError, match='stream must be a non-empty string'):
        make('image', '')


def test_the_seed_a_users_fn_receives_is_the_samples_seed():
    import loadr
    seen = []

    def mine(dp, seed):
        seen.append(seed)
        return dp

    crop = F.random_crop(size=4)
    data = [{'image': smooth_image(8, 8, seed=i)} for i in range(6)]
    with loadr.Loader(data, batch=3, fns=[mine, crop], workers=0, seed=5) as loader:
        batch = next(iter(loader))
    # The built-in salts inside itself: called with the seed the user's fn got, it gives the
    # batch's row. (seen[0] is the spec's look at the first datapoint.)
    for row, seed in enumerate(seen[-3:]):
        assert any(np.array_equal(batch['image'][row], crop(dp, seed=seed)['image'])
                   for dp in data)
    assert len(set(seen[-3:])) == 3              # one seed per sample, not a salted constant


# ----------------------------------------------------------------------------- names

def test_resolve_short_names_and_import_paths():
    for name, factory in F.REGISTRY.items():
        assert F.resolve(name) is factory
    assert F.resolve('loadr.fns:flip') is F.flip
    assert F.resolve('os.path:join') is os.path.join
    assert F.resolve('json:JSONDecoder.decode') is json.JSONDecoder.decode


@pytest.mark.parametrize('name, message', [
    ('flp', r"unknown fn 'flp'; did you mean 'flip'\? Built-ins: decode_jpeg, "),
    ('zzz', r"unknown fn 'zzz'\. Built-ins: .*'package.module:function'"),
    ('no_such_module_xyz:f', r"fn 'no_such_module_xyz:f': cannot import 'no_such_module_xyz'"),
    ('os.path:nope', r"fn 'os.path:nope': 'os.path' has no 'nope'"),
    ('os:sep', r"fn 'os:sep' is a str, not something callable"),
    ('os:__import__("x")', r"is not an import path"),
    (3, 'a fn name must be a string'),
])
def test_resolve_errors_name_the_fn(name, message):
    with pytest.raises(ConfigError, match=message):
        F.resolve(name)


@pytest.mark.parametrize('factory, kwargs, message', [
    (F.resize, {'size': 0}, 'size must be a positive int or two positive ints'),
    (F.resize, {'size': (3,)}, r'size must be two positive ints, got \(3,\)'),
    (F.resize, {'size': (2.5, 3)}, r'size must be two positive ints, got \(2.5, 3\)'),
    (F.resize, {'size': True}, 'size must be two positive ints, got True'),
    (F.resize, {}, 'size is required'),
    (F.center_crop, {'size': 'big'}, "size must be two positive ints, got 'big'"),
    (F.random_crop, {'size': (4, -1)}, 'size must be two positive ints'),
    (F.random_resized_crop, {'size': 4, 'scale': (0.5, 0.1)}, 'scale must be two positive numbers'),
    (F.random_resized_crop, {'size': 4, 'scale': (0.5, 1.5)}, 'and at most 1.0'),
    (F.random_resized_crop, {'size': 4, 'ratio': (0, 1)}, 'ratio must be two positive numbers'),
    (F.flip, {'p': 1.5}, 'p must be a probability between 0 and 1, got 1.5'),
    (F.flip, {'key': ''}, 'key must be a non-empty string'),
    (F.decode_jpeg, {'backend': 'turbo'}, "backend must be 'pillow' or 'simplejpeg'"),
    (F.decode_jpeg, {'mode': 'P'}, 'mode must be one of'),
    (F.decode_jpeg, {'size': -3}, 'size must be a positive int'),
    (F.normalize, {'std': [0.2, 0.0, 0.1]}, 'std must be positive'),
    (F.normalize, {'mean': 'cifar'}, "mean must be 'imagenet', a number or a list"),
    (F.normalize, {'layout': 'NCHW'}, "layout must be 'HWC' or 'CHW', got 'NCHW'"),
    (F.to_float, {'scale': 'x'}, 'scale must be a finite number'),
    (F.sample_frames, {'mode': 'dense'}, "mode must be one of .*got 'dense'"),
    (F.sample_frames, {'num': 0}, 'num must be a positive int, got 0'),
    (F.sample_frames, {'stride': 1.5}, 'stride must be a positive int, got 1.5'),
    (F.sample_frames, {'train': 'yes'}, 'train must be True or False'),
    (F.sample_frames, {'short': 'pad'}, "short must be 'loop' or 'clamp'"),
    (F.label_to_index, {'mapping': 3}, 'mapping must be None, a dict or the path'),
    (F.one_hot, {}, 'num_classes must be a positive int, got None'),
    (F.select, {'keys': []}, 'keys must be a non-empty list'),
    (F.select, {'keys': ['a', 'a']}, 'keys has a key twice'),
    (F.rename, {'mapping': {'a': 'c', 'b': 'c'}}, 'same new name'),
    (F.rename, {'mapping': ['a']}, 'mapping must be a non-empty dict'),
    (F.pad_sequence, {'key': 'x', 'length': 0}, 'length must be a positive int, got 0'),
    (F.truncate, {'key': 'x', 'length': -1}, 'length must be a positive int, got -1'),
    (F.truncate, {'length': 3}, 'key must be a non-empty string, got None'),
])
def test_arguments_are_checked_when_the_fn_is_built(factory, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        factory(**kwargs)


def test_sizes_from_yaml_lists_are_tuples():
    assert F.resize(size=[3, 4]).size == (3, 4)
    assert repr(F.center_crop(size=[3, 4])) == "center_crop(key='image', size=(3, 4))"
    assert F.random_crop(size=5).size == (5, 5)
    assert math.isclose(F.random_resized_crop(size=3).ratio[1], 4 / 3)
