"""The gulp reader, writer, checker and detector against gulpio2's own files.

Every expectation comes from tests/fixtures/MANIFEST.json (written by
gulpio2 0.0.4); corruption tests work on copies in ``tmp_path``.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

from loadr.codecs import decode_image, encode_image
from loadr.errors import ConfigError, DecodeError, FormatError, UnsafeFormatError, WriterError
from loadr.readers import Files, gulp
from loadr.readers.gulp import FORMAT, GulpReader, GulpWriter
from tests.readers.common import assert_equal, check_reader_contract

pytestmark = pytest.mark.timeout(60)

CHUNK_FILES = ('data_0.gulp', 'meta_0.gmeta', 'data_1.gulp', 'meta_1.gmeta')


def sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def copy_dataset(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """A writable copy (the fixtures are read-only, and copytree would keep that)."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.fixture
def gdir(fixtures, tmp_path) -> pathlib.Path:
    return copy_dataset(fixtures / 'gulp', tmp_path / 'g')


def edit_gmeta(path: pathlib.Path, fn) -> None:
    table = json.loads(path.read_text())
    fn(table)
    path.write_text(json.dumps(table))


class CountingFiles(Files):
    """Files that records every read it is asked for: (path, offset, length)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def read(self, path, offset, length, index=None):
        self.reads.append((os.path.basename(path), offset, length))
        return super().read(path, offset, length, index)


# ----------------------------------------------------------------------------- manifest

@pytest.mark.parametrize('key', ['gulp', 'gulp_pickle'])
def test_every_item_matches_manifest(fixtures, manifest, key):
    expected = manifest['datasets'][key]
    path = fixtures / expected['path']
    allow = key == 'gulp_pickle'
    raw = GulpReader(path, decode_images=False, allow_pickle=allow)
    decoded = GulpReader(path, allow_pickle=allow)
    assert len(raw) == len(decoded) == expected['num_items'] == 6
    assert raw.ids == expected['numeric_chunk_order_ids'] == [it['id'] for it in expected['items']]
    for i, item in enumerate(expected['items']):
        assert raw.index_of(item['id']) == i
        assert raw.frame_info(i) == [tuple(t) for t in item['frame_info']]
        assert raw.available(i) == {'id': True, 'meta': True, 'frames': range(item['num_frames'])}
        r, d = raw[i], decoded[i]
        assert r['id'] == d['id'] == item['id']
        assert r['meta'] == d['meta'] == item['meta_data']
        assert len(r['frames']) == len(d['frames']) == item['num_frames']
        chunk = expected['chunks'][item['chunk_id']]
        data = (fixtures / chunk['data_file']).read_bytes()
        for j, (frame, jpeg, pixels) in enumerate(zip(item['frames'], r['frames'], d['frames'])):
            record = data[frame['offset']:frame['offset'] + frame['length']]
            assert sha(record) == frame['record_sha256'], (i, j)
            assert isinstance(jpeg, bytes)
            assert len(jpeg) == frame['jpeg']['len'] == frame['length'] - frame['pad']
            assert sha(jpeg) == frame['jpeg']['sha256'], (i, j)
            ref = frame['jpeg']['pillow']
            assert pixels.dtype == np.dtype(ref['dtype']) and list(pixels.shape) == ref['shape']
            assert sha(pixels.tobytes()) == ref['sha256'], (i, j)
            assert pixels.ndim == (2 if frame['jpeg']['pillow_mode'] == 'L' else 3)
    assert raw.spec == {'id': 'utf8', 'frames': 'jpg[]', 'meta': 'json'}


def test_label2idx(fixtures, manifest, tmp_path):
    assert GulpReader(fixtures / 'gulp').label2idx == manifest['datasets']['gulp']['label2idx']
    assert GulpReader(fixtures / 'gulp_pickle', allow_pickle=True).label2idx is None
    copy = copy_dataset(fixtures / 'gulp', tmp_path / 'g')
    (copy / 'label2idx.json').write_text('{"a": ')
    with pytest.raises(FormatError, match='not valid JSON') as e:
        _ = GulpReader(copy).label2idx
    assert e.value.path.endswith('label2idx.json')


def test_reader_contract(fixtures):
    check_reader_contract(GulpReader(fixtures / 'gulp'))


def test_reader_contract_pickle_allowed(fixtures):
    # allow_pickle must travel with the pickled reader into the other process.
    check_reader_contract(GulpReader(fixtures / 'gulp_pickle', allow_pickle=True,
                                     decode_images=False))


def test_pickled_reader_carries_no_index(fixtures):
    r = GulpReader(fixtures / 'gulp')
    blob = pickle.dumps(r)
    assert b'vid_a' not in blob and b'frame_info' not in blob
    assert pickle.loads(blob).ids == r.ids


def test_format_row_and_detect(fixtures, tmp_path):
    assert FORMAT.name == 'gulp' and FORMAT.reader is GulpReader and FORMAT.writer is GulpWriter
    assert FORMAT.check is gulp.check and FORMAT.detect is gulp.detect
    assert gulp.detect(fixtures / 'gulp') and gulp.detect(str(fixtures / 'gulp_pickle'))
    (tmp_path / 'only_meta').mkdir()
    (tmp_path / 'only_meta' / 'meta_3.gmeta').write_text('{}')
    assert gulp.detect(tmp_path / 'only_meta')
    (tmp_path / 'empty').mkdir()
    for other in (fixtures / 'bag', fixtures / 'ffrecord' / 'single.ffr', tmp_path / 'empty',
                  tmp_path / 'missing', fixtures / 'gulp' / 'data_0.gulp', None, 3):
        assert gulp.detect(other) is False


# ----------------------------------------------------------------------------- subsets

def test_masks_and_get_select_frames(fixtures):
    r = GulpReader(fixtures / 'gulp')
    full = r[1]            # vid_b, 12 frames
    assert len(full['frames']) == 12

    def same(got, positions):
        assert_equal(got, [full['frames'][p] for p in positions])

    part = r[1, {'frames': range(2, 6), 'meta': True}]
    assert set(part) == {'frames', 'meta'} and part['meta'] == full['meta']
    same(part['frames'], [2, 3, 4, 5])
    same(r[1, {'frames': [4, 0, 4, 11]}]['frames'], [4, 0, 4, 11])
    same(r[1, {'frames': range(10, 0, -3)}]['frames'], [10, 7, 4, 1])
    same(r[1, {'frames': slice(None, None, 5)}]['frames'], [0, 5, 10])
    same(r[1, {'frames': np.array([3, 1])}]['frames'], [3, 1])
    assert r[1, {'frames': range(0)}] == {'frames': []}
    assert r[1, {'id': True}] == {'id': 'vid_b'}
    assert r[1, {}] == {}
    assert r[1, {'id': True, 'meta': False, 'frames': False}] == {'id': 'vid_b'}

    got = r.get('vid_b', frames=slice(1, 10, 2))
    assert got['id'] == 'vid_b' and got['meta'] == full['meta']
    same(got['frames'], [1, 3, 5, 7, 9])
    same(r.get('vid_b', frames=[1, 5, 6, 8])['frames'], [1, 5, 6, 8])
    same(r.get('vid_b', frames=[-1, -12])['frames'], [11, 0])
    same(r.get('vid_b', frames=range(3))['frames'], [0, 1, 2])
    assert_equal(r.get('vid_b'), full)
    r.get('vid_b')['meta']['label'] = 'edited'       # the caller's copy, not the reader's
    assert r[1]['meta'] == full['meta'] == {'label': 'falling', 'label_idx': 2}
    assert_equal(r.get(10), r[3])          # ids are strings; an int is looked up as one

    with pytest.raises(IndexError, match='frame 12 out of range for 12 frames at datapoint 1'):
        r[1, {'frames': [0, 12]}]
    with pytest.raises(IndexError, match='out of range'):
        r[1, {'frames': range(10, 13)}]
    with pytest.raises(IndexError):
        r[1, {'frames': [-1]}]              # masks take positions; negatives only in get()
    with pytest.raises(IndexError):
        r.get('vid_b', frames=[-13])
    with pytest.raises(TypeError):
        r[1, {'frames': [1.0]}]
    with pytest.raises(TypeError):
        r[1, {'frames': [True]}]
    with pytest.raises(TypeError):
        r[1, {'frames': 'all'}]
    with pytest.raises(TypeError):
        r[1, {'meta': range(2)}]
    with pytest.raises(ConfigError, match="'label'"):
        r[1, {'label': True}]
    with pytest.raises(TypeError):
        r[1, ['frames']]


def test_unknown_id_is_a_key_error_naming_id_and_path(fixtures):
    r = GulpReader(fixtures / 'gulp')
    for bad in ('vid_zz', 11, None):
        with pytest.raises(KeyError) as e:
            r.get(bad)
        assert repr(bad) in str(e.value) and str(fixtures / 'gulp') in str(e.value)
    with pytest.raises(KeyError, match='nope'):
        r.index_of('nope')


def test_contiguous_frames_are_one_read(fixtures):
    r = GulpReader(fixtures / 'gulp', decode_images=False)
    r._files = files = CountingFiles()
    info = r.frame_info(1)

    r[1, {'frames': range(2, 9)}]
    start, end = info[2][0], info[8][0] + info[8][2]
    assert files.reads == [('data_0.gulp', start, end - start)]

    files.reads.clear()
    r.get('vid_b')                                 # the whole video: one read
    assert files.reads == [('data_0.gulp', info[0][0], sum(t[2] for t in info))]

    files.reads.clear()
    r.get('vid_b', frames=[1, 2, 3, 7, 8, 0])      # three runs: 1-3, 7-8, 0
    assert [offset for _, offset, _ in files.reads] == [info[1][0], info[7][0], info[0][0]]

    files.reads.clear()
    r[1, {'meta': True, 'id': True}]               # no frames asked, nothing read
    assert files.reads == []


def test_read_plan_groups_only_adjacent_frames():
    frames = [(0, 1, 8), (8, 0, 4), (12, 2, 8), (40, 0, 4)]    # frame 3 is not adjacent
    assert gulp.layout.read_plan(frames, [0, 1, 2, 3]) == [
        (0, 20, [(0, 7), (8, 12), (12, 18)]), (40, 4, [(0, 4)])]
    assert gulp.layout.read_plan(frames, [2, 1]) == [(12, 8, [(0, 6)]), (8, 4, [(0, 4)])]
    assert gulp.layout.read_plan(frames, []) == []


# ----------------------------------------------------------------------------- pickle

def test_pickled_gmeta_is_refused_by_default(fixtures):
    with pytest.raises(UnsafeFormatError, match='allow_pickle=True') as e:
        GulpReader(fixtures / 'gulp_pickle')
    assert e.value.path == str(fixtures / 'gulp_pickle' / 'meta_0.gmeta')
    assert isinstance(e.value, FormatError)


def test_pickle_allowed_equals_json_fixture(fixtures):
    a = GulpReader(fixtures / 'gulp')
    b = GulpReader(fixtures / 'gulp_pickle', allow_pickle=True)
    assert a.ids == b.ids
    for i in range(len(a)):
        assert a.frame_info(i) == b.frame_info(i)
        assert_equal(a[i], b[i], f'datapoint {i}')


class _Evil:
    def __reduce__(self):
        return (os.system, ('touch PWNED',))


def test_restricted_unpickler_refuses_other_classes(fixtures, tmp_path):
    g = copy_dataset(fixtures / 'gulp_pickle', tmp_path / 'g')
    (g / 'meta_1.gmeta').write_bytes(pickle.dumps({'10': _Evil()}))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(UnsafeFormatError, match=r'system') as e:
            GulpReader(g, allow_pickle=True)
    finally:
        os.chdir(cwd)
    assert e.value.path == str(g / 'meta_1.gmeta')
    assert not (tmp_path / 'PWNED').exists()

    (g / 'meta_1.gmeta').write_bytes(pickle.dumps(['not', 'a', 'mapping']))
    with pytest.raises(FormatError, match='not an object of videos'):
        GulpReader(g, allow_pickle=True)
    (g / 'meta_1.gmeta').write_bytes(pickle.dumps({'10': 1})[:-5])
    with pytest.raises(FormatError, match='cannot unpickle') as e:
        GulpReader(g, allow_pickle=True)
    assert e.value.path == str(g / 'meta_1.gmeta')


# ----------------------------------------------------------------------------- writer

def test_writer_round_trip_arrays_bytes_gray_rgb_chunks(tmp_path):
    rng = np.random.default_rng(0)
    rgb = [rng.integers(0, 256, (24, 32, 3), dtype=np.uint8) for _ in range(4)]
    gray = [rng.integers(0, 256, (16, 8), dtype=np.uint8) for _ in range(3)]
    jpegs = [encode_image(a, quality=q) for a, q in zip(rgb + gray, (60, 70, 80, 50, 40, 30))]
    videos = [('rgb', {'label': 'x', 'n': 1}, rgb),
              ('gray', {'label': 'gris', 'é': [1, 2]}, gray),
              (7, {}, jpegs),
              ('mixed', {'k': None}, [gray[1], jpegs[0], rgb[3][:, :, :]]),
              ('one', {'label': 'y'}, [rgb[0]])]
    out = tmp_path / 'out'
    with GulpWriter(out, videos_per_chunk=2, label2idx={'x': 0, 'gris': 1}) as w:
        for id_, meta, frames in videos:
            w.append(id_, meta, frames)
    assert sorted(os.listdir(out)) == ['data_0.gulp', 'data_1.gulp', 'data_2.gulp',
                                       'label2idx.json', 'meta_0.gmeta', 'meta_1.gmeta',
                                       'meta_2.gmeta']
    assert sorted(os.listdir(tmp_path)) == ['out']      # no temporary left behind
    assert gulp.check(out) == []
    raw, dec = GulpReader(out, decode_images=False), GulpReader(out)
    assert raw.ids == ['rgb', 'gray', '7', 'mixed', 'one']
    assert raw.label2idx == {'x': 0, 'gris': 1}
    for i, (_id, meta, frames) in enumerate(videos):
        assert raw[i]['meta'] == meta
        for j, (frame, jpeg, pixels) in enumerate(zip(frames, raw[i]['frames'], dec[i]['frames'])):
            if isinstance(frame, bytes):
                assert jpeg == frame, (i, j)
            else:
                # Pillow at quality 90, exactly what encode_image gives.
                assert jpeg == encode_image(frame, quality=90), (i, j)
                assert pixels.shape == frame.shape
            assert_equal(pixels, decode_image(jpeg), f'{i}/{j}')
        for _offset, pad, length in raw.frame_info(i):
            assert length % 4 == 0 and pad == (4 - (length - pad) % 4) % 4
    assert {pad for i in range(5) for _, pad, _ in raw.frame_info(i)} == {0, 1, 2, 3}
    assert [raw.frame_info(i)[0][0] for i in range(5)] == [0, 0 + sum(
        t[2] for t in raw.frame_info(0)), 0, sum(t[2] for t in raw.frame_info(2)), 0]


def test_writer_reproduces_fixture_bytes(fixtures, manifest, tmp_path):
    expected = manifest['datasets']['gulp']
    src = GulpReader(fixtures / 'gulp', decode_images=False)
    out = tmp_path / 'copy'
    with GulpWriter(out, videos_per_chunk=3, label2idx=expected['label2idx']) as w:
        for item in expected['items']:
            dp = src.get(item['id'])
            w.append(item['id'], item['meta_data'], dp['frames'])
    for name in (*CHUNK_FILES, 'label2idx.json'):
        want = manifest['files'][f'gulp/{name}']
        got = (out / name).read_bytes()
        assert (len(got), sha(got)) == (want['size'], want['sha256']), name


def test_writer_refuses_bad_input(tmp_path):
    frame = np.zeros((8, 8, 3), np.uint8)
    busy = tmp_path / 'busy'
    busy.mkdir()
    (busy / 'x').write_text('keep me')
    with pytest.raises(WriterError, match='non-empty'):
        GulpWriter(busy)
    assert (busy / 'x').read_text() == 'keep me'
    (tmp_path / 'file').write_text('x')
    with pytest.raises(WriterError, match='existing file'):
        GulpWriter(tmp_path / 'file')
    with pytest.raises(WriterError, match='videos_per_chunk'):
        GulpWriter(tmp_path / 'o', videos_per_chunk=0)
    with pytest.raises(WriterError, match='label2idx'):
        GulpWriter(tmp_path / 'o', label2idx=['a'])

    out = tmp_path / 'out'
    w = GulpWriter(out)
    w.append('a', {}, [frame])
    bad_calls = [
        (('a', {}, [frame]), "'a' was already appended"),
        ((10, {}, [frame]), None),                       # fine: stored as '10'
        (('10', {}, [frame]), "'10' was already appended"),
        (('b', {}, []), 'has no frames'),
        (('b', {}, frame), 'must be a list'),
        (('b', {}, [b'\x89PNG....']), 'not a JPEG'),
        (('b', {}, [np.zeros((4, 4), np.float32)]), 'cannot be JPEG-encoded'),
        (('b', {}, [np.zeros((4, 4, 4), np.uint8)]), 'cannot be JPEG-encoded'),
        (('b', {'x': object()}, [frame]), 'not JSON-serializable'),
        (('b', ['not a dict'], [frame]), 'must be a dict'),
        ((None, {}, [frame]), 'must be a str'),
        (('b', {}, [frame, b'nope']), 'frame 1'),
    ]
    for args, message in bad_calls:
        if message is None:
            w.append(*args)
        else:
            with pytest.raises(WriterError, match=message):
                w.append(*args)
    w.append('b', {}, [frame])      # a failed append left the writer usable
    w.close()
    w.close()
    assert GulpReader(out).ids == ['a', '10', 'b']
    with pytest.raises(WriterError, match='after close'):
        w.append('c', {}, [frame])

    empty = tmp_path / 'empty'
    empty.mkdir()                   # an existing empty directory may be written into
    with GulpWriter(empty) as w:
        w.append('only', {}, [frame])
    assert GulpReader(empty).ids == ['only']
    with pytest.raises(WriterError, match='no videos'):
        with GulpWriter(tmp_path / 'none'):
            pass
    assert not (tmp_path / 'none').exists()


def test_interrupted_write_leaves_nothing_that_opens(tmp_path):
    frame = np.zeros((8, 8, 3), np.uint8)
    out = tmp_path / 'out'
    with pytest.raises(RuntimeError, match='boom'):
        with GulpWriter(out, videos_per_chunk=1) as w:
            w.append('a', {}, [frame])
            w.append('b', {}, [frame])
            raise RuntimeError('boom')
    assert os.listdir(tmp_path) == []
    with pytest.raises(FormatError, match='not a directory'):
        GulpReader(out)

    # A process killed mid-write (no cleanup at all) leaves no dataset at the path.
    script = (
        'import os, sys, numpy as np\n'
        'from loadr.readers.gulp import GulpWriter\n'
        'w = GulpWriter(sys.argv[1], videos_per_chunk=1)\n'
        'for i in range(3): w.append(str(i), {}, [np.zeros((8, 8, 3), np.uint8)])\n'
        'os._exit(9)\n')
    root = pathlib.Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, '-c', script, str(out)], cwd=root, timeout=30)
    assert proc.returncode == 9
    assert not out.exists()
    with pytest.raises(FormatError):
        GulpReader(out)


# ----------------------------------------------------------------------------- corruption

def test_truncated_gulp_names_file_and_index(gdir):
    data = (gdir / 'data_1.gulp').read_bytes()
    (gdir / 'data_1.gulp').write_bytes(data[:100_000])      # vid_f (index 5) frame 1 is cut
    with pytest.raises(FormatError, match="video 'vid_f' frame 1: .*past the end") as e:
        GulpReader(gdir)
    assert (e.value.path, e.value.index) == (str(gdir / 'data_1.gulp'), 5)


def test_file_cut_after_open_is_a_truncation_error(gdir):
    r = GulpReader(gdir, decode_images=False)
    data = (gdir / 'data_0.gulp').read_bytes()
    (gdir / 'data_0.gulp').write_bytes(data[:50_000])
    assert r[0]['id'] == 'vid_a'                               # still within the file
    with pytest.raises(FormatError, match='truncated') as e:
        r[1]
    assert (e.value.path, e.value.index) == (str(gdir / 'data_0.gulp'), 1)


@pytest.mark.parametrize('text, message', [
    ('', 'empty'),
    ('{"vid_a": {"frame_info": [[0, 0, 4]', 'not valid JSON'),
    ('\xff\xfe{}', 'not UTF-8'),
    ('[1, 2]', 'holds a list'),
    ('{"x": {"frame_info": [], "meta_data": [{}]}, "x": {}}', "key 'x' twice"),
    ('[' * 100_000, 'nested too deeply|not valid JSON'),
])
def test_broken_json_names_the_gmeta(gdir, text, message):
    (gdir / 'meta_1.gmeta').write_bytes(text.encode('latin-1'))
    with pytest.raises(FormatError, match=message) as e:
        GulpReader(gdir)
    assert e.value.path == str(gdir / 'meta_1.gmeta')
    assert not isinstance(e.value, UnsafeFormatError)


LIES = [
    # (how vid_b's entry is changed, message, file that is named)
    (lambda e: e['frame_info'].__setitem__(2, [10**9, 0, 8]), 'frame 2: .*past the end', 'data'),
    (lambda e: e['frame_info'].__setitem__(2, [2**80, 0, 2**70]), 'frame 2: .*past the end',
     'data'),
    (lambda e: e['frame_info'].__setitem__(2, [22292, 3, 2**62]), 'frame 2: .*past the end',
     'data'),
    (lambda e: e['frame_info'].__setitem__(2, [-4, 3, 7940]), 'frame 2: .*non-negative', 'meta'),
    (lambda e: e['frame_info'].__setitem__(2, [22292, -1, 7940]), 'frame 2: .*non-negative',
     'meta'),
    (lambda e: e['frame_info'].__setitem__(2, [22292, 3.0, 7940]), 'frame 2: .*integers', 'meta'),
    (lambda e: e['frame_info'].__setitem__(2, [22292, True, 7940]), 'frame 2: .*integers', 'meta'),
    (lambda e: e['frame_info'].__setitem__(2, ['22292', 3, 7940]), 'frame 2: .*integers', 'meta'),
    (lambda e: e['frame_info'].__setitem__(2, [22292, 3]), 'frame 2: .*integers', 'meta'),
    (lambda e: e['frame_info'].__setitem__(2, None), 'frame 2: .*integers', 'meta'),
    (lambda e: e['frame_info'].__setitem__(2, [22292, 5, 7940]), 'frame 2: pad 5 is not below 4',
     'meta'),
    (lambda e: e['frame_info'].__setitem__(2, [22292, 3, 2]), 'frame 2: pad 3 is larger', 'meta'),
    (lambda e: e.__setitem__('frame_info', {'0': 1}), 'frame_info is missing', 'meta'),
    (lambda e: e.pop('frame_info'), 'frame_info is missing', 'meta'),
    (lambda e: e.__setitem__('meta_data', []), 'meta_data', 'meta'),
    (lambda e: e.pop('meta_data'), 'meta_data', 'meta'),
]


@pytest.mark.parametrize('lie, message, file', LIES)
def test_lying_frame_info_names_file_index_and_frame(gdir, lie, message, file):
    edit_gmeta(gdir / 'meta_0.gmeta', lambda t: lie(t['vid_b']))
    with pytest.raises(FormatError, match="video 'vid_b'.*" + message) as e:
        GulpReader(gdir)
    assert e.value.index == 1
    assert e.value.path == str(gdir / ('data_0.gulp' if file == 'data' else 'meta_0.gmeta'))
    problems = gulp.check(gdir)
    assert any(p.index == 1 and p.path == e.value.path and e.value.message == p.message
               for p in problems), problems


def test_entry_not_an_object(gdir):
    edit_gmeta(gdir / 'meta_1.gmeta', lambda t: t.__setitem__('9', [1, 2, 3]))
    with pytest.raises(FormatError, match="video '9': entry is a list") as e:
        GulpReader(gdir)
    assert (e.value.path, e.value.index) == (str(gdir / 'meta_1.gmeta'), 4)


def test_missing_pairs_gaps_and_empty_directory(gdir, fixtures, tmp_path):
    (gdir / 'meta_1.gmeta').unlink()
    with pytest.raises(FormatError, match='data_1.gulp has no meta_1.gmeta') as e:
        GulpReader(gdir)
    assert e.value.path == str(gdir / 'data_1.gulp')

    (gdir / 'data_1.gulp').unlink()
    (gdir / 'data_0.gulp').unlink()
    with pytest.raises(FormatError, match='meta_0.gmeta has no data_0.gulp') as e:
        GulpReader(gdir)
    assert e.value.path == str(gdir / 'meta_0.gmeta')

    g2 = copy_dataset(fixtures / 'gulp', tmp_path / 'gap')
    os.rename(g2 / 'data_1.gulp', g2 / 'data_2.gulp')
    os.rename(g2 / 'meta_1.gmeta', g2 / 'meta_2.gmeta')
    with pytest.raises(FormatError, match='chunk 1 is missing') as e:
        GulpReader(g2)
    assert e.value.path == str(g2 / 'data_1.gulp')

    (g2 / 'data_99999999999999.gulp').write_bytes(b'')      # no loop over the gap
    with pytest.raises(FormatError, match='data_99999999999999.gulp has no meta'):
        GulpReader(g2)
    assert any('99999999999997 missing in all' in p.message for p in gulp.check(g2))
    (g2 / 'data_99999999999999.gulp').unlink()

    (g2 / 'data_x.gulp').write_bytes(b'')
    with pytest.raises(FormatError, match='data_x.gulp is not a chunk file name'):
        GulpReader(g2)

    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(FormatError, match='no gulp chunks') as e:
        GulpReader(empty)
    assert e.value.path == str(empty)


def test_numeric_chunk_order(tmp_path):
    frame = np.zeros((8, 8), np.uint8)
    out = tmp_path / 'out'
    with GulpWriter(out, videos_per_chunk=1) as w:
        for i in range(12):
            w.append(f'v{i}', {'i': i}, [frame])
    # data_2 comes before data_10 (gulpio2 would sort the names as strings).
    assert GulpReader(out).ids == [f'v{i}' for i in range(12)]



def same_json(a, b) -> bool:
    """Equal values of the same types, recursively (1 is not 1.0 nor True; nan is nan)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


def test_every_kind_of_json_meta_reads_back_as_json_gives_it(gdir):
    # The metas are kept serialised (msgpack, or a pickle of what msgpack cannot hold)
    # and decoded on each read: each must come back as json.loads gives it.
    metas = [{'int': 2**70, 'neg': -2**64, 'f': -0.0, 'nan': float('nan'), 'inf': float('inf'),
              'nested': [[], {}, [1, 2.5, None, True, 'x']], 'lone': '\ud800', 'é': 'ü'},
             {}, {'only': [1.0, 1, False]}]
    edit_gmeta(gdir / 'meta_0.gmeta', lambda t: [
        entry.update(meta_data=[meta]) for entry, meta in zip(t.values(), metas)])
    expected = [entry['meta_data'][0] for entry in
                json.loads((gdir / 'meta_0.gmeta').read_text()).values()][:3]
    reader = GulpReader(gdir, decode_images=False)
    for i, meta in enumerate(expected):
        got = reader[i]['meta']
        assert same_json(got, meta), (i, got, meta)
        got.clear()                     # a new object each read: editing it changes nothing
        assert same_json(reader[i]['meta'], meta)
    again = pickle.loads(pickle.dumps(reader))      # another process rebuilds the index
    assert same_json(again.get(again.ids[0])['meta'], expected[0])


def test_the_index_holds_no_python_object_per_video(tmp_path):
    # A forked worker copies every page of Python objects it reads (reference counts
    # are written): the index is flat arrays. Before, 5,000 videos were ~20,000
    # objects (a _Video, its meta dict, its frame tuples).
    jpeg = encode_image(np.zeros((8, 8), np.uint8))
    out = tmp_path / 'many'
    with GulpWriter(out, videos_per_chunk=1000) as w:
        for i in range(5000):
            w.append(f'v{i}', {'label': i, 'name': f'clip {i}'}, [jpeg, jpeg])
    gc.collect()
    before = len(gc.get_objects())
    reader = GulpReader(out, decode_images=False)
    gc.collect()
    grew = len(gc.get_objects()) - before
    assert grew < 200, grew
    assert reader[4321] == {'id': 'v4321', 'frames': [jpeg, jpeg],
                            'meta': {'label': 4321, 'name': 'clip 4321'}}
    assert reader.index_of('v17') == 17 and reader.details()['frames'] == 10_000

def test_duplicate_ids(gdir):
    edit_gmeta(gdir / 'meta_1.gmeta',
               lambda t: t.update({'vid_b': t.pop('9')}) or None)     # '9' renamed
    with pytest.raises(FormatError, match="'vid_b' is also in .*meta_0.gmeta") as e:
        GulpReader(gdir)
    assert (e.value.path, e.value.index) == (str(gdir / 'meta_1.gmeta'), 5)
    problems = gulp.check(gdir)
    assert [(p.path, p.index) for p in problems if 'also in' in p.message] == [
        (str(gdir / 'meta_1.gmeta'), 5)]


def test_bad_jpeg_start_fails_on_read_naming_frame(gdir):
    data = bytearray((gdir / 'data_0.gulp').read_bytes())
    data[22292] = 0x00                      # vid_b (index 1) frame 2
    (gdir / 'data_0.gulp').write_bytes(bytes(data))
    for decode in (True, False):
        r = GulpReader(gdir, decode_images=decode)
        r[0]
        r[1, {'frames': [0, 1, 3]}]         # the broken frame is not read
        with pytest.raises(DecodeError, match="frame 2 of video 'vid_b' is not a JPEG") as e:
            r[1]
        assert (e.value.path, e.value.index) == (str(gdir / 'data_0.gulp'), 1)


def test_undecodable_jpeg_is_a_decode_error(gdir):
    data = bytearray((gdir / 'data_0.gulp').read_bytes())
    data[22294:22294 + 600] = b'\xff' * 600     # keep SOI, wreck the headers after it
    (gdir / 'data_0.gulp').write_bytes(bytes(data))
    with pytest.raises(DecodeError, match="frame 2 of video 'vid_b'") as e:
        GulpReader(gdir)[1]
    assert (e.value.path, e.value.index) == (str(gdir / 'data_0.gulp'), 1)
    assert len(GulpReader(gdir, decode_images=False)[1]['frames']) == 12


# ----------------------------------------------------------------------------- check

def test_check_clean_fixture_has_no_problems(fixtures):
    assert gulp.check(fixtures / 'gulp') == []


def test_check_pickle_fixture_is_reported_not_unpickled(fixtures):
    problems = gulp.check(fixtures / 'gulp_pickle')
    assert [p.path for p in problems] == [str(fixtures / 'gulp_pickle' / f)
                                          for f in ('meta_0.gmeta', 'meta_1.gmeta')]
    assert all('allow_pickle=True' in p.message for p in problems)


def test_check_finds_planted_problems(gdir):
    data0 = bytearray((gdir / 'data_0.gulp').read_bytes())
    data0[2536] = 0x12                      # vid_a (index 0) frame 1: bad SOI
    data0[3899] = 0x01                      # vid_a frame 1's third pad byte is not NUL
    (gdir / 'data_0.gulp').write_bytes(bytes(data0) + b'\0' * 8)   # and 8 stray bytes
    (gdir / 'meta_1.gmeta').write_text('{"broken": ')
    (gdir / 'label2idx.json').write_text('[')
    (gdir / 'data_7.gulp').write_bytes(b'')
    problems = gulp.check(gdir)
    text = '\n'.join(map(str, problems))
    d0, m1 = str(gdir / 'data_0.gulp'), str(gdir / 'meta_1.gmeta')
    expected = [
        (d0, 0, "video 'vid_a' frame 1 does not start with a JPEG SOI marker"),
        (d0, 0, "video 'vid_a' frame 1: padding is 000001"),
        (d0, None, 'file is 110744 bytes but its .gmeta says the last frame ends at byte 110736'),
        (m1, None, '.gmeta is not valid JSON'),
        (str(gdir / 'label2idx.json'), None, 'label2idx.json is not valid JSON'),
        (str(gdir / 'data_7.gulp'), None, 'data_7.gulp has no meta_7.gmeta'),
        (str(gdir / 'data_2.gulp'), None, 'chunk 2 is missing'),
    ]
    for path, index, message in expected:
        assert any(p.path == path and p.index == index and p.message.startswith(message)
                   for p in problems), f'{message!r} not in:\n{text}'
    assert 'chunk 2 is missing (5 missing in all' in text      # chunks 2..6, said once
    assert len(problems) == len(expected), text


def test_check_empty_files_and_frames_past_end(gdir):
    (gdir / 'data_1.gulp').write_bytes(b'')
    (gdir / 'meta_0.gmeta').write_bytes(b'')
    problems = gulp.check(gdir)
    text = '\n'.join(map(str, problems))
    d1, m0 = str(gdir / 'data_1.gulp'), str(gdir / 'meta_0.gmeta')
    assert sum(p.path == d1 and p.message == 'file is empty' for p in problems) == 1, text
    assert sum(p.path == m0 and p.message == 'file is empty' for p in problems) == 1, text
    assert not any('.gmeta file is empty' in p.message for p in problems), text  # said once
    past = [p for p in problems if p.path == d1 and 'past the end' in p.message]
    # chunk 0 could not be read, so chunk 1's datapoint indices are unknown
    assert len(past) == 10 and all(p.index is None for p in past), text
    assert 'vid_f' in past[-1].message


def test_check_duplicate_and_past_end_indices(gdir):
    data = (gdir / 'data_1.gulp').read_bytes()
    (gdir / 'data_1.gulp').write_bytes(data[:100_000])
    problems = gulp.check(gdir)
    assert [(p.index, p.message.split(':')[0]) for p in problems] == [
        (5, "video 'vid_f' frame 1"), (5, "video 'vid_f' frame 2")]
    assert all(p.path == str(gdir / 'data_1.gulp') for p in problems)


def test_check_missing_directory(tmp_path):
    problems = gulp.check(tmp_path / 'missing')
    assert len(problems) == 1 and 'not a directory' in problems[0].message
