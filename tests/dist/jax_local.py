"""One-process checks of loadr.jax, run by tests/test_jax.py in a pytest of their own
(JAX's threads must not be in a process that forks loader workers afterwards)."""

from __future__ import annotations

import json
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import loadr
from loadr.errors import ConfigError, StateError
from loadr.jax import global_batches


def test_one_process_state_and_restore():
    sharding = NamedSharding(Mesh(jax.devices(), ('data',)), PartitionSpec('data'))
    data = [{'x': np.float32(i), 'name': str(i)} for i in range(10)]
    with global_batches(data, sharding, batch_size=4, seed=2, workers=0) as batches:
        first = [next(batches) for _ in range(3)]
        state = json.loads(json.dumps(batches.state()))
        rest = [np.asarray(next(batches)['x']) for _ in range(3)]
        assert isinstance(first[0]['x'], jax.Array) and first[0]['name'] == \
            [str(int(v)) for v in np.asarray(first[0]['x'])]
        batches.restore(state)
        assert all(np.array_equal(np.asarray(next(batches)['x']), r) for r in rest)
    with loadr.Loader(data, batch=4, seed=2, workers=0) as loader:
        expected = [next(it)['x'] for it in [iter(loader)] for _ in range(6)]
    assert all(np.array_equal(np.asarray(b['x']), e) for b, e in zip(first, expected))
    assert all(np.array_equal(r, e) for r, e in zip(rest, expected[3:]))


def test_a_loader_that_does_not_match_the_sharding_is_refused():
    sharding = NamedSharding(Mesh(jax.devices(), ('data',)), PartitionSpec('data'))
    data = [{'x': np.float32(i)} for i in range(10)]
    with loadr.Loader(data, batch=2, shard_id=1, num_shards=2, workers=0) as loader:
        with pytest.raises(ConfigError, match='shard_id=0, num_shards=1'):
            global_batches(loader, sharding)
    with pytest.raises(ConfigError, match='batch_size'):
        global_batches(data, sharding)
    with pytest.raises(ConfigError, match='batch_size'):
        global_batches(data, sharding, batch_size=10**400)     # was a hang
    with pytest.raises(ConfigError, match='sets'):
        global_batches(data, sharding, batch_size=4, shard_id=0)


def test_workers_start_without_forking_a_process_that_runs_jax_threads():
    # global_batches forked its workers after JAX had started its threads: a
    # RuntimeWarning about deadlocks on every run (and a deadlock now and then).
    sharding = NamedSharding(Mesh(jax.devices(), ('data',)), PartitionSpec('data'))
    data = [{'x': np.float32(i)} for i in range(40)]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        with global_batches(data, sharding, batch_size=4, seed=2, workers=2) as batches:
            assert batches.loader.start_method in ('forkserver', 'spawn')
            got = [np.asarray(next(batches)['x']) for _ in range(12)]
    assert not [w for w in seen if 'fork' in str(w.message)], [str(w.message) for w in seen]
    with loadr.Loader(data, batch=4, seed=2, workers=0) as loader:
        it = iter(loader)
        assert all(np.array_equal(g, next(it)['x']) for g in got)


def test_a_refused_restore_leaves_the_stream_as_it_was():
    sharding = NamedSharding(Mesh(jax.devices(), ('data',)), PartitionSpec('data'))
    data = [{'x': np.float32(i)} for i in range(10)]
    with global_batches(data, sharding, batch_size=4, seed=2, workers=0) as batches:
        expected = [np.asarray(next(batches)['x']) for _ in range(6)]
    with global_batches(data, sharding, batch_size=4, seed=2, workers=0) as batches:
        got = [np.asarray(next(batches)['x']) for _ in range(2)]
        state = batches.state()
        for bad in ({**state, 'seed': 3}, {**state, 'step': 'x'}, {**state, 'n': 11},
                    {**state, 'version': 9}):
            with pytest.raises(StateError):
                batches.restore(bad)
            assert batches.state() == state
        got += [np.asarray(next(batches)['x']) for _ in range(4)]
    assert all(np.array_equal(g, e) for g, e in zip(got, expected))
