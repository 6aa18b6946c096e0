"""A soak: a long stream with workers SIGKILLed at random, every sample checked, leaks measured.

Shared by ``tests/faults/test_soak.py`` (a short one in CI) and
``benchmarks/soak.py`` (at least 10^6 samples). Every sample is checked
without a reference run: its label must be the dataset index the order puts
at that stream position (nothing lost, nothing repeated), its vector must be
that label repeated (nothing torn) and its seed the one the order gives.

Example::

    figures = soak(samples=20_000, batch=64, workers=2, kill_probability=0.02, seed=1)
    figures['samples_checked'], figures['kills'], figures['rows'][-1]['fds']
"""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np

import loadr
from loadr.order import Order

from .helpers import children, open_fds, rss_bytes, segment_bytes, segments

VEC = 32


def stamp(dp, seed):
    """A datapoint whose every byte says where it came from."""
    return {'label': np.int64(dp['i']), 'vec': np.full(VEC, dp['i'], np.int64),
            'seed': np.uint64(seed)}


class Indices:
    """A dataset of ``n`` datapoints ``{'i': i}`` that costs no memory to hold."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {'i': i}


def measure(loader, other_children: int = 0) -> dict:
    """Open fds and RSS of this process, RSS of the workers, our /dev/shm use, and our
    children beyond the ``other_children`` we had before (e.g. multiprocess's resource
    tracker, started by an earlier spawn loader and kept for the process's life)."""
    worker_rss = 0
    for pid in loader.worker_pids:
        try:
            worker_rss += rss_bytes(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass                                   # just killed
    return {'fds': open_fds(), 'rss': rss_bytes(), 'worker_rss': worker_rss,
            'shm_bytes': segment_bytes(), 'shm_segments': len(segments()),
            'children': len(children()) - other_children}


def soak(samples: int, batch: int = 64, workers: int = 2, kill_probability: float = 0.02,
         n: int = 10_007, seed: int = 0, report_every: int = 50, out=None,
         jump_probability: float = 0.0) -> dict:
    """Stream ``samples`` samples, SIGKILLing a random worker before a batch with
    ``kill_probability`` and, with ``jump_probability``, moving the stream to a random
    position (by ``load()``, or by a new iterator after one); returns the figures and
    one measurement row per report."""
    rng = random.Random(seed)
    order = Order(n, seed)
    batches = -(-samples // batch)
    rows, kills, jumps, checked, position = [], 0, 0, 0, 0
    other_children = len(children())
    start = time.monotonic()
    with loadr.Loader(Indices(n), batch=batch, fns=[stamp], seed=seed, workers=workers) as loader:
        it = iter(loader)
        for k in range(batches):
            if k and rng.random() < kill_probability:
                pids = [w.process.pid for w in loader._pool.workers if w is not None and w.ready]
                if pids:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
            if k and rng.random() < jump_probability:
                position = rng.randrange(2**40)
                loader.load({'step': position, 'seed': seed})
                if rng.random() < 0.5:
                    it = iter(loader)               # a new iterator takes over
                jumps += 1
            b = next(it)
            want = order.indices(position, batch)
            if not np.array_equal(b['label'], want):
                raise AssertionError(f'batch {k}: labels {b["label"][:8]}... are not the '
                                     f'indices {want[:8]}... of positions {position}..')
            if not (b['vec'] == b['label'][:, None]).all():
                raise AssertionError(f'batch {k}: a torn row (vec differs from its label)')
            if b['seed'].tolist() != order.seeds(position, batch):
                raise AssertionError(f'batch {k}: seeds differ from the order\'s')
            position += batch
            checked += batch
            if k % report_every == 0 or k == batches - 1:
                row = {'batch': k, 'samples': checked, 'kills': kills, 'jumps': jumps,
                       'restarts': loader._pool.restarts,
                       'seconds': round(time.monotonic() - start, 2),
                       **measure(loader, other_children)}
                rows.append(row)
                if out is not None:
                    out(row)
        restarts = loader._pool.restarts
    return {'samples_checked': checked, 'batches': batches, 'kills': kills, 'jumps': jumps,
            'restarts': restarts, 'seconds': time.monotonic() - start, 'rows': rows,
            'after_close': {'shm_segments': len(segments()),
                            'children': len(children()) - other_children,
                            'fds': open_fds()}}


def growth(rows: list, key: str, skip: int = 1) -> int:
    """How much ``key`` rose from the first row after warm-up to the highest later row."""
    later = rows[skip:]
    return max(r[key] for r in later) - later[0][key]
