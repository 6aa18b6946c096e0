"""A trace of a loader reading over HTTP: its workers' read-ahead shows as counters."""

from __future__ import annotations

import json

import pytest

import loadr

from ..datasets import write_bag_sharded

pytestmark = pytest.mark.timeout(120)


def test_a_remote_readers_read_ahead_is_in_the_trace(nginx, served_root, tmp_path):
    # Large enough that the workers read it over the network as they go (a fixture's
    # few records are all read by the warm-up before the workers start).
    write_bag_sharded(served_root / 'trace_bag', n=600, shardlen=100)
    path = tmp_path / 'remote.trace.json'
    reader = loadr.open(f'{nginx.url}/trace_bag', decode_images=False)
    with loadr.Loader(reader, batch=4, fns=[loadr.fns.select(keys=['image', 'idx'])], seed=4,
                      workers=2, trace=path) as loader:
        for _ in zip(range(120), loader):
            pass
    with open(path, encoding='utf-8') as f:
        events = json.load(f)['traceEvents']
    ahead = [e for e in events if e['ph'] == 'C' and e['name'] == 'read ahead']
    assert ahead, sorted({e['name'] for e in events})
    for e in ahead:
        assert set(e['args']) == {'requests in flight', 'bytes ahead'}
        assert all(isinstance(v, (int, float)) and v >= 0 for v in e['args'].values())
    assert any(v > 0 for e in ahead for v in e['args'].values())
    worker_pids = {e['pid'] for e in events if e.get('cat') == 'worker' and e['name'] == 'task'}
    assert {e['pid'] for e in ahead} <= worker_pids
