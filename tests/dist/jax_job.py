"""One process of a 2-process JAX job on CPU, run by tests/test_jax.py.

Each process has 2 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)
and loads only its half of each global batch through ``loadr.jax.global_batches``;
it checks every global array against the single-process stream (a jitted sum over
the global array, and the array gathered from both processes), saves the iterator
state after 3 batches (through Orbax's CheckpointManager when Orbax is installed,
else as JSON), restores it after 6 and checks the batches that follow again.
It writes OUT/process<i>.json.

Usage::

    python tests/dist/jax_job.py --coordinator 127.0.0.1:PORT --process-id 0 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import loadr
from loadr.jax import global_batches

N, SEED, GLOBAL_BATCH, STEPS, SAVE_AT = 29, 11, 8, 6, 3
INIT_TIMEOUT_S = 60


def dataset(n: int) -> list[dict]:
    return [{'label': np.int32(i), 'vec': np.full(4, i, np.float32)} for i in range(n)]


def noisy(dp, seed):
    rng = np.random.default_rng(seed)
    return {'label': dp['label'], 'vec': dp['vec'] + rng.standard_normal(4).astype(np.float32)}


def expected_stream(steps: int) -> list[dict]:
    with loadr.Loader(dataset(N), batch=GLOBAL_BATCH, fns=[noisy], seed=SEED,
                      workers=0) as one:
        it = iter(one)
        return [{k: v.copy() for k, v in next(it).items()} for _ in range(steps)]


def save_state(directory: str, state: dict) -> str:
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        if jax.process_index() == 0:
            with open(os.path.join(directory, 'state.json'), 'w') as f:
                json.dump(state, f)
        multihost_utils.sync_global_devices('state saved')
        return 'json'
    with ocp.CheckpointManager(os.path.join(directory, 'ckpt')) as mngr:
        mngr.save(SAVE_AT, args=ocp.args.Composite(data=ocp.args.JsonSave(state)))
        mngr.wait_until_finished()
    return 'orbax'


def load_state(directory: str, how: str) -> dict:
    if how == 'json':
        with open(os.path.join(directory, 'state.json')) as f:
            return json.load(f)
    import orbax.checkpoint as ocp
    with ocp.CheckpointManager(os.path.join(directory, 'ckpt')) as mngr:
        restored = mngr.restore(mngr.latest_step(),
                                args=ocp.args.Composite(data=ocp.args.JsonRestore()))
    return restored['data']


def check(batch: dict, want: dict, total) -> None:
    assert batch['vec'].shape == (GLOBAL_BATCH, 4), batch['vec'].shape
    assert len(batch['vec'].addressable_shards) == 2        # this process's 2 devices
    gathered = multihost_utils.process_allgather(batch['vec'], tiled=True)
    assert np.array_equal(np.asarray(gathered), want['vec'])
    assert int(total(batch['label'])) == int(want['label'].sum())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--coordinator', required=True)
    p.add_argument('--process-id', type=int, required=True)
    p.add_argument('--num-processes', type=int, default=2)
    p.add_argument('--out', required=True)
    args = p.parse_args()
    jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                               initialization_timeout=INIT_TIMEOUT_S)
    mesh = Mesh(jax.devices(), ('data',))       # ordered by process: rows split in halves
    sharding = NamedSharding(mesh, PartitionSpec('data'))
    want = expected_stream(STEPS)
    total = jax.jit(lambda x: x.sum())          # a computation over the global array
    with global_batches(dataset(N), sharding, batch_size=GLOBAL_BATCH, fns=[noisy],
                        seed=SEED, workers=1) as batches:
        assert batches.loader.shard_id == jax.process_index()
        assert batches.loader.batch == GLOBAL_BATCH // 2
        for k in range(STEPS):
            check(next(batches), want[k], total)
            if k + 1 == SAVE_AT:
                how = save_state(args.out, batches.state())
        batches.restore(load_state(args.out, how))
        for k in range(SAVE_AT, STEPS):
            check(next(batches), want[k], total)
        state = batches.state()
    with open(os.path.join(args.out, f'process{args.process_id}.json'), 'w') as f:
        json.dump({'devices': jax.device_count(), 'local_devices': jax.local_device_count(),
                   'checkpoint': how, 'state': state}, f)
    jax.distributed.shutdown()


if __name__ == '__main__':
    main()
