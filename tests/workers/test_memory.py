"""Steady memory (memory.py) in worker processes: glibc malloc thresholds in effect, reported,
given back when idle."""

from __future__ import annotations

import time

import numpy as np
import pytest

import loadr
from loadr.workers.memory import IDLE_TRIM_S, mmapped_chunks

from ..loader_helpers import trivial

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(mmapped_chunks() is None,
                                 reason='steady memory is a glibc setting; this C library '
                                        'is not glibc')]

BIG = 40 * 2**20        # above glibc's largest dynamic mmap threshold (32 MiB)


def probe(dp, seed):
    """Whether a 40 MiB buffer got its own mmap here (1) or came from the heap (0)."""
    before = mmapped_chunks()
    buf = bytearray(BIG)
    after = mmapped_chunks()
    del buf
    return {'label': np.int64(dp['label']), 'mmapped': np.int64(after - before)}


@pytest.mark.parametrize('setting,expected', [(None, 0), ('1', 0), ('0', 1), ('off', 1)])
def test_steady_memory_is_on_in_workers_unless_turned_off(monkeypatch, setting, expected):
    if setting is None:
        monkeypatch.delenv('LOADR_STEADY_MEMORY', raising=False)
    else:
        monkeypatch.setenv('LOADR_STEADY_MEMORY', setting)
    with loadr.Loader(trivial(16), batch=4, fns=[probe], shuffle=False, workers=2) as loader:
        got = [next(it)['mmapped'].tolist() for it in [iter(loader)] for _ in range(4)]
        memory = loader._pool.memory()
    assert got == [[expected] * 4] * 4
    assert sorted(memory) == [0, 1]
    for held in memory.values():
        assert held['rss_bytes'] >= held['heap_bytes'] > 0
    # The main process is left as it is.
    with loadr.Loader(trivial(4), batch=4, fns=[probe], shuffle=False, workers=0) as loader:
        assert next(iter(loader))['mmapped'].tolist() == [1] * 4


def churn(dp, seed):
    """Allocate and free 160 MiB in 1 MiB pieces: under the steady setting it all
    comes from the heap, and stays there (below the 256 MiB trim threshold)."""
    pieces = [bytearray(2**20) for _ in range(160)]
    del pieces
    return {'label': np.int64(dp['label'])}


def test_an_idle_worker_gives_its_kept_heap_back(monkeypatch):
    monkeypatch.delenv('LOADR_STEADY_MEMORY', raising=False)
    with loadr.Loader(trivial(4), batch=2, fns=[churn], shuffle=False, workers=1,
                      prefetch=1) as loader:
        it = iter(loader)
        next(it)
        next(it)
        busy = loader._pool.memory()[0]['heap_bytes']
        assert busy > 100 * 2**20               # kept for the next sample
        # No more tasks: the window is full and nobody asks. Within a few idle periods
        # the worker trims its heap.
        deadline = time.monotonic() + 10 * IDLE_TRIM_S
        while loader._pool.memory()[0]['heap_bytes'] > busy - 100 * 2**20:
            assert time.monotonic() < deadline, loader._pool.memory()
            time.sleep(0.2)
