"""WebDataset shards: what the webdataset package writes, loadr reads, and back."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import shutil
import tarfile

import numpy as np
import pytest
from PIL import Image

import loadr
from loadr import fns
from loadr.convert import convert
from loadr.errors import DecodeError, FormatError, SpecError
from loadr.readers.webdataset import build_index, check
from loadr.readers.webdataset.index import SIDECAR_SUFFIX, parse_sidecar, scan, sidecar_bytes
from loadr.storage import LocalStorage

from ..loader_helpers import batch_digest, stream_digests
from .common import assert_equal, check_reader_contract

wds = pytest.importorskip('webdataset')
pytestmark = pytest.mark.timeout(60)


def jpeg(seed: int, side: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (side, side, 3), np.uint8)).save(out, 'JPEG')
    return out.getvalue()


def sample(k: int) -> dict:
    return {'__key__': f'{k:06d}', 'jpg': jpeg(k), 'cls': k % 7, 'json': {'id': k, 'tags': ['a']},
            'txt': f'caption {k}'}


def write_shards(root, shards=3, per=6, name='train-{:06d}.tar') -> list[str]:
    """Shards written by the webdataset package itself."""
    os.makedirs(root, exist_ok=True)
    paths = []
    for s in range(shards):
        path = os.path.join(root, name.format(s))
        with wds.TarWriter(path) as w:
            for i in range(per):
                w.write(sample(s * per + i))
        paths.append(path)
    return paths


@pytest.fixture
def shards(tmp_path):
    write_shards(tmp_path / 'shards')
    return tmp_path / 'shards'


def test_reads_what_webdataset_writes_with_the_same_content(shards):
    r = loadr.open(str(shards / 'train-{000000..000002}.tar'))
    assert len(r) == 18 and type(r).__name__ == 'WebDatasetReader'
    theirs = wds.WebDataset(str(shards / 'train-{000000..000002}.tar'), shardshuffle=False,
                            empty_check=False).decode()
    for i, dp in enumerate(theirs):
        mine = r[i]
        assert set(mine) == set(dp) - {'__url__', '__local_path__'}
        for key in mine:
            assert mine[key] == dp[key], (i, key)
    assert r[3]['jpg'] == jpeg(3)             # images stay bytes, for decode_jpeg
    assert r.spec == {'__key__': 'utf8', 'cls': 'int', 'jpg': 'jpg', 'json': 'msgpack',
                      'txt': 'utf8'}
    check_reader_contract(r)


def test_a_directory_a_glob_a_list_and_one_tar_open(shards):
    names = sorted(p for p in os.listdir(shards) if p.endswith('.tar'))
    by_pattern = loadr.open(str(shards / 'train-{000000..000002}.tar'))
    for other in (loadr.open(shards), loadr.open(str(shards / '*.tar')),
                  loadr.open([str(shards / n) for n in names])):
        assert len(other) == 18
        assert other.identity() == by_pattern.identity()
        for i in (0, 7, 17):
            assert_equal(other[i], by_pattern[i])
    one = loadr.open(shards / names[1])
    assert len(one) == 6 and one[0]['__key__'] == '000006'
    assert by_pattern.identity()['files'] == {n: os.path.getsize(shards / n) for n in names}


def test_the_index_is_built_once_and_kept_beside_the_tar(shards):
    tar = str(shards / 'train-000000.tar')
    loadr.open(tar)
    side = tar + SIDECAR_SUFFIX
    index = parse_sidecar(open(side, 'rb').read(), os.path.getsize(tar))
    assert index is not None and index.samples == 6 and index.exts == ['cls', 'jpg', 'json', 'txt']
    assert isinstance(index.offset, np.ndarray) and index.offset.dtype == np.int64
    assert sidecar_bytes(index) == open(side, 'rb').read()
    # A scan reads the headers alone: a 512-byte block per member, and the pax header
    # (a block and its data block) Python's tarfile writes before each.
    fresh = scan(LocalStorage(), tar)
    assert fresh.bytes_read == 512 * (3 * fresh.members + 1)
    stamp = os.stat(side).st_mtime_ns
    loadr.open(tar)
    assert os.stat(side).st_mtime_ns == stamp        # read, not built again


def test_a_tar_written_again_gets_a_new_index(shards):
    tar = shards / 'train-000000.tar'
    assert len(loadr.open(tar)) == 6
    with wds.TarWriter(str(tar)) as w:                 # the same name, other samples
        for k in range(9):
            w.write(sample(100 + k))
    r = loadr.open(tar)
    assert len(r) == 9 and r[8]['__key__'] == '000108'


def test_an_index_not_written_travels_with_the_reader(shards):
    # As where the directory is read-only (root may write anywhere, so asked by name here).
    r = loadr.open(shards, write_index=False)
    assert not any(n.endswith(SIDECAR_SUFFIX) for n in os.listdir(shards))
    shipped = pickle.loads(pickle.dumps(r))
    assert shipped._shards[0].index is not None
    assert_equal(shipped[10], r[10])
    check_reader_contract(r)
    kept = loadr.open(shards)                 # written now: workers read it themselves
    assert pickle.loads(pickle.dumps(kept))._shards[0].index is None


def test_pickled_members_are_never_unpickled_unless_asked(tmp_path):
    tar = str(tmp_path / 'p.tar')
    payload = pickle.dumps({'x': 1})
    with wds.TarWriter(tar) as w:
        w.write({'__key__': 'a', 'pyd': payload, 'cls': 1})
    assert loadr.open(tar)[0]['pyd'] == payload
    assert loadr.open(tar, allow_pickle=True)[0]['pyd'] == {'x': 1}


def test_a_compressed_tar_says_how_to_convert(shards, tmp_path):
    raw = (shards / 'train-000000.tar').read_bytes()
    gz = tmp_path / 'x.tar.gz'
    gz.write_bytes(gzip.compress(raw))
    with pytest.raises(FormatError, match='gunzip') as err:
        loadr.open(gz)
    assert str(gz) in str(err.value)
    disguised = tmp_path / 'y.tar'
    disguised.write_bytes(gzip.compress(raw))
    with pytest.raises(FormatError, match='random'):
        loadr.open(disguised)


def test_truncated_and_corrupt_tars_give_loadr_errors_naming_the_tar(shards, tmp_path):
    raw = (shards / 'train-000001.tar').read_bytes()
    index = scan(LocalStorage(), str(shards / 'train-000001.tar'))
    cut = tmp_path / 'cut.tar'
    for end in (int(index.offset[9]) + 10, int(index.offset[9]) - 200):   # in data, in a header
        cut.write_bytes(raw[:end])
        with pytest.raises(FormatError, match='truncated') as err:
            loadr.open(cut)
        assert err.value.path == str(cut)
    bad = tmp_path / 'bad.tar'
    # The second member's header, its name damaged: its checksum no longer holds.
    second = int(index.offset[1]) - 512
    bad.write_bytes(raw[:second] + b'X' + raw[second + 1:])
    with pytest.raises(FormatError, match='checksum') as err:
        loadr.open(bad)
    assert err.value.path == str(bad) and 'member 1' in str(err.value)
    report = loadr.check(cut)
    assert not report.ok and report.problems[0].path == str(cut)


def test_a_member_that_does_not_decode_names_tar_member_and_index(tmp_path):
    tar = str(tmp_path / 'j.tar')
    with wds.TarWriter(tar, encoder=False) as w:
        w.write({'__key__': 'good', 'json': b'{}'})
        w.write({'__key__': 'bad', 'json': b'{not json'})
    r = loadr.open(tar)
    with pytest.raises(DecodeError) as err:
        r[1]
    assert err.value.path == tar and err.value.index == 1 and "'bad.json'" in str(err.value)
    problems = check(tar)
    assert [(p.path, p.index) for p in problems] == [(tar, 1)]
    assert 'bad.json' in problems[0].message


def test_masks_read_only_the_members_asked(shards):
    r = loadr.open(shards)
    assert r[4, {'cls': True}] == {'cls': 4}
    assert r[4, {'__key__': True, 'txt': True}] == {'__key__': '000004', 'txt': 'caption 4'}
    assert r.available(4) == {'__key__': True, 'cls': True, 'jpg': True, 'json': True,
                              'txt': True}
    with pytest.raises(SpecError):
        r[4, {'png': True}]


def test_loadr_writes_shards_the_webdataset_package_reads(shards, tmp_path):
    out = tmp_path / 'out'
    convert(str(shards), out, 'webdataset', shardlen=5)
    tars = sorted(n for n in os.listdir(out) if n.endswith('.tar'))
    assert tars == [f'shard-{k:06d}.tar' for k in range(4)]
    theirs = list(wds.WebDataset(str(out / 'shard-{000000..000003}.tar'), shardshuffle=False,
                                 empty_check=False).decode())
    assert [d['__key__'] for d in theirs] == [f'{k:06d}' for k in range(18)]
    for k, dp in enumerate(theirs):
        want = sample(k)
        assert {key: dp[key] for key in want} == want
    again = loadr.open(out)
    assert check(out) == [] and len(again) == 18
    # The writer's own sidecars are what a scan of its tars finds.
    for name in tars:
        kept = parse_sidecar((out / (name + SIDECAR_SUFFIX)).read_bytes(),
                             os.path.getsize(out / name))
        assert kept is not None
        assert sidecar_bytes(kept) == sidecar_bytes(scan(LocalStorage(), str(out / name)))
    with tarfile.open(out / tars[0]) as t:        # plain tars that tar reads too
        assert t.getnames()[:2] == ['000000.cls', '000000.jpg']


def _pipeline():
    return [fns.select(keys=['jpg', 'cls']), fns.decode_jpeg(key='jpg', size=(12, 12)),
            fns.flip(key='jpg')]


def test_same_batches_as_the_data_converted_to_bag_for_any_worker_count(shards, tmp_path):
    bag = tmp_path / 'bag'
    convert(str(shards), bag, 'bag')
    streams = []
    for source in (loadr.open(shards), loadr.open(bag, decode_images=False)):
        for workers in (0, 2):
            with loadr.Loader(source, batch=4, fns=_pipeline(), seed=5,
                              workers=workers) as loader:
                streams.append(stream_digests(loader, 12))
    assert streams[0] == streams[1] == streams[2] == streams[3]
    assert len(set(streams[0])) > 5


def test_resume_gives_the_same_batches(shards):
    r = loadr.open(shards)
    with loadr.Loader(r, batch=4, fns=_pipeline(), seed=2, workers=2) as loader:
        expected = stream_digests(loader, 10)
    with loadr.Loader(r, batch=4, fns=_pipeline(), seed=2, workers=2) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(loader.save()))
    with loadr.Loader(r, batch=4, fns=_pipeline(), seed=2, workers=0) as loader:
        loader.load(state)
        it = iter(loader)
        assert [batch_digest(next(it)) for _ in range(7)] == expected[3:]


def test_build_index_reports_the_bytes_it_read(shards):
    seen = []
    built = build_index(shards, progress=lambda done, total: seen.append((done, total)))
    total = sum(os.path.getsize(shards / n) for n in os.listdir(shards) if n.endswith('.tar'))
    assert len(built) == 3 and seen[-1] == (total, total)
    assert all(0 < index.bytes_read < index.tar_size for _, index in built)
    again = build_index(shards)
    assert all(index.bytes_read == 0 for _, index in again)     # the sidecars were good


def test_samples_never_span_tars_and_empty_tars_are_fine(tmp_path):
    root = tmp_path / 'd'
    root.mkdir()
    with tarfile.open(root / 'a.tar', 'w'):
        pass
    shutil.copy(write_shards(tmp_path / 'src', shards=1, per=2)[0], root / 'b.tar')
    r = loadr.open(root)
    assert len(r) == 2 and r[1]['__key__'] == '000001'


def test_a_sidecar_of_another_tar_is_caught_at_the_first_read(shards):
    loadr.open(shards)
    a, b = (str(shards / f'train-00000{k}.tar{SIDECAR_SUFFIX}') for k in (0, 1))
    shutil.copy(b, a)                           # same size tars: the size cannot tell
    r = loadr.open(shards / 'train-000000.tar')
    with pytest.raises(FormatError, match='does not match the tar') as err:
        r[2]
    assert err.value.index == 2 and err.value.path.endswith('train-000000.tar')
    assert any(SIDECAR_SUFFIX in p.path for p in check(shards))


def test_large_members_between_small_ones_read_right_in_every_combination(tmp_path):
    # Members over SMALL_MEMBER_BYTES are read alone, small ones together with the header.
    tar = str(tmp_path / 'mixed.tar')
    rng = np.random.default_rng(3)
    samples = []
    for k in range(4):
        big = rng.integers(0, 255, 40_000 + k, np.uint8).tobytes()
        samples.append({'__key__': f's{k}', 'a.bin': big, 'cls': k, 'json': [k],
                        'z.bin': big[::-1], 'txt': 'x' * (20_000 if k % 2 else 3)})
    with wds.TarWriter(tar) as w:
        for dp in samples:
            w.write(dp)
    r = loadr.open(tar)
    for k, dp in enumerate(samples):
        assert r[k] == dp
        for keys in (['cls'], ['a.bin'], ['z.bin', 'json'], ['txt', 'cls', 'a.bin']):
            assert r[k, {key: True for key in keys}] == {key: dp[key] for key in keys}
    assert r.read_batch([3, 0, 3]) == [samples[3], samples[0], samples[3]]


def test_a_folder_whose_name_looks_like_a_pattern_is_that_folder(tmp_path):
    root = tmp_path / 'data[1]{a,b}'
    write_shards(root, shards=2, per=2)
    r = loadr.open(root)
    assert len(r) == 4 and r.identity()['files'] == {'train-000000.tar': os.path.getsize(
        root / 'train-000000.tar'), 'train-000001.tar': os.path.getsize(root / 'train-000001.tar')}
