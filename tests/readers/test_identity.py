"""reader.identity(): what a saved state names as its dataset (small, JSON, no content read)."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

import loadr


@pytest.mark.parametrize('rel, options', [
    ('bag', {}), ('bag_sharded', {}), ('gulp', {}), ('gulp_pickle', {'allow_pickle': True}),
    ('ffrecord/multi', {}), ('ffrecord/single.ffr', {})])
def test_identity_is_small_json_relative_and_stable(fixtures, tmp_path, rel, options):
    r = loadr.open(fixtures / rel, **options)
    ident = r.identity()
    assert ident['format'] == loadr.readers.detect(fixtures / rel).name
    assert ident['datapoints'] == len(r)
    text = json.dumps(ident)
    assert len(text) < 1000 and str(fixtures) not in text
    assert pickle.loads(pickle.dumps(r)).identity() == ident
    # The same dataset elsewhere has the same identity: paths are relative to it.
    moved = tmp_path / rel
    moved.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if (fixtures / rel).is_dir() else shutil.copy)(fixtures / rel, moved)
    assert loadr.open(moved, **options).identity() == ident


def test_identity_names_every_file_with_its_size(fixtures):
    ident = loadr.open(fixtures / 'gulp').identity()
    sizes = {p.name: p.stat().st_size for p in (fixtures / 'gulp').iterdir()
             if p.suffix in ('.gulp', '.gmeta')}
    assert ident['files'] == sizes
    many = loadr.open(fixtures / 'bag_sharded').identity()      # 21 files: listed by a hash
    assert many['file_count'] == 21 and len(many['files_sha256']) == 64
    assert many['bytes'] == sum(p.stat().st_size for p in (fixtures / 'bag_sharded').rglob('*')
                                if p.is_file())
