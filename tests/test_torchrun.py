"""Real multi-process jobs under torchrun (gloo, CPU, loopback): tests/dist/job.py.

- 3 ranks: every rank's batches, put together, are the single-process global
  batches; every rank yields len(dl) batches; the states are the same on all.
- Rank 0's state resumes a 2-rank job (same global batch) bit for bit.
- A rank whose datapoint raises stops the whole job with its error, no hang.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import uuid

import numpy as np
import pytest

from .conftest import in_ci

# Jobs of several processes (CI runs them: -m '').
pytestmark = pytest.mark.slow

try:
    import torch.distributed as dist
except ImportError:
    if in_ci():
        raise
    pytest.skip('torch is not installed (pip install torch==2.13.0)', allow_module_level=True)
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip('this torch has no gloo backend', allow_module_level=True)

from loadr.torch import DataLoader  # noqa: E402

from .dist.data import dataset, noisy  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOB = ROOT / 'tests' / 'dist' / 'job.py'
JOB_TIMEOUT_S = 150          # a hang fails here instead of blocking the suite
N, SEED, GLOBAL_BATCH = 23, 5, 6


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nnodes=1',
           f'--nproc-per-node={nproc}', '--rdzv-backend=c10d',
           '--rdzv-endpoint=127.0.0.1:0',            # port 0: the store takes a free one
           f'--rdzv-id={uuid.uuid4().hex}', '--max-restarts=0', '--monitor-interval=0.1',
           str(JOB), *args]
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1',
           'MASTER_ADDR': '127.0.0.1'}
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)


def single_process(epochs: int, state: dict | None = None) -> list[list[dict]]:
    with DataLoader(dataset(N), batch_size=GLOBAL_BATCH, fns=[noisy], seed=SEED,
                    num_workers=0) as dl:
        if state is not None:
            dl.load_state_dict(state)
        return [[{k: v.numpy().copy() for k, v in b.items()} for b in dl]
                for _ in range(epochs)]


def joined(out: pathlib.Path, world: int, epoch: int, k: int, key: str) -> np.ndarray:
    parts = [np.load(out / f'rank{r}.npz')[f'{epoch}/{k}/{key}'] for r in range(world)]
    return np.concatenate(parts)


def test_ranks_together_are_the_global_batch_and_rank0_state_resumes_two_ranks(tmp_path):
    three = tmp_path / 'three'
    three.mkdir()
    run = torchrun(3, '--out', str(three), '--per-rank', '2', '--workers', '1',
                   '--save-after', '3')
    assert run.returncode == 0, run.stderr[-4000:]
    whole = single_process(2)
    for e in range(2):
        lens = [np.load(three / f'rank{r}.npz')[f'{e}/len'].tolist() for r in range(3)]
        assert lens == [[len(whole[e])] * 2] * 3          # len(dl) == yielded, on every rank
        for k, global_batch in enumerate(whole[e]):
            for key in ('label', 'vec'):
                assert np.array_equal(joined(three, 3, e, k, key), global_batch[key])
    states = [json.loads((three / f'state{r}.json').read_text()) for r in range(3)]
    assert states[0] == states[1] == states[2]

    two = tmp_path / 'two'
    two.mkdir()
    run = torchrun(2, '--out', str(two), '--per-rank', '3', '--resume',
                   str(three / 'state0.json'))
    assert run.returncode == 0, run.stderr[-4000:]
    # The rest of epoch 0 after 3 batches, then epoch 1: the uninterrupted stream.
    expected = [whole[0][3:], whole[1]]
    resumed_here = single_process(2, states[0])
    assert [len(x) for x in resumed_here] == [len(x) for x in expected]
    assert all(np.array_equal(a['vec'], b['vec'])
               for x, y in zip(resumed_here, expected) for a, b in zip(x, y))
    for e in range(2):
        for k, global_batch in enumerate(expected[e]):
            for key in ('label', 'vec'):
                assert np.array_equal(joined(two, 2, e, k, key), global_batch[key])
        assert np.load(two / 'rank0.npz')[f'{e}/len'][1] == len(expected[e])


def test_a_rank_that_raises_stops_every_rank_with_its_error(tmp_path):
    # Stopped, not left waiting for the broken rank: a hang ends in torchrun()'s timeout.
    run = torchrun(3, '--out', str(tmp_path), '--fail-rank', '1', '--workers', '1')
    assert run.returncode != 0
    out = run.stdout + run.stderr
    assert 'ValueError' in out and 'is broken' in out, out[-4000:]
    assert 'rank' in out and ': 1' in out                 # torchrun's summary names rank 1
    assert not list(tmp_path.glob('rank*.npz'))           # nobody finished
