"""Bag datasets (granular): the fixtures byte for byte, masks, caches, writes, corruption, check."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest

from loadr import codecs
from loadr.errors import ConfigError, DecodeError, FormatError, WriterError
from loadr.readers.bag import (
    FORMAT,
    Bag,
    BagFileWriter,
    BagReader,
    BagWriter,
    check,
    detect,
    parse_type,
)
from loadr.readers.base import Files
from tests.readers.common import assert_equal, check_reader_contract

DATASETS = ['bag', 'bag_types', 'bag_sharded']
ROOT = pathlib.Path(__file__).resolve().parents[2]


def sha(data) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def shards_of(manifest, key):
    """The manifest's dataset directories of ``key``: one, or one per shard."""
    entry = manifest['datasets'][key]
    return entry['shards'] if 'shards' in entry else [entry]


@pytest.fixture(scope='module')
def synth(fixtures):
    spec = importlib.util.spec_from_file_location('synth', fixtures / 'synth.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synth_image


def copy(fixtures, name, tmp_path) -> pathlib.Path:
    target = tmp_path / name
    shutil.copytree(fixtures / name, target)
    return target


def patch(path, offset, data: bytes):
    with open(path, 'r+b') as f:
        f.seek(offset if offset >= 0 else os.path.getsize(path) + offset)
        f.write(data)


def u64(value) -> bytes:
    return int(value).to_bytes(8, 'little')


def rewrite_bag(path, records):
    os.unlink(path)
    with BagFileWriter(path) as w:
        for record in records:
            w.append(record)


class CountingFiles(Files):
    """Files that log every read as (file name, offset, length)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def read(self, path, offset, length, index=None):
        self.reads.append((os.path.basename(path), offset, length))
        return super().read(path, offset, length, index)


class CountingReader(BagReader):
    files_class = CountingFiles


# -- the fixtures, exactly -----------------------------------------------------------------

@pytest.mark.parametrize('key', ['bag_v1', 'bag_v2'])
def test_bag_file_matches_manifest(fixtures, manifest, key):
    expected = manifest['datasets'][key]
    bag = Bag(fixtures / expected['path'])
    assert (bag.version, len(bag), bag.index_offset, bag.size) == (
        expected['version'], expected['num_records'], expected['index_offset'],
        expected['file_size'])
    assert bag.limits == expected['limits']
    records = bag.read_range(0, len(bag))
    for i, (record, want) in enumerate(zip(records, expected['records'], strict=True)):
        assert bag[i] == record
        assert (len(record), sha(record)) == (want['len'], want['sha256'])
        if 'hex' in want:
            assert record.hex() == want['hex']
    assert bag.read_range(2, 5) == records[2:5] and bag.read_range(3, 3) == []
    for bad in (-1, len(bag)):
        with pytest.raises(IndexError):
            bag[bad]
    with pytest.raises(TypeError):
        bag['0']
    with pytest.raises(IndexError):
        bag.read_range(4, 7)


@pytest.mark.parametrize('key', DATASETS)
def test_bag_tables_match_manifest(fixtures, manifest, key):
    count = 0
    for shard in shards_of(manifest, key):
        for name, want in shard['bags'].items():
            bag = Bag(fixtures / want['path'])
            assert (bag.version, len(bag), bag.index_offset, bag.size, bag.limits) == (
                want['version'], want['num_records'], want['index_offset'],
                want['file_size'], want['limits']), name
            assert [sha(r) for r in bag.read_range(0, len(bag))] == [
                r['sha256'] for r in want['records']]
            count += 1
    assert count >= 8


def tree_matches(expected, value, where):
    if isinstance(expected, dict) and '__ndarray__' in expected:
        nd = expected['__ndarray__']
        assert isinstance(value, np.ndarray), where
        assert (value.dtype.str, list(value.shape), sha(value.tobytes())) == (
            nd['dtype'], nd['shape'], nd['sha256']), where
        assert value.tolist() == nd['value'], where
    elif isinstance(expected, dict):
        assert isinstance(value, dict) and list(value) == list(expected), where
        for k in expected:
            tree_matches(expected[k], value[k], f'{where}.{k}')
    elif isinstance(expected, list):
        assert isinstance(value, list) and len(value) == len(expected), where
        for i, (e, v) in enumerate(zip(expected, value)):
            tree_matches(e, v, f'{where}[{i}]')
    else:
        assert type(value) is type(expected) and value == expected, where


def value_matches(base, want, value, raw, where):
    """One decoded value and its raw record against the manifest's description."""
    if base in ('jpg', 'png'):
        assert (len(raw), sha(raw)) == (want['len'], want['sha256']), where
        assert value.dtype.name == want['pillow']['dtype'], where
        assert list(value.shape) == want['pillow']['shape'], where
        assert sha(value.tobytes()) == want['pillow']['sha256'], where
        return
    assert (len(raw), sha(raw)) == (want['raw']['len'], want['raw']['sha256']), where
    if base == 'bytes':
        assert value == raw, where
    elif base == 'array':
        assert (value.dtype.str, list(value.shape), sha(value.tobytes())) == (
            want['dtype'], want['shape'], want['sha256']), where
        if 'value' in want:
            assert value.tolist() == want['value'], where
    elif base == 'tree':
        tree_matches(want['value'], value, where)
    else:
        assert type(value) is type(want['value']) and value == want['value'], where


@pytest.mark.parametrize('key', DATASETS)
def test_dataset_matches_manifest(fixtures, manifest, key):
    entry = manifest['datasets'][key]
    reader = BagReader(fixtures / entry['path'])
    raw_reader = BagReader(fixtures / entry['path'], decode_images=False)
    assert len(reader) == entry['length']
    assert reader.spec == entry['spec'] and list(reader.spec) == sorted(entry['spec'])
    assert reader.size == sum(f['size'] for p, f in manifest['files'].items()
                              if p.startswith(entry['path'] + '/'))
    checked = 0
    for shard in shards_of(manifest, key):
        directory = fixtures / shard['path']
        assert (directory / 'spec.json').read_text() == shard['spec_json']
        refs_bag = Bag(directory / 'refs.bag')
        bags = {k: Bag(directory / f'{k}.bag') for k in entry['spec']}
        for dp in shard['datapoints']:
            index = dp['index']
            refs = msgpack.unpackb(refs_bag[dp['local_index']])
            assert refs == dp['refs']
            value = reader[index]
            raw_value = raw_reader[index]
            assert list(value) == sorted(entry['spec'])
            available = reader.available(index)
            for (k, type_name), ref in zip(sorted(entry['spec'].items()), refs):
                base, is_seq = parse_type(type_name)
                want = dp['values'][k]
                if is_seq:
                    raws = bags[k].read_range(ref[0], ref[0] + ref[1]) if ref else []
                    assert available[k] == range(want['count']) == range(len(value[k]))
                    assert len(raws) == want['count']
                    for j, (w, v, r) in enumerate(zip(want['items'], value[k], raws)):
                        value_matches(base, w, v, r, f'{index}.{k}[{j}]')
                        if base in ('jpg', 'png'):
                            assert raw_value[k][j] == r
                        checked += 1
                else:
                    assert available[k] is True
                    raw = bags[k][ref]
                    value_matches(base, want, value[k], raw, f'{index}.{k}')
                    if base in ('jpg', 'png'):
                        assert raw_value[k] == raw
                    else:
                        assert_equal(raw_value[k], value[k])
                    checked += 1
    assert checked == sum(v.get('count', 1) for shard in shards_of(manifest, key)
                          for dp in shard['datapoints'] for v in dp['values'].values()) > 50


@pytest.mark.parametrize('key', DATASETS)
def test_reader_contract(fixtures, key):
    check_reader_contract(BagReader(fixtures / key, cache_keys=('refs',)))


def test_a_shard_is_a_dataset_and_detection(fixtures):
    whole = BagReader(fixtures / 'bag_sharded')
    shard = BagReader(fixtures / 'bag_sharded' / '000001')
    assert (whole.shards, shard.shards, len(shard)) == (3, 1, 5)
    assert_equal(shard[2], whole[7])
    for name in DATASETS + ['bag_sharded/000002']:
        assert detect(fixtures / name)
    for name in ['bag_raw', 'bag_raw/v1.bag', 'gulp', 'ffrecord', 'missing', 'MANIFEST.json']:
        assert not detect(fixtures / name)
    assert (FORMAT.name, FORMAT.reader, FORMAT.writer, FORMAT.check, FORMAT.detect) == (
        'bag', BagReader, BagWriter, check, detect)


# -- masks read only what they ask ---------------------------------------------------------

def test_masks_pick_what_they_ask(fixtures):
    r = BagReader(fixtures / 'bag')
    full = r[1]                                    # frames: 4 elements, tags: 3
    cases = [
        (range(1, 3), [1, 2]), (range(0, 99), [0, 1, 2, 3]), (range(3, 1), []),
        (range(0, 4, 2), [0, 2]), (slice(2, None), [2, 3]), ([3, 0, 3], [3, 0, 3]), ([], []),
        ((1,), [1]), (np.array([2, 1]), [2, 1]), (True, [0, 1, 2, 3]),
    ]
    for mask, positions in cases:
        got = r[1, {'frames': mask}]
        assert list(got) == ['frames']
        assert_equal(got['frames'], [full['frames'][p] for p in positions], str(mask))
    got = r[1, {'tags': True, 'idx': True, 'image': False, 'frames': False}]
    assert got == {'idx': 1, 'tags': full['tags']}
    assert r[0, {'tags': range(0, 5)}] == {'tags': []}       # dp 0 has no tags
    assert r[1, {}] == {}
    with pytest.raises(ConfigError, match='nope'):
        r[1, {'nope': True}]
    with pytest.raises(TypeError):
        r[1, {'idx': range(1)}]
    with pytest.raises(TypeError):
        r[1, {'frames': 'all'}]
    for bad in ([4], [-1], range(-1, 2)):
        with pytest.raises(IndexError):
            r[1, {'frames': bad}]
    with pytest.raises(TypeError):
        r[1, {'frames': [0.5]}]
    with pytest.raises(TypeError):
        r[1, ['frames']]


def test_masked_reads_touch_only_what_they_need(fixtures, manifest):
    limits = manifest['datasets']['bag']['bags']['frames']['limits']   # dp 1 frames = records 1..4
    r = CountingReader(fixtures / 'bag', cache_index=False)
    r._files.reads.clear()
    got = r[1, {'frames': range(1, 3)}]                # records 2, 3
    reads = r._files.reads
    assert [name for name, _, _ in reads] == ['refs.bag', 'refs.bag', 'frames.bag', 'frames.bag']
    assert reads[-1] == ('frames.bag', limits[1], limits[3] - limits[1])
    assert_equal(got['frames'], BagReader(fixtures / 'bag')[1]['frames'][1:3])
    r._files.reads.clear()
    r[1, {'frames': [3, 0]}]                            # covering range 1..4: one data read
    assert r._files.reads[-1] == ('frames.bag', limits[0], limits[4] - limits[0])
    assert len([x for x in r._files.reads if x[0] == 'frames.bag']) == 2

    cached = CountingReader(fixtures / 'bag', cache_index=True, cache_keys=('refs',))
    cached[0, {'frames': True}]                         # loads the refs and frames tables
    cached._files.reads.clear()
    cached[1, {'frames': range(1, 3)}]
    assert cached._files.reads == [('frames.bag', limits[1], limits[3] - limits[1])]
    cached._files.reads.clear()
    cached[2, {'idx': True}]
    assert [name for name, _, _ in cached._files.reads] == ['idx.bag', 'idx.bag']  # table, value
    cached._files.reads.clear()
    assert cached.available(5) == {'feat': True, 'frames': range(1), 'idx': True,
                                   'image': True, 'meta': True, 'name': True, 'tags': range(0)}
    assert cached._files.reads == []                    # refs.bag is in memory


@pytest.mark.parametrize('key', DATASETS)
def test_cache_options_give_identical_data(fixtures, key):
    base = BagReader(fixtures / key, cache_index=False)
    everything = [base[i] for i in range(len(base))]
    spec = list(base.spec)
    for options in [dict(cache_index=True), dict(cache_keys=('refs',)),
                    dict(cache_index=False, cache_keys=('refs', spec[0])),
                    dict(cache_keys=('refs', *spec))]:
        reader = BagReader(fixtures / key, **options)
        cold = pickle.dumps(reader)
        for i, dp in enumerate(everything):
            assert_equal(reader[i], dp, f'{options} {i}')
        assert len(pickle.dumps(reader)) == len(cold)   # the caches are not pickled
        copy_ = pickle.loads(pickle.dumps(reader))
        assert_equal(copy_[len(everything) - 1], everything[-1])
    with pytest.raises(ConfigError, match='nope'):
        BagReader(fixtures / key, cache_keys=('nope',))
    with pytest.raises(ConfigError):
        BagReader(fixtures / key, cache_keys='refs')


# -- writing -------------------------------------------------------------------------------

def source_datapoints(fixtures, manifest, key, synth):
    """The datapoints the fixture was written from: images rebuilt from their synth recipes,
    everything else as the reader decodes it (which the manifest tests pin down)."""
    entry = manifest['datasets'][key]
    reader = BagReader(fixtures / entry['path'])
    out = []
    for shard in shards_of(manifest, key):
        for dp in shard['datapoints']:
            value = reader[dp['index']]
            for k, type_name in entry['spec'].items():
                base, is_seq = parse_type(type_name)
                if base in ('jpg', 'png'):
                    items = dp['values'][k]['items'] if is_seq else [dp['values'][k]]
                    pixels = [synth(**{n: it['source'][n] for n in 'seed h w c'.split()})
                              for it in items]
                    value[k] = pixels if is_seq else pixels[0]
            out.append(value)
    return out


@pytest.mark.parametrize('key', DATASETS)
def test_writes_are_byte_identical_to_granular(fixtures, manifest, key, synth, tmp_path):
    entry = manifest['datasets'][key]
    datapoints = source_datapoints(fixtures, manifest, key, synth)
    out = tmp_path / 'out'
    with BagWriter(out, entry['spec'], shardlen=entry.get('shardlen')) as w:
        for dp in datapoints:
            w.append(dp)
        assert len(w) == entry['length']
    expected = {p[len(key) + 1:]: f['sha256'] for p, f in manifest['files'].items()
                if p.startswith(key + '/')}
    written = {str(p.relative_to(out)): sha(p.read_bytes()) for p in out.rglob('*')
               if p.is_file()}
    assert written == expected
    assert not list(tmp_path.glob('.out.*'))            # no temporary left behind


@pytest.mark.parametrize('version, key', [(1, 'bag_v1'), (2, 'bag_v2')])
def test_bag_file_writer_is_byte_identical(fixtures, manifest, version, key, tmp_path):
    path = manifest['datasets'][key]['path']
    source = Bag(fixtures / path)
    with BagFileWriter(tmp_path / 'x.bag', version=version) as w:
        for i in range(len(source)):
            assert w.append(source[i]) == i
        assert w.size == manifest['files'][path]['size']
    assert sha((tmp_path / 'x.bag').read_bytes()) == manifest['files'][path]['sha256']


def test_bag_file_writer_edges(tmp_path):
    with BagFileWriter(tmp_path / 'v2.bag') as w:
        pass
    with BagFileWriter(tmp_path / 'v1.bag', version=1) as w:
        pass
    assert (tmp_path / 'v2.bag').read_bytes() == b''
    assert (tmp_path / 'v1.bag').read_bytes() == b'\x00' * 8
    assert len(Bag(tmp_path / 'v2.bag')) == len(Bag(tmp_path / 'v1.bag')) == 0
    with pytest.raises(WriterError, match='overwrite'):
        BagFileWriter(tmp_path / 'v2.bag')
    with pytest.raises(WriterError, match='version'):
        BagFileWriter(tmp_path / 'v3.bag', version=3)
    with pytest.raises(RuntimeError):
        with BagFileWriter(tmp_path / 'new.bag') as w:
            w.append(b'abc')
            with pytest.raises(WriterError, match='zero-byte'):
                w.append(b'')
            with pytest.raises(WriterError, match='bytes'):
                w.append('text')
            raise RuntimeError('interrupted')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['v1.bag', 'v2.bag']


ALL_TYPES = {'arr': 'array', 'arrs': 'array[]', 'big': 'i64', 'blob': 'bytes', 'n': 'int',
             'ns': 'int[]', 'img': 'jpg', 'imgs': 'jpg[]', 'mask': 'png', 'masks': 'png[]',
             'meta': 'msgpack', 'name': 'utf8', 'names': 'utf8[]', 'tree': 'tree', 'u': 'u64'}


def all_types_datapoint(i):
    rng = np.random.RandomState(i)
    return {
        'arr': rng.randn(i, 2).astype(np.float32), 'arrs': [np.arange(j) for j in range(i % 3)],
        'big': -(2 ** 63) + i, 'blob': bytes([i]) * (i + 1), 'n': [-129, 255, 0, 2 ** 70][i % 4],
        'ns': list(range(-i, i, 7)), 'img': rng.randint(0, 256, (8, 12, 3)).astype(np.uint8),
        'imgs': [rng.randint(0, 256, (8, 8)).astype(np.uint8)] * (i % 2),
        'mask': rng.randint(0, 2, (5, 7)).astype(np.uint8) * 255,
        'masks': [rng.randint(0, 256, (3, 4, 3)).astype(np.uint8)] * (i % 3),
        'meta': {'i': i, 'f': [1.5, None]}, 'name': f'näme {i}', 'names': ['a'] * (i % 2),
        'tree': {'x': [np.eye(2) * i, (i, 'y')], 'z': {}}, 'u': 2 ** 64 - 1 - i,
    }


def expected_back(dp):
    """What reading gives back: decoded PNG pixels exactly, JPEG only in shape; tuples as lists."""
    out = dict(dp)
    out['tree'] = {'x': [dp['tree']['x'][0], list(dp['tree']['x'][1])], 'z': {}}
    out.pop('img')
    out.pop('imgs')
    return out


@pytest.mark.parametrize('shardlen', [None, 2, 5])
def test_round_trip_every_type(tmp_path, shardlen):
    datapoints = [all_types_datapoint(i) for i in range(5)]
    out = tmp_path / 'out'
    with BagWriter(out, ALL_TYPES, shardlen=shardlen) as w:
        for i, dp in enumerate(datapoints):
            assert w.append(dp) == i
    shards = sorted(p.name for p in out.iterdir())
    assert shards == {None: ['arr.bag', 'arrs.bag', 'big.bag', 'blob.bag', 'img.bag',
                             'imgs.bag', 'mask.bag', 'masks.bag', 'meta.bag', 'n.bag', 'name.bag',
                             'names.bag', 'ns.bag', 'refs.bag', 'spec.json', 'tree.bag', 'u.bag'],
                      2: ['000000', '000001', '000002'], 5: ['000000']}[shardlen]
    r = BagReader(out)
    raw = BagReader(out, decode_images=False)
    assert (len(r), r.spec, r.shards) == (5, dict(sorted(ALL_TYPES.items())), len(shards)
                                          if shardlen else 1)
    for i, dp in enumerate(datapoints):
        got = r[i]
        assert got['img'].shape == (8, 12, 3) and len(got['imgs']) == i % 2
        assert raw[i]['img'] == codecs.encode('jpg', dp['img'])
        assert r.available(i)['arrs'] == range(i % 3)
        assert_equal({k: v for k, v in got.items() if k not in ('img', 'imgs')},
                     expected_back(dp), f'datapoint {i}')
    assert check(out) == []
    if shardlen == 2:
        check_reader_contract(r)


def test_empty_datasets_and_empty_existing_target(tmp_path):
    (tmp_path / 'empty').mkdir()
    with BagWriter(tmp_path / 'empty', {'x': 'int'}):
        pass
    with BagWriter(tmp_path / 'sharded', {'x': 'int[]'}, shardlen=3):
        pass
    for name in ('empty', 'sharded'):
        r = BagReader(tmp_path / name)
        assert (len(r), check(tmp_path / name)) == (0, [])
    assert (tmp_path / 'empty' / 'spec.json').read_bytes() == b'{"x": "int"}'
    assert os.listdir(tmp_path / 'sharded') == ['000000']


def test_writer_validates_datapoints(tmp_path):
    spec = {'frames': 'png[]', 'label': 'int', 'name': 'utf8'}
    good = {'frames': [np.zeros((2, 2), np.uint8)], 'label': 1, 'name': 'a'}
    with BagWriter(tmp_path / 'out', spec) as w:
        w.append(good)
        cases = [
            ({'label': 1, 'name': 'a'}, "misses key 'frames'"),
            ({**good, 'extra': 1}, "key 'extra'"),
            ({**good, 'label': 'seven'}, "key 'label' \\(int\\)"),
            ({**good, 'label': 2 ** 200}, "key 'label'"),
            ({**good, 'frames': 'x.png'}, "key 'frames' is a sequence"),
            ({**good, 'frames': [np.zeros(2), np.zeros((2, 2, 2, 2))]}, r"key 'frames\[0\]'"),
            ({**good, 'name': ''}, "key 'name': an empty value"),
            ([('label', 1)], 'must be a dict'),
        ]
        for datapoint, match in cases:
            with pytest.raises(WriterError, match=match) as info:
                w.append(datapoint)
            assert info.value.index == 1 and 'datapoint 1' in info.value.message
        w.append({**good, 'label': -5})              # the failures left nothing behind
    r = BagReader(tmp_path / 'out')
    assert [r[i]['label'] for i in range(len(r))] == [1, -5]
    assert check(tmp_path / 'out') == []


@pytest.mark.parametrize('spec, match', [
    ({'x': 'gif'}, 'unknown type'), ({'x': 'mp4'}, 'not supported'), ({'refs': 'int'}, 'reserved'),
    ({'a/b': 'int'}, 'bad key'), ({'Big': 'int'}, 'start with'), ({'x': 3}, 'must be a string'),
    (['x'], 'JSON object'),
])
def test_writer_refuses_bad_specs(tmp_path, spec, match):
    with pytest.raises(WriterError, match=match):
        BagWriter(tmp_path / 'out', spec)
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_existing_targets_and_bad_shardlen(tmp_path):
    (tmp_path / 'full').mkdir()
    (tmp_path / 'full' / 'x').write_text('keep me')
    (tmp_path / 'file').write_text('keep me')
    for name in ('full', 'file'):
        with pytest.raises(WriterError, match='existing'):
            BagWriter(tmp_path / name, {'x': 'int'})
    for bad in (0, -1, 2.5, True):
        with pytest.raises(WriterError, match='shardlen'):
            BagWriter(tmp_path / 'new', {'x': 'int'}, shardlen=bad)
    assert (tmp_path / 'full' / 'x').read_text() == 'keep me'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file', 'full']


def test_exception_inside_with_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with BagWriter(tmp_path / 'out', {'x': 'int'}, shardlen=2) as w:
            for i in range(5):
                w.append({'x': i})
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_killed_writer_leaves_nothing_that_opens(tmp_path):
    script = textwrap.dedent(f'''
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from loadr.readers.bag import BagWriter
        w = BagWriter({str(tmp_path / 'out')!r}, {{'x': 'int', 'y': 'utf8[]'}}, shardlen=2)
        for i in range(5):
            w.append({{'x': i, 'y': ['a'] * i}})
        os.kill(os.getpid(), signal.SIGKILL)
    ''')
    proc = subprocess.run([sys.executable, '-c', script], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / 'out').exists()
    leftovers = list(tmp_path.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith('.out.')
    assert sorted(os.listdir(leftovers[0])) == ['000000', '000001', '000002']
    assert not detect(leftovers[0])
    with pytest.raises(FormatError, match='missing spec.json'):
        BagReader(leftovers[0] / '000000')


# -- corruption: each the specific error, naming file and index ----------------------------

def test_truncated_and_lying_headers_fail_at_open(fixtures, tmp_path):
    data = copy(fixtures, 'bag', tmp_path)
    frames = data / 'frames.bag'
    size = frames.stat().st_size
    cases = [
        (lambda: os.truncate(frames, size - 3), 'past the end'),
        (lambda: os.truncate(frames, size - 8), 'whole number'),
        (lambda: patch(frames, -8, u64(size)), 'past the end'),
        (lambda: patch(frames, -8, u64(2 ** 63)), 'past the end'),
        (lambda: patch(frames, -8, u64(size - 12)), 'whole number'),
        (lambda: os.truncate(frames, 5), 'at least 8 bytes'),
    ]
    original = frames.read_bytes()
    for corrupt, match in cases:
        frames.write_bytes(original)
        corrupt()
        with pytest.raises(FormatError, match=match) as info:
            BagReader(data)
        assert info.value.path == str(frames)
        problems = check(data)
        assert [(p.path, p.message) for p in problems] == [(str(frames), info.value.message)]


@pytest.mark.parametrize('cache_index', [False, True])
def test_lying_table_entries_name_the_datapoint(fixtures, manifest, tmp_path, cache_index):
    data = copy(fixtures, 'bag', tmp_path)
    frames = data / 'frames.bag'
    offset = manifest['datasets']['bag']['bags']['frames']['index_offset']
    patch(frames, offset + 8 * 2, u64(10 ** 12))     # record 2 (datapoint 1) ends far away
    r = BagReader(data, cache_index=cache_index)
    if not cache_index:
        assert len(r[0]['frames']) == 1               # record 0 alone is still fine
    with pytest.raises(FormatError, match='index table') as info:
        r[1]
    assert (info.value.path, info.value.index) == (str(frames), 1)
    assert r[1, {'idx': True}] == {'idx': 1}
    assert [(p.path, p.index) for p in check(data)] == [(str(frames), 3)]  # record 3 < record 2
    shutil.copy(fixtures / 'bag' / 'frames.bag', frames)
    patch(frames, offset + 8 * 1, u64(600))          # record 1 ends before record 0 does
    r = BagReader(data, cache_index=cache_index)
    with pytest.raises(FormatError, match='record 1 ends at 600, before it starts at 683') as info:
        r[1]
    assert (info.value.path, info.value.index) == (str(frames), 1)


def test_table_claiming_the_whole_file_does_not_allocate(tmp_path):
    path = tmp_path / 'x.bag'
    with BagFileWriter(path) as w:
        w.append(b'\xff' * 64)
    patch(path, -8, u64(0))                          # "the table is the whole file"
    bag = Bag(path)
    assert len(bag) == 9 and bag.index_offset == 0
    with pytest.raises(FormatError, match='past the data end') as info:
        bag[0]
    assert (info.value.path, info.value.index) == (str(path), 0)
    with pytest.raises(FormatError):
        bag.validate()


@pytest.mark.parametrize('bad_refs, match', [
    ([3, [24, 2], 3, 3, 3, 3, [4, 3]], 'records 24..26 run past a bag of 25'),
    ([3, [], 99, 3, 3, 3, [4, 3]], 'record 99 is out of range'),
    ([3, [], 3, 3, 3, 3], 'list of 7 entries'),
    ([3, [], [3], 3, 3, 3, [4, 3]], 'must be an int'),
    ([3, 0, 3, 3, 3, 3, [4, 3]], r'must be \[\] or \[start, length\]'),
    ([3, [], 3, 3, 3, 3, [4, -1]], 'negative'),
    ({'a': 1}, 'list of 7'),
])
def test_bad_refs_name_refs_bag_and_index(fixtures, tmp_path, bad_refs, match):
    data = copy(fixtures, 'bag', tmp_path)
    records = Bag(data / 'refs.bag').read_range(0, 12)
    records[3] = msgpack.packb(bad_refs)
    rewrite_bag(data / 'refs.bag', records)
    r = BagReader(data)
    for call in (lambda: r[3], lambda: r.available(3), lambda: r[3, {'idx': True}]):
        with pytest.raises(FormatError, match=match) as info:
            call()
        assert (info.value.path, info.value.index) == (str(data / 'refs.bag'), 3)
    assert r[2]['idx'] == 5
    assert [(p.path, p.index) for p in check(data)] == [(str(data / 'refs.bag'), 3)]


def test_refs_that_are_not_msgpack_and_sharded_indices_are_global(fixtures, tmp_path):
    data = copy(fixtures, 'bag_sharded', tmp_path)
    refs = data / '000001' / 'refs.bag'
    records = Bag(refs).read_range(0, 5)
    records[2] = b'\xc1'
    rewrite_bag(refs, records)
    r = BagReader(data)
    with pytest.raises(FormatError, match='not msgpack') as info:
        r[7]
    assert (info.value.path, info.value.index) == (str(refs), 7)
    assert [(p.path, p.index) for p in check(data)] == [(str(refs), 7)]


@pytest.mark.parametrize('key, name, index, corrupt', [
    ('bag', 'image.bag', 3, b'\x00\x00'),             # the JPEG's SOI marker
    ('bag', 'name.bag', 5, b'\xff'),                  # not UTF-8
    ('bag', 'meta.bag', 0, b'\xc1'),                  # never used in msgpack
    ('bag', 'feat.bag', 4, b'\x91'),                  # a 1-list, not [dtype, shape, bytes]
    ('bag_types', 'tree.bag', 2, b'\x93'),            # a 3-list with the map's bytes after it
    ('bag_types', 'masks.bag', 3, b'\x00'),           # PNG signature (datapoint 3's 2nd mask)
    ('bag_sharded', '000001/frames.bag', 7, b'\x00'),
])
def test_bad_values_are_decode_errors(fixtures, manifest, tmp_path, key, name, index, corrupt):
    data = copy(fixtures, key, tmp_path)
    shard = next(s for s in shards_of(manifest, key) if any(
        dp['index'] == index for dp in s['datapoints']))
    dp = next(dp for dp in shard['datapoints'] if dp['index'] == index)
    bag_key = pathlib.Path(name).stem
    ref = dp['refs'][sorted(shard['spec']).index(bag_key)]
    record = ref if isinstance(ref, int) else ref[0] + ref[1] - 1
    limits = shard['bags'][bag_key]['limits']
    patch(data / name, limits[record - 1] if record else 0, corrupt)
    r = BagReader(data)
    with pytest.raises(DecodeError) as info:
        r[index]
    assert (info.value.path, info.value.index) == (str(data / name), index)
    assert repr(bag_key) in info.value.message or f"'{bag_key}[" in info.value.message
    others = {k: True for k in shard['spec'] if k != bag_key}
    assert set(r[index, others]) == set(others)       # the other keys still read
    assert [(p.path, p.index) for p in check(data)] == [(str(data / name), index)]


@pytest.mark.parametrize('text, match', [
    (b'{"idx": "int", ', 'not valid JSON'), (b'\xff\xfe{}', 'not valid JSON'),
    (b'["idx"]', 'JSON object'), (b'{"idx": "gif"}', "unknown type 'gif'"),
    (b'{"idx": "int", "idx": "utf8"}', 'twice'), (b'{"../idx": "int"}', 'bad key'),
    (b'{"refs": "int"}', 'reserved'), (b'{"idx": 5}', 'must be a string'),
    (b'{"idx": "int[][]"}', 'unknown type'),
])
def test_broken_spec_json(fixtures, tmp_path, text, match):
    data = copy(fixtures, 'bag', tmp_path)
    (data / 'spec.json').write_bytes(text)
    with pytest.raises(FormatError, match=match) as info:
        BagReader(data)
    assert info.value.path == str(data / 'spec.json')
    assert [(p.path, p.message) for p in check(data)] == [(info.value.path, info.value.message)]


def test_missing_pieces(fixtures, tmp_path):
    data = copy(fixtures, 'bag', tmp_path)
    (data / 'tags.bag').unlink()
    with pytest.raises(FormatError, match="missing bag file for key 'tags'") as info:
        BagReader(data)
    assert info.value.path == str(data / 'tags.bag')
    assert [p.path for p in check(data)] == [str(data / 'tags.bag')]
    (data / 'spec.json').unlink()
    with pytest.raises(FormatError, match='missing spec.json'):
        BagReader(data)
    assert not detect(data)
    with pytest.raises(FormatError, match='missing spec.json: bag files without'):
        BagReader(fixtures / 'bag_raw')
    (tmp_path / 'nothing').mkdir()
    (tmp_path / 'nothing' / 'notes.txt').write_text('')
    with pytest.raises(FormatError, match='not a bag dataset'):
        BagReader(tmp_path / 'nothing')
    assert [p.message[:17] for p in check(tmp_path / 'nothing')] == ['not a bag dataset']
    with pytest.raises(FormatError, match='not a directory'):
        BagReader(fixtures / 'bag_raw' / 'v1.bag')


def test_shard_gap_and_differing_specs(fixtures, tmp_path):
    data = copy(fixtures, 'bag_sharded', tmp_path)
    shutil.rmtree(data / '000001')
    assert detect(data)
    with pytest.raises(FormatError, match='shard 000001 is missing') as info:
        BagReader(data)
    assert info.value.path == str(data / '000001')
    assert [p.path for p in check(data)] == [str(data / '000001')]
    data = copy(fixtures, 'bag_sharded', tmp_path / 'again')
    spec = json.loads((data / '000002' / 'spec.json').read_text())
    (data / '000002' / 'spec.json').write_text(json.dumps({**spec, 'label': 'bytes'}))
    with pytest.raises(FormatError, match='spec differs') as info:
        BagReader(data)
    assert info.value.path == str(data / '000002' / 'spec.json')


def test_unsupported_video_type_opens_and_fails_clearly(tmp_path):
    data = tmp_path / 'video'
    data.mkdir()
    (data / 'spec.json').write_text('{"clip": "mp4", "label": "int"}')
    for name, records in [('refs', [msgpack.packb([0, 0])]), ('clip', [b'\x00\x00\x00\x18ftyp']),
                          ('label', [b'\x07'])]:
        with BagFileWriter(data / f'{name}.bag') as w:
            for record in records:
                w.append(record)
    r = BagReader(data)
    assert r[0, {'label': True}] == {'label': 7}
    assert r.available(0) == {'clip': True, 'label': True}
    with pytest.raises(DecodeError, match='not supported') as info:
        r[0]
    assert (info.value.path, info.value.index) == (str(data / 'clip.bag'), 0)
    assert check(data) == []                            # video is not decoded, not a problem


# -- check ---------------------------------------------------------------------------------

@pytest.mark.parametrize('key', DATASETS + ['bag_sharded/000000'])
def test_check_finds_nothing_in_the_fixtures(fixtures, key):
    assert check(fixtures / key) == []


def test_check_finds_every_planted_problem(fixtures, manifest, tmp_path):
    data = copy(fixtures, 'bag', tmp_path)
    bags = manifest['datasets']['bag']['bags']
    patch(data / 'image.bag', bags['image']['limits'][2], b'\x00\x00')           # datapoint 3
    patch(data / 'name.bag', bags['name']['limits'][4], b'\xff')                 # datapoint 5
    patch(data / 'meta.bag', bags['meta']['limits'][4] + 1, b'\xc1')             # datapoint 5
    patch(data / 'tags.bag', bags['tags']['index_offset'] + 8 * 5, u64(10 ** 9))  # record 5
    records = Bag(data / 'refs.bag').read_range(0, 12)
    records[8] = msgpack.packb([8, [16, 1], 8, 8, 8, 8, [8]])
    rewrite_bag(data / 'refs.bag', records)
    (data / 'extra.bag').write_bytes(b'')
    found = {(os.path.basename(p.path), p.index) for p in check(data)}
    assert found == {('image.bag', 3), ('name.bag', 5), ('meta.bag', 5), ('tags.bag', 6),
                     ('refs.bag', 8), ('extra.bag', None)}


def test_check_reports_layout_problems_of_sharded_datasets(fixtures, tmp_path):
    data = copy(fixtures, 'bag_sharded', tmp_path)
    (data / '000001').rename(data / '000003')
    (data / '9999999999').mkdir()                     # a far-away number: no slow scan
    (data / 'README').write_text('not a shard')
    (data / '.hidden').write_text('ignored, as granular ignores it')
    os.truncate(data / '000002' / 'label.bag', 3)
    problems = check(data)
    assert [(os.path.relpath(p.path, data), p.index) for p in problems] == [
        ('000001', None), ('000004', None), ('README', None), ('000002/label.bag', None),
        ('9999999999/spec.json', None)]
    assert problems[1].message.startswith('shards 000004 to 9999999998 are missing')
    assert 'missing' in problems[0].message and 'granular' in problems[2].message
    assert check(tmp_path / 'nowhere')[0].message == 'not a directory'


@pytest.mark.parametrize('chunk', [1, 2, 3, 1 << 20])
def test_check_validates_tables_across_chunks(tmp_path, monkeypatch, chunk):
    from loadr.readers.bag import file as bag_module
    monkeypatch.setattr(bag_module, 'VALIDATE_CHUNK_ENTRIES', chunk)   # small chunks, same code
    path = tmp_path / 'x.bag'
    with BagFileWriter(path) as w:
        for i in range(7):
            w.append(bytes([i]) * (i + 1))
    Bag(path).validate()
    table = Bag(path).index_offset
    patch(path, table + 8 * 3, u64(2))                # record 3 ends before it starts (at 6)
    with pytest.raises(FormatError, match='record 3 ends at 2, before it starts at 6') as info:
        Bag(path).validate()
    assert (info.value.path, info.value.index) == (str(path), 3)
