"""What a worker pool holds, and how it gives it back, in order, whatever Ctrl-C does.

A :class:`~loadr.workers.pool.WorkerPool` takes processes, a ZeroMQ socket and
its context, shared-memory segments and owned directories. Each is recorded in
its :class:`Held` as it is taken, and :func:`release` gives them back in the one
order that leaks nothing (workers first, then the socket, then the memory they
mapped), from ``close()``, at garbage collection, or at interpreter exit
(:func:`release_at_exit`), and again without harm if a run was cut short.

Ctrl-C is the hazard throughout: it is deferred while things are taken or
given back (:func:`sigint_deferred`), blocked across a fork or a socket's
making (:func:`sigint_blocked`), and a message it cut between two frames is
mended before the next one goes out (:meth:`Held.send`; see
:mod:`~loadr.workers.protocol`, MEND).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np
import zmq

from . import protocol
from .shm import Segment, remove_owned

__all__ = ['Held', 'WorkerProcess', 'release', 'release_at_exit', 'sigint_deferred',
           'sigint_blocked', 'JOIN_TIMEOUT_S', 'STOP_RETRY_S']

JOIN_TIMEOUT_S = 2.0
# How often release() asks a worker that has not connected yet to STOP.
STOP_RETRY_S = 0.005
_SNDMORE = int(zmq.SNDMORE)


@contextlib.contextmanager
def sigint_blocked(*more: int):
    """Block SIGINT (and ``more``) in this thread during the block; a signal that came
    meanwhile is delivered once the old mask is back."""
    old = None
    if hasattr(signal, 'pthread_sigmask'):
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *more})
    try:
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def sigint_deferred():
    """Ctrl-C during the block is held back and raised (or handled) once it ends.

    For the stretches that take or give back what must not leak (segments,
    directories, processes): a second Ctrl-C landing in close() used to stop
    it halfway, after the workers had gone and before the memory was freed.
    Only the main thread gets Python's signal handlers; elsewhere a Ctrl-C
    cannot interrupt us and this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:                # set outside Python: we could not put it back
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, caught[-1])     # Python's: KeyboardInterrupt
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


class WorkerProcess:
    """One worker process as the pool sees it."""

    def __init__(self, wid: int, incarnation: int, process, identity: bytes):
        self.wid, self.incarnation = wid, incarnation
        self.process, self.identity = process, identity
        self.ready = False                  # said hello and can take tasks
        self.started = False                # said hello once (ready drops when unreachable)
        self.tasks: list[int] = []          # task ids in the order sent
        self.head_since: float | None = None    # when the first task in hand was started
        self.beat = -1                          # its heartbeat when last looked at
        self.frozen_since: float | None = None  # when first seen frozen, its beat unmoved


class Held:
    """What a pool holds that must be given back: filled as it is taken, emptied by
    :func:`release`, which also runs at garbage collection or interpreter exit when
    nobody called close() (or a Ctrl-C cut in before the Loader kept the pool)."""

    def __init__(self, workers: int):
        self.workers: list[WorkerProcess | None] = [None] * workers
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self.segments: list[Segment] = []
        self.dirs: list[str] = []
        self.released = False
        # The workers' stage counters (in the status segment) ...
        self.stats_rows: np.ndarray | None = None
        # ... as they were when the workers had stopped.
        self.last_stats: np.ndarray | None = None
        # True from just before a message is sent until it is all out: a Ctrl-C
        # between its frames leaves it cut (see protocol: MEND).
        self.cut = False

    def mend(self) -> None:
        """Finish a message a Ctrl-C may have cut, so that the next one starts clean."""
        if self.cut and self.sock is not None:
            try:
                self.sock.send_multipart(protocol.mend(), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass        # nothing was cut: the lone frame named no worker
        self.cut = False

    def send(self, identity: bytes, frames: list, flags: int = 0) -> None:
        """Send ``frames`` to the worker ``identity``, mending a cut message first."""
        self.mend()
        self.cut = True
        sock, more = self.sock, _SNDMORE | flags
        assert sock is not None         # sent to only while the pool is open
        # Frame by frame with int flags: send_multipart's checks and flag enums
        # cost more than the sends themselves (3.7 against 1.4 us a message).
        try:
            sock.send(identity, more)
        except zmq.ZMQError:
            self.cut = False    # refused at its first frame: nothing went out
            raise
        for frame in frames[:-1]:
            sock.send(frame, more)
        sock.send(frames[-1], flags)
        self.cut = False

    def told_to_stop(self, w: WorkerProcess) -> bool:
        """Send ``w`` its STOP (non-blocking); False while it has not connected."""
        try:
            self.send(w.identity, protocol.stop(), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            # ROUTER_MANDATORY: an identity that has not connected (yet) is unreachable.
            return exc.errno != zmq.EHOSTUNREACH
        return True


def release(held: Held) -> None:
    """The shutdown order, written down once; every step can be run again if an
    earlier run was cut short:

    1. ask every worker to STOP (non-blocking), so idle ones exit between tasks;
       one still starting is asked again as soon as it has connected;
    2. give them JOIN_TIMEOUT_S together, then SIGKILL whatever is left and reap
       it: a hung or stopped worker cannot be asked;
    3. close the socket with linger 0 and end the context, so nothing waits on
       messages nobody will read;
    4. only now, with no process mapping them, unlink the shared memory and
       remove the owned directories (in ``finally``: whatever happened above).
    """
    if held.released:
        return
    with sigint_deferred():
        try:
            live = [w for w in held.workers if w is not None]
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            if held.sock is not None:
                # A STOP sent before a worker connects is refused, not queued: one
                # sent once left a worker that started late waiting for tasks until
                # it was killed at the deadline (every close that came early).
                starting = [w for w in live if not held.told_to_stop(w)]
                while starting and time.monotonic() < deadline:
                    time.sleep(STOP_RETRY_S)
                    starting = [w for w in starting
                                if w.process.exitcode is None and not held.told_to_stop(w)]
            for w in live:
                w.process.join(max(0.0, deadline - time.monotonic()))
            for w in live:
                if w.process.exitcode is None:
                    try:
                        os.kill(w.process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    w.process.join(JOIN_TIMEOUT_S)
            held.workers[:] = [None] * len(held.workers)
            if held.stats_rows is not None:
                held.last_stats, held.stats_rows = held.stats_rows.copy(), None
            if held.sock is not None:
                held.sock.close(0)
                held.sock = None
            if held.ctx is not None:
                held.ctx.term()
                held.ctx = None
        finally:
            while held.segments:
                seg = held.segments.pop()
                seg.close()
                seg.unlink()
            while held.dirs:
                remove_owned(held.dirs.pop())
            held.released = True


# What the pools of this process hold, until a pool is gone (weakly: a pool's
# finaliser holds its Held while the pool lives).
_OPEN: weakref.WeakSet = weakref.WeakSet()


def release_at_exit(held: Held) -> None:
    """Have ``held`` released when the interpreter exits, before multiprocess's exit hook.

    That hook SIGTERMs every daemonic child and joins it with no limit: a worker
    that is stopped (SIGSTOP, a frozen cgroup) or that swallowed the SIGTERM never
    ends, and neither does the exit. Weakref finalisers (a pool's) run after it when
    their atexit hook was registered first, as it usually is. Registered after
    multiprocess's hook, this one runs before it (atexit is last in, first out)
    and releases what each open pool holds in :func:`release`'s bounded order, so
    the hook finds no child left.
    """
    if not _EXIT_HOOK.registered:
        import multiprocess.util  # noqa: F401 - registers its exit hook on import: first
        atexit.register(_release_open)
        _EXIT_HOOK.registered = True
    _OPEN.add(held)


@dataclass
class _ExitHook:
    """Whether :func:`_release_open` is registered with atexit (once a process)."""

    registered: bool = False


_EXIT_HOOK = _ExitHook()


def _release_open() -> None:
    for held in list(_OPEN):
        release(held)
