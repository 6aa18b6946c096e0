"""The remote storages (loadr/storage/remote.py, http.py, s3.py) against nginx and moto's S3
on loopback, faults and all."""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys

import multiprocess
import pytest
import yarl

import loadr
from loadr.errors import ConfigError, FormatError, ReadError, WriterError
from loadr.storage import remote_storage

from ..conftest import require_fixtures
from ..readers.common import assert_equal
from .proxy import Proxy
from .servers import s3_client, start_plain_http

pytestmark = pytest.mark.timeout(90)

FILE = 'ffrecord/single.ffr'
FAST = {'backoff_s': 0.005, 'backoff_max_s': 0.05}


@pytest.fixture(params=['http', 's3'])
def remote(request, served_root):
    """(storage, base URL of the served fixtures) for nginx and for moto's S3."""
    if request.param == 'http':
        web = request.getfixturevalue('nginx')
        return remote_storage(web.url, {'loadr': FAST}), web.url
    s3 = request.getfixturevalue('moto')
    return remote_storage('s3://fixtures', {'endpoint_url': s3.url, 'loadr': FAST}), \
        's3://fixtures'


def _local_files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob('*') if p.is_file())


def test_every_file_reads_as_locally(remote, served_root):
    storage, base = remote
    # The reference fixtures' files: other tests add their own beside them (and upload
    # them to S3 only where they need them there).
    rels = [r for r in _local_files(require_fixtures()) if not r.endswith('.py')]
    # moto spends milliseconds of CPU per request: one file of each folder there.
    some = rels if base.startswith('http') else sorted({r.rpartition('/')[0]: r
                                                        for r in rels}.values())
    for rel in some:
        data = (served_root / rel).read_bytes()
        url = f'{base}/{rel}'
        assert storage.size(url) == len(data), rel
        assert storage.read_all(url) == data, rel
        if len(data) > 10:
            assert storage.read(url, 3, len(data) - 10, 5) == data[3:-7], rel
    # Many ranges of many files at once, close ones merged, in the order asked.
    ranges = [(f'{base}/{rel}', off, 7, k) for k, rel in enumerate(rels)
              for off in (0, 9, 20) if (served_root / rel).stat().st_size >= off + 7]
    got = storage.read_many(ranges)
    assert got == [(served_root / r[0][len(base) + 1:]).read_bytes()[r[1]:r[1] + 7]
                   for r in ranges]


def test_names_as_locally(remote, served_root):
    storage, base = remote
    for folder in ['bag', 'bag_sharded', 'bag_sharded/000001', 'gulp', 'ffrecord/multi']:
        assert storage.list(f'{base}/{folder}') == sorted(os.listdir(served_root / folder))
        assert storage.isdir(f'{base}/{folder}') and not storage.isfile(f'{base}/{folder}')
    fresh = pickle.loads(pickle.dumps(storage))._init_process  # noqa: F841 - picklable
    for rel in [FILE, 'bag/spec.json', 'bag_sharded/000002/refs.bag']:
        other = type(storage)(base, storage.options)     # nothing listed: asks the server
        assert other.isfile(f'{base}/{rel}') and not other.isdir(f'{base}/{rel}')
        assert other.exists(f'{base}/{rel}')
    for missing in ['nothing.bin', 'bag/nothing.bag', 'nothing/at/all']:
        assert not storage.exists(f'{base}/{missing}')
        assert not storage.isfile(f'{base}/{missing}') and not storage.isdir(f'{base}/{missing}')


def test_truncated_read_is_a_format_error(remote, served_root):
    storage, base = remote
    size = (served_root / FILE).stat().st_size
    with pytest.raises(FormatError, match='truncated') as info:
        storage.read(f'{base}/{FILE}', size - 2, 5, 7)
    assert info.value.index == 7 and info.value.path == f'{base}/{FILE}'


def test_prefetched_ranges_are_read_without_new_requests(remote, served_root):
    storage, base = remote
    url = f'{base}/{FILE}'
    data = (served_root / FILE).read_bytes()
    storage.size(url)
    ranges = [(url, off, 1000, k) for k, off in enumerate(range(0, 100_000, 5000))]
    before = storage.requests
    storage.prefetch(ranges)
    assert [storage.read(*r) for r in ranges] == [data[o:o + 1000] for _, o, _, _ in ranges]
    # 4000-byte gaps: none merged; over HTTP they go in one multi-range request.
    sent = 1 if base.startswith('http') else len(ranges)
    assert storage.requests == before + sent
    # Consumed: read again, they are fetched again.
    assert storage.read(*ranges[0]) == data[:1000]
    assert storage.requests == before + sent + 1


def test_s3_keeps_as_many_requests_in_flight_as_max_concurrency_allows(moto, served_root):
    """botocore's pool holds 10 connections unless told: 20 ranges read ahead behind a
    slow proxy are all in flight at once, not 10 and then 10."""
    data = (served_root / FILE).read_bytes()
    with Proxy(moto.url, delay_s=0.1) as proxy:
        storage = remote_storage('s3://fixtures', {'endpoint_url': proxy.url, 'loadr': FAST})
        url = f's3://fixtures/{FILE}'
        storage.size(url)
        ranges = [(url, off, 1000, k) for k, off in enumerate(range(0, 100_000, 5000))]
        proxy.reset_stats()
        storage.prefetch(ranges)
        assert [storage.read(*r) for r in ranges] == [data[o:o + 1000] for _, o, _, _ in ranges]
        assert proxy.stats['requests'] == len(ranges), proxy.stats
        assert proxy.stats['max_in_flight'] > 10, proxy.stats


def test_one_multi_range_request_per_file_over_http(nginx, served_root):
    storage = remote_storage(nginx.url, {'loadr': {'max_ranges': 7}})
    files = [FILE, 'bag/image.bag']
    datas = {f: (served_root / f).read_bytes() for f in files}
    ranges = [(f'{nginx.url}/{f}', off, 300, k) for f in files
              for k, off in enumerate(range(0, 10 * 1024, 1024))]
    got = storage.read_many(ranges[::-1])       # any order in, the same order out
    assert got == [datas[r[0][len(nginx.url) + 1:]][r[1]:r[1] + 300] for r in ranges[::-1]]
    assert storage.requests == 4                # 10 ranges a file, 7 a request
    assert storage.bytes_fetched > 20 * 300     # the parts' headers come too
    # A range that ends at the end of the file, and one byte ranges.
    size = len(datas[FILE])
    ends = [(f'{nginx.url}/{FILE}', size - 5, 5), (f'{nginx.url}/{FILE}', 0, 1),
            (f'{nginx.url}/{FILE}', 7, 1)]
    assert storage.read_many(ends) == [datas[FILE][-5:], datas[FILE][:1], datas[FILE][7:8]]


def test_a_server_that_answers_many_ranges_whole_is_asked_range_by_range(nginx, served_root):
    # Our proxy drops the Range header of multi-range requests here: nginx sends the
    # whole file (200), which is not read; the ranges are then asked one by one.
    with Proxy(nginx.url, whole_for_many_ranges=True) as proxy:
        storage = remote_storage(proxy.url)
        url = f'{proxy.url}/{FILE}'
        data = (served_root / FILE).read_bytes()
        ranges = [(url, off, 100) for off in range(0, 50_000, 5000)]
        for _ in range(2):
            assert storage.read_many(ranges) == [data[o:o + 100] for _, o, _ in ranges]
        ranged = [r for _, _, r in proxy.log]
        assert sum(',' in r for r in ranged) == 1      # asked once, then remembered
        assert storage.bytes_fetched == 2 * 10 * 100   # the whole file was never read


def test_close_ranges_are_merged_into_one_request(nginx, served_root):
    storage = remote_storage(nginx.url, {'loadr': {'merge_gap_bytes': 100}})
    url = f'{nginx.url}/{FILE}'
    data = (served_root / FILE).read_bytes()
    ranges = [(url, off, 50) for off in range(0, 15_000, 150)]      # gaps of 100 bytes
    assert storage.read_many(ranges) == [data[o:o + 50] for _, o, _ in ranges]
    assert storage.requests == 1 and storage.bytes_fetched == 14_900


def test_pickled_storage_reads_in_another_process(moto, served_root):
    base = 's3://fixtures'
    storage = remote_storage(base, {'endpoint_url': moto.url})
    storage.list(f'{base}/bag')
    blob = pickle.dumps(storage)
    ctx = multiprocess.get_context('spawn')
    with ctx.Pool(1) as pool:
        got = pool.apply(_read_in_child, (blob, f'{base}/bag/refs.bag'))
    assert got == (served_root / 'bag/refs.bag').read_bytes()


def _read_in_child(blob, url):
    storage = pickle.loads(blob)
    size = storage.size(url)
    assert storage.requests == 0              # the size came with the pickle
    return storage.read(url, 0, size)


# ---------------------------------------------------------------------------
# Faults


def test_faults_are_retried_to_the_same_bytes(nginx, moto, served_root):
    data = (served_root / FILE).read_bytes()
    for upstream, base, options in [(nginx.url, None, {}),
                                    (moto.url, 's3://fixtures', {})]:
        with Proxy(upstream, delay_s=0.002, error=0.2, short=0.2, reset=0.2, seed=3,
                   max_faults=2) as proxy:
            base = base or proxy.url
            if base.startswith('s3'):
                options = {'endpoint_url': proxy.url}
            storage = remote_storage(base, {**options, 'loadr': {**FAST, 'retries': 2}})
            url = f'{base}/{FILE}'
            ranges = [(url, off, 700, k) for k, off in enumerate(range(0, 140_000, 3500))]
            assert storage.read_many(ranges) == [data[o:o + 700] for _, o, _, _ in ranges]
            storage.prefetch([(url, 1, 5000)])
            assert storage.read(url, 1, 5000) == data[1:5001]
            assert proxy.stats['error'] and proxy.stats['short'] and proxy.stats['reset']


def test_persistent_failure_names_url_record_and_attempts(nginx):
    with Proxy(nginx.url, error=1.0, max_faults=100) as proxy:
        storage = remote_storage(proxy.url, {'loadr': {**FAST, 'retries': 2}})
        url = f'{proxy.url}/{FILE}'
        with pytest.raises(ReadError) as info:
            storage.read(url, 0, 10, 42)
        err = info.value
        assert err.path == url and err.index == 42 and err.attempts == 3
        assert 'after 3 attempts' in str(err) and '503' in str(err)
        assert '\n' not in str(err) and err.__cause__ is None and err.__suppress_context__
        assert proxy.stats['error'] == 3


def test_failed_read_ahead_raises_for_the_record_read(nginx, served_root):
    storage = remote_storage(nginx.url, {'loadr': {**FAST, 'retries': 1}})
    with Proxy(nginx.url, error=1.0, max_faults=100) as proxy:
        storage = remote_storage(proxy.url, {'loadr': {**FAST, 'retries': 1}})
        url = f'{proxy.url}/{FILE}'
        storage.versions.sizes[url] = (served_root / FILE).stat().st_size
        storage.prefetch([(url, 0, 10, 1), (url, 5000, 10, 2)])
        with pytest.raises(ReadError, match='after 2 attempts') as info:
            storage.read(url, 5000, 10, 2)
        assert info.value.index == 2


@pytest.mark.parametrize('fault', ['wrong', 'total'])
@pytest.mark.parametrize('protocol', ['http', 's3'])
def test_an_answer_for_other_bytes_is_retried_then_a_clear_error(nginx, moto, served_root,
                                                                 protocol, fault):
    # A 206 for a shifted range (the same length), or one that gives the file another
    # size: the single-range path took it as the bytes asked for.
    data = (served_root / FILE).read_bytes()

    def storage_and_url(proxy):
        if protocol == 'http':
            storage = remote_storage(proxy.url, {'loadr': {**FAST, 'retries': 2}})
            url = f'{proxy.url}/{FILE}'
        else:
            storage = remote_storage('s3://fixtures', {'endpoint_url': proxy.url,
                                                      'loadr': {**FAST, 'retries': 2}})
            url = f's3://fixtures/{FILE}'
        storage.size(url)
        return storage, url

    with Proxy(nginx.url if protocol == 'http' else moto.url, **{fault: 1.0},
               max_faults=1) as proxy:
        storage, url = storage_and_url(proxy)
        assert storage.read(url, 1000, 50, 4) == data[1000:1050]        # asked again
        assert proxy.stats[fault] == 1
        ranges = [(url, off, 100, k) for k, off in enumerate(range(5000, 50_000, 5000))]
        assert storage.read_many(ranges) == [data[o:o + 100] for _, o, _, _ in ranges]
    with Proxy(nginx.url if protocol == 'http' else moto.url, **{fault: 1.0},
               max_faults=100) as proxy:
        storage, url = storage_and_url(proxy)
        expected = 'asked for bytes 1000-1049' if fault == 'wrong' else \
            f'the answer gives the file {len(data) + 1} bytes, not the {len(data)}'
        with pytest.raises(ReadError, match=f'after 3 attempts: WrongRange: {expected}') \
                as info:
            storage.read(url, 1000, 50, 4)
        assert info.value.path == url and info.value.index == 4 and info.value.attempts == 3
        if fault == 'wrong':
            with pytest.raises(ReadError, match='WrongRange') as info:
                storage.read_many([(url, *r[1:]) for r in ranges])
            assert info.value.index == 0


def test_a_server_that_ignores_range_is_read_whole_once(served_root):
    # python's http.server answers a range request with the whole file (200): every
    # read but at offset 0 failed with 'ShortBody', after a whole download per
    # retry. A small file is read whole once and its ranges cut.
    data = (served_root / FILE).read_bytes()
    with start_plain_http(served_root) as web:
        url = f'{web.url}/{FILE}'
        storage = remote_storage(web.url, {'loadr': FAST})
        ranges = [(url, off, 100, k) for k, off in enumerate(range(1, 60_000, 3000))]
        assert storage.read_many(ranges) == [data[o:o + 100] for _, o, _, _ in ranges]
        assert storage.bytes_fetched == len(data)          # read whole once
        sent = storage.requests
        storage.prefetch([(url, 7, 10_000)])
        assert storage.read(url, 7, 10_000) == data[7:10_007]
        assert storage.read_many(ranges[::-1]) == [data[o:o + 100] for _, o, _, _ in
                                                   ranges[::-1]]
        assert storage.requests == sent                    # kept: no more requests
        # A reader reads the same datapoints as locally, with one GET of the file.
        web.log.clear()
        here = loadr.open(served_root / FILE)
        there = loadr.open(url)
        for i in range(len(here)):
            assert_equal(there[i], here[i], f'[{i}]')
        assert [m for m, target, _ in web.log if target.endswith(FILE)].count('GET') == 1


def test_a_server_that_ignores_range_with_a_big_file_is_a_clear_error(tmp_path):
    # More than loadr reads whole: a ReadError at once, no retries, no second download.
    with open(tmp_path / 'big.bin', 'wb') as f:
        f.truncate((64 << 20) + 1)                          # sparse: no disk used
    with start_plain_http(tmp_path) as web:
        url = f'{web.url}/big.bin'
        storage = remote_storage(web.url, {'loadr': {**FAST, 'retries': 3}})
        for read in (lambda: storage.read(url, 10, 8, 3),
                     lambda: storage.read_many([(url, 10, 8, 3), (url, 1 << 20, 8, 4)])):
            with pytest.raises(ReadError, match='the server ignored the Range request; loadr '
                                                'needs byte ranges') as info:
                read()
            assert info.value.path == url and info.value.index == 3
            assert '\n' not in str(info.value)
        assert [m for m, _, _ in web.log].count('GET') == 1
        assert storage.bytes_fetched == 0


@pytest.mark.parametrize('max_ranges', [64, 0])
def test_a_failed_grouped_request_is_asked_range_by_range(nginx, served_root, max_ranges):
    # Byte 5000 is never served: every request that carries it fails. The ranges
    # around it are merged into one request with it (and over HTTP go in one
    # multi-range request with far ones); they used to fail with it, under its
    # first neighbour's index.
    data = (served_root / FILE).read_bytes()
    with Proxy(nginx.url, refuse='single.ffr', refuse_bytes=(5000, 5001)) as proxy:
        storage = remote_storage(proxy.url, {'loadr': {**FAST, 'retries': 1, 'merge_gap_bytes':
                                                      100, 'max_ranges': max_ranges}})
        url = f'{proxy.url}/{FILE}'
        storage.size(url)
        ranges = [(url, off, 50, k) for k, off in enumerate(range(4000, 6000, 120))]
        ranges += [(url, off, 50, 100 + k) for k, off in enumerate(range(20_000, 60_000, 9000))]
        bad = next(r for r in ranges if r[1] <= 5000 < r[1] + r[2])
        good = [r for r in ranges if r is not bad]
        with pytest.raises(ReadError, match='503') as info:
            storage.read_many(ranges)
        assert info.value.index == bad[3] and info.value.path == url
        assert storage.read_many(good) == [data[o:o + 50] for _, o, _, _ in good]
        # Read ahead: the spans that held it fail; each other range is asked alone.
        for _ in range(2):
            storage.prefetch(ranges)
            for r in ranges:
                if r is bad:
                    with pytest.raises(ReadError, match='503') as info:
                        storage.read(*r)
                    assert info.value.index == bad[3]
                else:
                    assert storage.read(*r) == data[r[1]:r[1] + 50]
            storage.prefetch(ranges)
            assert storage.read_many(good) == [data[o:o + 50] for _, o, _, _ in good]


def test_server_that_hangs_times_out(nginx):
    with Proxy(nginx.url, hang=True) as proxy:
        storage = remote_storage(proxy.url, {'loadr': {**FAST, 'timeout_s': 0.5}})
        with pytest.raises(ReadError, match='timeout_s=0.5') as info:
            storage.read(f'{proxy.url}/{FILE}', 0, 10, 3)
        assert info.value.index == 3


def test_a_grouped_request_that_times_out_is_not_asked_again_range_by_range(nginx):
    # Its deadline is spent: asking each range again would wait timeout_s once more
    # per range on a server that stalls. The records share the timeout error.
    with Proxy(nginx.url, hang=True) as proxy:
        storage = remote_storage(proxy.url, {'loadr': {**FAST, 'timeout_s': 0.3}})
        url = f'{proxy.url}/{FILE}'
        storage.versions.sizes[url] = 144_202
        ranges = [(url, off, 10, k) for k, off in enumerate([0, 100, 5000, 9000])]
        with pytest.raises(ReadError, match='timeout_s=0.3') as info:
            storage.read_many(ranges)
        assert info.value.index == 0
        assert proxy.stats['requests'] == 1         # one multi-range request, no more
        storage.prefetch(ranges)
        for r in ranges:
            with pytest.raises(ReadError, match='timeout_s=0.3') as info:
                storage.read(*r)
            assert info.value.index == r[3]
        # The read-ahead's one request, not one more per range (that would be 5 or more).
        # On a busy machine a read may start before the read-ahead's request is under
        # way and ask once itself: at most one more.
        assert 2 <= proxy.stats['requests'] <= 3


def test_server_gone_is_a_clear_error(nginx):
    proxy = Proxy(nginx.url).start()
    proxy.stop()
    storage = remote_storage(proxy.url, {'loadr': {**FAST, 'retries': 2}})
    with pytest.raises(ReadError, match=r'after 3 attempts: ClientConnectorError') as info:
        storage.read(f'{proxy.url}/{FILE}', 0, 10, 3)
    assert info.value.path == f'{proxy.url}/{FILE}'


# ---------------------------------------------------------------------------
# One-line errors with the fix


def test_missing_object_and_bucket(moto, nginx):
    storage = remote_storage('s3://fixtures', {'endpoint_url': moto.url})
    with pytest.raises(ReadError, match='no such object') as info:
        storage.read('s3://fixtures/nothing.bin', 0, 1, 9)
    assert info.value.index == 9 and '\n' not in str(info.value)
    storage = remote_storage('s3://no-such-bucket', {'endpoint_url': moto.url})
    with pytest.raises(ReadError, match='bucket does not exist'):
        storage.size('s3://no-such-bucket/x')
    storage = remote_storage(nginx.url)
    with pytest.raises(ReadError, match=r'no such object.*404'):
        storage.size(f'{nginx.url}/nothing.bin')


def test_missing_package_names_the_extra():
    pytest.importorskip('fsspec')
    try:
        import gcsfs  # noqa: F401
        pytest.skip('gcsfs is installed here: no missing package to report')
    except ImportError:
        pass
    with pytest.raises(ConfigError, match=r"pip install fsspec gcsfs \(the 'gcs' extra: "
                                          r"pip install -e '\.\[gcs\]'") as info:
        remote_storage('gs://bucket/x.ffr')
    assert str(info.value).startswith('gs://bucket/x.ffr: ') and info.value.__cause__ is None
    with pytest.raises(ConfigError, match='unknown protocol nosuch://'):
        remote_storage('nosuch://x')


def test_bad_and_missing_credentials(moto_auth, monkeypatch):
    storage = remote_storage('s3://fixtures', {'endpoint_url': moto_auth.url})
    with pytest.raises(ReadError, match='access denied: check the credentials'):
        storage.size('s3://fixtures/x')
    for name in list(os.environ):
        if name.startswith('AWS_'):
            monkeypatch.delenv(name)
    monkeypatch.setenv('AWS_SHARED_CREDENTIALS_FILE', '/nonexistent/credentials')
    monkeypatch.setenv('AWS_CONFIG_FILE', '/nonexistent/config')
    monkeypatch.setenv('AWS_EC2_METADATA_DISABLED', 'true')
    storage = remote_storage('s3://fixtures', {'endpoint_url': moto_auth.url})
    with pytest.raises(ReadError, match=r"no valid credentials.*'anon': True") as info:
        storage.size('s3://fixtures/x')
    assert '\n' not in str(info.value)


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match='unknown'):
        remote_storage('s3://b/x', {'loadr': {'retry': 3}})
    with pytest.raises(ConfigError, match=r"\['retries'\] must be a whole number from 0"):
        remote_storage('s3://b/x', {'loadr': {'retries': -1}})


@pytest.mark.parametrize('key,value', [
    ('readahead_bytes', float('inf')), ('max_concurrency', float('inf')),
    ('timeout_s', float('nan')), ('backoff_max_s', float('nan')), ('backoff_s', float('inf')),
    ('retries', 2.5), ('retries', 10**400), ('max_ranges', -1), ('merge_gap_bytes', 'big'),
    ('max_request_bytes', 0), ('timeout_s', 0),
    ('max_concurrency', True), ('readahead_bytes', 1e300),
])
def test_every_numeric_setting_is_checked_finite_and_in_range(key, value):
    # Once, when the storage is made: inf and nan used to be taken and end in an
    # OverflowError, no timeout at all, or an unrelated error at the first read.
    with pytest.raises(ConfigError, match=rf"storage_options\['loadr'\]\[{key!r}\] must be") \
            as info:
        remote_storage('s3://b/x', {'loadr': {key: value}})
    assert info.value.path == 's3://b/x' and repr(value)[:20] in str(info.value)


def test_numeric_settings_in_range_are_taken():
    from loadr.storage.settings import DEFAULTS
    from loadr.storage.settings import NUMBERS as _NUMBERS
    # Every numeric default has its bounds (a new setting cannot slip past the check).
    assert {k for k, v in DEFAULTS.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)} == set(_NUMBERS)
    import numpy as np
    storage = remote_storage('s3://b/x', {'loadr': {'retries': 3.0, 'timeout_s': 2,
                                                   'readahead_bytes': np.int64(0),
                                                   'max_ranges': 0, 'backoff_s': np.float32(.5)}})
    assert storage.settings.retries == 3 and type(storage.settings.retries) is int
    assert storage.settings.timeout_s == 2.0 and storage.settings.backoff_s == 0.5
    assert type(storage.settings.readahead_bytes) is int


# ---------------------------------------------------------------------------
# Writing


def test_staged_object_is_uploaded_only_on_commit(moto):
    storage = remote_storage('s3://fixtures', {'endpoint_url': moto.url})
    client = s3_client(moto.url)
    url = 's3://fixtures/out/one.bin'
    with storage.open_write(url) as f:
        f.write(b'x' * 100)
        f.pwrite(b'HEAD', 0)
        assert not storage.occupied(url)
        f.commit()
    assert client.get_object(Bucket='fixtures', Key='out/one.bin')['Body'].read() == \
        b'HEAD' + b'x' * 96
    with pytest.raises(RuntimeError):
        with storage.open_write('s3://fixtures/out/two.bin') as f:
            f.write(b'never')
            raise RuntimeError('stop')
    assert not storage.occupied('s3://fixtures/out/two.bin')
    assert not os.path.exists(f.path)
    with pytest.raises(WriterError, match='appeared'):
        with storage.open_write(url) as f:
            f.commit(overwrite=False)


def test_staged_directory_is_uploaded_on_commit(moto):
    storage = remote_storage('s3://fixtures', {'endpoint_url': moto.url})
    target = 's3://fixtures/out/dir'
    d = storage.stage_dir(target)
    d.mkdir('000000')
    d.write_file('000000/spec.json', b'{}')
    with d.open_write('000000/a.bag') as f:
        f.write(b'abc')
    assert not storage.occupied(target)
    d.commit()
    assert not os.path.exists(d.path)
    assert storage.list(target) == ['000000']
    assert storage.list(f'{target}/000000') == ['a.bag', 'spec.json']
    assert storage.read_all(f'{target}/000000/a.bag') == b'abc'
    with pytest.raises(WriterError, match='non-empty'):
        storage.stage_dir(target).commit()


def test_http_is_read_only(nginx):
    with pytest.raises(ConfigError, match='read-only'):
        remote_storage(nginx.url).open_write(f'{nginx.url}/x.bin')


def test_a_synchronous_fsspec_filesystem_works_too(served_root):
    """memory:// has no async API: its calls run in threads (one process: it is in memory)."""
    import fsspec

    memory = fsspec.filesystem('memory')
    memory.pipe('/loadr-test/single.ffr', (served_root / FILE).read_bytes())
    try:
        here = loadr.open(served_root / FILE)
        there = loadr.open('memory://loadr-test/single.ffr')
        there.prefetch(range(len(there)))
        for i in range(len(here)):
            assert_equal(there[i], here[i], f'[{i}]')
        with pytest.raises(ReadError, match='no such object'):
            loadr.open('memory://loadr-test/single.ffr')._files.size('memory://loadr-test/x')
    finally:
        memory.rm('/loadr-test', recursive=True)


def test_import_loadr_and_local_reads_never_import_fsspec(served_root):
    code = ('import sys, loadr; r = loadr.open(sys.argv[1]); r[0]; r.prefetch([0]); '
            'print(r.prefetches, sorted(m for m in sys.modules if m in '
            '("loadr.storage.remote", "loadr.storage.http") or '
            'm.split(".")[0] in ("fsspec", "s3fs", "aiohttp", "botocore")))')
    out = subprocess.run([sys.executable, '-c', code, str(served_root / 'bag')],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['False', '[]']


def test_copies_of_a_storage_share_one_filesystem_that_is_never_dropped(nginx, served_root):
    # fsspec closes a dropped HTTP filesystem's session from the dropping thread,
    # beside a busy IO loop, which can lose a live socket from the loop (a read
    # then hangs until its timeout): a process keeps one filesystem per options.
    import gc
    storage = remote_storage(nginx.url)
    url = f'{nginx.url}/{FILE}'
    data = (served_root / FILE).read_bytes()
    assert storage.read(url, 0, 100) == data[:100]
    for _ in range(3):
        copy = pickle.loads(pickle.dumps(storage))
        assert copy.read(url, 100, 100) == data[100:200]
        assert copy.fs is storage.fs
        del copy
        gc.collect()
    assert not storage.fs._session.closed
    assert storage.read_many([(url, 0, 10), (url, 5000, 10)]) == [data[:10], data[5000:5010]]
    assert remote_storage(nginx.url, {'loadr': {'retries': 1}}).fs is storage.fs


def test_overlapping_read_ahead_serves_every_range_once_without_refetching(nginx, served_root):
    # Two batches whose merged spans overlap (one covers the other's records):
    # each read gives its claim back to the span it claimed, so no span is worn
    # out by another batch's reads and nothing is fetched twice.
    storage = remote_storage(nginx.url, {'loadr': {'merge_gap_bytes': 4096, 'max_ranges': 0}})
    url = f'{nginx.url}/{FILE}'
    data = (served_root / FILE).read_bytes()
    storage.size(url)
    first = [(url, off, 10) for off in range(0, 20_000, 2_000)]        # one span, 0..18010
    second = [(url, off, 10) for off in range(1_000, 21_000, 2_000)]   # inside it but the last
    storage.prefetch(first)
    storage.prefetch(second)
    for ranges in (second, first):
        for r in ranges:
            assert storage.read(*r) == data[r[1]:r[1] + 10]
    sent = 2            # the first batch's span, and the second's last range (outside it)
    assert storage.requests == sent
    # All given back: the spans are gone, a read fetches again.
    assert storage.ahead.buffer.bytes == 0 and not storage.ahead.buffer.claims
    storage.read(*first[0])
    assert storage.requests == sent + 1


def _small_file(served_root) -> tuple[str, bytes]:
    """(path under the served root, bytes) of a small file: a bag shard's refs.bag."""
    rel = 'bag_sharded/' + sorted(p.name for p in (served_root / 'bag_sharded').iterdir()
                                  if p.is_dir())[0] + '/refs.bag'
    return rel, (served_root / rel).read_bytes()


def _small_file_through(proxy, served_root, small: int | None) -> tuple:
    """(storage, URL, bytes) of :func:`_small_file` through ``proxy``, its size known;
    ``small_file_bytes=small`` unless None (the default)."""
    rel, data = _small_file(served_root)
    settings = dict(FAST, **({} if small is None else {'small_file_bytes': small}))
    storage = remote_storage(proxy.url, {'loadr': settings})
    url = f'{proxy.url}/{rel}'
    storage.size(url)
    return storage, url, data


@pytest.mark.parametrize('small', [None, 0])
def test_a_small_file_is_read_whole_once_per_process(nginx, served_root, small):
    """Ranges of a small file read ahead in separate calls (batch after batch): one
    request for the whole file, the ranges sliced from it; ``small_file_bytes=0``:
    a request per call, as before."""
    with Proxy(nginx.url) as proxy:
        storage, url, data = _small_file_through(proxy, served_root, small)
        proxy.reset_stats()
        for offset, length in [(0, 8), (len(data) - 9, 9), (3, 5)]:
            storage.prefetch([(url, offset, length)])
            assert storage.read(url, offset, length) == data[offset:offset + length]
        assert storage.read(url, 1, 4) == data[1:5]      # not read ahead: from the file too
        assert proxy.stats['requests'] == (1 if small is None else 4), proxy.log


def test_a_small_file_whose_whole_read_fails_is_read_as_ranges(nginx, served_root):
    """A bad byte in a small file fails its whole read: the good ranges are then read
    alone, and only the range that holds the bad byte fails, naming its record."""
    rel, data = _small_file(served_root)
    bad = len(data) - 3
    with Proxy(nginx.url, refuse='refs.bag', refuse_bytes=(bad, bad + 1)) as proxy:
        storage = remote_storage(proxy.url, {'loadr': dict(FAST, retries=1)})
        url = f'{proxy.url}/{rel}'
        storage.prefetch([(url, 0, 8, 1)])
        assert storage.read(url, 0, 8, 1) == data[:8]
        storage.prefetch([(url, 2, 4, 2), (url, bad - 1, 2, 7)])
        assert storage.read(url, 2, 4, 2) == data[2:6]
        with pytest.raises(ReadError) as info:
            storage.read(url, bad - 1, 2, 7)
        assert info.value.index == 7 and 'refs.bag' in str(info.value)
        # The whole read: tried (and retried once), then never again.
        assert 1 <= len([r for _, _, r in proxy.log if r == f'bytes=0-{len(data) - 1}']) \
            <= 2, proxy.log


def test_read_many_asks_for_the_rest_before_waiting_for_a_read_ahead(nginx, served_root):
    """A range still on its way from the read-ahead (a small file read whole) costs the
    other ranges of the same ``read_many`` no round trip: they are asked for at once,
    so both requests are in flight together (before: one after the other)."""
    shard = sorted(p.name for p in (served_root / 'bag_sharded').iterdir() if p.is_dir())[0]
    small, other = f'bag_sharded/{shard}/refs.bag', FILE
    data = {rel: (served_root / rel).read_bytes() for rel in (small, other)}
    with Proxy(nginx.url, delay_s=0.3) as proxy:
        storage = remote_storage(proxy.url, {'loadr': FAST})
        urls = {rel: f'{proxy.url}/{rel}' for rel in data}
        for url in urls.values():
            storage.size(url)
        proxy.reset_stats()
        storage.prefetch([(urls[small], 0, 8)])         # the whole small file, on its way
        got = storage.read_many([(urls[small], 0, 8), (urls[other], 4, 16)])
        assert got == [data[small][:8], data[other][4:20]]
        assert proxy.stats['requests'] == 2 and proxy.stats['max_in_flight'] == 2, proxy.log


def test_http_requests_in_flight_reach_max_concurrency(nginx, served_root):
    """The HTTP connection pool holds max_concurrency connections (aiohttp's own holds
    100): one ranged read of each of 24 files behind a slow proxy, 20 at once.
    S3: test_s3_keeps_as_many_requests_in_flight_as_max_concurrency_allows."""
    rels = sorted(p.relative_to(served_root).as_posix()
                  for p in served_root.rglob('*') if p.is_file() and p.stat().st_size >= 4)[:24]
    with Proxy(nginx.url, delay_s=0.3) as proxy:
        storage = remote_storage(proxy.url, {'loadr': dict(FAST, max_concurrency=20)})
        urls = [f'{proxy.url}/{rel}' for rel in rels]
        for url in urls:
            storage.size(url)
        proxy.reset_stats()
        got = storage.read_many([(url, 0, 4) for url in urls])
        assert got == [(served_root / rel).read_bytes()[:4] for rel in rels]
        assert proxy.stats['max_in_flight'] == 20, proxy.stats


def test_read_many_with_a_failed_read_ahead_asks_alone_and_names_the_bad_record(
        nginx, served_root):
    """A small file whose whole read (claimed by a read_many) fails on one bad byte: its
    other ranges are asked alone and come back right; the range holding the bad byte
    raises a ReadError naming the file and its record; another file's range is untouched."""
    rel = 'bag_sharded/' + sorted(p.name for p in (served_root / 'bag_sharded').iterdir()
                                  if p.is_dir())[0] + '/refs.bag'
    data, other = (served_root / rel).read_bytes(), (served_root / FILE).read_bytes()
    bad = len(data) - 3
    with Proxy(nginx.url, refuse='refs.bag', refuse_bytes=(bad, bad + 1)) as proxy:
        storage = remote_storage(proxy.url, {'loadr': dict(FAST, retries=1)})
        url, url2 = f'{proxy.url}/{rel}', f'{proxy.url}/{FILE}'
        storage.size(url2)
        storage.prefetch([(url, 0, 8, 1)])          # the whole file, which will fail
        assert storage.read_many([(url, 0, 8, 1), (url2, 4, 16, 9), (url, 2, 4, 2)]) == \
            [data[:8], other[4:20], data[2:6]]
        storage.prefetch([(url, 0, 8, 1)])
        with pytest.raises(ReadError) as info:
            storage.read_many([(url, 0, 8, 1), (url, bad - 1, 2, 7), (url2, 4, 16, 9)])
        assert info.value.index == 7 and 'refs.bag' in str(info.value)


def _read_forked(storage, ranges, conn):
    """In a forked child: the ranges read, and the requests that took."""
    try:
        got = [storage.read(*r) for r in ranges[:-1]]
        try:
            storage.read(*ranges[-1])
            err = None
        except ReadError as exc:
            err = (exc.index, str(exc))
        conn.send((got, storage.requests, err))
    finally:
        conn.close()


def test_a_forked_child_keeps_what_its_parent_read_ahead_and_settled(nginx, served_root):
    """A process that reads ahead and settles before it forks: the child reads those
    ranges with no request of its own (the loader's first batches), and a range whose
    read ahead failed is asked again by the child, which names its record."""
    data = (served_root / FILE).read_bytes()
    with Proxy(nginx.url, refuse='single.ffr', refuse_bytes=(90_000, 90_001)) as proxy:
        storage = remote_storage(proxy.url, {'loadr': {**FAST, 'retries': 0,
                                                        'small_file_bytes': 0}})
        url = f'{proxy.url}/{FILE}'
        storage.size(url)
        good = [(url, off, 1000, k) for k, off in enumerate(range(0, 60_000, 5000))]
        bad = (url, 89_500, 1000, 99)
        storage.prefetch(good)
        storage.prefetch([bad])             # a request of its own, refused
        assert storage.settle(10)
        parent, child = multiprocess.get_context('fork').Pipe()
        proc = multiprocess.get_context('fork').Process(
            target=_read_forked, args=(storage, good + [bad], child))
        proc.start()
        got, requests, err = parent.recv()
        proc.join(30)
        refused = [r for _, _, r in proxy.log if r.startswith('bytes=89500')]
    assert got == [data[o:o + 1000] for _, o, _, _ in good]
    assert requests == 1, requests          # the bad range alone, asked again by the child
    assert err is not None and err[0] == 99 and 'single.ffr' in err[1], err
    assert len(refused) == 2, proxy.log     # the parent's try and the child's


# ---------------------------------------------------------------------------
# S3 ranges as GETs of presigned URLs (loadr/storage/s3gets.py)


def _s3_through(proxy, presigned=True, **settings):
    return remote_storage('s3://fixtures', {'endpoint_url': proxy.url, 'loadr': {
        **FAST, 's3_presigned': presigned, 'small_file_bytes': 0, 'max_concurrency': 4,
        **settings}})


def test_presigned_gets_read_what_get_object_reads(moto, served_root):
    """The fast path (a GET of the object's presigned URL per range, signed once per
    object) against the general one (a botocore get_object per range): the same bytes
    for every range, and one signature for all the ranges of an object."""
    rels = ['ffrecord/single.ffr', 'bag/refs.bag']
    with Proxy(moto.url) as proxy:
        got = {}
        for presigned in (True, False):
            storage = _s3_through(proxy, presigned)
            proxy.reset_stats()
            ranges = [(f's3://fixtures/{rel}', off, 100, k) for rel in rels
                      for k, off in enumerate(range(0, 4000, 1000))
                      if (served_root / rel).stat().st_size >= off + 100]
            got[presigned] = storage.read_many(ranges) + [storage.read(*ranges[0])]
            signatures = {t.rpartition('?')[0]: t.rpartition('?')[2] for _, t, _ in proxy.log
                          if '?' in t}
            # SigV4 (SigV2 is refused for buckets made after June 2020).
            assert all('X-Amz-Algorithm=AWS4-HMAC-SHA256' in v for v in signatures.values())
            if presigned:
                # Every range of an object through the same URL: one signature each.
                assert sorted(signatures) == sorted(f'/fixtures/{r}' for r in rels), proxy.log
                assert len([t for _, t, _ in proxy.log if '?' in t]) == len(ranges) + 1
            else:
                assert not signatures, proxy.log
    expected = [(served_root / r[0][len('s3://fixtures/'):]).read_bytes()[r[1]:r[1] + 100]
                for r in ranges] + [(served_root / rels[0]).read_bytes()[:100]]
    assert got[True] == got[False] == expected


def test_an_expired_presigned_url_is_signed_again_once(moto, served_root):
    """A 403 to a URL signed a while ago (credentials or URL expired) is signed again, in
    the same attempt; a 403 to a URL just signed is access denied, naming the record."""
    data = (served_root / FILE).read_bytes()
    with Proxy(moto.url, refuse='expired=1', refuse_status=403) as proxy:
        storage = _s3_through(proxy, retries=0)
        url = f's3://fixtures/{FILE}'
        assert storage.read(url, 0, 10) == data[:10]
        gets = storage._presigned('fixtures')
        (name, (signed, at)), = gets.urls.items()
        # Signed 10 s ago, and refused:
        gets.urls[name] = (yarl.URL(f'{signed}&expired=1', encoded=True), at - 10)
        assert storage.read(url, 10, 10, 3) == data[10:20]
        assert proxy.stats['refused'] == 1
        # Refused again at once: the URL was just signed, so the refusal stands.
        proxy.refuse = 'X-Amz-Signature'
        gets.urls.clear()
        with pytest.raises(ReadError, match=r'access denied.*HTTP 403') as info:
            storage.read(url, 20, 10, 4)
        assert info.value.index == 4 and FILE in str(info.value)
        assert proxy.stats['refused'] == 2
        # The refusal changed nothing: lifted, the same read goes the same way and reads.
        proxy.refuse = None
        assert storage.read(url, 20, 10, 4) == data[20:30]
        assert storage._presigned('fixtures') is gets


@pytest.mark.parametrize('status,code', [(301, 'PermanentRedirect'),
                                         (400, 'AuthorizationQueryParametersError')])
def test_a_bucket_that_redirects_presigned_gets_is_read_with_get_object(moto, served_root,
                                                                       status, code):
    """S3 redirects a request for a bucket of another region, or refuses a URL signed for
    the client's region; botocore's get_object finds the bucket's region where a presigned
    GET cannot: that bucket's ranges are read so from then on."""
    data = (served_root / FILE).read_bytes()
    with Proxy(moto.url, refuse='X-Amz-Signature', refuse_status=status,
               refuse_code=code) as proxy:
        storage = _s3_through(proxy)
        url = f's3://fixtures/{FILE}'
        assert storage.read(url, 5, 10) == data[5:15]
        assert storage.read(url, 50, 10) == data[50:60]
        assert proxy.stats['refused'] == 1, proxy.log


def test_s3_presigned_must_be_a_bool():
    with pytest.raises(ConfigError, match='s3_presigned must be True or False'):
        remote_storage('s3://fixtures', {'loadr': {'s3_presigned': 'yes'}})


def test_what_a_parent_held_for_its_children_goes_once_they_are_forked(nginx, served_root):
    """hold(): a range read ahead stays once this process has read it too, so that a
    child forked after still has it; release() (the children are forked) lets it go:
    read again here, it is asked again."""
    data = (served_root / FILE).read_bytes()
    storage = remote_storage(nginx.url, {'loadr': {**FAST, 'small_file_bytes': 0}})
    url = f'{nginx.url}/{FILE}'
    storage.size(url)
    ranges = [(url, off, 1000, k) for k, off in enumerate(range(0, 30_000, 5000))]
    storage.hold()
    storage.prefetch(ranges)
    assert storage.settle(10)
    assert storage.read(*ranges[0]) == data[:1000]          # read here too: still kept
    parent, child = multiprocess.get_context('fork').Pipe()
    proc = multiprocess.get_context('fork').Process(
        target=_read_forked, args=(storage, ranges + [ranges[0]], child))
    proc.start()
    got, requests, err = parent.recv()
    proc.join(30)
    assert got == [data[o:o + 1000] for _, o, _, _ in ranges] and requests == 0 and err is None
    before = storage.requests
    storage.release()
    assert storage.read(*ranges[1]) == data[5000:6000]
    assert storage.requests == before + 1


@pytest.mark.parametrize('small', [None, 0])
def test_a_small_file_read_whole_is_kept_as_read_ahead_keeps_it(nginx, served_root, small):
    """A read that fetches a whole small file (the open reads a small bag's header so:
    its last 16 KiB are all of it) keeps it: the read-ahead and the reads of its ranges
    then ask for nothing, in this process and in a forked one. A part of it is not
    kept; ``small_file_bytes=0``: nothing is."""
    with Proxy(nginx.url) as proxy:
        storage, url, data = _small_file_through(proxy, served_root, small)
        assert storage.read(url, 1, len(data) - 1) == data[1:]      # a part: not kept
        assert storage.read_many([(url, 0, len(data))]) == [data]   # the whole: kept
        proxy.reset_stats()
        storage.prefetch([(url, 3, 5)])
        assert storage.read(url, 3, 5) == data[3:8]
        parent, child = multiprocess.get_context('fork').Pipe()
        proc = multiprocess.get_context('fork').Process(
            target=_read_forked, args=(storage, [(url, 0, 8), (url, 2, 4)], child))
        proc.start()
        got, requests, err = parent.recv()
        proc.join(30)
        assert got == [data[:8]] and err is None
        # small=0: the parent's read ahead, and each of the child's reads.
        assert (proxy.stats['requests'], requests) == ((0, 0) if small is None else (3, 2))


def test_a_presigned_url_is_sent_byte_for_byte_as_signed(moto):
    """A key whose characters the signature escapes (a space, +, =, &, ?, %, ;, ',', (, !,
    ), *, é): the request carries the URL exactly as botocore signed it (aiohttp would
    otherwise requote some of them, and a server that checks signatures would refuse it),
    and reads the object's bytes."""
    key = 'odd/f 1+x~é=&?%41;,(!)*.bin'
    blob = bytes(range(256)) * 20
    client = s3_client(moto.url)
    bucket = 'odd-keys'             # not the fixtures' bucket, which others list
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key=key, Body=blob)
    with Proxy(moto.url) as proxy:
        storage = _s3_through(proxy)
        assert storage.read(f's3://{bucket}/{key}', 100, 300) == blob[100:400]
        (_, (signed, _)), = storage._presigned(bucket).urls.items()
        sent = [t for _, t, _ in proxy.log if 'X-Amz-Signature' in t]
    assert sent == [str(signed).split(proxy.url, 1)[1]], (sent, str(signed))


@pytest.mark.parametrize('presigned', [True, False])
def test_anonymous_reads_are_unsigned_both_ways(moto, served_root, presigned):
    """``anon=True`` (a public bucket): no credentials are looked for, the ranges go
    unsigned over either path, and read the object's bytes."""
    data = (served_root / FILE).read_bytes()
    client = s3_client(moto.url)
    bucket = 'public-data'
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket, ACL='public-read')
    client.put_object(Bucket=bucket, Key=FILE, Body=data, ACL='public-read')
    with Proxy(moto.url) as proxy:
        storage = remote_storage(f's3://{bucket}', {
            'endpoint_url': proxy.url, 'anon': True,
            'loadr': {**FAST, 's3_presigned': presigned, 'small_file_bytes': 0}})
        url = f's3://{bucket}/{FILE}'
        assert storage.read(url, 100, 50, 1) == data[100:150]
        gets = [t for m, t, _ in proxy.log if m == 'GET' and FILE in t]
    assert gets and not any('Signature' in t for t in gets), gets


def test_a_signature_version_the_profile_sets_is_kept(moto, tmp_path, monkeypatch):
    """loadr asks for SigV4 (its presigned URLs would be SigV2 in some regions otherwise),
    unless the storage options or the AWS config file's profile name a version (a store
    that needs another): then that one rules, for every request."""
    def asked(**options):
        storage = remote_storage('s3://fixtures', {'endpoint_url': moto.url, **options})
        return storage.fs.config_kwargs.get('signature_version')
    assert asked() == 's3v4'
    assert asked(config_kwargs={'signature_version': 's3'}) == 's3'
    config = tmp_path / 'aws_config'
    config.write_text('[default]\ns3 =\n    signature_version = s3\n')
    monkeypatch.setenv('AWS_CONFIG_FILE', str(config))
    assert asked() is None              # botocore reads the profile's
