"""The local cache of remote records (cache_dir, cache_bytes) under a Loader, over nginx."""

from __future__ import annotations

import hashlib
import os
import pickle

import numpy as np
import pytest

import loadr
from loadr.errors import ConfigError
from loadr.storage import using_storage_options

from ..loader_helpers import stream_digests
from ..test_loader_readers import PIPELINES
from .proxy import Proxy
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
            # The records came from the cache (a few small ranges are not cached).
            assert fetched[1] < fetched[0] // 10, (workers, fetched)
