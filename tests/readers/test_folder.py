"""Image folders in place: ingest's labels and order, no copy."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

import loadr
from loadr import fns
from loadr.errors import ConfigError
from loadr.ingest import ingest_images
from loadr.readers.folder import ImageFolderReader, check

from ..loader_helpers import stream_digests
from .common import assert_equal, check_reader_contract

pytestmark = pytest.mark.timeout(60)


def image(seed: int, fmt: str = 'JPEG') -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (12, 10, 3), np.uint8)).save(out, fmt)
    return out.getvalue()


@pytest.fixture
def photos(tmp_path):
    """Classes out of natural order (b10 before b2 sorted), nested folders, odd files."""
    root = tmp_path / 'photos'
    layout = {'cat': ['10.jpg', '2.jpg', 'sub/1.jpg', '.hidden.jpg', 'notes.txt'],
              'b10': ['a.jpg', 'b.JPG'], 'b2': ['x.jpeg'], 'dog': ['1.jpg', 'deep/er/z.jpg']}
    seed = 0
    for label, files in layout.items():
        for name in files:
            path = root / label / name
            path.parent.mkdir(parents=True, exist_ok=True)
            fmt = 'PNG' if name.endswith('png') else 'JPEG'
            path.write_bytes(image(seed, fmt) if not name.endswith('txt') else b'text')
            seed += 1
    (root / '.cache').mkdir()
    (root / 'loose.txt').write_bytes(b'x')
    return root


def test_the_same_datapoints_as_ingest(photos, tmp_path):
    r = loadr.open(photos)
    assert isinstance(r, ImageFolderReader) and r.classes == ['b10', 'b2', 'cat', 'dog']
    ingest_images(str(photos), str(tmp_path / 'bag'), workers=1)
    bag = loadr.open(tmp_path / 'bag', decode_images=False)
    assert len(r) == len(bag) == 8
    for i in range(len(r)):
        assert_equal(r[i], bag[i], f'datapoint {i}')
    assert r[0]['image'] == (photos / r[0]['path']).read_bytes()
    check_reader_contract(r)
    assert r[3, {'label': True}] == {'label': r[3]['label']}


def test_the_same_batches_as_the_ingested_bag_for_any_worker_count(photos, tmp_path):
    ingest_images(str(photos), str(tmp_path / 'bag'), workers=1)
    pipeline = [fns.select(keys=['image', 'label']), fns.decode_jpeg(key='image', size=(8, 8))]
    streams = []
    for reader in (loadr.open(photos), loadr.open(tmp_path / 'bag', decode_images=False)):
        for workers in (0, 2):
            with loadr.Loader(reader, batch=3, fns=pipeline, seed=4, workers=workers) as loader:
                streams.append(stream_digests(loader, 6))
    assert streams[0] == streams[1] == streams[2] == streams[3]


def test_empty_class_folders_are_refused_unless_allowed(photos):
    (photos / 'empty').mkdir()
    with pytest.raises(ConfigError, match='empty'):
        loadr.open(photos)
    r = loadr.open(photos, allow_empty=True)
    assert r.classes[-2:] == ['dog', 'empty'] and len(r) == 8


def test_check_decodes_every_image_and_names_the_bad_one(photos):
    assert check(photos) == []
    bad = photos / 'dog' / '1.jpg'
    bad.write_bytes(bad.read_bytes()[:40])
    problems = check(photos)
    r = loadr.open(photos)
    assert [(p.path, p.index) for p in problems] == [(str(bad), r.paths.index('dog/1.jpg'))]
    assert not loadr.check(photos).ok


def test_a_folder_without_class_folders_is_no_dataset(tmp_path):
    (tmp_path / 'flat').mkdir()
    (tmp_path / 'flat' / 'a.jpg').write_bytes(image(0))
    with pytest.raises(loadr.errors.FormatError, match='not a dataset loadr knows'):
        loadr.open(tmp_path / 'flat')
    assert os.listdir(tmp_path / 'flat') == ['a.jpg']
