"""The local cache of remote records (cache_dir, cache_bytes) under a Loader, over nginx."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import re
import shutil
import zlib

import numpy as np
import pytest

import loadr
from loadr.errors import ConfigError, ReadError
from loadr.storage.cachedir import DEFAULT_CAP

from ..loader_helpers import stream_digests
from ..storage.test_cache import mounts  # noqa: F401 - a fixture: tmpfs mounts, unmounted at the end
from ..test_loader_readers import PIPELINES
from .proxy import Proxy
from .servers import s3_client, start_plain_http, upload
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


def _entries(cache_dir) -> dict[str, bytes]:
    """{path: bytes} of the cache's entries (<key><crc>-<index>-<length>)."""
    out = {}
    for folder, _, names in os.walk(cache_dir):
        for name in names:
            if re.fullmatch(r'[0-9a-f]{32}-\d+-\d+', name):
                with open(os.path.join(folder, name), 'rb') as f:
                    out[os.path.join(folder, name)] = f.read()
    return out


@contextlib.contextmanager
def _logged(path):
    """The 'loadr' log of this process and of its forked workers, written to ``path`` (a
    forked worker has pytest's handlers, which keep what it logs in its own memory)."""
    handler = logging.FileHandler(path)
    logger = logging.getLogger('loadr')
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


def _warnings(path, capfd, directory) -> list[str]:
    """The lines about ``directory`` logged (see _logged; a spawned worker writes to stderr)
    since the last call."""
    with open(path, 'r+') as f:
        lines = f.read().splitlines()
        f.truncate(0)
    lines += capfd.readouterr().err.splitlines()
    return [line for line in lines if str(directory) in line]


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
        reader, pipeline = _remote_pipeline('bag', proxy.url, {'loadr': settings})
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
    reader, pipeline = _remote_pipeline('bag', nginx.url, {'loadr': settings})
    for epoch in range(3):
        assert _epoch(reader, pipeline, epoch, workers=2) == expected[epoch]
        assert 0 < _entries_bytes(tmp_path / 'cache') <= cache_bytes
    leftovers = [name for _, _, names in os.walk(tmp_path / 'cache') for name in names
                 if 'tmp' in name]
    assert not leftovers


def test_loadr_open_takes_the_cache_settings(nginx, served_root, tmp_path):
    reader = loadr.open(f'{nginx.url}/ffrecord/multi', decode='msgpack',
                        cache_dir=tmp_path / 'c', cache_bytes=10_000)
    assert reader.caches and reader._files.settings.cache_bytes == 10_000
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
    # Named as given (reader options), never as storage_options['loadr'] the user did not use.
    for bad in (0, -1, float('inf'), float('nan'), '10GB', True):
        with pytest.raises(ConfigError, match='cache_bytes') as err:
            loadr.open(url, cache_dir=tmp_path / 'c', cache_bytes=bad)
        assert 'storage_options' not in str(err.value) and 'leave it out' in str(err.value)
    with pytest.raises(ConfigError, match='cache_policy') as err:
        loadr.open(url, cache_dir=tmp_path / 'c', cache_bytes=1000, cache_policy='random')
    assert 'storage_options' not in str(err.value)
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



def _content(dp, seed=None):
    """The datapoint's content as one fixed-size key (the sources' keys differ)."""
    digest = hashlib.blake2b(pickle.dumps(sorted(dp.items())), digest_size=16).digest()
    return {'content': np.frombuffer(digest, dtype=np.uint8)}


def test_each_source_of_a_mix_keeps_its_cache(nginx, served_root, tmp_path):
    """Inside a Mix, each remote source's cache fills as it does alone (it stayed empty):
    a run after one that read two epochs fetches nothing, with the local batches."""
    def mix(root, **cache):
        return loadr.Mix({'ffr': loadr.open(f'{root}/ffrecord/multi', decode='msgpack', **cache),
                          'bag': loadr.open(f'{root}/bag_sharded', decode_images=False,
                                            **cache)},
                         weights={'ffr': 0.5, 'bag': 0.5}, source_key=None)

    def run(reader, workers):
        with loadr.Loader(reader, batch=BATCH, seed=2, fns=[_content], workers=workers) as loader:
            return stream_digests(loader, steps)

    local = mix(served_root)
    steps = 2 * len(local) // BATCH                 # two epochs
    expected = run(local, 0)
    with Proxy(nginx.url) as proxy:
        for workers in (0, 2):
            cache = {'cache_dir': tmp_path / f'cache{workers}', 'cache_bytes': 10**8}
            fetched = []
            for again in (False, True):
                remote = mix(proxy.url, **cache)
                assert remote.caches
                before = proxy.stats['body_bytes']
                assert run(remote, 0 if again else workers) == expected
                fetched.append(proxy.stats['body_bytes'] - before)
            folders = os.listdir(tmp_path / f'cache{workers}')
            assert len(folders) == 2 and all(
                _entries_bytes(tmp_path / f'cache{workers}' / f) > 0 for f in folders), folders
            # The records came from the cache. What is fetched again is not cached by
            # design: a few small ranges, and the bag shards' headers, which a reader behind
            # a URL reads at their first use (some 16 KiB a shard), not at the open.
            assert fetched[1] < fetched[0] // 3, (workers, fetched)


def test_a_cache_dir_alone_gets_a_share_of_the_free_disk(nginx, served_root, tmp_path):
    reader = loadr.open(f'{nginx.url}/ffrecord/multi', decode='msgpack', cache_dir=tmp_path / 'c')
    budget = reader._files.settings.cache_bytes
    assert 0 < budget <= DEFAULT_CAP                # storage.cachedir.default_budget, fixed at open
    with loadr.Loader(reader, batch=BATCH, seed=1, workers=0) as loader:
        got = stream_digests(loader, 4)
    local = loadr.open(served_root / 'ffrecord/multi', decode='msgpack')
    with loadr.Loader(local, batch=BATCH, seed=1, workers=0) as loader:
        assert got == stream_digests(loader, 4)
    assert _entries_bytes(tmp_path / 'c') > 0
    # The workers get the figure of the open, not one of their own.
    config = tmp_path / 'p.yaml'
    config.write_text(f'reader: {{path: "{nginx.url}/ffrecord/multi", decode: msgpack, '
                      f'cache_dir: "{tmp_path / "y"}"}}\n'
                      f'loader: {{batch: {BATCH}, seed: 1, workers: 2}}\n')
    with loadr.pipeline(str(config)) as loader:
        assert stream_digests(loader, 4) == got
        assert 0 < loader.reader._files.settings.cache_bytes <= DEFAULT_CAP


def _flip(path: str) -> None:
    with open(path, 'r+b') as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize('name', ['bag', 'ffrecord'])
def test_damaged_entries_are_fetched_again_and_replaced(nginx, served_root, tmp_path, name):
    local, pipeline = PIPELINES[name](served_root)
    expected = [_epoch(local, pipeline, e, workers=0) for e in range(2)]
    settings = {'cache_dir': str(tmp_path / 'cache'), 'cache_bytes': 10**7}   # holds it all
    reader, pipeline = _remote_pipeline(name, nginx.url, {'loadr': settings})
    assert _epoch(reader, pipeline, 0, workers=0) == expected[0]
    whole = _entries(tmp_path / 'cache')
    assert len(whole) >= 4                           # ranges read: a record or a few
    paths = sorted(whole)
    damaged = paths[::2] + paths[1:4:2]
    for path in paths[::2]:
        _flip(path)                                  # same length, other bytes
    with open(paths[1], 'ab') as f:
        f.write(b'!')                                # longer
    os.truncate(paths[3], len(whole[paths[3]]) - 1)  # shorter
    # A new run on that cache (the same epoch: the same ranges are read): the batches
    # of the server, each damaged entry it meets replaced.
    reader, pipeline = _remote_pipeline(name, nginx.url, {'loadr': settings})
    assert _epoch(reader, pipeline, 0, workers=0) == expected[0]
    met = reader._files.cache_stats()['damaged']
    # Most reads look in the cache; some take their bytes from what was read for a
    # neighbour (a read ahead over a small gap, an FFRecord header read with its file's
    # first records): those are the server's bytes, and leave their entry unseen.
    assert met >= len(damaged) // 2, (met, len(damaged))
    assert _replaced(tmp_path / 'cache', whole, damaged) == met
    # And under workers, in other epochs.
    for path in paths[::3]:
        _flip(path)
    reader, pipeline = _remote_pipeline(name, nginx.url, {'loadr': settings})
    assert _epoch(reader, pipeline, 1, workers=2) == expected[1]
    assert _epoch(reader, pipeline, 0, workers=2) == expected[0]


def _replaced(cache_dir, whole: dict, damaged: list) -> int:
    """How many of the ``damaged`` entries are back whole; the others are as they were
    before (damaged), never another content, and every other entry verifies."""
    now = _entries(cache_dir)
    assert {path: now.get(path) for path in whole if path not in damaged} == {
        path: data for path, data in whole.items() if path not in damaged}
    for path, data in now.items():
        crc, _, length = os.path.basename(path)[24:].split('-')
        if path not in damaged:
            assert (zlib.crc32(data), len(data)) == (int(crc, 16), int(length)), path
    return sum(now.get(path) == whole[path] for path in damaged)


def test_a_read_only_cache_dir_gives_the_same_batches_and_one_warning(
        nginx, served_root, tmp_path, mounts, capfd):  # noqa: F811 - the fixture
    local, pipeline = PIPELINES['ffrecord'](served_root)
    expected = [_epoch(local, pipeline, e, workers=0) for e in range(2)]
    cache_dir = mounts.tmpfs(tmp_path / 'cache', size='1m')
    settings = {'cache_dir': str(cache_dir), 'cache_bytes': 40_000}         # about half
    reader, pipeline = _remote_pipeline('ffrecord', nginx.url, {'loadr': settings})
    assert _epoch(reader, pipeline, 0, workers=0) == expected[0]
    entries = _entries(cache_dir)
    assert entries
    _flip(sorted(entries)[0])                        # and one of them damaged
    (dataset,) = [d for d in cache_dir.iterdir() if d.is_dir()]
    os.unlink(dataset / '.loadr-cache.lock')        # nor can the lock be made
    mounts.read_only(cache_dir)
    log = tmp_path / 'log'
    with _logged(log):
        for workers in (2, 0):
            reader, pipeline = _remote_pipeline('ffrecord', nginx.url, {'loadr': settings})
            assert _epoch(reader, pipeline, 1, workers=workers) == expected[1]
            lines = _warnings(log, capfd, dataset)
            # Both workers meet it, one says it; then this process, unless a worker
            # of the run that said it still lives (see loadr.storage.cachedir.warn_once).
            assert len(lines) == (1 if workers else len(lines[:1])), lines
            assert all('Read-only file system' in line and 'uncached' in line
                       for line in lines)
    assert reader._files.cache_stats()['hits'] > 0   # what verifies is still read
    assert _entries(cache_dir).keys() == entries.keys()


def test_a_full_cache_disk_gives_the_same_batches_and_one_warning(
        nginx, served_root, tmp_path, mounts, capfd):  # noqa: F811 - the fixture
    local, pipeline = PIPELINES['bag'](served_root)
    expected = [_epoch(local, pipeline, e, workers=0) for e in range(2)]
    cache_dir = mounts.tmpfs(tmp_path / 'cache', size='64k')     # a page an entry: 16
    settings = {'cache_dir': str(cache_dir), 'cache_bytes': 10**7}
    log = tmp_path / 'log'
    with _logged(log):
        for workers in (2, 0):
            reader, pipeline = _remote_pipeline('bag', nginx.url, {'loadr': settings})
            assert _epoch(reader, pipeline, 0, workers=workers) == expected[0]
            lines = _warnings(log, capfd, cache_dir)
            assert len(lines) == (1 if workers else len(lines[:1])), lines   # as above
            assert all('No space left on device' in line and 'uncached' in line
                       for line in lines)
    assert _entries(cache_dir)


# -- a dataset replaced at its URL ---------------------------------------------------

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


def test_a_dataset_whose_server_gives_no_version_is_never_read_from_an_old_cache(
        nginx, served_root, tmp_path, capfd):
    """A server that says no version of its files (no ETag, no Last-Modified: nginx's
    /bare/): the cache cannot tell the files of a new upload from those it holds, so
    they are not cached, one warning naming the URL says so, and a new run after the
    dataset was replaced reads the new bytes (it read the old ones from the cache)."""
    name = f'unversioned-{os.getpid()}'
    for v in (1, 2):
        _write_version(tmp_path / f'v{v}', v)
    expected = {v: _all(loadr.open(tmp_path / f'v{v}')) for v in (1, 2)}
    shutil.copytree(tmp_path / 'v1', served_root / name)
    url = f'{nginx.url}/bare/{name}'
    cache = {'cache_dir': str(tmp_path / 'cache'), 'cache_bytes': 1 << 20}
    log = tmp_path / 'log'
    try:
        with _logged(log):
            assert _all(loadr.open(url, **cache)) == expected[1]
            shutil.copytree(tmp_path / 'v2', tmp_path / 'staged')
            _replace_over(served_root / name, tmp_path / 'staged', later_s=5)
            assert _all(loadr.open(url, **cache)) == expected[2]
        lines = _warnings(log, capfd, url)
        assert len(lines) == 1, lines
        assert 'no version' in lines[0] and 'not cached' in lines[0], lines
        assert _entries_bytes(tmp_path / 'cache') == 0
    finally:
        shutil.rmtree(served_root / name, ignore_errors=True)


def test_a_listing_without_versions_has_each_file_asked_for_its_version(tmp_path):
    """A listing that gives each file's size but not its version: each file is asked for
    its version (a HEAD: its Last-Modified here) before the cache serves any of it, so
    a new run after the dataset was replaced reads the new bytes (it read the old ones
    from the cache), and the files are still cached, under their versions."""
    for v in (1, 2):
        _write_version(tmp_path / f'v{v}', v)
    expected = {v: _all(loadr.open(tmp_path / f'v{v}')) for v in (1, 2)}
    shutil.copytree(tmp_path / 'v1', tmp_path / 'site' / 'ds')
    cache = {'cache_dir': str(tmp_path / 'cache'), 'cache_bytes': 1 << 20}
    with start_plain_http(tmp_path / 'site', json_listing=True) as web:
        url = f'{web.url}/ds'
        assert _all(loadr.open(url, **cache)) == expected[1]
        cached = _entries_bytes(tmp_path / 'cache')
        assert cached > 0
        assert any(method == 'HEAD' for method, _, _ in web.log), web.log
        shutil.copytree(tmp_path / 'v2', tmp_path / 'staged')
        _replace_over(tmp_path / 'site' / 'ds', tmp_path / 'staged', later_s=5)
        assert _all(loadr.open(url, **cache)) == expected[2]
        assert _entries_bytes(tmp_path / 'cache') > cached      # version 2's, beside


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
            for _i in range(8):
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
