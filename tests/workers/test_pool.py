"""The pool's socket: a message a Ctrl-C cut between its frames is mended, not misread."""

from __future__ import annotations

import hashlib

import pytest
import zmq

import loadr

from ..loader_helpers import trivial

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
