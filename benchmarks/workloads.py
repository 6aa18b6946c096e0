"""The benchmark data (made here, in a temp dir) and the per-sample functions.

Every loader in a workload gets the same data and calls the same plain
Python function on each sample, so the numbers differ only by the loader.
The functions live at module level so that loaders that start their
workers with ``spawn`` (granular, grain) can import them.

Workloads (sizes at ``scale=1``; ``--scale`` multiplies the dataset sizes):

1. ``trivial``: ``{'label': int, 'vec': float32[16]}`` in a Python list,
   batch 256, no per-sample work: what the loader itself costs per sample.
2. ``images``: a bag dataset of distinct 375×500 JPEGs (quality 90, ~97 KB
   each, every one different: a decoder's per-sample allocations cannot hide
   behind a few repeated small pictures); per sample: Pillow decode, random
   224×224 crop, random left-right flip; batch 64.
3. ``video``: a gulp dataset of 30–60 frame videos at 128×170; per sample:
   8 frames chosen TSN-style (one random frame in each of 8 segments),
   Pillow decode, stack; batch 16.
4. ``raw``: an FFRecord file of 4 KiB records; 256 random records per
   batch, CRC32 checked, handed over as uint8[4096] rows.

Example::

    data = make_images(tmp, n=64)
    dp = data.reader[0]                     # {'image': b'\\xff\\xd8...', 'label': 0}
    out = image_fn(dp, seed=5)              # {'image': uint8[224, 224, 3], 'label': 0}
"""

from __future__ import annotations

import dataclasses
import io
import os

import numpy as np

__all__ = [
    'TRIVIAL_BATCH', 'IMAGE_BATCH', 'VIDEO_BATCH', 'RAW_BATCH', 'RECORD_BYTES',
    'IMAGE_HW', 'CROP', 'FRAME_HW', 'FRAMES_PER_CLIP', 'Data',
    'make_trivial', 'make_images', 'make_video', 'make_raw', 'FarDataset', 'distinct_pictures',
    'identity_fn', 'image_fn', 'video_fn', 'raw_fn', 'tsn_positions',
]

TRIVIAL_BATCH = 256
IMAGE_BATCH = 64
VIDEO_BATCH = 16
RAW_BATCH = 256
RECORD_BYTES = 4096
IMAGE_HW = (375, 500)
CROP = 224
FRAME_HW = (128, 170)
FRAMES_PER_CLIP = 8
VIDEO_FRAMES = (30, 60)          # inclusive range of frames per video
JPEG_QUALITY = 90
# Unique frames encoded for video; the clips repeat them. Images are all distinct.
UNIQUE_FRAMES = 160
# Grain added to every image (±IMAGE_GRAIN): at 27, a 375×500 q90 JPEG is ~97 KB,
# the size of an ImageNet photograph at that resolution.
IMAGE_GRAIN = 27


@dataclasses.dataclass
class Data:
    """One workload's data: what each loader reads, and how big a batch is."""

    name: str
    batch: int
    n: int
    path: str | None            # on disk (None: in memory)
    reader: object              # loadr's reader (or the list) every loader reads
    nbytes: int                 # bytes on disk (or in memory)


# ---------------------------------------------------------------------------
# Synthetic pictures: smooth colour fields plus grain, so that JPEG sizes
# and decode times are those of photographs (~60 KB at 375×500 q90), not
# those of flat colour (tiny) or white noise (huge).


def _picture(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image
    small = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))
    grain = rng.integers(-10, 11, (h, w, 3), dtype=np.int16)
    return np.clip(img.astype(np.int16) + grain, 0, 255).astype(np.uint8)


def _jpeg(img: np.ndarray) -> bytes:
    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(img).save(out, 'JPEG', quality=JPEG_QUALITY)
    return out.getvalue()


def _dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# ---------------------------------------------------------------------------
# Making the data


def make_trivial(n: int) -> Data:
    """``n`` datapoints ``{'label': int, 'vec': float32[16]}`` in a list (no disk)."""
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((n, 16), dtype=np.float32)
    items = [{'label': i % 1000, 'vec': vecs[i]} for i in range(n)]
    return Data('trivial', TRIVIAL_BATCH, n, None, items, vecs.nbytes + 8 * n)


def distinct_pictures(n: int, seed: int = 1):
    """``n`` different 375×500 RGB pictures (uint8), made deterministically from ``seed``.

    Each is its own smooth colour field plus a window of a shared grain field
    at its own offset, so no two are alike and none costs a fresh noise draw.

    >>> [p.shape for p in distinct_pictures(2)]
    [(375, 500, 3), (375, 500, 3)]
    """
    from PIL import Image
    h, w = IMAGE_HW
    rng = np.random.default_rng(seed)
    grain = rng.integers(-IMAGE_GRAIN, IMAGE_GRAIN + 1, (2 * h, 2 * w, 3), dtype=np.int16)
    for _ in range(n):
        small = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))
        y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
        yield np.clip(img.astype(np.int16) + grain[y:y + h, x:x + w], 0, 255).astype(np.uint8)


def make_images(root: str, n: int, shardlen: int | None = None) -> Data:
    """A bag dataset of ``n`` distinct 375×500 q90 JPEGs (~97 KB) with int labels
    (in shards of ``shardlen`` images, if given)."""
    import loadr
    from loadr.writers import BagWriter
    path = os.path.join(root, 'images')
    with BagWriter(path, {'image': 'jpg', 'label': 'int'}, shardlen=shardlen) as w:
        for i, picture in enumerate(distinct_pictures(n)):
            w.append({'image': _jpeg(picture), 'label': i % 1000})
    reader = loadr.open(path, decode_images=False)
    return Data('images', IMAGE_BATCH, n, path, reader, _dir_bytes(path))


def make_video(root: str, n: int) -> Data:
    """A gulp dataset of ``n`` videos of 30–60 frames at 128×170 (JPEG q90)."""
    import loadr
    from loadr.writers import GulpWriter
    rng = np.random.default_rng(2)
    frames = [_jpeg(_picture(*FRAME_HW, rng)) for _ in range(UNIQUE_FRAMES)]
    path = os.path.join(root, 'video')
    k = 0
    with GulpWriter(path, videos_per_chunk=64) as w:
        for i in range(n):
            length = int(rng.integers(VIDEO_FRAMES[0], VIDEO_FRAMES[1] + 1))
            clip = [frames[(k + j) % len(frames)] for j in range(length)]
            k += length
            w.append(f'video{i}', {'label': i % 100}, clip)
    reader = loadr.open(path, decode_images=False)
    return Data('video', VIDEO_BATCH, n, path, reader, _dir_bytes(path))


def make_raw(root: str, n: int) -> Data:
    """An FFRecord file of ``n`` random 4 KiB records, read with checksums on."""
    from loadr.readers.ffrecord import FFRecordReader
    from loadr.writers import FFRecordWriter
    path = os.path.join(root, 'raw.ffr')
    rng = np.random.default_rng(3)
    block = rng.integers(0, 256, (1024, RECORD_BYTES), dtype=np.uint8)
    with FFRecordWriter(path, n) as w:
        for i in range(n):
            row = block[i % len(block)].copy()
            row[:8] = np.frombuffer(i.to_bytes(8, 'little'), np.uint8)   # every record unique
            w.write_one(row.tobytes())
    reader = FFRecordReader(path, check_data=True)
    return Data('raw', RAW_BATCH, n, path, reader, _dir_bytes(path))


class FarDataset:
    """``n`` trivial datapoints made from the index, for resuming far into a huge dataset.

    >>> FarDataset(10**9)[123]['label']
    123
    """

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        vec = np.full(16, index % 997, np.float32)
        return {'label': index % 1000, 'vec': vec}


# ---------------------------------------------------------------------------
# The per-sample functions (the same for every loader)


def _as_bytes(value) -> bytes:
    # granular's Loader turns every value into an array first (bytes -> 0-d |S array).
    if isinstance(value, np.ndarray):
        return value.tobytes()
    return bytes(value)


def _label(value) -> np.int64:
    # A numpy scalar, not an int: granular's Loader takes the spec from .dtype/.shape.
    return np.int64(value.item() if isinstance(value, np.ndarray) else value)


def identity_fn(dp: dict, seed=None) -> dict:
    """The trivial workload's per-sample function: the datapoint as it is."""
    return {'label': _label(dp['label']), 'vec': dp['vec']}


def image_fn(dp: dict, seed=0) -> dict:
    """Decode the JPEG (Pillow), crop a random 224×224 window, flip left-right half the time.

    ``seed`` is anything ``numpy.random.default_rng`` takes (an int, or
    granular's ``[seed, step]``).
    """
    from PIL import Image
    rng = np.random.default_rng(seed)
    with Image.open(io.BytesIO(_as_bytes(dp['image']))) as im:
        img = np.asarray(im.convert('RGB'))
    h, w = img.shape[:2]
    top = int(rng.integers(0, h - CROP + 1))
    left = int(rng.integers(0, w - CROP + 1))
    crop = img[top:top + CROP, left:left + CROP]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return {'image': np.ascontiguousarray(crop), 'label': _label(dp['label'])}


def tsn_positions(n: int, seed) -> list[int]:
    """TSN sampling as ``loadr.fns.sample_frames(num=8, mode='tsn')``: one frame per segment."""
    from loadr.fns import sample_frames
    return sample_frames(num=FRAMES_PER_CLIP, mode='tsn').positions(n, seed)


def video_fn(dp: dict, seed=0) -> dict:
    """Decode the (already chosen) frames with Pillow and stack them: uint8[8, 128, 170, 3]."""
    from PIL import Image
    frames = []
    for jpeg in dp['frames']:
        with Image.open(io.BytesIO(_as_bytes(jpeg))) as im:
            frames.append(np.asarray(im.convert('RGB')))
    return {'frames': np.stack(frames), 'label': _label(dp['meta']['label'])}


def raw_fn(dp: dict, seed=None) -> dict:
    """An FFRecord sample's bytes as a uint8 row (the copy every loader has to make)."""
    return {'data': np.frombuffer(_as_bytes(dp['data']), np.uint8)}
