"""The local cache of remote records (cache_dir, cache_bytes) under a Loader, over nginx."""

from __future__ import annotations

import os
import shutil

import pytest

import loadr
from loadr.errors import ConfigError, ReadError
from loadr.storage import using_storage_options

from ..loader_helpers import stream_digests
from ..test_loader_readers import PIPELINES
from .proxy import Proxy
from .servers import s3_client, upload
from .test_remote_readers import _remote_pipeline

pytestmark = pytest.mark.timeout(120)
BATCH = 4


def _entries_bytes(cache_dir) -> int:
    """Bytes of the cached ranges (entries are named <hash>-<index>-<length>)."""
    total = 0
    for folder, _, names in os.walk(cache_dir):
        for name in names:
            parts = name.split('-')
            if len(parts) == 3 and all(p.isdigit() for p in parts[1:]):
                assert os.path.getsize(os.path.join(folder, name)) == int(parts[2])
                total += int(parts[2])
    return total


def _epoch(reader, pipeline, epoch, workers=2):
    with loadr.Loader(reader, batch=BATCH, fns=pipeline, seed=5, workers=workers) as loader:
        n = len(reader)
        loader.load({'step': epoch * n, 'seed': 5})
        return stream_digests(loader, n // BATCH)


@pytest.mark.parametrize('policy', ['furthest', 'lru'])
def test_a_cached_epoch_gives_the_same_batches_and_fetches_less(nginx, served_root, tmp_path,
                                                               policy):
    # In the main process (workers=0): the bytes fetched per epoch are exact,
    # with no worker reading its own index tables or reading ahead past the end.
    local, pipeline = PIPELINES['bag'](served_root)
    expected = [_epoch(local, pipeline, e, workers=0) for e in range(3)]
    cache_bytes = (served_root / 'bag/image.bag').stat().st_size // 3
    settings = {'cache_dir': str(tmp_path / 'cache'), 'cache_bytes': cache_bytes,
                'cache_policy': policy}
    with Proxy(nginx.url) as proxy:
        with using_storage_options({'loadr': settings}):
            reader, pipeline = _remote_pipeline('bag', proxy.url)
        fetched = []
        for epoch in range(3):
            before = proxy.stats['body_bytes']
            # A new loader each epoch, as a resumed run: the cache outlives it.
            assert _epoch(reader, pipeline, epoch, workers=0) == expected[epoch]
            fetched.append(proxy.stats['body_bytes'] - before)
            assert 0 < _entries_bytes(tmp_path / 'cache') <= cache_bytes
    if policy == 'furthest':
        # What it kept at each epoch's end is read early in the next one.
        assert fetched[1] < fetched[0] - cache_bytes // 2, fetched
        assert fetched[2] < fetched[0] - cache_bytes // 2, fetched
    else:
        assert fetched[1] <= fetched[0] and fetched[2] <= fetched[0], fetched


def test_workers_share_the_cache_and_give_the_same_batches(nginx, served_root, tmp_path):
    local, pipeline = PIPELINES['bag'](served_root)
    expected = [_epoch(local, pipeline, e, workers=0) for e in range(3)]
    cache_bytes = (served_root / 'bag/image.bag').stat().st_size // 3
    settings = {'cache_dir': str(tmp_path / 'cache'), 'cache_bytes': cache_bytes}
    with using_storage_options({'loadr': settings}):
        reader, pipeline = _remote_pipeline('bag', nginx.url)
    for epoch in range(3):
        assert _epoch(reader, pipeline, epoch, workers=2) == expected[epoch]
        assert 0 < _entries_bytes(tmp_path / 'cache') <= cache_bytes
    leftovers = [name for _, _, names in os.walk(tmp_path / 'cache') for name in names
                 if 'tmp' in name]
    assert not leftovers


def test_loadr_open_takes_the_cache_settings(nginx, served_root, tmp_path):
    reader = loadr.open(f'{nginx.url}/ffrecord/multi', decode='msgpack',
                        cache_dir=tmp_path / 'c', cache_bytes=10_000)
    assert reader.caches and reader._files.settings['cache_bytes'] == 10_000
    local = loadr.open(served_root / 'ffrecord/multi', decode='msgpack')
    with loadr.Loader(reader, batch=BATCH, seed=1, workers=0) as loader:
        got = stream_digests(loader, 6)
    with loadr.Loader(local, batch=BATCH, seed=1, workers=0) as loader:
        assert got == stream_digests(loader, 6)
    assert 0 < _entries_bytes(tmp_path / 'c') <= 10_000
    # No cache unless asked for.
    assert not loadr.open(f'{nginx.url}/ffrecord/multi', decode='msgpack').caches


def test_cache_settings_are_checked(nginx, served_root, tmp_path):
    url = f'{nginx.url}/bag'
    with pytest.raises(ConfigError, match='cache_bytes'):
        loadr.open(url, cache_dir=tmp_path / 'c')
    with pytest.raises(ConfigError, match='cache_policy'):
        loadr.open(url, cache_dir=tmp_path / 'c', cache_bytes=1000, cache_policy='random')
    with pytest.raises(ConfigError, match='URLs') as err:
        loadr.open(served_root / 'bag', cache_dir=tmp_path / 'c', cache_bytes=1000)
    assert str(served_root / 'bag') in str(err.value)
    # A directory that holds something else is not taken over (nor emptied).
    other = tmp_path / 'mine'
    other.mkdir()
    (other / 'notes.txt').write_text('keep me')
    reader = loadr.open(f'{nginx.url}/ffrecord/multi', decode='msgpack',
                        storage_options={'loadr': {'cache_dir': str(other),
                                                   'cache_bytes': 1000}})
    with loadr.Loader(reader, batch=BATCH, seed=1, workers=0) as loader:
        next(iter(loader))              # the cache is a subdirectory: ours alone
    assert (other / 'notes.txt').read_text() == 'keep me'


def test_a_yaml_reader_section_takes_the_cache_settings(nginx, served_root, tmp_path):
    config = tmp_path / 'p.yaml'
    config.write_text(f'reader: {{path: "{nginx.url}/ffrecord/multi", decode: msgpack, '
                      f'cache_dir: "{tmp_path / "c"}", cache_bytes: 10000}}\n'
                      f'loader: {{batch: {BATCH}, seed: 1, workers: 0}}\n')
    with loadr.pipeline(str(config)) as loader:
        got = stream_digests(loader, 4)
        assert loader.reader.caches
    local = loadr.open(served_root / 'ffrecord/multi', decode='msgpack')
    with loadr.Loader(local, batch=BATCH, seed=1, workers=0) as loader:
        assert got == stream_digests(loader, 4)
    assert 0 < _entries_bytes(tmp_path / 'c') <= 10_000
    config.write_text(f'reader: {{path: "{served_root / "ffrecord/multi"}", cache_dir: c, '
                      f'cache_bytes: 10000}}\n')
    with pytest.raises(ConfigError, match='behind URLs'):
        loadr.pipeline(str(config))


# -- a dataset replaced at its URL (issue 20, item 2) ----------------------------------

N_REPLACED = 24


def _write_version(path, version: int) -> None:
    """A sharded bag whose values depend on ``version``: every file the same size in each."""
    from loadr.readers.bag import BagWriter
    with BagWriter(path, {'v': 'bytes', 'n': 'int'}, shardlen=8) as w:
        for i in range(N_REPLACED):
            w.append({'v': bytes([version]) * 40 + i.to_bytes(4, 'little'), 'n': 1000 + i})


def _replace_over(target, source, later_s: float) -> None:
    """Every file of ``source`` renamed over its twin in ``target`` (as a sync tool does),
    its mtime ``later_s`` on: nginx's version of a file is its mtime (seconds) and size."""
    for folder, _, names in os.walk(source):
        for name in names:
            new = os.path.join(folder, name)
            old = os.path.join(target, os.path.relpath(new, source))
            assert os.path.getsize(new) == os.path.getsize(old)
            stamp = os.stat(old).st_mtime + later_s
            os.utime(new, (stamp, stamp))
            os.replace(new, old)


@pytest.fixture(params=['http', 's3'])
def replaceable(request, served_root, tmp_path):
    """(URL, storage_options, replace()) of a dataset in version 1; replace() puts version 2
    at the same URL. Versions 1 and 2 are also at tmp_path/v1 and tmp_path/v2."""
    name = f'replaced-{request.param}-{os.getpid()}-{request.node.name[:40]}'
    for v in (1, 2):
        _write_version(tmp_path / f'v{v}', v)
    if request.param == 'http':
        web = request.getfixturevalue('nginx')
        shutil.copytree(tmp_path / 'v1', served_root / name)
        staged = tmp_path / 'staged'
        yield (f'{web.url}/{name}', {},
               lambda: (shutil.copytree(tmp_path / 'v2', staged),
                        _replace_over(served_root / name, staged, later_s=5)))
        shutil.rmtree(served_root / name, ignore_errors=True)
    else:
        s3 = request.getfixturevalue('moto')
        upload(s3.url, 'fixtures', tmp_path / 'v1', name)
        yield (f's3://fixtures/{name}', {'endpoint_url': s3.url},
               lambda: upload(s3.url, 'fixtures', tmp_path / 'v2', name))


def _all(reader) -> list:
    with loadr.Loader(reader, batch=BATCH, seed=3, workers=0) as loader:
        return stream_digests(loader, N_REPLACED // BATCH)


def test_a_dataset_replaced_between_runs_is_read_anew_never_from_the_cache(replaceable,
                                                                           tmp_path):
    url, options, replace = replaceable
    expected = {v: _all(loadr.open(tmp_path / f'v{v}')) for v in (1, 2)}
    assert expected[1] != expected[2]
    cache = {'cache_dir': str(tmp_path / 'cache'), 'cache_bytes': 1 << 20}
    first = loadr.open(url, storage_options=options, **cache)
    assert _all(first) == expected[1]
    assert _entries_bytes(tmp_path / 'cache') > 0         # the whole of version 1 is cached
    replace()
    # A new run: a new open, the same URL and cache_dir.
    second = loadr.open(url, storage_options=options, **cache)
    assert _all(second) == expected[2]
    assert _all(loadr.open(url, storage_options=options, **cache)) == expected[2]


def test_a_dataset_replaced_during_a_run_is_an_error_naming_the_url(replaceable, tmp_path):
    url, options, replace = replaceable
    reader = loadr.open(url, storage_options=options)
    batched = loadr.open(url, storage_options=options)
    local = loadr.open(tmp_path / 'v1')
    for i in range(4):                      # some records of version 1 are read...
        assert reader[i] == local[i] and batched[i] == local[i]
    replace()
    with pytest.raises(ReadError, match='changed since the reader was made') as err:
        for i in range(4, N_REPLACED):      # ... and none of version 2 after them
            assert reader[i] == local[i]
    assert str(err.value).startswith(url + '/'), err.value
    # Many ranges of a file in one request (HTTP multi-range), and read ahead: the same.
    with pytest.raises(ReadError, match='changed since the reader was made') as err:
        batched.read_batch(range(4, N_REPLACED))
    assert str(err.value).startswith(url + '/'), err.value
    # Through a loader's workers: a loadr error naming the URL, never a batch of version 2.
    with pytest.raises(loadr.LoadrError, match='changed since the reader was made') as err:
        with loadr.Loader(loadr.open(tmp_path / 'v1'), batch=BATCH, seed=3, workers=0) as old:
            expected = stream_digests(old, N_REPLACED // BATCH)
        with loadr.Loader(batched, batch=BATCH, seed=3, workers=2) as loader:
            assert stream_digests(loader, N_REPLACED // BATCH) == expected
    assert url + '/' in str(err.value), err.value
    # Opened again, the reader reads the new version.
    again = loadr.open(url, storage_options=options)
    new = loadr.open(tmp_path / 'v2')
    assert [again[i] for i in range(N_REPLACED)] == [new[i] for i in range(N_REPLACED)]


@pytest.mark.parametrize('protocol', ['http', 's3'])
def test_a_single_file_replaced_during_a_run_is_an_error(protocol, served_root, tmp_path,
                                                         request):
    """A file opened by itself (its version from a HEAD: nginx's ETag, S3's), not listed."""
    from loadr.writers import FFRecordWriter
    for v in (1, 2):
        with FFRecordWriter(tmp_path / f'v{v}.ffr', n=8) as w:
            for i in range(8):
                w.write_one(bytes([v]) * 32)
    name = f'single-{protocol}-{os.getpid()}.ffr'
    if protocol == 'http':
        url, options = f"{request.getfixturevalue('nginx').url}/{name}", {}
        shutil.copy(tmp_path / 'v1.ffr', served_root / name)

        def replace():
            stamp = os.stat(served_root / name).st_mtime + 5
            os.utime(tmp_path / 'v2.ffr', (stamp, stamp))
            os.replace(tmp_path / 'v2.ffr', served_root / name)
    else:
        s3 = request.getfixturevalue('moto')
        url, options = f's3://fixtures/{name}', {'endpoint_url': s3.url}
        s3_client(s3.url).put_object(Bucket='fixtures', Key=name,
                                     Body=(tmp_path / 'v1.ffr').read_bytes())

        def replace():
            s3_client(s3.url).put_object(Bucket='fixtures', Key=name,
                                         Body=(tmp_path / 'v2.ffr').read_bytes())
    try:
        reader = loadr.open(url, storage_options=options)
        assert reader.read_one(0) == bytes([1]) * 32
        replace()
        with pytest.raises(ReadError, match='changed since the reader was made') as err:
            reader.read_one(5)
        assert err.value.path == url
        assert loadr.open(url, storage_options=options).read_one(5) == bytes([2]) * 32
    finally:
        (served_root / name).unlink(missing_ok=True)
