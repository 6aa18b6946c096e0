"""loadr.jax on CPU: a real 2-process job (jax.distributed, a local coordinator),
2 devices per process, each process loading half of each global batch
(tests/dist/jax_job.py); plus the checks that need one process only.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from .conftest import in_ci

try:
    import jax
except ImportError:
    if in_ci():
        raise
    pytest.skip('jax is not installed (pip install jax jaxlib)', allow_module_level=True)

from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import loadr  # noqa: E402
from loadr.errors import ConfigError  # noqa: E402
from loadr.jax import global_batches  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOB = ROOT / 'tests' / 'dist' / 'jax_job.py'
JOB_TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_two_processes_build_global_arrays_from_their_halves_and_resume(tmp_path):
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'JAX_PLATFORMS': 'cpu',
           'XLA_FLAGS': '--xla_force_host_platform_device_count=2', 'OMP_NUM_THREADS': '1'}
    coordinator = f'127.0.0.1:{free_port()}'
    procs = [subprocess.Popen([sys.executable, str(JOB), '--coordinator', coordinator,
                               '--process-id', str(i), '--out', str(tmp_path)],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=JOB_TIMEOUT_S)[0])
    finally:
        for p in procs:                 # one that hangs (its peer died) must not outlive us
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    results = [json.loads((tmp_path / f'process{i}.json').read_text()) for i in range(2)]
    assert [(r['devices'], r['local_devices']) for r in results] == [(4, 2)] * 2
    assert results[0]['state'] == results[1]['state']        # one state for every process
    try:
        import orbax.checkpoint  # noqa: F401
        assert results[0]['checkpoint'] == 'orbax'
    except ImportError:
        assert results[0]['checkpoint'] == 'json'


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
    with pytest.raises(ConfigError, match='sets'):
        global_batches(data, sharding, batch_size=4, shard_id=0)
