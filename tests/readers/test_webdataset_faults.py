"""WebDataset shards that are not what their index says: stale indexes, truncated tars, keys
that a tar cannot hold. Each is a loadr error naming the tar, never other bytes or fewer
samples than the tar was written with."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

import loadr
from loadr.errors import FormatError, WriterError
from loadr.readers.webdataset import build_index, check
from loadr.readers.webdataset.index import (
    SIDECAR_SUFFIX,
    TarIndex,
    parse_sidecar,
    scan,
    sidecar_bytes,
)
from loadr.storage import LocalStorage
from loadr.writers import WebDatasetWriter

from .test_webdataset import sample

wds = pytest.importorskip('webdataset')
pytestmark = pytest.mark.timeout(120)

BIG = 20_000                   # over SMALL_MEMBER_BYTES: read in a range of its own


def member_values(k: int) -> dict:
    """Sample ``k``: two 1-byte members, and two large ones of one size."""
    rng = np.random.default_rng(k)
    return {'txt': f'sample {k}'.encode(), 'cls': str(k % 10).encode(),
            'id': str((k + 5) % 10).encode(), 'a.bin': rng.bytes(BIG), 'b.bin': rng.bytes(BIG)}


def write_tar(path, order, samples=4) -> None:
    """A tar of ``samples`` samples, each's members in ``order``, written as tools write:
    a new file renamed over the old."""
    new = f'{path}.new'
    with tarfile.open(new, 'w', format=tarfile.GNU_FORMAT) as t:
        for k in range(samples):
            values = member_values(k)
            for ext in order:
                info = tarfile.TarInfo(f'{k:04d}.{ext}')
                info.size, info.mtime = len(values[ext]), 0
                t.addfile(info, io.BytesIO(values[ext]))
    os.replace(new, path)


ORDER = ['txt', 'cls', 'id', 'a.bin', 'b.bin']
# Same first member, same offsets and sizes: only the names of the members moved.
REORDERED = ['txt', 'id', 'cls', 'b.bin', 'a.bin']


# -- a stale index ----------------------------------------------------------------------


def test_a_tar_replaced_with_the_same_size_and_mtime_is_never_read_by_its_old_index(tmp_path):
    tar = tmp_path / 'a.tar'
    write_tar(tar, ORDER)
    stamp = os.stat(tar)
    r = loadr.open(tar)
    assert r[1]['cls'] == 1 and r[1]['a.bin'] == member_values(1)['a.bin']
    assert os.path.exists(f'{tar}{SIDECAR_SUFFIX}')
    write_tar(tar, REORDERED)                        # as `rsync -t`, `cp -p` would leave it
    os.utime(tar, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert os.path.getsize(tar) == stamp.st_size
    r = loadr.open(tar)                               # the old sidecar: same size, not older
    # Whichever members are read (small ones together, a large one alone), each one's own
    # header is checked against the index.
    for mask in (None, {'cls': True}, {'id': True, 'txt': True}, {'a.bin': True},
                 {'b.bin': True}, {'txt': True, 'b.bin': True}):
        with pytest.raises(FormatError, match='does not match the tar') as err:
            r[2] if mask is None else r[2, mask]
        assert err.value.path == str(tar) and err.value.index == 2
        assert f'loadr index --rebuild {tar}' in str(err.value) and SIDECAR_SUFFIX in str(
            err.value)
    with pytest.raises(FormatError, match='does not match the tar'):
        r.read_batch([3, 0])
    assert r[2, {'txt': True}] == {'txt': 'sample 2'}        # the first member did not move
    assert any(p.path == f'{tar}{SIDECAR_SUFFIX}' for p in check(tar))
    build_index(tar, rebuild=True)                   # what the message says to do
    fresh = loadr.open(tar)
    for k in range(4):
        want = member_values(k)
        got = fresh[k]
        assert (got['cls'], got['id']) == (int(want['cls']), int(want['id']))
        assert (got['a.bin'], got['b.bin']) == (want['a.bin'], want['b.bin'])


def test_members_whose_names_the_header_cuts_read_right(tmp_path):
    # The header of a long or non-ASCII name holds a part or an ASCII form of it (the whole
    # is in an extended header before): the check must accept every form writers leave.
    keys = ['d/' + 'x' * 120 + '/k', 'é' * 70, 'y' * 98, 'plain']
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        tar = tmp_path / f'long{fmt}.tar'
        with tarfile.open(tar, 'w', format=fmt) as t:
            for key in keys:
                for ext, data in (('CLS', b'3'), ('bin', b'z' * BIG)):
                    info = tarfile.TarInfo(f'{key}.{ext}')
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        r = loadr.open(tar)
        assert [r[k] for k in range(len(keys))] == [
            {'__key__': key, 'cls': 3, 'bin': b'z' * BIG} for key in keys]


def _abbreviated(path, keys) -> None:
    """Members whose header holds a shortened name of a writer's own making (libarchive
    shortens long names so), the whole name in the pax header before it."""
    with tarfile.open(path, 'w', format=tarfile.PAX_FORMAT) as t:
        for key in keys:
            for ext, data in (('cls', b'3'), ('bin', key.encode() * 4000)):
                info = tarfile.TarInfo(f'short/{key[-3:]}.{ext}')
                info.size, info.pax_headers = len(data), {'path': f'{key}.{ext}'}
                t.addfile(info, io.BytesIO(data))


def test_a_header_name_in_a_form_of_its_writers_own_is_checked_by_a_scan(tmp_path):
    tar = tmp_path / 'abbr.tar'
    keys = [f'long/{"p" * 120}/{k:03d}' for k in range(3)]
    _abbreviated(tar, keys)
    stamp = os.stat(tar)
    theirs = list(wds.WebDataset(str(tar), shardshuffle=False, empty_check=False))
    assert [d['__key__'] for d in theirs] == keys
    r = loadr.open(tar)
    assert [r[k]['bin'] for k in range(3)] == [key.encode() * 4000 for key in keys]
    _abbreviated(tar, keys[::-1])                   # the same sizes, names and time
    os.utime(tar, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    with pytest.raises(FormatError, match='does not match the tar'):
        loadr.open(tar)[0]


# -- truncated tars ---------------------------------------------------------------------


def _written(kind: str, path) -> str:
    """A 40-sample shard written by the webdataset package or by loadr's writer."""
    if kind == 'webdataset':
        with wds.TarWriter(f'{path}.tar') as w:
            for k in range(40):
                w.write(sample(k))
        return f'{path}.tar'
    with WebDatasetWriter(path, shardlen=100) as w:
        for k in range(40):
            w.append(sample(k))
    return str(path / 'shard-000000.tar')


@pytest.mark.parametrize('kind', ['webdataset', 'loadr'])
def test_a_truncated_tar_is_an_error_naming_it_never_a_shorter_tar(tmp_path, kind):
    tar = _written(kind, tmp_path / 'w')
    raw = open(tar, 'rb').read()
    index = scan(LocalStorage(), tar)
    assert index.samples == 40 and len(loadr.open(tar)) == 40
    m = index.members // 2
    end = int(index.offset[-1] + index.size[-1])
    end += -end % 512                                # the last member's padded end
    cuts = {'in a member': int(index.offset[m]) + 3,
            'in a header': int(index.offset[m]) - 300,
            'between members': int(index.offset[m]) - 512,     # at a header's first byte
            'half the file': len(raw) // 2,
            'before the end-of-archive blocks': end,
            'in the end-of-archive blocks': end + 512,
            'in the end-of-archive block': end + 100}
    cut = tmp_path / 'cut.tar'
    for where, at in cuts.items():
        cut.write_bytes(raw[:at])
        with pytest.raises(FormatError, match='truncated') as err:
            loadr.open(cut)
        assert err.value.path == str(cut), where
        with pytest.raises(FormatError, match='truncated'):
            build_index(cut)
        report = loadr.check(cut)
        assert not report.ok and report.problems[0].path == str(cut), where
        assert 'truncated' in report.problems[0].message
    # What follows the end-of-archive blocks is padding: cutting there loses nothing.
    cut.write_bytes(raw[:end + 1024])
    assert len(loadr.open(cut)) == 40 and loadr.check(cut).ok
    empty = tmp_path / 'empty.tar'
    empty.write_bytes(b'')
    with pytest.raises(FormatError, match='truncated.*empty'):
        loadr.open(empty)


def test_a_sidecar_an_older_loadr_made_of_a_truncated_tar_is_not_trusted(tmp_path):
    tar = _written('webdataset', tmp_path / 'w')
    full = scan(LocalStorage(), tar)
    s = 22                                           # the samples left whole by the cut
    m = int(full.first[s])
    at = int(full.offset[m]) - 512
    cut = tmp_path / 'cut.tar'
    cut.write_bytes(open(tar, 'rb').read()[:at])
    short = TarIndex(at, full.offset[:m], full.size[:m], full.ext[:m], full.exts,
                     full.first[:s + 1], full.key_at[:s + 1],
                     full.key_bytes[:int(full.key_at[s])])
    assert short.problem() is None
    old = bytearray(sidecar_bytes(short))
    old[8:12] = (1).to_bytes(4, 'little')           # version 1, made before ends were checked
    (tmp_path / f'cut.tar{SIDECAR_SUFFIX}').write_bytes(bytes(old))
    assert parse_sidecar(bytes(old), at) is None
    with pytest.raises(FormatError, match='truncated'):
        loadr.open(cut)


# -- keys a tar cannot hold -------------------------------------------------------------


@pytest.mark.parametrize('keys,problem', [
    (['a', 'a'], 'already the key of datapoint 0'),
    (['a', 'b', 'a'], 'already the key of datapoint 0'),
    (['a', 'x\0y'], 'NUL'),
    (['a', '../etc/passwd'], '".." part'),
    (['a', 'd/../../x'], '".." part'),
    (['a', '/abs/x'], 'absolute'),
    (['a', 'd/'], 'last part'),
])
def test_the_writer_refuses_keys_a_tar_cannot_hold(tmp_path, keys, problem):
    out = tmp_path / 'out'
    with WebDatasetWriter(out, shardlen=10) as w:
        for k, key in enumerate(keys[:-1]):
            w.append({'__key__': key, 'cls': k})
        with pytest.raises(WriterError, match=problem) as err:
            w.append({'__key__': keys[-1], 'jpg': b'x', 'cls': 9})
        assert err.value.index == len(keys) - 1
        w.append({'__key__': 'z', 'cls': 7})         # nothing of it was written: go on
    tar = str(out / 'shard-000000.tar')
    names = [*keys[:-1], 'z']
    # The sidecar, a scan of the tar and webdataset agree on every sample.
    assert [loadr.open(tar)[k]['__key__'] for k in range(len(names))] == names
    assert sidecar_bytes(scan(LocalStorage(), tar)) == open(tar + SIDECAR_SUFFIX, 'rb').read()
    theirs = list(wds.WebDataset(tar, shardshuffle=False, empty_check=False))
    assert [d['__key__'] for d in theirs] == names
    # A key may come again in another shard (each tar is unpacked and read on its own).
    with WebDatasetWriter(tmp_path / 'two', shardlen=1) as w:
        w.append({'__key__': 'a', 'cls': 1})
        w.append({'__key__': 'a', 'cls': 2})
    assert [d['cls'] for d in loadr.open(tmp_path / 'two').read_batch([0, 1])] == [1, 2]


def _tar_of(path, names) -> str:
    with tarfile.open(path, 'w') as t:
        for k, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = 1
            t.addfile(info, io.BytesIO(str(k % 10).encode()))
    return str(path)


def test_repeated_keys_in_a_tar_read_as_webdataset_reads_them(tmp_path):
    # Consecutive members of one key are one sample; the key again later, another sample;
    # what webdataset skips (__meta__ files and folders), skipped.
    tar = _tar_of(tmp_path / 'r.tar', ['a.cls', 'a.txt', 'b.cls', 'a.id', '__meta__/x.cls',
                                       '__info__', 'c.cls'])
    theirs = [{k: v for k, v in d.items() if k == '__key__' or not k.startswith('__')}
              for d in wds.WebDataset(tar, shardshuffle=False, empty_check=False).decode()]
    r = loadr.open(tar)
    assert [r[k] for k in range(len(r))] == theirs == [
        {'__key__': 'a', 'cls': 0, 'txt': '1'}, {'__key__': 'b', 'cls': 2},
        {'__key__': 'a', 'id': 3}, {'__key__': 'c', 'cls': 6}]
    # Two members of one name in one sample: webdataset raises, and so does loadr, naming it.
    dup = _tar_of(tmp_path / 'd.tar', ['a.cls', 'b.cls', 'b.txt', 'b.cls'])
    with pytest.raises(ValueError, match='duplicate'):
        list(wds.WebDataset(dup, shardshuffle=False, empty_check=False))
    with pytest.raises(FormatError, match="member 3 .*'b.cls'.*duplicate") as err:
        loadr.open(dup)
    assert err.value.path == dup and err.value.index == 1
    assert not loadr.check(dup).ok
