"""Whole files gone wrong, each a named, specific error that names the file (and the index).

Truncation, chunk pairs, shard gaps and most corruptions have their tests in
``tests/readers``; these are the cases that were missing: permission denied
(for real), zero-length files in every role, files of the wrong format in
every role, and a spec.json that disagrees with refs.bag.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import numpy as np
import pytest

import loadr
from loadr.errors import DecodeError, FormatError, LoadrError

from ..conftest import FIXTURES

pytestmark = pytest.mark.timeout(60)

NOBODY = 65534


@pytest.fixture
def data(fixtures):
    """A writable copy of the fixtures, in a directory every user can enter (see denied())."""
    root = pathlib.Path(tempfile.mkdtemp(prefix='loadr-bad-'))
    try:            # removed however the copy or the test ends (it leaked when a copy failed)
        os.chmod(root, 0o755)
        for name in ('gulp', 'bag', 'bag_sharded', 'ffrecord'):
            shutil.copytree(fixtures / name, root / name)
        for p in root.rglob('*'):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def read_everything(path, **options) -> None:
    r = loadr.open(path, **options)
    for i in range(len(r)):
        r[i]


def outcome(path, **options):
    """(error class name, path, index, message) of opening and reading ``path``, or 'ok'."""
    try:
        read_everything(path, **options)
    except LoadrError as exc:
        return type(exc).__name__, exc.path, exc.index, exc.message
    return 'ok'


def denied(path, deny):
    """What reading ``path`` gives to a user who may not read ``deny``, and check()'s problems.

    As root, chmod 000 denies nothing, so the reading happens in a forked child
    that has become the unprivileged user 'nobody' (a real EACCES, no mock).
    """
    os.chmod(deny, 0)
    read_everything(FIXTURES / 'bag')       # import every plugin before dropping privileges
    read_everything(FIXTURES / 'gulp')
    try:
        if os.geteuid() != 0:
            return outcome(path), [(p.path, p.index) for p in loadr.check(path).problems]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                result = [outcome(path), [(p.path, p.index) for p in loadr.check(path).problems]]
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails
                result = [('raised', repr(exc)), []]
            finally:
                os.write(w, json.dumps(result).encode())
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            got = f.read()
        os.waitpid(pid, 0)
        first, problems = json.loads(got)
        return tuple(first) if isinstance(first, list) else first, \
            [tuple(p) for p in problems]
    finally:
        os.chmod(deny, 0o644)


@pytest.mark.parametrize('dataset,deny,index', [
    ('ffrecord/single.ffr', 'ffrecord/single.ffr', None),
    ('ffrecord/multi', 'ffrecord/multi/PART_00001.ffr', None),
    ('gulp', 'gulp/meta_1.gmeta', None),
    ('gulp', 'gulp/data_1.gulp', 3),                # the first video of chunk 1
    ('bag', 'bag/spec.json', None),
    ('bag', 'bag/tags.bag', None),
    ('bag_sharded', 'bag_sharded/000002/refs.bag', None),
])
def test_permission_denied_is_a_read_error_naming_the_file(data, dataset, deny, index):
    (kind, path, got_index, message), problems = denied(data / dataset, data / deny)
    assert (kind, path, got_index) == ('ReadError', str(data / deny), index)
    assert 'EACCES' in message and message.count('EACCES') == 1
    assert (str(data / deny), index) in problems


@pytest.mark.parametrize('dataset,empty,error,match,index', [
    ('gulp', 'meta_0.gmeta', FormatError, r'\.gmeta file is empty', None),
    ('gulp', 'data_1.gulp', FormatError, r"video '10' frame 0: .* past the end", 3),
    ('gulp', 'label2idx.json', None, None, None),    # optional, only read on demand: below
    ('bag', 'spec.json', FormatError, 'not valid JSON', None),
    ('bag', 'refs.bag', FormatError, r'refs.bag is empty but feat.bag holds 12 records', None),
    ('bag', 'tags.bag', FormatError, r"refs entry for 'tags' .* run past a bag of 0", 1),
    ('bag', 'idx.bag', FormatError, r'record 0 is out of range for a bag of 0', 0),
])
def test_zero_length_files_in_every_role(data, dataset, empty, error, match, index):
    target = data / dataset / empty
    target.write_bytes(b'')
    if error is None:
        with pytest.raises(FormatError, match='not valid JSON') as info:
            _ = loadr.open(data / dataset).label2idx
        assert info.value.path == str(target)
        return
    with pytest.raises(error, match=match) as info:
        read_everything(data / dataset)
    where = str(data / dataset / 'refs.bag') if empty in ('tags.bag', 'idx.bag') else str(target)
    assert (info.value.path, info.value.index) == (where, index)
    assert (where, index) in [(p.path, p.index) for p in loadr.check(data / dataset).problems]


def test_files_of_the_wrong_format_in_every_role(data):
    jpeg = (data / 'gulp' / 'data_0.gulp').read_bytes()[:2536]      # vid_a's first frame
    png = loadr.codecs.encode('png', np.zeros((4, 4), np.uint8))
    # Nothing loadr knows: a detection error naming the path and what was looked for.
    (data / 'picture.png').write_bytes(png)
    with pytest.raises(FormatError, match='not a dataset loadr knows') as info:
        loadr.open(data / 'picture.png')
    assert info.value.path == str(data / 'picture.png')
    # A JPEG and a bag file named .ffr.
    (data / 'photo.ffr').write_bytes(jpeg)
    with pytest.raises(FormatError, match='header claims') as info:
        loadr.open(data / 'photo.ffr')
    assert info.value.path == str(data / 'photo.ffr')
    shutil.copy(data / 'bag' / 'idx.bag', data / 'labels.ffr')
    with pytest.raises(FormatError, match='too short|header claims') as info:
        loadr.open(data / 'labels.ffr')
    # A .gmeta that holds a bag spec, a .gulp that holds PNG frames.
    meta = data / 'gulp' / 'meta_1.gmeta'
    original = meta.read_bytes()
    shutil.copy(data / 'bag' / 'spec.json', meta)
    assert outcome(data / 'gulp')[:3] == ('FormatError', str(meta), 3)
    meta.write_bytes(original)
    gulp = data / 'gulp' / 'data_0.gulp'
    gulp.write_bytes(png + b'\0' * (len(gulp.read_bytes()) - len(png)))
    with pytest.raises(DecodeError, match='not a JPEG') as info:
        loadr.open(data / 'gulp')[0]
    assert (info.value.path, info.value.index) == (str(gulp), 0)
    # A spec.json that is a .gmeta, a refs.bag that is a value bag.
    spec = data / 'bag' / 'spec.json'
    shutil.copy(meta, spec)
    assert outcome(data / 'bag')[:3] == ('FormatError', str(spec), None)
    shutil.copy(FIXTURES / 'bag' / 'spec.json', spec)
    os.chmod(spec, 0o644)
    shutil.copy(data / 'bag' / 'idx.bag', data / 'bag' / 'refs.bag')
    assert outcome(data / 'bag')[:3] == ('FormatError', str(data / 'bag' / 'refs.bag'), 0)


@pytest.mark.parametrize('change,error,match,where', [
    ({'idx': 'int[]'}, FormatError, r"refs entry for 'idx' \(int\[\]\): must be \[\]", 'refs.bag'),
    ({'frames': 'jpg'}, FormatError, r"refs entry for 'frames' \(jpg\): must be an int",
     'refs.bag'),
    ({'zz': 'int'}, FormatError, 'must be a list of 8 entries', 'refs.bag'),
    ({'feat': 'utf8'}, DecodeError, "value of 'feat' .*bad utf8", 'feat.bag'),
    ({'name': 'png'}, DecodeError, "value of 'name' .*not a JPEG or PNG", 'name.bag'),
])
def test_a_spec_that_disagrees_with_refs_and_bags(data, change, error, match, where):
    spec_path = data / 'bag' / 'spec.json'
    spec = json.loads(spec_path.read_text())
    spec.update(change)
    spec_path.write_text(json.dumps(dict(sorted(spec.items()))))
    for key in change:
        if not (data / 'bag' / f'{key}.bag').exists():
            shutil.copy(data / 'bag' / 'idx.bag', data / 'bag' / f'{key}.bag')
    with pytest.raises(error, match=match) as info:
        read_everything(data / 'bag')
    assert (info.value.path, info.value.index) == (str(data / 'bag' / where), 0)
    assert (str(data / 'bag' / where), 0) in [(p.path, p.index)
                                              for p in loadr.check(data / 'bag').problems]
