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


def test_a_folder_link_that_loops_lists_each_image_once(photos, tmp_path, caplog):
    want = loadr.open(photos).paths
    os.symlink('..', photos / 'cat' / 'up')                 # back to the root
    os.symlink('..', photos / 'dog' / 'deep' / 'again')     # back to its own class folder
    outside = tmp_path / 'outside'
    outside.mkdir()
    (outside / 'o.jpg').write_bytes(image(50))
    os.symlink(outside, photos / 'dog' / 'more')            # no loop: followed as before
    with caplog.at_level('WARNING', logger='loadr'):
        r = loadr.open(photos)
    assert r.paths == want + ['dog/more/o.jpg'] and len(r) == 9
    assert r[8]['image'] == (outside / 'o.jpg').read_bytes()
    assert 'cat/up' in caplog.text and 'dog/deep/again' in caplog.text and 'loop' in caplog.text
    assert check(photos) == []
    # ingest lists the same images (it did not follow the link out of the folder).
    ingest_images(str(photos), str(tmp_path / 'bag'), workers=1)
    bag = loadr.open(tmp_path / 'bag', decode_images=False)
    assert [bag[i]['path'] for i in range(len(bag))] == r.paths
    for i in range(len(r)):
        assert_equal(r[i], bag[i], f'datapoint {i}')


def torchvision_numbering(root) -> tuple[list, dict]:
    """``(classes, {relative path: label})`` by torchvision's ``find_classes`` and
    ``make_dataset``: the sorted directory entries of the root (dot-named ones too), and
    every file of a known extension under each, links followed."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    number = {name: k for k, name in enumerate(classes)}
    out = {}
    for name in sorted(number):
        for folder, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for file in sorted(files):
                if file.lower().endswith(('.jpg', '.jpeg', '.png')):
                    out[os.path.relpath(os.path.join(folder, file), root)] = number[name]
    return classes, out


@pytest.fixture
def notebook_photos(tmp_path):
    """Classes with a dot-named one, which sorts first, and names sorted by code point."""
    root = tmp_path / 'photos'
    for k, rel in enumerate(['.ipynb_checkpoints/a-checkpoint.jpg', 'cat/1.jpg', 'cat/2.jpg',
                             'dog/1.jpg', '_x/1.jpg', 'Zebra/9.jpg']):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(image(k))
    return root


def test_dot_named_class_folders_are_numbered_as_torchvision_numbers_them(notebook_photos,
                                                                          caplog):
    root = notebook_photos
    classes, labels = torchvision_numbering(root)
    assert classes[0] == '.ipynb_checkpoints'
    with caplog.at_level('WARNING', logger='loadr'):
        r = loadr.open(root)
    assert r.classes == classes
    assert dict(zip(r.paths, r.labels)) == labels
    assert r[r.paths.index('dog/1.jpg')]['label'] == classes.index('dog')
    assert "'.ipynb_checkpoints'" in caplog.text and 'label 0' in caplog.text


def test_dot_named_class_folders_against_torchvision_itself(notebook_photos):
    tv = pytest.importorskip('torchvision.datasets')
    folder = tv.ImageFolder(str(notebook_photos))
    r = loadr.open(notebook_photos)
    assert folder.classes == r.classes
    assert {os.path.relpath(p, notebook_photos): y for p, y in folder.samples} == \
        dict(zip(r.paths, r.labels))


def test_ingest_numbers_dot_named_class_folders_as_the_reader_does(tmp_path):
    root = tmp_path / 'photos'
    for k, rel in enumerate(['.hidden/a.jpg', 'cat/1.jpg', 'dog/1.jpg']):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(image(k))
    ingest_images(str(root), str(tmp_path / 'bag'), workers=1)
    bag = loadr.open(tmp_path / 'bag', decode_images=False)
    r = loadr.open(root)
    assert r.classes == ['.hidden', 'cat', 'dog'] and len(bag) == len(r) == 3
    for i in range(len(r)):
        assert_equal(r[i], bag[i], f'datapoint {i}')


def test_an_empty_dot_named_folder_is_an_empty_class_as_in_torchvision(photos):
    (photos / '.cache').mkdir()
    with pytest.raises(ConfigError, match=r"'\.cache'.*dot-named"):
        loadr.open(photos)
    r = loadr.open(photos, allow_empty=True)
    assert r.classes == ['.cache', 'b10', 'b2', 'cat', 'dog']
    assert sorted(set(r.labels)) == [1, 2, 3, 4]             # every label one up, as there
