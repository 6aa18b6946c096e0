"""Small datasets the tests write themselves, shaped like the reference fixtures.

The tests of the config, the command line and the loader over real readers
need *a* dataset, not the reference one: these write one with loadr's own
writers in a test's folder, so those tests run from a bare clone. What the
content is matters only as far as the tests read it (the keys, how many
datapoints), and it is a pure function of the arguments.

Example::

    path = write_bag(tmp_path / 'bag')          # 12 datapoints: image (jpg), idx, name, ...
"""

from __future__ import annotations

import io
import pathlib

import msgpack
import numpy as np
from PIL import Image

from loadr.writers import BagWriter, FFRecordWriter, GulpWriter

__all__ = ['jpeg', 'write_bag', 'write_bag_sharded', 'write_gulp', 'write_ffrecord',
           'write_ffrecord_multi', 'image_folder']

# Sizes of the reference fixtures' images: every dataset mixes sizes and modes on purpose.
SHAPES = ((100, 133, 3), (133, 100, 3), (48, 64, 3), (64, 48, 3), (60, 80))


def jpeg(shape=(24, 32, 3), seed: int = 0, fmt: str = 'JPEG') -> bytes:
    """Encoded noise with a smooth part (so crops and flips change the bytes)."""
    rng = np.random.default_rng(seed)
    h, w = shape[:2]
    ramp = np.add.outer(np.arange(h) * 3, np.arange(w) * 2) % 256
    noise = rng.integers(0, 60, shape)
    pixels = ((ramp if len(shape) == 2 else ramp[:, :, None]) + noise) % 256
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buf, fmt)
    return buf.getvalue()


def write_bag(path, n: int = 12) -> pathlib.Path:
    """A bag like the fixture ``bag``: ``image`` (jpg), ``idx`` (int), ``name`` (utf8), ``feat``."""
    path = pathlib.Path(path)
    spec = {'image': 'jpg', 'idx': 'int', 'name': 'utf8', 'feat': 'array'}
    with BagWriter(path, spec) as w:
        for i in range(n):
            w.append({'image': jpeg(SHAPES[i % len(SHAPES)], seed=i), 'idx': 7 * i + 3,
                      'name': f'item-{i}', 'feat': np.arange(4, dtype=np.float32) * i})
    return path


def write_bag_sharded(path, n: int = 13, shardlen: int = 5) -> pathlib.Path:
    """A sharded bag like ``bag_sharded``: ``image``, ``idx``, ``label`` (utf8, a list key)."""
    path = pathlib.Path(path)
    with BagWriter(path, {'image': 'jpg', 'idx': 'int', 'label': 'utf8'}, shardlen=shardlen) as w:
        for i in range(n):
            w.append({'image': jpeg(SHAPES[i % len(SHAPES)], seed=100 + i), 'idx': i,
                      'label': ('cat', 'dog', 'bird')[i % 3]})
    return path


def write_gulp(path, videos: int = 6, per_chunk: int = 3) -> pathlib.Path:
    """A gulp directory like ``gulp``: videos of 3..8 frames, meta ``{label, label_idx}``."""
    path = pathlib.Path(path)
    labels = ['jump', 'run', 'wave']
    with GulpWriter(path, videos_per_chunk=per_chunk,
                    label2idx={name: i for i, name in enumerate(labels)}) as w:
        for v in range(videos):
            shape = SHAPES[v % len(SHAPES)]
            frames = [jpeg(shape, seed=1000 + 10 * v + k) for k in range(3 + v)]
            label = labels[v % len(labels)]
            w.append(f'vid_{v}', {'label': label, 'label_idx': v % len(labels)}, frames)
    return path


def write_ffrecord(path, n: int = 20, seed: int = 0) -> pathlib.Path:
    """One .ffr file of msgpack ``{image: JPEG bytes, label: int < 1000}`` samples."""
    path = pathlib.Path(path)
    with FFRecordWriter(path, n) as w:
        for i in range(n):
            image = jpeg(SHAPES[i % len(SHAPES)], seed=seed + i)
            w.write_one(msgpack.packb({'image': image, 'label': (37 * (seed + i)) % 1000}))
    return path


def write_ffrecord_multi(path, sizes=(7, 5)) -> pathlib.Path:
    """A directory of .ffr files, like ``ffrecord/multi``."""
    path = pathlib.Path(path)
    path.mkdir(parents=True)
    for k, n in enumerate(sizes):
        write_ffrecord(path / f'part_{k}.ffr', n, seed=50 * k)
    return path


def image_folder(root, sizes=((24, 32), (40, 30), (33, 33), (20, 50)),
                 labels=('cat', 'dog')) -> pathlib.Path:
    """``root/<label>/<i>.jpg`` photos of different sizes, as a user's folder has."""
    root = pathlib.Path(root)
    for j, label in enumerate(labels):
        (root / label).mkdir(parents=True)
        for i, (h, w) in enumerate(sizes):
            (root / label / f'{i}.jpg').write_bytes(jpeg((h, w, 3), seed=10 * j + i))
    return root
