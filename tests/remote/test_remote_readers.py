"""Every format over HTTP (nginx) and S3 (moto): the datapoints, batches and files of local."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import struct

import pytest

import loadr
import loadr.convert
from loadr.errors import FormatError
from loadr.readers import BagReader, FFRecordReader, GulpReader
from loadr.stats import format_table
from loadr.storage import netstats

from ..loader_helpers import batch_digest, stream_digests
from ..readers.common import assert_equal, check_reader_contract
from ..test_loader_readers import PIPELINES
from ..waiting import wait_until
from .proxy import Proxy
from .servers import s3_client

pytestmark = pytest.mark.timeout(120)

DATASETS = ['gulp', 'ffrecord/single.ffr', 'ffrecord/multi', 'bag', 'bag_sharded', 'bag_types']
FAST = {'backoff_s': 0.005, 'backoff_max_s': 0.05}
# Small files read as ranges, not whole once: the fixtures' files are all small.
RANGES = {'loadr': {'small_file_bytes': 0}}


@pytest.fixture(params=['http', 's3'])
def remote(request):
    """(base URL of the served fixtures, storage_options) for nginx and for moto's S3."""
    if request.param == 'http':
        return request.getfixturevalue('nginx').url, {}
    return 's3://fixtures', {'endpoint_url': request.getfixturevalue('moto').url}


def test_every_datapoint_equals_the_local_read(remote, served_root):
    base, options = remote
    for rel in DATASETS:
        here = loadr.open(served_root / rel)
        there = loadr.open(f'{base}/{rel}', storage_options=options)
        assert type(there) is type(here) and len(there) == len(here), rel
        assert there.spec == here.spec and there.identity() == here.identity(), rel
        # Read ahead first where requests are dear (moto spends milliseconds of CPU on each):
        # then the reads are served from what came back.
        if base.startswith('s3'):
            there.prefetch(range(len(there)))
        for i in range(len(here)):
            assert_equal(there[i], here[i], f'{rel}[{i}]')
        if base.startswith('s3'):
            continue
        for i in range(len(here)):
            assert there.available(i) == here.available(i)
        order = list(range(len(here)))[::-1]
        for i, dp in zip(order, there.read_batch(order)):
            assert_equal(dp, here[i], f'{rel} batch [{i}]')


def test_reader_classes_take_storage_options(remote, served_root):
    base, options = remote
    for cls, rel, kw in [(BagReader, 'bag_sharded', {}), (GulpReader, 'gulp', {}),
                         (FFRecordReader, 'ffrecord/multi', {'decode': 'msgpack'})]:
        there = cls(f'{base}/{rel}', storage_options=options, **kw)
        here = cls(str(served_root / rel), **kw)
        assert_equal(there[len(here) - 1], here[len(here) - 1], rel)


def test_reader_contract_over_http(nginx, served_root):
    """The shared reader checks (pickled to another process too), on a URL."""
    everything = check_reader_contract(loadr.open(f'{nginx.url}/bag_sharded'))
    here = loadr.open(served_root / 'bag_sharded')
    for i, dp in enumerate(everything):
        assert_equal(dp, here[i], f'bag_sharded[{i}]')


def _table_offset(path) -> int:
    with open(path, 'rb') as f:
        f.seek(-8, 2)
        return struct.unpack('<Q', f.read(8))[0]


def test_index_tables_are_read_once_per_process(nginx, served_root):
    """A second pass over a reader asks the server for records only, never a table again."""
    with Proxy(nginx.url) as proxy:
        for rel in ['gulp', 'ffrecord/multi', 'bag_sharded']:
            # Files as ranges (small ones would come whole, and nothing be asked again).
            reader = loadr.open(f'{proxy.url}/{rel}',
                                storage_options={'loadr': {'small_file_bytes': 0}})
            for i in range(len(reader)):
                reader[i]
            proxy.reset_stats()
            for i in range(len(reader)):
                reader[i]
            targets = [t for _, t, _ in proxy.log]
            assert targets and all(t.endswith(('.gulp', '.ffr', '.bag')) for t in targets), rel
            for method, target, range_ in proxy.log:
                assert method == 'GET' and range_.startswith('bytes='), (rel, target)
                start = int(range_[6:].split('-')[0])
                local = served_root / target.lstrip('/')
                if target.endswith('.ffr'):
                    assert start > 0, f'{rel}: FFRecord header read again'
                if target.endswith('.bag'):
                    assert start < _table_offset(local), f'{rel}: {target} table read again'


def _remote_pipeline(name, url, storage_options=None):
    class Root(str):
        def __truediv__(self, other):
            return Root(f'{self}/{other}')
    return PIPELINES[name](Root(url), storage_options=storage_options)


@pytest.mark.parametrize('name', sorted(PIPELINES))
def test_loader_through_faults_gives_the_local_batches(nginx, served_root, name):
    """Delay, 503s, short bodies and resets: the same batch digests (2 workers) as locally."""
    reader, pipeline = PIPELINES[name](served_root)
    with loadr.Loader(reader, batch=5, fns=pipeline, seed=3, workers=0) as loader:
        expected = stream_digests(loader, 10)
    with Proxy(nginx.url, delay_s=0.005, error=0.1, short=0.1, reset=0.1, seed=11) as proxy:
        reader, pipeline = _remote_pipeline(name, proxy.url, {'loadr': FAST})
        with loadr.Loader(reader, batch=5, fns=pipeline, seed=3, workers=2) as loader:
            assert stream_digests(loader, 10) == expected
        faults = proxy.stats['error'] + proxy.stats['short'] + proxy.stats['reset']
        assert faults > 0, proxy.stats


@pytest.mark.parametrize('how', ['gone', 'hangs'])
def test_loader_names_the_url_when_the_server_goes_away(nginx, served_root, how):
    """A clear error from the workers within timeout_s (the test's own timeout: a hang)."""
    proxy = Proxy(nginx.url).start()
    try:
        # A read-ahead buffer smaller than the file: the workers must ask the server again
        # (a buffer that holds the whole 144 KB file serves every later epoch from memory,
        # and a server gone after the first batch is then never noticed).
        reader = loadr.open(f'{proxy.url}/ffrecord/single.ffr', decode='msgpack',
                            storage_options={'loadr': {**FAST, 'retries': 2, 'timeout_s': 2,
                                                       'readahead_bytes': 1 << 14}})
        with loadr.Loader(reader, batch=4, fns=PIPELINES['ffrecord'](served_root)[1], seed=0,
                          workers=2) as loader:
            it = iter(loader)
            next(it)
            if how == 'gone':
                proxy.stop()
            else:
                proxy.hang = True
            # Gone: the retries are spent ('after N attempts'), or, on a loaded machine,
            # the read's deadline comes before a second attempt (the refusal itself).
            expected = '(attempts|refused|connect|timeout_s=2)' if how == 'gone' \
                else 'timeout_s=2'
            with pytest.raises(loadr.LoadrError, match=rf'single\.ffr.*{expected}'):
                for _ in range(20):
                    next(it)
    finally:
        proxy.stop()


# ---------------------------------------------------------------------------
# Writing to S3


def _download(moto_url: str, bucket: str, prefix: str, dest):
    client = s3_client(moto_url)
    keys = [o['Key'] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + '/')
            .get('Contents', [])]
    for key in keys:
        path = dest / key[len(prefix) + 1:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(client.get_object(Bucket=bucket, Key=key)['Body'].read())
    return sorted(k[len(prefix) + 1:] for k in keys)


@pytest.mark.parametrize('source,target,kw', [
    ('bag_sharded', 'bag', {'shardlen': 4}),
    ('gulp', 'gulp', {'videos_per_chunk': 4}),
    ('ffrecord/single.ffr', 'ffrecord', {}),
])
def test_writers_to_s3_write_the_local_bytes(moto, served_root, tmp_path, source, target, kw):
    options = {'endpoint_url': moto.url}
    suffix = '.ffr' if target == 'ffrecord' else ''
    prefix = f'written/{target}{suffix}'
    local = tmp_path / f'local{suffix}'
    loadr.convert.convert(str(served_root / source), str(local), target, **kw)
    loadr.convert.convert(str(served_root / source), f's3://fixtures/{prefix}', target,
                          storage_options=options, **kw)
    got = tmp_path / 'got'
    if target == 'ffrecord':
        got.mkdir()
        (got / 'x.ffr').write_bytes(s3_client(moto.url).get_object(
            Bucket='fixtures', Key=prefix)['Body'].read())
        assert (got / 'x.ffr').read_bytes() == local.read_bytes()
        got = got / 'x.ffr'
    else:
        names = _download(moto.url, 'fixtures', prefix, got)
        assert names == sorted(p.relative_to(local).as_posix() for p in local.rglob('*')
                               if p.is_file())
        for name in names:
            assert (got / name).read_bytes() == (local / name).read_bytes(), name
    here, there = loadr.open(local), loadr.open(got)
    for i in range(len(here)):
        assert_equal(there[i], here[i], f'{target}[{i}]')


def test_writer_with_storage_options_is_all_or_nothing(moto):
    options = {'endpoint_url': moto.url}
    url = 's3://fixtures/written/partial.ffr'
    with pytest.raises(RuntimeError):
        with loadr.writers.FFRecordWriter(url, 3, storage_options=options) as w:
            w.write_one(b'one')
            raise RuntimeError('interrupted')
    storage = loadr.storage.storage_for(url, options)
    assert not storage.exists(url)
    with pytest.raises(loadr.errors.WriterError):
        with loadr.writers.BagWriter('s3://fixtures/written/short', {'x': 'int'},
                                     storage_options=options) as w:
            w.append({'x': 1})
            w.append({'y': 2})
    assert not storage.occupied('s3://fixtures/written/short')
    with loadr.writers.FFRecordWriter(url, 1, storage_options=options) as w:
        w.write_one(b'one')
    assert loadr.open(url, storage_options=options).read_one(0) == b'one'


@contextlib.contextmanager
def _removed_after(path):
    # The served copy is the session's: other tests list it and expect the fixtures only.
    try:
        yield
    finally:
        shutil.rmtree(path)


def test_checksum_mismatch_is_never_retried_into_success(nginx, served_root):
    """A corrupt FFRecord sample served whole: ChecksumError, not transient, every time."""
    from loadr.errors import ChecksumError
    from loadr.storage import transient

    here = loadr.open(served_root / 'ffrecord/single.ffr')
    info = here.locate(3)
    data = bytearray((served_root / 'ffrecord/single.ffr').read_bytes())
    data[info['offset'] + info['length'] // 2] ^= 0xFF
    (served_root / 'corrupt').mkdir(exist_ok=True)
    (served_root / 'corrupt/single.ffr').write_bytes(bytes(data))
    with Proxy(nginx.url) as proxy, _removed_after(served_root / 'corrupt'):
        reader = loadr.open(f'{proxy.url}/corrupt/single.ffr')
        for _attempt in range(2):
            with pytest.raises(ChecksumError) as err:
                reader[3]
            assert err.value.index == 3 and not transient(err.value)
        reader.prefetch([3, 4])
        with pytest.raises(ChecksumError):
            reader.read_batch([4, 3])
        assert_equal(reader[4], here[4])
        sample_reads = [r for _, t, r in proxy.log if r.startswith(f'bytes={info["offset"]}-')]
        assert 0 < len(sample_reads) <= 8          # bounded: no retry loop on a bad CRC


@pytest.mark.parametrize('max_ranges', [0, 64])
def test_reads_of_a_batch_and_the_next_are_in_flight_together(nginx, served_root, max_ranges):
    """Read-ahead: one worker keeps the requests of a batch and of the next in flight
    at once (the tasks it holds are planned together: records of a file next to each
    other in one request, its other ranges in one multi-range request)."""
    reader, pipeline = PIPELINES['ffrecord'](served_root)
    with loadr.Loader(reader, batch=4, fns=pipeline, seed=2, workers=0) as loader:
        expected = stream_digests(loader, 8)
    with Proxy(nginx.url, delay_s=0.05) as proxy:
        # The fixture's files are small (read whole once otherwise): read as ranges here.
        reader, pipeline = _remote_pipeline('ffrecord', proxy.url, {
            'loadr': {'max_ranges': max_ranges, 'small_file_bytes': 0}})
        with loadr.Loader(reader, batch=4, fns=pipeline, seed=2, workers=1) as loader:
            assert stream_digests(loader, 8) == expected
        multi = [r for _, _, r in proxy.log if ',' in r]
        assert proxy.stats['max_in_flight'] >= 2, proxy.stats
        if not max_ranges:
            assert not multi, multi


def _image_label(dp, seed):
    import numpy as np
    return {'label': np.int64(dp.get('label', dp.get('idx', 0)) if not isinstance(
        dp.get('label'), str) else len(dp['label']))}


def test_a_mix_of_remote_sources_reads_ahead_and_matches_local(nginx, served_root):
    def mix(root):
        return loadr.Mix({'bag': loadr.open(f'{root}/bag_sharded'),
                          'ffr': loadr.open(f'{root}/ffrecord/multi', decode='msgpack')},
                         weights={'bag': 0.5, 'ffr': 0.5}, source_key=None)
    with loadr.Loader(mix(served_root), batch=4, fns=[_image_label], seed=1,
                      workers=0) as loader:
        expected = stream_digests(loader, 6)
    with Proxy(nginx.url, delay_s=0.02) as proxy:
        with loadr.Loader(mix(proxy.url), batch=4, fns=[_image_label], seed=1,
                          workers=0) as loader:
            assert stream_digests(loader, 6) == expected
        assert proxy.stats['max_in_flight'] > 1, proxy.stats


@pytest.mark.parametrize('source,target,marker', [('bag_sharded', 'bag', 'spec.json'),
                                                  ('gulp', 'gulp', '.gmeta')])
def test_a_directory_upload_that_fails_leaves_nothing(moto, served_root, source, target,
                                                      marker):
    """Data objects go up first, the files that make a dataset last; a failed upload takes
    away what it put there (ours: the target was empty)."""
    url = f's3://fixtures/cut/{target}'
    with Proxy(moto.url, refuse=marker) as proxy:
        options = {'endpoint_url': proxy.url, 'loadr': {**FAST, 'retries': 1}}
        with pytest.raises(loadr.errors.WriterError):
            loadr.convert.convert(str(served_root / source), url, target, shardlen=5,
                                  storage_options=options)
        puts = [t for m, t, _ in proxy.log if m == 'PUT']
        deletes = [t for m, t, _ in proxy.log if m == 'DELETE']
    first_marker = min(k for k, t in enumerate(puts) if t.endswith(marker))
    assert first_marker > 0 and all(t.endswith(_MARKERS) for t in puts[first_marker:])
    assert sorted(deletes) == sorted(t for t in puts if not t.endswith(marker)), deletes
    assert not loadr.storage.storage_for(url, {'endpoint_url': moto.url}).occupied(url)


_MARKERS = ('.json', '.gmeta')


# ---------------------------------------------------------------------------
# One bad record among healthy ones


def _ffrecord_with_a_bad_sample(src, dst, index):
    """A copy of the FFRecord dataset ``src`` whose sample ``index`` fails its CRC."""
    shutil.copytree(src, dst)
    path, offset, length, _ = loadr.open(dst, decode='msgpack')._ranges([index])[0]
    with open(path, 'r+b') as f:
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    return path, offset, length


@pytest.mark.parametrize('max_ranges', [64, 0])
def test_one_unreadable_record_fails_alone_for_any_worker_count(nginx, served_root, tmp_path,
                                                                max_ranges):
    """A record whose bytes the server never serves (every request carrying them fails)
    among healthy neighbours that share its merged ranges, multi-range request and
    read-ahead spans: only it is replaced under on_error='skip', by the datapoint that
    replaces it locally (where it fails its CRC), the same stream for workers 0, 1 and
    2; under on_error='raise' the error names it (its URL and index)."""
    bad = 3
    rel = 'ffrecord/multi'
    path, offset, length = _ffrecord_with_a_bad_sample(served_root / rel, tmp_path / 'multi',
                                                       bad)
    _, pipeline = PIPELINES['ffrecord'](served_root)
    kw = dict(batch=4, fns=pipeline, seed=3, on_error='skip', max_error_fraction=0.5)
    with loadr.Loader(loadr.open(tmp_path / 'multi', decode='msgpack'), workers=0,
                      **kw) as loader:
        expected = stream_digests(loader, 9)            # three epochs of 12
        assert loader.errors == 3
    name = path.rpartition('/')[2] if isinstance(path, str) else path.name
    options = {'loadr': {**FAST, 'retries': 1, 'max_ranges': max_ranges}}
    with Proxy(nginx.url, refuse=name, refuse_bytes=(offset + length // 2,
                                                     offset + length // 2 + 1)) as proxy:
        url = f'{proxy.url}/{rel}'
        for workers in (0, 1, 2):
            reader = loadr.open(url, decode='msgpack', storage_options=options)
            with loadr.Loader(reader, workers=workers, **kw) as loader:
                assert stream_digests(loader, 9) == expected, workers
                assert loader.errors == 3, workers
        assert proxy.stats['error'] > 0
        reader = loadr.open(url, decode='msgpack', storage_options=options)
        with pytest.raises(loadr.errors.ReadError) as info:
            reader.read_batch([1, 2, 3, 4, 5])              # one merged read, then one by one
        assert info.value.index == bad and info.value.path == f'{url}/{name}'
        for workers in (0, 2):
            reader = loadr.open(url, decode='msgpack', storage_options=options)
            with loadr.Loader(reader, workers=workers, **{**kw, 'on_error': 'raise'}) as loader:
                with pytest.raises(loadr.LoadrError, match=rf'\[index {bad}\]'):
                    stream_digests(loader, 3)


@pytest.mark.parametrize('protocol', ['http', 's3'])
def test_one_unreadable_bag_value_fails_alone_for_any_worker_count(served_root, request,
                                                                   protocol):
    """The same over a bag, whose read ahead asks for the refs records first and then
    the value records they name (and whose first batches the loader reads before it
    forks): one image never served, one datapoint replaced, the same stream for workers
    0, 1 and 2; the others read as locally. Over S3 too, where a range is a GET of a
    presigned URL: the refused record's error names its URL and index, and the
    refusal leaves nothing behind (every other record, read again, is the local one)."""
    bad = 5
    _, pipeline = PIPELINES['bag'](served_root)
    kw = dict(batch=4, fns=pipeline, seed=3, on_error='skip', max_error_fraction=0.5)
    n = len(loadr.open(served_root / 'bag'))
    server = request.getfixturevalue('nginx' if protocol == 'http' else 'moto')
    base = server.url if protocol == 'http' else 's3://fixtures'
    plain = loadr.open(f'{base}/bag', storage_options=None if protocol == 'http' else {
        'endpoint_url': server.url})
    image = next(r for r in plain._ranges([bad]) if r[0].endswith('/image.bag'))
    plain._files.close()            # what _ranges read ahead, out of the shared storage
    with Proxy(server.url, refuse='image.bag', refuse_bytes=(image[1] + 1, image[1] + 2)) \
            as proxy:
        options = {'loadr': {**FAST, 'retries': 1}}
        if protocol == 's3':
            base, options = 's3://fixtures', {**options, 'endpoint_url': proxy.url}
        else:
            base = proxy.url
        streams = []
        for workers in (0, 1, 2):
            reader = loadr.open(f'{base}/bag', decode_images=False, storage_options=options)
            with loadr.Loader(reader, workers=workers, **kw) as loader:
                streams.append(stream_digests(loader, 3 * n // 4))   # three epochs
                assert loader.errors == 3, workers
        assert streams[0] == streams[1] == streams[2]
        reader = loadr.open(f'{base}/bag', storage_options=options)
        here = loadr.open(served_root / 'bag')
        reader.prefetch(range(n))
        for attempt in range(2):
            for i in range(n):
                if i == bad:
                    with pytest.raises(loadr.errors.ReadError, match='503') as info:
                        reader[i]
                    assert info.value.index == bad
                    assert info.value.path == f'{base}/bag/image.bag'
                else:
                    assert_equal(reader[i], here[i], f'bag[{i}], attempt {attempt}')


# Datasets of many files: opened concurrently

MANY = 24


def _many_files(root, jpeg: bytes):
    """A bag of MANY shards, an FFRecord directory of MANY files, a gulp of MANY chunks."""
    from loadr.writers import BagWriter, FFRecordWriter, GulpWriter
    with BagWriter(root / 'bag', {'blob': 'bytes', 'label': 'int'}, shardlen=2) as w:
        for i in range(2 * MANY):
            w.append({'blob': i.to_bytes(4, 'little') * 8, 'label': i})
    (root / 'ffr').mkdir()
    for k in range(MANY):
        with FFRecordWriter(root / 'ffr' / f'{k:03}.ffr', n=2) as w:
            w.append({'k': k, 'j': 0})
            w.append({'k': k, 'j': 1})
    with GulpWriter(root / 'gulp', videos_per_chunk=1) as w:
        for i in range(MANY):
            w.append(f'clip{i}', {'label': i}, [jpeg])


def test_many_files_open_concurrently_and_read_as_locally(nginx, served_root):
    name = f'many-{os.getpid()}'
    jpeg = (served_root / 'gulp').rglob('*.gulp').__next__().read_bytes()
    start = jpeg.index(b'\xff\xd8')
    _many_files(served_root / name, jpeg[start:jpeg.index(b'\xff\xd9', start) + 2])
    try:
        with Proxy(nginx.url) as proxy:
            for rel, kw in [('bag', {}), ('ffr', {'decode': 'msgpack'}), ('gulp', {})]:
                local = loadr.open(served_root / name / rel, **kw)
                proxy.reset_stats()
                proxy.delay_s = 0.02            # a far server, while the dataset opens
                there = loadr.open(f'{proxy.url}/{name}/{rel}', **kw)
                proxy.delay_s = 0.0
                # The open's round trips went out together, not one after the other.
                assert proxy.stats['max_in_flight'] > 1, (rel, proxy.stats)
                assert len(there) == len(local) and there.identity() == local.identity(), rel
                for workers in (0, 2):
                    got = []
                    for r in (local, there):
                        with loadr.Loader(r, batch=4, seed=1, workers=workers) as loader:
                            got.append(stream_digests(loader, len(local) // 4))
                    assert got[0] == got[1], (rel, workers)
    finally:
        shutil.rmtree(served_root / name, ignore_errors=True)


def test_a_broken_value_bag_behind_a_url_is_named_at_its_first_use(nginx, served_root):
    """The value bags' headers are read on first use behind a URL: what is wrong with one
    is still a FormatError naming it (at open locally)."""
    name = f'broken-{os.getpid()}'
    shutil.copytree(served_root / 'bag', served_root / name)
    try:
        spec = json.loads((served_root / name / 'spec.json').read_text())
        key = sorted(spec)[0]
        with open(served_root / name / f'{key}.bag', 'r+b') as f:
            f.truncate(5)
        with pytest.raises(FormatError, match='holds 0 or at least 8 bytes') as err:
            loadr.open(served_root / name)
        assert err.value.path.endswith(f'{key}.bag')
        for ahead in (False, True):
            with pytest.raises(FormatError, match='holds 0 or at least 8 bytes') as err:
                reader = loadr.open(f'{nginx.url}/{name}')
                if ahead:
                    reader.prefetch(range(len(reader)))
                reader[0]
            assert err.value.path == f'{nginx.url}/{name}/{key}.bag'
    finally:
        shutil.rmtree(served_root / name, ignore_errors=True)


def test_a_bad_value_table_behind_a_url_names_the_datapoint_as_locally(nginx, served_root):
    """A value bag's table that came with its header (read on first use) is checked
    where the local read checks it: the same error, naming the same datapoint."""
    name = f'bad-table-{os.getpid()}'
    shutil.copytree(served_root / 'bag', served_root / name)
    try:
        spec = json.loads((served_root / name / 'spec.json').read_text())
        key = sorted(spec)[0]
        path = served_root / name / f'{key}.bag'
        start = _table_offset(path)
        with open(path, 'r+b') as f:          # record 1 ends before record 0 does
            f.seek(start)
            first, second = struct.unpack('<QQ', f.read(16))
            f.seek(start)
            f.write(struct.pack('<QQ', second, first))
        here = loadr.open(served_root / name)
        for ahead in (False, True):
            there = loadr.open(f'{nginx.url}/{name}')
            if ahead:
                there.prefetch(range(len(there)))
            failed = 0
            for i in range(len(here)):
                errors = []
                for reader in (here, there):
                    try:
                        reader[i]
                        errors.append(None)
                    except FormatError as exc:
                        errors.append((exc.message, exc.index, exc.path.rpartition('/')[2]))
                assert errors[0] == errors[1], (i, ahead, errors)
                failed += errors[0] is not None
            assert failed, 'the damaged table failed no datapoint'
    finally:
        shutil.rmtree(served_root / name, ignore_errors=True)


def test_of_shards_opened_together_the_first_broken_one_is_named(nginx, served_root):
    """As a loop over the shards would: the error of the first broken shard, whatever
    order the concurrent opens end in."""
    from loadr.writers import BagWriter
    name = f'first-broken-{os.getpid()}'
    with BagWriter(served_root / name, {'label': 'int'}, shardlen=1) as w:
        for i in range(12):
            w.append({'label': i})
    try:
        for shard in ('000009', '000003'):
            (served_root / name / shard / 'spec.json').write_text('{"label": ')
        with pytest.raises(FormatError, match='not valid JSON') as here:
            loadr.open(served_root / name)
        assert '000003' in here.value.path
        for _ in range(3):
            with pytest.raises(FormatError, match='not valid JSON') as there:
                loadr.open(f'{nginx.url}/{name}')
            assert there.value.path == f'{nginx.url}/{name}/000003/spec.json'
    finally:
        shutil.rmtree(served_root / name, ignore_errors=True)


@pytest.mark.parametrize('small', [None, 0])
@pytest.mark.parametrize('workers', [0, 1])
def test_a_server_slow_for_some_ranges_gives_the_local_stream(nginx, served_root, small,
                                                              workers):
    """Read-ahead (small files whole, or range by range) with a third of the requests
    answered 60 ms late: the batch digests of the local read, and the remote stage
    in loader.stats()."""
    reader, pipeline = PIPELINES['bag_sharded'](served_root)
    with loadr.Loader(reader, batch=4, fns=pipeline, seed=5, workers=0) as loader:
        expected = stream_digests(loader, 8)
    settings = {} if small is None else {'small_file_bytes': small}
    with Proxy(nginx.url, delay_s=0.005, slow=0.3, slow_s=0.06, seed=3) as proxy:
        reader, pipeline = _remote_pipeline('bag_sharded', proxy.url, {'loadr': settings})
        with loadr.Loader(reader, batch=4, fns=pipeline, seed=5, workers=workers) as loader:
            assert stream_digests(loader, 8) == expected
            remote = loader.stats().as_dict()['remote']
            table = format_table(loader.stats())
        assert proxy.stats['slow'] > 0, proxy.stats
    if workers and small is None:
        # Every file of this dataset is small: the loader's warm-up before the fork read
        # them all whole, and the forked worker, inheriting them, asks for nothing (it
        # may still have waited on its own read-ahead thread: a stage with 0 requests).
        assert remote is None or remote['requests'] == 0, remote
        return
    # The proxy holds each request 5 ms; asyncio's timers may wake up to a clock
    # resolution early, so the round trips measured are a little under it at times.
    assert remote['requests'] > 0 and remote['rtt_s'] > 0.003, remote
    assert remote['max_in_flight'] >= 1 and remote['bytes'] > 0, remote
    assert 'remote: ' in table and 'round trip' in table, table



@pytest.mark.parametrize('workers', [1, 2])
def test_read_ahead_grows_with_the_round_trip_and_keeps_the_local_stream(nginx, served_root,
                                                                         workers):
    """Round trips of 40 ms (a third of the ranges 60 ms later still) against tasks of a
    few ms: each worker asks to hold more tasks than the first three (the remote stage
    of loader.stats() says how many), and the batches are still the local read's."""
    reader, pipeline = PIPELINES['bag_sharded'](served_root)
    with loadr.Loader(reader, batch=4, fns=pipeline, seed=5, workers=0) as loader:
        expected = stream_digests(loader, 10)
    with Proxy(nginx.url, delay_s=0.04, slow=0.3, slow_s=0.06, seed=3) as proxy:
        reader, pipeline = _remote_pipeline('bag_sharded', proxy.url, RANGES)
        with loadr.Loader(reader, batch=4, fns=pipeline, seed=5, workers=workers) as loader:
            it, got, held = iter(loader), [], []
            for _ in range(10):
                got.append(batch_digest(next(it)))
                # The tasks the pool has out with each worker: more than the first three.
                held.append(max(len(w.tasks) for w in loader._pool.workers))
            assert got == expected
            remote = loader.stats().as_dict()['remote']
            table = format_table(loader.stats())
        assert proxy.stats['slow'] > 0, proxy.stats
    assert max(held) > netstats.FEWEST_TASKS_AHEAD, held
    assert remote['tasks_ahead'] > netstats.FEWEST_TASKS_AHEAD, remote
    assert remote['tasks_ahead'] <= netstats.MOST_TASKS_AHEAD, remote
    assert f"up to {remote['tasks_ahead']} tasks held" in table, table


def _blob_array(dp, seed):
    import numpy as np
    return {'blob': np.frombuffer(dp['blob'], np.uint8), 'label': dp['label']}


def _fetched_twice(log: list, size_of) -> list:
    """Bytes that two requests of the proxy's ``log`` both carried, by file; a read of a
    file's last bytes (a bag's header and table, read once per process) left out."""
    spans: dict = collections.defaultdict(list)
    for _, target, header in log:
        if header.startswith('bytes='):
            for part in header[len('bytes='):].split(','):
                a, b = part.split('-')
                spans[target].append((int(a), int(b) + 1))
        else:
            spans[target].append((0, size_of(target)))
    twice = []
    for target, got in spans.items():
        got = sorted(r for r in got if r[1] != size_of(target))
        twice += [(target, r, q) for r, q in zip(got, got[1:]) if q[0] < r[1]]
    return twice


@pytest.mark.parametrize('workers', [1, 2])
def test_no_record_is_fetched_twice_in_an_epoch(nginx, served_root, workers):
    """Value bags too big to read whole, a server slow for some ranges: over an epoch
    no two requests carry the same bytes of a file (a read finds the range in flight
    or buffered and waits for it; tasks held together are planned together), and the
    batches are the local read's."""
    from loadr.writers import BagWriter

    name = f'bag_big_{workers}'
    path = served_root / name
    with BagWriter(str(path), {'blob': 'bytes', 'label': 'int'}, shardlen=16) as w:
        for i in range(48):
            w.append({'blob': bytes([i % 251]) * 5000 + i.to_bytes(4, 'little'), 'label': i})
    try:
        spec = {'blob': ('uint8', (5004,)), 'label': ('int64', ())}
        local = loadr.open(path)
        with loadr.Loader(local, batch=8, fns=[_blob_array], seed=4, workers=0,
                          spec=spec) as loader:
            expected = [batch_digest(b) for b in loader.epoch(0)]
        with Proxy(nginx.url, delay_s=0.03, slow=0.3, slow_s=0.08, seed=7) as proxy:
            reader = loadr.open(f'{proxy.url}/{name}')
            proxy.reset_stats()
            with loadr.Loader(reader, batch=8, fns=[_blob_array], seed=4, workers=workers,
                              spec=spec) as loader:
                # One epoch, and no more: the next one reads every record again.
                assert [batch_digest(b) for b in loader.epoch(0)] == expected
            log = list(proxy.log)
        assert any('value' in t or 'blob' in t for _, t, _ in log), log
        sizes = {f'/{name}/{p.relative_to(path).as_posix()}': p.stat().st_size
                 for p in path.rglob('*') if p.is_file()}
        assert _fetched_twice(log, sizes.__getitem__) == []
    finally:
        shutil.rmtree(path, ignore_errors=True)



def test_a_resumed_loader_reads_the_batches_it_resumes_at_before_the_fork(nginx, served_root):
    """After ``load(state)`` the first batches the loader reads before the fork are those
    of the saved step, not of the stream's start: the worker makes its first batch with
    no request of its own, and the stream goes on as it would have."""
    reader, pipeline = PIPELINES['bag_sharded'](served_root)
    with loadr.Loader(reader, batch=4, fns=pipeline, seed=6, workers=0) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.save()
        expected = [batch_digest(next(it)) for _ in range(3)]
    with Proxy(nginx.url) as proxy:
        reader, pipeline = _remote_pipeline('bag_sharded', proxy.url, RANGES)
        with loadr.Loader(reader, batch=4, fns=pipeline, seed=6, workers=1,
                          start_method='fork', prefetch=1) as loader:
            loader.load(state)
            it = iter(loader)
            got = [batch_digest(next(it))]
            remote = loader.stats().as_dict()['remote']
            got += [batch_digest(next(it)) for _ in range(2)]
    assert got == expected
    assert remote is None or remote['requests'] == 0, remote


def _net_wait_s() -> float:
    from loadr.storage import netstats
    return netstats.counters()[netstats.FIELDS.index('net_wait_s')]


def test_a_bag_counts_its_wait_on_the_read_ahead_job_not_the_jobs_own(nginx, served_root):
    """The network waits are the reader's: its wait for the read-ahead job (the refs'
    round trip) counts; the job's thread waiting while the reader works does not."""
    with Proxy(nginx.url, delay_s=0.04) as proxy:
        reader = BagReader(f'{proxy.url}/bag', storage_options=RANGES)
        # Values whole in memory: the only round trip left per datapoint is its refs'.
        reader = BagReader(reader.path, cache_keys=sorted(reader.spec),
                           storage_options={'loadr': {'small_file_bytes': 0}})
        reader[0]
        before = _net_wait_s()
        reader.prefetch([1])
        reader[1]                       # at once: waits for the job's refs round trip
        assert _net_wait_s() > before
        before = _net_wait_s()
        reader.prefetch([2])
        # The reader does other work while its job waits on the network (here: the test
        # waits for the job to end): that wait is the job's, not the reader's.
        job = reader._ahead[2]
        wait_until(job.done, 'the read-ahead job of datapoint 2')
        reader[2]
        assert _net_wait_s() == before


def test_a_loader_of_a_bag_over_a_slow_server_reports_its_network_wait(nginx, served_root):
    """loader.stats() of a bag read ahead behind a slow server shows the reads' waits."""
    with Proxy(nginx.url, delay_s=0.03) as proxy:
        reader, pipeline = _remote_pipeline('bag_sharded', proxy.url, RANGES)
        with loadr.Loader(reader, batch=4, fns=pipeline, seed=5, workers=1) as loader:
            stream_digests(loader, 8)
            remote = loader.stats().as_dict()['remote']
    assert remote['wait_s'] > 0 and remote['waits'] > 0, remote


def test_warm_reads_each_small_bag_once_whole(nginx, served_root):
    """A bag's small files come whole at warm(), one request each: header, table and
    records together, never asked again for the reads ahead and the reads."""
    with Proxy(nginx.url, delay_s=0.005) as proxy:
        reader = BagReader(f'{proxy.url}/bag_sharded', cache_keys=())
        proxy.reset_stats()
        reader.warm()
        reader.prefetch(range(len(reader)))
        for i in range(len(reader)):
            reader[i]
        targets = collections.Counter(t for _, t, _ in proxy.log)
    assert targets and all(n == 1 for n in targets.values()), targets


def test_a_first_read_of_a_shard_not_read_ahead_asks_each_bag_once(nginx, served_root):
    """The loader's spec probe (datapoint 0, no read ahead): the shard's small bags come
    whole in one concurrent round trip, not a header then a record per bag in turn."""
    local = BagReader(served_root / 'bag_sharded')
    with Proxy(nginx.url, delay_s=0.005) as proxy:
        reader = BagReader(f'{proxy.url}/bag_sharded')
        proxy.reset_stats()
        assert_equal(reader[0], local[0])
        targets = collections.Counter(t for _, t, _ in proxy.log)
    assert targets and all(n == 1 for n in targets.values()), targets


def test_forked_workers_inherit_what_the_loader_warmed(nginx, served_root):
    """With forked workers the loader warms the reader itself (beside the spec probe),
    before the fork: the index tables and small files are read once, not once more by
    each worker after the probe, and the batches are the local read's. A refs.bag is
    read whole once in all: by the open, which reads its header (its last bytes are
    all of it), and kept from then on."""
    reader, pipeline = PIPELINES['bag_sharded'](served_root)
    with loadr.Loader(reader, batch=4, fns=pipeline, seed=2, workers=0) as loader:
        expected = stream_digests(loader, 6)
    small = {p.relative_to(served_root).as_posix(): p.stat().st_size
             for p in (served_root / 'bag_sharded').rglob('refs.bag')}
    with Proxy(nginx.url) as proxy:
        reader, pipeline = _remote_pipeline('bag_sharded', proxy.url)
        with loadr.Loader(reader, batch=4, fns=pipeline, seed=2, workers=2,
                          start_method='fork') as loader:
            assert stream_digests(loader, 6) == expected
        log = list(proxy.log)
    for rel, size in small.items():
        asked = [r for _, t, r in log if t.endswith(rel)]
        assert asked == [f'bytes=0-{size - 1}'], (rel, asked, log)



@pytest.mark.parametrize('workers', [1, 2])
def test_forked_workers_inherit_the_first_batches_records(nginx, served_root, workers):
    """The loader reads the records of the first ``workers + 1`` batches before it forks
    (every file read as ranges here: ``small_file_bytes=0``): the workers make them
    with no request of their own, and the stream is the local read's."""
    reader, pipeline = PIPELINES['bag_sharded'](served_root)
    with loadr.Loader(reader, batch=4, fns=pipeline, seed=2, workers=0) as loader:
        expected = stream_digests(loader, 6)
    with Proxy(nginx.url) as proxy:
        reader, pipeline = _remote_pipeline('bag_sharded', proxy.url, RANGES)
        # prefetch=1: a batch is asked for once the one before is handed out, so after
        # the first, the workers have made it and the second (both read before the fork).
        with loadr.Loader(reader, batch=4, fns=pipeline, seed=2, workers=workers,
                          start_method='fork', prefetch=1) as loader:
            it = iter(loader)
            got = [batch_digest(next(it))]
            remote = loader.stats().as_dict()['remote']
            # The workers are forked: this process let go of what it read for them.
            held = reader._files.ahead.buffer.bytes
            got += [batch_digest(next(it)) for _ in range(5)]
    assert got == expected
    assert remote is None or remote['requests'] == 0, remote
    assert held == 0, held
