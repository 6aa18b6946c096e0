"""Workers killed or stopped for real, mid-read, mid-decode, mid-write: the stream stays exact.

A clean run with ``workers=0`` is the reference; every faulty run must give
the same batch hashes (nothing lost, repeated or torn) and clean up after
the processes it lost.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
import uuid

import numpy as np
import pytest

import loadr
from loadr.errors import WorkerError
from loadr.order import Order
from loadr.workers.pool import FROZEN_AFTER_S

from ..loader_helpers import batch_digest, noisy, slowed, stream_digests, trivial
from ..waiting import wait_until
from .helpers import Killer, children, running, wait_until_gone

pytestmark = pytest.mark.timeout(60)


def busy(dp, seed):
    """noisy(), after ~0.4 ms of CPU: long enough for kills to land mid-batch."""
    until = time.perf_counter() + 0.0004
    while time.perf_counter() < until:
        pass
    return noisy(dp, seed)


class Arms:
    """Kills the calling process the first time a chosen (phase, index) is reached.

    A marker file per (phase, index), created with O_EXCL, makes each kill
    happen once across every worker; unarmed (the reference run, in this
    process) it does nothing.
    """

    def __init__(self, directory, plan: dict, armed: bool):
        self.directory, self.plan, self.armed = str(directory), plan, armed

    def maybe_die(self, phase: str, index: int) -> None:
        if not self.armed or index not in self.plan.get(phase, ()):
            return
        try:
            fd = os.open(os.path.join(self.directory, f'{phase}-{index}'),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)

    def fired(self) -> set:
        return {tuple(n.split('-')) for n in os.listdir(self.directory)}


class PerSampleReader:
    """trivial() data read one datapoint at a time; dies mid-read where armed."""

    def __init__(self, n: int, arms: Arms):
        self.data, self.arms = trivial(n), arms

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        self.arms.maybe_die('read', i)
        return self.data[i]


class BatchReader(PerSampleReader):
    """The same, with a batch read (what loadr's readers have); dies inside it where armed."""

    def read_batch(self, indices):
        for i in indices:
            self.arms.maybe_die('batch', i)
        return [self.data[i] for i in indices]


class Deferred:
    """An array value whose conversion (in Assembler._write_checked, after the earlier keys of
    the row are already in shared memory) is where the worker dies: a torn row."""

    def __init__(self, value: np.ndarray, arms: Arms, index: int):
        self.value, self.arms, self.index = value, arms, index

    def __array__(self, dtype=None, copy=None):
        self.arms.maybe_die('write', self.index)
        return self.value


SPEC = {'label': ('int64', ()), 'vec': ('float32', (16,)), 'seed': ('uint64', ()),
        'late': ('float32', (16,))}


def make_decode(arms: Arms):
    def decode(dp, seed):
        arms.maybe_die('decode', dp['label'])
        out = noisy(dp, seed)
        out['late'] = Deferred(out['vec'] * 2, arms, dp['label'])
        return out
    return decode


@pytest.mark.parametrize('reader_cls,read_phase', [(PerSampleReader, 'read'),
                                                   (BatchReader, 'batch')])
def test_kills_mid_read_mid_decode_and_mid_write_leave_the_stream_exact(tmp_path, reader_cls,
                                                                        read_phase):
    plan = {read_phase: {5, 150, 280}, 'decode': {17, 99, 203}, 'write': {42, 160, 299}}
    batches = 40                                   # 640 positions: every index at least twice
    clean = Arms(tmp_path, plan, armed=False)
    with loadr.Loader(reader_cls(300, clean), batch=16, fns=[make_decode(clean)], seed=4,
                      workers=0, spec=SPEC) as ref:
        expected = stream_digests(ref, batches)
    arms = Arms(tmp_path, plan, armed=True)
    with loadr.Loader(reader_cls(300, arms), batch=16, fns=[make_decode(arms)], seed=4,
                      workers=2, spec=SPEC) as loader:
        got = stream_digests(loader, batches)
        restarts = loader._pool.restarts
    assert got == expected
    want = {(phase, str(i)) for phase, indices in plan.items() for i in indices}
    assert arms.fired() == want                     # every planned kill happened, once
    assert restarts == len(want)


def test_random_sigkills_many_times_in_one_run():
    data = trivial(1000)
    got = []
    with loadr.Loader(data, batch=16, fns=[busy], seed=9, workers=3) as loader:
        it = iter(loader)
        got.append(next(it))
        # Iterate while the killer shoots (20 workers at random moments, each replaced
        # before the next is shot), to at least 100 batches.
        with Killer(loader, seed=1, every_s=(0.005, 0.03), max_kills=20) as killer:
            while not killer.done.is_set() or len(got) < 100:
                got.append(next(it))
        restarts = loader._pool.restarts
    # Every kill reached a live worker, and the pool replaced each one once.
    assert killer.kills == 20 and restarts == killer.kills, (restarts, killer.kills)
    with loadr.Loader(data, batch=16, fns=[busy], seed=9, workers=0) as ref:
        assert [batch_digest(b) for b in got] == stream_digests(ref, len(got))
    order = Order(len(data), 9)
    labels = np.concatenate([b['label'] for b in got])
    assert labels.tolist() == order.indices(0, 16 * len(got)).tolist()   # none lost or repeated


def test_a_sample_that_kills_inside_a_batch_read_is_named(tmp_path):
    # Regression: a death inside the reader's batch read held no sample "in hand",
    # so the batch was resent forever. Now it is redone sample by sample and named.
    class Deadly(BatchReader):
        def read_batch(self, indices):
            if 13 in indices:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().read_batch(indices)

        def __getitem__(self, i):
            if i == 13:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.data[i]

    arms = Arms(tmp_path, {}, armed=False)
    with loadr.Loader(Deadly(30, arms), batch=10, shuffle=False, workers=2) as loader:
        it = iter(loader)
        next(it)
        # Raised, not resent forever (a hang, which the test's timeout catches).
        with pytest.raises(WorkerError, match='killed a worker 3 times') as info:
            next(it)
        assert info.value.index == 13


def test_a_stopped_worker_misses_its_deadline_is_replaced_and_reaped(caplog):
    data = trivial(200)

    slow = slowed(0.002)
    with loadr.Loader(data, batch=8, fns=[slow], seed=3, workers=0) as ref:
        expected = stream_digests(ref, 30)
    loader = loadr.Loader(data, batch=8, fns=[slow], seed=3, workers=2, timeout=1.0)
    try:
        with caplog.at_level(logging.WARNING, logger='loadr'):
            it = iter(loader)
            got = [batch_digest(next(it)) for _ in range(3)]
            victim = loader._pool.workers[0].process
            os.kill(victim.pid, signal.SIGSTOP)             # a hang: it never answers again
            got += [batch_digest(next(it)) for _ in range(27)]
        assert got == expected
        assert loader._pool.restarts == 1
        # Found by the deadline or by the stopped-worker check, not by chance: the pool
        # says which, and it killed the worker (SIGKILL ends a stopped process too).
        logged = [r.getMessage() for r in caplog.records]
        assert any('worker 0 missed its 1 s deadline' in m
                   or (f'pid {victim.pid}' in m and 'stopped (SIGSTOP' in m)
                   for m in logged), logged
        assert victim.exitcode == -signal.SIGKILL
        assert not running(victim.pid) and victim.pid not in children()   # and reaped
        # close() with a stopped worker: it cannot be asked to STOP, so it is killed.
        procs = [w.process for w in loader._pool.workers]
        os.kill(procs[1].pid, signal.SIGSTOP)
        loader.close()
        assert procs[1].exitcode == -signal.SIGKILL
        assert all(p.exitcode is not None for p in procs)                 # all reaped
        assert not {p.pid for p in procs} & set(children())
    finally:
        loader.close()


def _stop_one_worker_and_read_on(freeze, caplog, fn=None, batches=30):
    """Three batches, ``freeze(pid)`` one worker, then the rest with default settings
    (a 300 s task deadline): the stream must come out exact, long before the deadline."""
    data = trivial(200)
    fn = fn or slowed(0.002)
    with loadr.Loader(data, batch=8, fns=[fn], seed=3, workers=0) as ref:
        expected = stream_digests(ref, batches)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(data, batch=8, fns=[fn], seed=3, workers=2) as loader:
            it = iter(loader)
            got = [batch_digest(next(it)) for _ in range(3)]
            victim = loader.worker_pids[0]
            freeze(victim)
            got += [batch_digest(next(it)) for _ in range(batches - 3)]
            restarts = loader._pool.restarts
            alive = loader.worker_pids
    assert got == expected
    return victim, restarts, alive, [r.getMessage() for r in caplog.records]


def test_a_stopped_worker_is_replaced_within_seconds_with_default_settings(caplog):
    # It used to be found only by the 300 s task deadline (pytest's 60 s timeout here).
    victim, restarts, alive, logged = _stop_one_worker_and_read_on(
        lambda pid: os.kill(pid, signal.SIGSTOP), caplog)
    assert restarts == 1 and victim not in alive
    assert any('stopped (SIGSTOP' in m and f'pid {victim}' in m for m in logged), logged
    wait_until_gone([victim])
    assert victim not in children()                 # killed and reaped


def _freezer():
    """A fresh cgroup to freeze processes in, as (dir, freeze(pid), thaw()); None where
    this machine does not let us make one (not root, no writable cgroup fs)."""
    from loadr.pids import cgroup_dir

    for controller, control, on, off in ((None, 'cgroup.freeze', '1', '0'),
                                         ('freezer', 'freezer.state', 'FROZEN', 'THAWED')):
        base = cgroup_dir('self', controller)
        if base is None:
            continue
        path = os.path.join(base, f'loadr-test-{uuid.uuid4().hex[:8]}')
        try:
            os.mkdir(path)
        except OSError:
            continue

        def freeze(pid, path=path, control=control, on=on):
            with open(os.path.join(path, 'cgroup.procs'), 'w') as f:
                f.write(str(pid))
            with open(os.path.join(path, control), 'w') as f:
                f.write(on)

        def thaw(path=path, control=control, off=off):
            with open(os.path.join(path, control), 'w') as f:
                f.write(off)

        return path, freeze, thaw
    return None


def test_a_worker_frozen_by_a_cgroup_freezer_is_replaced_within_seconds(caplog):
    made = _freezer()
    if made is None:
        pytest.skip('cannot make a cgroup to freeze a worker in (needs root and a '
                    'writable cgroup fs)')
    path, freeze, thaw = made
    try:
        victim, restarts, alive, logged = _stop_one_worker_and_read_on(freeze, caplog)
        assert restarts == 1 and victim not in alive
        assert any('frozen by its cgroup' in m and f'pid {victim}' in m for m in logged), logged
    finally:
        thaw()                  # a cgroup v1 freezer holds even a SIGKILLed process
        wait_until(lambda: _removed(path), f'the cgroup {path} to empty')


def _removed(path: str) -> bool:
    """Whether the directory ``path`` could be removed (a cgroup goes once empty)."""
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def _slow_at(index: int, how: str):
    def fn(dp, seed):
        if dp['label'] == index:
            if how == 'sleep':
                time.sleep(3 * FROZEN_AFTER_S)
            else:
                # C code that holds the GIL and sleeps: the heartbeat thread cannot
                # run, so the heartbeat stands still; the worker is alive all the same.
                ctypes.PyDLL(None).usleep(int(3 * FROZEN_AFTER_S * 1e6))
        return noisy(dp, seed)
    return fn


@pytest.mark.parametrize('how', ['sleep', 'gil'])
def test_a_slow_fn_is_not_taken_for_a_frozen_worker(how, caplog):
    data = trivial(100)
    fn = _slow_at(37, how)
    with loadr.Loader(data, batch=8, fns=[fn], seed=3, shuffle=False, workers=0) as ref:
        expected = stream_digests(ref, 8)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(data, batch=8, fns=[fn], seed=3, shuffle=False, workers=2) as loader:
            got = stream_digests(loader, 8)
            assert loader._pool.restarts == 0
    assert got == expected
    assert not [r for r in caplog.records if 'replacement' in r.getMessage()]
