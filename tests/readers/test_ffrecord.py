"""FFRecord: the reference fixtures, the writer, and every kind of damage, each with its error."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tracemalloc
import warnings
import zlib

import msgpack
import numpy as np
import pytest

import loadr
from loadr.codecs import decode_image
from loadr.errors import (
    ChecksumError,
    ConfigError,
    DecodeError,
    FormatError,
    ReadError,
    SpecError,
    WriterError,
)
from loadr.readers import ffrecord
from loadr.readers.ffrecord import FORMAT, FFRecordReader, FFRecordWriter, check, detect
from tests.readers.common import check_reader_contract

KEYS = ('ffrecord_single', 'ffrecord_multi')


def sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


def dataset(manifest, key):
    return manifest['datasets'][key]


def fixture_path(fixtures, manifest, key):
    return fixtures / dataset(manifest, key)['path']


def copy_fixture(fixtures, manifest, key, tmp_path):
    """A writable copy of a fixture (file or directory) in tmp_path."""
    src = fixture_path(fixtures, manifest, key)
    dst = tmp_path / src.name
    if src.is_dir():
        shutil.copytree(src, dst)
        for p in dst.iterdir():
            p.chmod(0o644)
        dst.chmod(0o755)
    else:
        shutil.copyfile(src, dst)
        dst.chmod(0o644)
    return dst


def parse_header(path):
    """Our own reading of a header, independent of the module under test."""
    raw = path.read_bytes()
    meta, n = struct.unpack_from('<Iq', raw, 0)
    crcs = np.frombuffer(raw, '<u4', n, 12).copy()
    offsets = np.frombuffer(raw, '<i8', n, 12 + 4 * n).copy()
    return meta, n, crcs, offsets


def write_header(path, n, crcs, offsets, meta=None):
    """Overwrite a header in place; the metadata CRC is recomputed unless given."""
    body = struct.pack('<q', n) + np.asarray(crcs, '<u4').tobytes() + \
        np.asarray(offsets, '<i8').tobytes()
    if meta is None:
        meta = zlib.crc32(body)
    with open(path, 'r+b') as f:
        f.write(struct.pack('<I', meta) + body)


def flip(path, offset):
    with open(path, 'r+b') as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def write_ffr(path, samples):
    with FFRecordWriter(path, len(samples)) as w:
        for s in samples:
            w.write_one(s)
    return path


# -- the reference fixtures -----------------------------------------------------


@pytest.mark.parametrize('key', KEYS)
def test_headers_match_manifest(fixtures, manifest, key):
    ds = dataset(manifest, key)
    r = FFRecordReader(fixture_path(fixtures, manifest, key))
    assert r.n == len(r) == ds['n']
    assert len(r.files) == len(ds['files'])
    for k, want in enumerate(ds['files']):
        assert os.path.samefile(r.files[k], fixtures / want['path'])
        got = r.file_info(k)
        for field in ('n', 'meta_checksum', 'header_size', 'file_size', 'crc32', 'offsets'):
            assert got[field] == want[field], (want['path'], field)


@pytest.mark.parametrize('key', KEYS)
def test_samples_match_manifest(fixtures, manifest, key):
    ds = dataset(manifest, key)
    r = FFRecordReader(fixture_path(fixtures, manifest, key))
    batch = r.read(range(r.n))
    assert [sha256(b) for b in batch] == [s['sha256'] for s in ds['samples']]
    for s in ds['samples']:
        i = s['index']
        where = r.locate(i)
        assert (where['file_index'], where['local_index'], where['offset'], where['length'],
                where['crc32']) == (s['file_index'], s['local_index'], s['offset'], s['length'],
                                    s['crc32'])
        one = r.read_one(i)
        assert isinstance(one, bytes) and len(one) == s['length'] and sha256(one) == s['sha256']
        assert r[i] == {'data': one}
        assert r.available(i) == {'data': True}
    assert r.spec == {'data': 'bytes'}


@pytest.mark.parametrize('key', KEYS)
def test_msgpack_content_matches_manifest(fixtures, manifest, key):
    ds = dataset(manifest, key)
    r = FFRecordReader(fixture_path(fixtures, manifest, key), decode='msgpack')
    assert r.spec == {'image': 'bytes', 'label': 'int'}
    for s, dp in zip(ds['samples'], r.read_batch(range(r.n))):
        content = s['content']
        assert sorted(dp) == content['keys'] == ['image', 'label']
        assert dp['label'] == content['label']
        image = content['image']
        assert len(dp['image']) == image['len'] and sha256(dp['image']) == image['sha256']
        pixels = decode_image(dp['image'])
        assert list(pixels.shape) == image['pillow']['shape']
        assert str(pixels.dtype) == image['pillow']['dtype']
        assert sha256(pixels.tobytes()) == image['pillow']['sha256']
        assert r[s['index'], {'label': True}] == {'label': content['label']}


def test_reader_contract_single_raw(fixtures, manifest):
    everything = check_reader_contract(
        FFRecordReader(fixture_path(fixtures, manifest, 'ffrecord_single')))
    assert [sha256(dp['data']) for dp in everything] == \
        [s['sha256'] for s in dataset(manifest, 'ffrecord_single')['samples']]


def test_reader_contract_multi_msgpack(fixtures, manifest):
    everything = check_reader_contract(
        FFRecordReader(fixture_path(fixtures, manifest, 'ffrecord_multi'), decode='msgpack'))
    assert [dp['label'] for dp in everything] == \
        [s['content']['label'] for s in dataset(manifest, 'ffrecord_multi')['samples']]


def test_read_orders_and_repeats(fixtures, manifest):
    ds = dataset(manifest, 'ffrecord_multi')
    r = FFRecordReader(fixture_path(fixtures, manifest, 'ffrecord_multi'))
    order = [11, 0, 7, 6, 6, 1, 2, 3, 8, 9, 10, 0]
    assert [sha256(b) for b in r.read(order)] == [ds['samples'][i]['sha256'] for i in order]
    assert r.read([]) == []
    assert r.read(np.array([3, 2])) == [r.read_one(3), r.read_one(2)]
    with pytest.raises(IndexError):
        r.read([0, 12])
    with pytest.raises(TypeError):
        r.read([0, 1.5])


def test_coalesced_reads_match_single_reads(tmp_path):
    # Small adjacent samples take the coalesced path; big ones do not.
    rng = np.random.default_rng(1)
    sizes = [0, 1, 100, 5000, 20000, 3, 0, 70000, 10, 10, 10]
    samples = [rng.bytes(n) for n in sizes] * 3
    r = FFRecordReader(write_ffr(tmp_path / 'x.ffr', samples))
    assert r.read(range(len(samples))) == samples
    assert r.read(list(range(len(samples)))[::-1]) == samples[::-1]
    assert [r.read_one(i) for i in range(len(samples))] == samples
    # A bad sample inside a coalesced run is still named exactly.
    flip(tmp_path / 'x.ffr', r.locate(9)['offset'])
    with pytest.raises(ChecksumError) as err:
        r.read([8, 9, 10])
    assert err.value.index == 9
    assert r.read([8, 10, 11]) == [samples[8], samples[10], samples[11]]


def test_random_batches_with_repeats_and_neighbours_match_single_reads(tmp_path):
    rng = np.random.default_rng(2)
    samples = [rng.bytes(int(n)) for n in rng.integers(0, 3000, 120)]
    parts = [write_ffr(tmp_path / f'{k}.ffr', samples[k * 40:(k + 1) * 40]) for k in range(3)]
    assert len(parts) == 3
    r = FFRecordReader(str(tmp_path))               # three files, 40 samples each
    for _ in range(50):
        picks = rng.integers(0, 120, int(rng.integers(1, 60))).tolist()
        picks += [p + 1 for p in picks[:5] if p + 1 < 120]     # some neighbours
        rng.shuffle(picks)
        assert r.read(picks) == [samples[i] for i in picks]
    assert r.read(np.arange(3, 9)) == samples[3:9]  # numpy ints take the checked path


def test_format_row_and_lazy_exports(fixtures, manifest):
    assert FORMAT.name == 'ffrecord'
    assert (FORMAT.detect, FORMAT.reader, FORMAT.writer, FORMAT.check) == \
        (detect, FFRecordReader, FFRecordWriter, check)
    assert loadr.readers.FFRecordReader is FFRecordReader
    assert loadr.writers.FFRecordWriter is FFRecordWriter


# -- writer ---------------------------------------------------------------------


@pytest.mark.parametrize('key', KEYS)
def test_writer_is_byte_identical_to_ffrecord(fixtures, manifest, key, tmp_path):
    r = FFRecordReader(fixture_path(fixtures, manifest, key))
    for k, info in enumerate(dataset(manifest, key)['files']):
        samples = [r.read_one(i) for i in range(r.n) if r.locate(i)['file_index'] == k]
        assert len(samples) == r.file_info(k)['n'] == info['n']
        out = write_ffr(tmp_path / os.path.basename(info['path']), samples)
        assert sha256(out.read_bytes()) == manifest['files'][info['path']]['sha256']
        assert out.read_bytes() == (fixtures / info['path']).read_bytes()


def test_round_trip_with_every_buffer_type(tmp_path):
    rng = np.random.default_rng(2)
    samples = [b'', b'x', rng.bytes(1000), bytearray(b'from a bytearray'),
               memoryview(b'from a memoryview'), memoryview(np.arange(6, dtype='<i4')),
               memoryview(b'abcdef')[2:], rng.bytes(300000)]
    path = write_ffr(tmp_path / 'x.ffr', samples)
    r = FFRecordReader(path)
    expect = [bytes(s) for s in samples]
    assert r.read(range(len(samples))) == expect
    assert [r[i]['data'] for i in range(len(samples))] == expect
    assert check(path) == []
    assert os.listdir(tmp_path) == ['x.ffr']


def test_zero_samples(tmp_path):
    path = write_ffr(tmp_path / 'empty.ffr', [])
    assert path.read_bytes() == struct.pack('<Iq', zlib.crc32(struct.pack('<q', 0)), 0)
    r = FFRecordReader(path, decode='msgpack')
    assert len(r) == 0 and r.read([]) == [] and r.spec == {}
    with pytest.raises(IndexError):
        r[0]
    assert check(path) == [] and detect(path)


def test_writer_short_of_n_leaves_nothing(tmp_path):
    w = FFRecordWriter(tmp_path / 'x.ffr', 3)
    w.write_one(b'a')
    w.write_one(b'b')
    with pytest.raises(WriterError, match='2 of 3'):
        w.close()
    assert os.listdir(tmp_path) == []
    with pytest.raises(WriterError):
        with FFRecordWriter(tmp_path / 'y.ffr', 2) as w:
            w.write_one(b'only one')
    assert os.listdir(tmp_path) == []


def test_writer_more_than_n(tmp_path):
    w = FFRecordWriter(tmp_path / 'x.ffr', 1)
    w.write_one(b'a')
    with pytest.raises(WriterError, match='n=1'):
        w.write_one(b'b')
    w.close()                          # the n samples it was made for are intact
    assert FFRecordReader(tmp_path / 'x.ffr').read([0]) == [b'a']
    with pytest.raises(WriterError):
        with FFRecordWriter(tmp_path / 'y.ffr', 1) as w:
            w.write_one(b'a')
            w.write_one(b'b')
    assert sorted(os.listdir(tmp_path)) == ['x.ffr']


def test_writer_rejects_bad_values(tmp_path):
    with pytest.raises(WriterError):
        FFRecordWriter(tmp_path / 'x.ffr', -1)
    with pytest.raises(TypeError):
        FFRecordWriter(tmp_path / 'x.ffr', 2.0)
    with FFRecordWriter(tmp_path / 'x.ffr', 1) as w:
        with pytest.raises(WriterError, match='str'):
            w.write_one('text')
        with pytest.raises(WriterError, match='contiguous'):
            w.write_one(memoryview(np.zeros((4, 4), np.uint8)[:, 1]))
        w.write_one(b'ok')
    with pytest.raises(WriterError, match='closed'):
        w.write_one(b'late')
    assert FFRecordReader(tmp_path / 'x.ffr').read([0]) == [b'ok']


def test_exception_inside_with_removes_the_temporary_and_keeps_the_old_file(tmp_path):
    path = write_ffr(tmp_path / 'x.ffr', [b'old'])

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with FFRecordWriter(path, 2) as w:
            w.write_one(b'new')
            raise Boom()
    assert os.listdir(tmp_path) == ['x.ffr']
    assert FFRecordReader(path).read([0]) == [b'old']


def test_killed_writer_leaves_nothing_that_opens(tmp_path):
    script = (
        'import os, signal, sys\n'
        'from loadr.readers.ffrecord import FFRecordWriter\n'
        'w = FFRecordWriter(sys.argv[1], 3)\n'
        'w.write_one(b"one")\n'
        'w.write_one(b"two")\n'
        'os.kill(os.getpid(), signal.SIGKILL)\n')
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, '-c', script, str(tmp_path / 'x.ffr')], cwd=root,
                          env={**os.environ, 'PYTHONPATH': root}, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    left = os.listdir(tmp_path)
    assert len(left) == 1 and left[0].startswith('.x.ffr.') and not left[0].endswith('.ffr')
    assert not (tmp_path / 'x.ffr').exists()
    assert not detect(tmp_path)
    with pytest.raises(FormatError, match='no \\*.ffr files'):
        FFRecordReader(tmp_path)


# -- directories --------------------------------------------------------------------


def test_directory_is_sorted_ffr_files_in_one_index_space(tmp_path):
    d = tmp_path / 'd'
    d.mkdir()
    write_ffr(d / 'c2.ffr', [b'c2-0'])
    write_ffr(d / 'b.ffr', [b'b-0', b'b-1'])
    write_ffr(d / 'a.ffr', [b'a-0'])
    write_ffr(d / 'c10.ffr', [b'c10-0', b'c10-1', b'c10-2'])
    write_ffr(d / 'b0.ffr', [])                       # an empty file holds no indices
    (d / 'notes.txt').write_text('not a record file')
    (d / 'sub.ffr').mkdir()                           # a directory is not a file
    r = FFRecordReader(d)
    assert [os.path.basename(f) for f in r.files] == ['a.ffr', 'b.ffr', 'b0.ffr', 'c10.ffr',
                                                      'c2.ffr']
    want = [b'a-0', b'b-0', b'b-1', b'c10-0', b'c10-1', b'c10-2', b'c2-0']
    assert r.read(range(7)) == want
    assert [r[i]['data'] for i in range(7)] == want
    assert [(os.path.basename(w['path']), w['local_index']) for w in map(r.locate, range(7))] \
        == [('a.ffr', 0), ('b.ffr', 0), ('b.ffr', 1), ('c10.ffr', 0), ('c10.ffr', 1),
            ('c10.ffr', 2), ('c2.ffr', 0)]
    assert check(d) == []


# -- decode options -------------------------------------------------------------------


def labelled(data: bytes) -> dict:
    return {'n': len(data)}


def upper(data: bytes) -> str:
    return data.decode().upper()


def test_decode_options(tmp_path):
    raw = write_ffr(tmp_path / 'mp.ffr', [msgpack.packb({'a': 1, 'b': b'\x00'}),
                                          msgpack.packb([1, 2]), msgpack.packb(7)])
    r = FFRecordReader(raw, decode='msgpack')
    assert r[0] == {'a': 1, 'b': b'\x00'} and r[1] == {'data': [1, 2]} and r[2] == {'data': 7}
    assert r.available(0) == {'a': True, 'b': True} and r.available(1) == {'data': True}
    assert r.spec == {'a': 'int', 'b': 'bytes'}

    js = write_ffr(tmp_path / 'js.ffr', [json.dumps({'x': [1, 'y']}).encode(), b'"text"'])
    r = FFRecordReader(js, decode='json')
    assert r[0] == {'x': [1, 'y']} and r[1] == {'data': 'text'} and r.spec == {'x': 'list'}

    pk = write_ffr(tmp_path / 'pk.ffr', [pickle.dumps({'k': (1, 2)}), pickle.dumps(3.5)])
    assert FFRecordReader(pk)[0] == {'data': pickle.dumps({'k': (1, 2)})}   # never unpickled
    r = FFRecordReader(pk, decode='pickle')
    assert r[0] == {'k': (1, 2)} and r[1] == {'data': 3.5}

    text = write_ffr(tmp_path / 'text.ffr', [b'hello', b'abc'])
    r = FFRecordReader(text, decode=labelled)
    assert r.read_batch([1, 0]) == [{'n': 3}, {'n': 5}]
    r = FFRecordReader(text, decode=upper)
    assert r[0] == {'data': 'HELLO'} and r.spec == {'data': 'str'}
    assert pickle.loads(pickle.dumps(r))[1] == {'data': 'ABC'}

    with pytest.raises(ConfigError, match='yaml'):
        FFRecordReader(text, decode='yaml')
    with pytest.raises(TypeError):
        FFRecordReader(text, decode=3)


def test_mask_selects_keys(fixtures, manifest):
    r = FFRecordReader(fixture_path(fixtures, manifest, 'ffrecord_single'), decode='msgpack')
    full = r[3]
    assert r[3, {'image': True}] == {'image': full['image']}
    assert r[3, {'image': False, 'label': True}] == {'label': full['label']}
    assert r[3, {}] == {}
    with pytest.raises(SpecError) as err:
        r[3, {'caption': True}]
    assert err.value.index == 3 and err.value.path.endswith('single.ffr')
    with pytest.raises(TypeError):
        r[3, {'image': range(2)}]


@pytest.mark.parametrize('decode, bad', [('msgpack', b'\xc1'), ('msgpack', b'\x92\x01'),
                                         ('json', b'{"a": '), ('json', b'\xff\xfe'),
                                         ('pickle', b'not a pickle')])
def test_bad_encoded_sample_is_a_decode_error(tmp_path, decode, bad):
    good = {'msgpack': msgpack.packb({}), 'json': b'{}', 'pickle': pickle.dumps({})}[decode]
    d = tmp_path / 'd'
    d.mkdir()
    write_ffr(d / 'a.ffr', [good])
    write_ffr(d / 'b.ffr', [good, bad])
    r = FFRecordReader(d, decode=decode)
    last = len(r) - 1
    for call in (lambda: r[last], lambda: r.read_batch([0, last]), lambda: r.available(last)):
        with pytest.raises(DecodeError) as err:
            call()
        assert err.value.path == str(d / 'b.ffr') and err.value.index == last
        assert 'sample 1 of this file' in str(err.value)


def test_decode_callable_failure_is_chained(tmp_path):
    r = FFRecordReader(write_ffr(tmp_path / 'x.ffr', [b'\xff']), decode=upper)
    with pytest.raises(DecodeError, match='upper') as err:
        r[0]
    assert isinstance(err.value.__cause__, UnicodeDecodeError)
    assert err.value.index == 0 and err.value.path == str(tmp_path / 'x.ffr')


# -- damage -------------------------------------------------------------------------


def test_flipped_sample_byte(fixtures, manifest, tmp_path):
    d = copy_fixture(fixtures, manifest, 'ffrecord_multi', tmp_path)
    part = d / 'PART_00001.ffr'
    sample = dataset(manifest, 'ffrecord_multi')['samples'][9]
    assert (sample['file_index'], sample['local_index']) == (1, 2)
    flip(part, sample['offset'] + sample['length'] // 2)
    r = FFRecordReader(d)
    for call in (lambda: r.read_one(9), lambda: r[9], lambda: r.read([8, 9, 10]),
                 lambda: r.read_batch([0, 9])):
        with pytest.raises(ChecksumError) as err:
            call()
        assert err.value.path == str(part) and err.value.index == 9
        assert 'sample 2 of this file' in str(err.value) and 'index 9' in str(err.value)
    assert r.read([8, 10]) == [r.read_one(8), r.read_one(10)]     # neighbours are fine
    unchecked = FFRecordReader(d, check_data=False).read_one(9)
    assert len(unchecked) == sample['length'] and sha256(unchecked) != sample['sha256']
    problems = check(d)
    assert [(p.path, p.index) for p in problems] == [(str(part), 9)]
    assert 'CRC32' in problems[0].message


def test_flipped_header_byte(fixtures, manifest, tmp_path):
    path = copy_fixture(fixtures, manifest, 'ffrecord_single', tmp_path)
    flip(path, 12 + 4 * 5)                     # inside crc[5]
    with pytest.raises(ChecksumError, match='metadata checksum') as err:
        FFRecordReader(path)
    assert err.value.path == str(path) and err.value.index is None
    r = FFRecordReader(path, check_data=False)         # skips both checks
    assert len(r.read_one(5)) == dataset(manifest, 'ffrecord_single')['samples'][5]['length']
    problems = check(path)
    # The header CRC, and sample 5 against its damaged stored CRC.
    assert [(p.index, 'metadata' in p.message) for p in problems] == [(None, True), (5, False)]


def test_huge_n_allocates_nothing(fixtures, manifest, tmp_path):
    path = copy_fixture(fixtures, manifest, 'ffrecord_single', tmp_path)
    with open(path, 'r+b') as f:
        f.seek(4)
        f.write(struct.pack('<q', 1 << 60))
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match='claims 1152921504606846976 samples') as err:
            FFRecordReader(path)
        problems = check(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert err.value.path == str(path)
    assert [(p.path, p.index) for p in problems] == [(str(path), None)]


@pytest.mark.parametrize('check_data', [True, False])
def test_n_slightly_too_large(fixtures, manifest, tmp_path, check_data):
    path = copy_fixture(fixtures, manifest, 'ffrecord_single', tmp_path)
    size = path.stat().st_size
    too_many = (size - 12) // 12 + 1           # the table alone would run past the end
    with open(path, 'r+b') as f:
        f.seek(4)
        f.write(struct.pack('<q', too_many))
    with pytest.raises(FormatError, match=f'claims {too_many} samples') as err:
        FFRecordReader(path, check_data=check_data)
    assert err.value.path == str(path)
    # One more than written: the table fits, but is read askew.
    with open(path, 'r+b') as f:
        f.seek(4)
        f.write(struct.pack('<q', 21))
    with pytest.raises(ChecksumError if check_data else FormatError) as err:
        FFRecordReader(path, check_data=check_data)
    assert err.value.path == str(path)
    assert check(path) != []


def test_negative_n(fixtures, manifest, tmp_path):
    path = copy_fixture(fixtures, manifest, 'ffrecord_single', tmp_path)
    write_header(path, -1, [], [])
    with pytest.raises(FormatError, match='negative'):
        FFRecordReader(path)
    assert len(check(path)) == 1


def test_offsets_going_backwards(fixtures, manifest, tmp_path):
    d = copy_fixture(fixtures, manifest, 'ffrecord_multi', tmp_path)
    part = d / 'PART_00001.ffr'
    meta, n, crcs, offsets = parse_header(part)
    offsets[3] = offsets[1]                    # CRC fixed up: only the order is wrong
    write_header(part, n, crcs, offsets)
    for check_data in (True, False):
        with pytest.raises(FormatError, match='goes back') as err:
            FFRecordReader(d, check_data=check_data)
        assert err.value.path == str(part) and err.value.index == 7 + 3
    problems = check(d)
    assert (str(part), 10) in [(p.path, p.index) for p in problems]


def test_offsets_out_of_file_and_first_offset(fixtures, manifest, tmp_path):
    path = copy_fixture(fixtures, manifest, 'ffrecord_single', tmp_path)
    meta, n, crcs, offsets = parse_header(path)
    bad = offsets.copy()
    bad[n - 1] = path.stat().st_size + 10
    write_header(path, n, crcs, bad)
    with pytest.raises(FormatError, match='past the end') as err:
        FFRecordReader(path)
    assert err.value.index == n - 1
    assert [p.index for p in check(path)] == [n - 1]

    bad = offsets.copy()
    bad[0] += 4                                # four unreachable bytes after the header
    write_header(path, n, crcs, bad)
    with pytest.raises(FormatError, match='first offset') as err:
        FFRecordReader(path)
    assert err.value.index == 0
    assert 0 in [p.index for p in check(path)]


def test_truncated_files(fixtures, manifest, tmp_path):
    ds = dataset(manifest, 'ffrecord_single')
    path = copy_fixture(fixtures, manifest, 'ffrecord_single', tmp_path)
    data = path.read_bytes()
    # Cut inside sample 10: samples 11.. start past the end.
    path.write_bytes(data[:ds['samples'][10]['offset'] + 5])
    with pytest.raises(FormatError, match='past the end') as err:
        FFRecordReader(path)
    assert err.value.path == str(path) and err.value.index == 11
    assert [p.index for p in check(path)] == list(range(11, 20))
    # Cut inside the last sample: only its CRC can tell.
    path.write_bytes(data[:-3])
    r = FFRecordReader(path)
    with pytest.raises(ChecksumError) as err:
        r.read_one(19)
    assert err.value.index == 19
    assert [p.index for p in check(path)] == [19]
    # Cut inside the header.
    path.write_bytes(data[:100])
    with pytest.raises(FormatError, match='claims 20 samples'):
        FFRecordReader(path)
    path.write_bytes(data[:7])
    with pytest.raises(FormatError, match='too short'):
        FFRecordReader(path)
    assert len(check(path)) == 1


def test_file_cut_after_the_reader_opened_it(fixtures, manifest, tmp_path):
    path = copy_fixture(fixtures, manifest, 'ffrecord_single', tmp_path)
    r = FFRecordReader(path)
    r.read_one(18)
    os.truncate(path, dataset(manifest, 'ffrecord_single')['samples'][15]['offset'])
    with pytest.raises(FormatError, match='truncated') as err:
        r.read_one(17)
    assert err.value.path == str(path) and err.value.index == 17
    with pytest.raises(FormatError, match='truncated') as err:
        r.read([10, 16, 17])
    assert err.value.index == 16


def test_shrunk_file_names_the_sample_inside_a_coalesced_run(tmp_path):
    path = write_ffr(tmp_path / 'x.ffr', [b'a' * 100, b'b' * 100, b'c' * 100])
    r = FFRecordReader(path)
    os.truncate(path, r.locate(2)['offset'] + 50)
    with pytest.raises(FormatError, match='truncated') as err:
        r.read([0, 1, 2])
    assert err.value.index == 2


def test_zero_length_file(tmp_path):
    path = tmp_path / 'empty.ffr'
    path.write_bytes(b'')
    with pytest.raises(FormatError, match='0 bytes') as err:
        FFRecordReader(path)
    assert err.value.path == str(path)
    assert [(p.path, p.index) for p in check(path)] == [(str(path), None)]
    assert detect(path)        # it claims to be one; check() says what is wrong


def test_missing_file_is_a_read_error(tmp_path):
    with pytest.raises(ReadError) as err:
        FFRecordReader(tmp_path / 'nope.ffr')
    assert err.value.path == str(tmp_path / 'nope.ffr')


def test_bytes_after_an_empty_header(tmp_path):
    path = write_ffr(tmp_path / 'x.ffr', [])
    with open(path, 'ab') as f:
        f.write(b'junk')
    with pytest.raises(FormatError, match='0 samples but 4 bytes'):
        FFRecordReader(path)
    assert len(check(path)) == 1


def test_old_format_meta_crc_zero_warns_and_reads(fixtures, manifest, tmp_path):
    d = copy_fixture(fixtures, manifest, 'ffrecord_multi', tmp_path)
    for part in sorted(d.iterdir()):
        with open(part, 'r+b') as f:
            f.write(b'\0\0\0\0')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        r = FFRecordReader(d)
        got = r.read(range(len(r)))
    old = [w for w in caught if 'old-version' in str(w.message)]
    assert len(old) == 2 and all(issubclass(w.category, UserWarning) for w in old)
    assert {str(d / 'PART_00000.ffr'), str(d / 'PART_00001.ffr')} == \
        {str(w.message).split(':')[0] for w in old}
    assert [sha256(b) for b in got] == \
        [s['sha256'] for s in dataset(manifest, 'ffrecord_multi')['samples']]
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        FFRecordReader(d, check_data=False).read([0])    # no checks, no warning
    assert check(d) == []


def test_pickled_reader_reads_the_header_again(fixtures, manifest, tmp_path):
    path = copy_fixture(fixtures, manifest, 'ffrecord_single', tmp_path)
    r = FFRecordReader(path)
    blob = pickle.dumps(r)
    assert len(blob) < 2000                    # the header table does not travel
    flip(path, 12 + 4 * 3)
    assert r.read_one(0) is not None           # this process already holds the header
    with pytest.raises(ChecksumError, match='metadata'):
        pickle.loads(blob).read_one(0)


# -- check and detect -----------------------------------------------------------------


@pytest.mark.parametrize('key', KEYS)
def test_check_clean_fixtures(fixtures, manifest, key):
    assert check(fixture_path(fixtures, manifest, key)) == []


def test_check_finds_every_flipped_sample(fixtures, manifest, tmp_path):
    d = copy_fixture(fixtures, manifest, 'ffrecord_multi', tmp_path)
    samples = dataset(manifest, 'ffrecord_multi')['samples']
    for i in (0, 6, 7, 11):
        s = samples[i]
        flip(d / os.path.basename(dataset(manifest, 'ffrecord_multi')['files'][s['file_index']]
                                  ['path']), s['offset'])
    problems = check(d)
    assert [(os.path.basename(p.path), p.index) for p in problems] == [
        ('PART_00000.ffr', 0), ('PART_00000.ffr', 6), ('PART_00001.ffr', 7),
        ('PART_00001.ffr', 11)]
    assert all(str(p).startswith(p.path) and f'[index {p.index}]' in str(p) for p in problems)


def test_check_streams_big_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(ffrecord.checks, 'CHECK_BLOCK_BYTES', 1000)
    rng = np.random.default_rng(3)
    samples = [rng.bytes(n) for n in (10, 3500, 20, 30, 999, 1001)]
    path = write_ffr(tmp_path / 'x.ffr', samples)
    assert check(path) == []
    meta, n, crcs, offsets = parse_header(path)
    flip(path, int(offsets[1]) + 3100)
    flip(path, int(offsets[5]) + 1000)
    assert [p.index for p in check(path)] == [1, 5]


def test_check_without_ffr_files(tmp_path):
    assert [(p.path, p.index) for p in check(tmp_path)] == [(str(tmp_path), None)]


def test_detect(fixtures, manifest, tmp_path):
    assert detect(fixture_path(fixtures, manifest, 'ffrecord_single'))
    assert detect(fixture_path(fixtures, manifest, 'ffrecord_multi'))
    assert detect(str(fixture_path(fixtures, manifest, 'ffrecord_multi')))
    assert not detect(fixtures / 'bag')
    assert not detect(tmp_path)
    assert not detect(tmp_path / 'missing.ffr')
    (tmp_path / 'x.bin').write_bytes(b'0' * 20)
    assert not detect(tmp_path / 'x.bin')
    (tmp_path / 'sub.ffr').mkdir()
    assert not detect(tmp_path)                # only a directory named like a file
    (tmp_path / 'sub.ffr' / 'inner.ffr').write_bytes(b'')
    assert not detect(tmp_path)                # files are looked for directly inside only
    for odd in (None, 3, 'bad\0path', b'x'):
        assert detect(odd) is False


def test_check_streams_the_table_of_a_huge_sparse_file(tmp_path):
    # 4 KB of data claiming 10^8 samples (a 1.2 GB table, all holes): check() must read the
    # table in pieces, in memory that does not grow with N; here the whole process gets a
    # 1 GiB address space, less than the table. (10^9 works the same, in ten times the time.)
    n = 10 ** 8
    path = tmp_path / 'sparse.ffr'
    with open(path, 'wb') as f:
        f.write(struct.pack('<Iq', 0, n))       # meta CRC 0: an old-version file, not summed
        f.write(b'\0' * 4084)
        f.truncate(12 + 12 * n)
    script = ('import resource, sys\n'
              'resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n'
              'from loadr.readers.ffrecord import check\n'
              'for p in check(sys.argv[1]):\n'
              '    print(p.index, p.message)\n')
    done = subprocess.run([sys.executable, '-c', script, str(path)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    first, last = done.stdout.splitlines()
    # Every offset is 0: the first does not start where the header ends, the rest are empty
    # samples (CRC 0, no read) but the last, which runs to the end of the file.
    assert first.startswith('0 sample 0 of this file: first offset is 0')
    assert last.startswith(f'{n - 1} sample {n - 1} of this file: CRC32 is ')


def test_check_across_table_pieces_and_its_problem_limit(tmp_path):
    # More samples than one piece of the table: the metadata CRC summed over the pieces,
    # a bad sample just past the first piece and an offset at the seam are all found.
    n = ffrecord.checks.CHECK_TABLE_ENTRIES + 10
    seam = ffrecord.checks.CHECK_TABLE_ENTRIES
    path = tmp_path / 'many.ffr'
    # Written here in one go (a million write_one calls take long): samples are empty but
    # for one byte in each of a few around the seam, and 5000 at the start.
    lengths = np.zeros(n, np.int64)
    lengths[list(range(5000)) + list(range(seam - 3, seam + 5))] = 1
    data = bytes(i % 251 + 1 for i in range(int(lengths.sum())))
    offsets = ffrecord.header_bytes(n) + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    crcs = np.zeros(n, '<u4')
    crcs[lengths == 1] = [zlib.crc32(data[k:k + 1]) for k in range(len(data))]
    body = struct.pack('<q', n) + crcs.tobytes() + offsets.astype('<i8').tobytes()
    path.write_bytes(struct.pack('<I', zlib.crc32(body)) + body + data)
    assert check(path) == []
    with open(path, 'r+b') as f:
        f.seek(int(offsets[seam + 3]))             # sample 2^20 + 3's one byte
        f.write(b'\0')
    assert [(p.index, 'CRC32' in p.message) for p in check(path)] == [
        (ffrecord.checks.CHECK_TABLE_ENTRIES + 3, True)]
    with open(path, 'r+b') as f:                  # the first offset of the second piece
        f.seek(12 + 4 * n + 8 * ffrecord.checks.CHECK_TABLE_ENTRIES)
        f.write(struct.pack('<q', 5))
    found = [(p.index, p.message.split('file: ', 1)[-1][:24]) for p in check(path)]
    assert found[0] == (None, 'metadata checksum mismat')
    assert (seam, 'offset 5 goes back befor') in found
    assert (seam + 3, 'CRC32 is 0xd202ef8d, hea') in found      # crc32(b'\0')
    # A table of garbage does not make a list of N problems.
    with open(path, 'r+b') as f:
        f.seek(12)
        f.write(b'\xff' * 4 * 5000)               # 5000 wrong CRCs
    problems = check(path)
    assert len(problems) == ffrecord.checks.MAX_PROBLEMS_PER_FILE + 1
    assert 'more than 1000 problems' in problems[-1].message
