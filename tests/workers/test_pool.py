"""The pool's socket: a message a Ctrl-C cut between its frames is mended, not misread."""

from __future__ import annotations

import hashlib
import os
import pathlib
import signal
import threading
import time

import numpy as np
import pytest
import zmq

import loadr
from loadr.workers import held as held_module
from loadr.workers import protocol
from loadr.workers.pool import WorkerPool
from loadr.workers.shm import Layout

from ..loader_helpers import trivial
from ..waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def digests(loader, steps):
    it = iter(loader)
    return [hashlib.sha256(next(it)['label'].tobytes()).hexdigest() for _ in range(steps)]


def cut(pool, k):
    """Leave the socket as a Ctrl-C between a task's two frames leaves it: the
    identity frame gone out with more to come (the state pool._send marks), to
    the k-th worker that has said hello (one still starting cannot be sent to).
    The worker it went to, and those that could be told to STOP."""
    ready = [w for w in pool.workers if w.ready]
    worker = ready[k % len(ready)]
    pool._held.cut = True
    pool._held.sock.send(worker.identity, zmq.SNDMORE)
    return [w.process for w in ready]


@pytest.mark.parametrize('wid', [0, 1])
def test_a_cut_message_is_mended_and_the_loader_goes_on(wid):
    with loadr.Loader(trivial(64), batch=4, shuffle=True, seed=3, workers=0) as loader:
        expected = digests(loader, 8)
    with loadr.Loader(trivial(64), batch=4, shuffle=True, seed=3, workers=2) as loader:
        assert digests(loader, 3) == expected[:3]
        procs = cut(loader._pool, wid)
        # A new iterator (as after a KeyboardInterrupt left the last one) goes
        # on from batch 3; its first task would have finished the cut message.
        assert digests(loader, 5) == expected[3:]
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_close_mends_a_cut_message_before_stopping_the_workers():
    with loadr.Loader(trivial(64), batch=4, shuffle=False, workers=2) as loader:
        digests(loader, 2)
        procs = cut(loader._pool, 0)
    # Every worker got its STOP (none read a stray identity as a header and died).
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_a_mend_with_nothing_cut_names_no_worker_and_is_dropped():
    with loadr.Loader(trivial(64), batch=4, shuffle=True, seed=1, workers=0) as loader:
        expected = digests(loader, 4)
    with loadr.Loader(trivial(64), batch=4, shuffle=True, seed=1, workers=2) as loader:
        assert digests(loader, 2) == expected[:2]
        loader._pool._held.cut = True       # a Ctrl-C after the message was all out
        assert digests(loader, 2) == expected[2:]
        procs = [w.process for w in loader._pool.workers if w.ready]
    assert [p.exitcode for p in procs] == [0] * len(procs)


class Gated(list):
    """A list of rows whose copy in a spawned worker waits for ``gate`` to exist before
    the worker can go on (unpickling comes before the worker connects its socket)."""

    def __init__(self, rows, gate):
        super().__init__(rows)
        self.gate, self.maker = str(gate), os.getpid()

    def __setstate__(self, state):
        self.__dict__.update(state)
        deadline = time.monotonic() + 60
        while (os.getpid() != self.maker and not os.path.exists(self.gate)
               and time.monotonic() < deadline):
            time.sleep(0.01)


def test_close_stops_a_worker_that_connects_late_instead_of_waiting_it_out(
        tmp_path, monkeypatch):
    # A STOP sent to a worker that has not connected yet is refused (ROUTER_MANDATORY:
    # EHOSTUNREACH): close used to send it once, and wait JOIN_TIMEOUT_S for a worker
    # that, connected meanwhile, waited for tasks. A join timeout longer than this test
    # may run makes such a wait a hang.
    monkeypatch.setattr(held_module, 'JOIN_TIMEOUT_S', 600.0)
    # Every STOP close() sends is made by protocol.stop(), counted here (and sent as ever).
    stops, made = [], protocol.stop
    monkeypatch.setattr(protocol, 'stop', lambda: stops.append(1) or made())
    gate = pathlib.Path(tmp_path) / 'gate'
    spec = {'label': (np.dtype('int64'), ()), 'vec': (np.dtype('float32'), (16,))}
    pool = WorkerPool(Gated(trivial(16), gate), [], spec, Layout(spec, 4), workers=2, slots=4,
                      n=16, shuffle=False, on_error='raise', start_method='spawn')
    procs = [w.process for w in pool.workers]
    closing = threading.Thread(target=pool.close, daemon=True)
    closing.start()
    # The first STOP went out (and was refused) while the gate held the workers once the
    # second is made: each is made just before it is sent, one at a time.
    wait_until(lambda: len(stops) >= 2, 'close() to send its STOPs')
    gate.touch()
    closing.join(30)
    try:
        assert not closing.is_alive(), 'close waited for workers that connected late'
        assert [p.exitcode for p in procs] == [0] * len(procs)     # by STOP, not SIGKILL
    finally:
        for p in procs:
            if p.exitcode is None:
                os.kill(p.pid, signal.SIGKILL)
        closing.join(30)
