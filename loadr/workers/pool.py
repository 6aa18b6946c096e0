"""Start, watch, restart and stop the worker processes.

The pool owns the ZeroMQ ROUTER socket (bound in a private 0700 directory),
the shared-memory slots and the processes, each recorded as it is taken and
given back in one order (:mod:`~loadr.workers.held`). It hands each task to one named
worker, so it always knows which tasks a worker holds: when a worker dies
(SIGKILL, segfault, out of memory) or misses its deadline (a hang), the pool
starts a replacement and reports the worker's tasks as *lost*, for the loader
to send again. A task whose sample kills workers ``MAX_DEATHS_PER_POSITION``
times is reported as failed, naming the dataset index.

A worker that cannot run (stopped by SIGSTOP or a debugger, frozen by a
cgroup freezer) is treated the same way once its heartbeat has stood still
and it has been seen so for ``FROZEN_AFTER_S``: found within seconds, not at
the task deadline. A worker that is merely slow (a long fn, a read waiting
on a disk, C code holding the GIL) runs on until the task deadline.

The pool makes ``slots`` batch slots, or fewer if the shared-memory budget
(``shm_bytes``, see :func:`~loadr.workers.shm.shm_budget`) holds fewer:
``pool.slot_count`` is what it made, and the window must use only those.
Workers run with steady memory (:mod:`loadr.workers.memory`) unless
``steady_memory=False``; ``pool.memory()`` says what each one holds.
Each worker adds its stage times (:mod:`loadr.stats`) to a row of float64
counters after the status cells; ``pool.stats_rows()`` reads them, and a
replacement worker goes on with its predecessor's row.

Example::

    pool = WorkerPool(reader, fns, spec, layout, workers=2, slots=4, n=len(reader),
                      shuffle=True, on_error='raise')
    pool.slot_count                           # 4, or fewer within the budget
    pool.submit(protocol.Task(task_id=0, slot=0, row=0, seed=0, start=0, count=64))
    for event in pool.poll(100):
        ...                                   # Done(task_id=0, extras={}, replaced=[])
    pool.close()
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import signal
import tempfile
import time
import weakref
from typing import cast

import numpy as np
import zmq

from .. import pids
from ..stats import record_width, ring_rows, row_width
from . import protocol
from .held import Held, WorkerProcess, release, release_at_exit, sigint_blocked, sigint_deferred
from .inherited import note, open_files
from .ledger import MAX_DEATHS_PER_POSITION, Ledger, exit_text
from .memory import frozen_for_fork, private_bytes, resident, steady_memory_default
from .shm import (
    SHM_DIR,
    Segment,
    StatusCells,
    owned_dir,
    plan_slots,
    reclaim_stale,
    shm_budget,
    size_text,
    use_memfd,
)
from .worker import (
    MAX_TASKS_PER_WORKER,
    MAX_TASKS_READING_AHEAD,
    WorkerArgs,
    most_tasks_held,
    run,
    tasks_held,
)

__all__ = ['WorkerPool', 'MAX_TASKS_PER_WORKER', 'MAX_TASKS_READING_AHEAD',
           'MAX_DEATHS_PER_POSITION', 'FROZEN_AFTER_S']

log = logging.getLogger('loadr')

# A worker seen stopped or frozen, its heartbeat still, for this long is replaced.
# Heartbeats come every PARENT_CHECK_S (0.2 s): a live worker's moves 5 times meanwhile.
FROZEN_AFTER_S = 1.0
LIVENESS_EVERY_S = 0.25         # how often poll() looks at the heartbeats
# How often poll() asks for the workers' exit codes (a waitpid each) when no
# sentinel woke it: a death wakes a waiting poll at once through its
# sentinel, so this only bounds the delay while replies keep coming.
EXIT_CHECK_S = 0.05
MEMORY_EVERY_S = 1.0            # how old the workers' USS in stats() may be
_EVENTS, _POLLIN = zmq.EVENTS, int(zmq.POLLIN)


class WorkerPool:
    """Worker processes, their socket and their shared memory (see module docstring)."""

    def __init__(self, reader, fns, spec, layout, workers: int, slots: int, n: int,
                 shuffle: bool, on_error: str, start_method: str = 'spawn',
                 task_timeout_s: float | None = None, order_version: int | None = None,
                 steady_memory: bool | None = None, shm_bytes: int | None = None,
                 init_fn=None, needed_slots: int | None = None, before_fork=None,
                 trace_records: int = 0):
        import multiprocess

        self.closed = False
        # Everything taken is recorded in held at once, and given back by close(),
        # or by this finaliser if the pool is dropped (or the interpreter exits) first.
        self._held = held = Held(workers)
        self._finalizer = weakref.finalize(self, release, held)
        release_at_exit(held)
        self.workers: list[WorkerProcess | None] = held.workers
        self._segments = held.segments
        self._dir: str | None = None
        self._shm_dir: str | None = None
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._stats_rows: np.ndarray | None = None
        # Each worker's ring of task records for a trace (loadr.stats.TaskRing), after the
        # stage counters; None when not tracing.
        self.trace_rings: np.ndarray | None = None
        self._trace_records = trace_records
        # (when, {worker id: USS bytes}): private_memory()
        self._uss: tuple[float, dict[int, int]] | None = None
        # The status cells (views of the status segment, made by _open); None once closed.
        self.progress: np.ndarray | None = None
        self._cancelled: memoryview | None = None
        self._beats: np.ndarray | None = None
        self._wants: np.ndarray | None = None
        self.stats_width = row_width(len(fns))
        self._init_fn = init_fn             # each worker calls it once with its id
        # Called once the shared memory is made, before the first worker starts: the
        # loader's warm-up of a remote reader ends there, beside the allocation.
        self._before_fork = before_fork
        try:
            with sigint_deferred():
                self._open(reader, fns, spec, layout, workers, slots, n, shuffle, on_error,
                           multiprocess.get_context(start_method), task_timeout_s,
                           order_version, steady_memory, shm_bytes, needed_slots)
        except BaseException:
            self.close()
            raise

    def _open(self, reader, fns, spec, layout, workers, slots, n, shuffle, on_error, mp,
              task_timeout_s, order_version, steady_memory, shm_bytes, needed_slots) -> None:
        held = self._held
        reclaim_stale()
        memfd = use_memfd()
        # Fewer slots than asked if the budget says so (the window shrinks to
        # fit), an error before anything is made if not one per worker plus one.
        status_bytes = StatusCells.nbytes(workers)
        self.slot_count = plan_slots(layout.nbytes, slots, workers,
                                     shm_budget(shm_bytes, memfd), status_bytes, needed_slots)
        # Slots past ``needed_slots`` are the loader's room for more read-ahead: had
        # only where the budget holds them (and READ_AHEAD_ROOM_BYTES), with no warning.
        if self.slot_count < min(slots, needed_slots or slots):
            log.warning('loadr: the shared-memory budget holds %d of the %d batch slots asked '
                        'for (%s each); the prefetch window shrinks to fit (set LOADR_SHM_BYTES '
                        'higher for more)', self.slot_count, slots, size_text(layout.nbytes))
        slots = self.slot_count
        self._mp = mp
        self._dir = owned_dir(tempfile.gettempdir())   # mode 0700: ours alone
        held.dirs.append(self._dir)
        self.endpoint = f'ipc://{self._dir}/tasks'
        # Ctrl-C inside Socket() would leave a socket that nothing closes,
        # and close() would then wait forever in Context.term().
        with sigint_blocked():
            self._ctx = held.ctx = zmq.Context(1)
            self._sock = held.sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.bind(self.endpoint)
        if memfd:
            def make(what, size):
                return Segment.create_memfd(f'{os.getpid()}-{what}', size)
        else:
            shm_dir = self._shm_dir = owned_dir(SHM_DIR)
            held.dirs.append(shm_dir)

            def make(what, size):
                return Segment.create(os.path.join(shm_dir, what), size)
        for i in range(slots):
            held.segments.append(make(f'slot{i}', layout.nbytes))
        # After the status cells, each worker's stage counters (loadr.stats): a
        # float64 row it adds to per batch, read here for loader.stats() with no
        # messages. A few hundred bytes, left out of the budget (whose unit is a slot).
        stats_bytes = 8 * workers * self.stats_width
        trace_records = self._trace_records
        ring_shape = (workers, ring_rows(trace_records), record_width(len(fns)))
        trace_bytes = 8 * int(np.prod(ring_shape)) if trace_records else 0
        self._status = make('status', status_bytes + stats_bytes + trace_bytes)
        held.segments.append(self._status)
        self._stats_rows = np.ndarray((workers, self.stats_width), dtype=np.float64,
                                      buffer=self._status.buf, offset=status_bytes)
        self._stats_rows[:] = 0.0
        held.stats_rows = self._stats_rows
        if trace_records:
            self.trace_rings = np.ndarray(ring_shape, dtype=np.float64, buffer=self._status.buf,
                                          offset=status_bytes + stats_bytes)
            self.trace_rings[:] = 0.0
        cells = StatusCells(self._status.buf, workers)
        self.progress = cells.progress_rows()
        self.progress[:] = -1           # [position, index] in hand; -1: none yet
        self._cancelled = cells.cancelled()
        self._cancelled[0] = -1
        self._beats = cells.heartbeats()
        # The tasks each worker asks to hold at once: where it starts; a worker that
        # reads ahead raises it to what its round trips need, up to max_tasks.
        self._wants = cells.wants_rows()
        self._first_wants = tasks_held(reader)
        self._wants[:] = self._first_wants
        self._liveness_at = self._exits_at = time.monotonic()
        self._polled: tuple | None = None
        self._poller_held: zmq.Poller | None = None
        self.layout = layout
        self.views = [layout.views(seg.buf) for seg in self._segments[:slots]]
        if self._before_fork is not None:
            self._before_fork()
        me = pids.proc_stat(os.getpid())
        self._template = dict(
            reader=reader, fns=list(fns), spec=spec, layout=layout,
            slot_specs=[s.spec for s in self._segments[:slots]],
            status_spec=self._status.spec, owned_dirs=list(held.dirs),
            parent_pid=os.getpid(), parent_start=None if me is None else me[2], n=n,
            shuffle=shuffle, on_error=on_error, endpoint=self.endpoint, workers=workers,
            order_version=order_version, init_fn=self._init_fn, trace_records=trace_records,
            steady_memory=steady_memory_default() if steady_memory is None else steady_memory)
        self.task_timeout_s = task_timeout_s
        self.max_tasks = most_tasks_held(reader)
        # Files the dataset holds open now: every forked worker would share each one
        # (one file offset), and their reads would interleave. Said once here, and
        # by every error of a worker (see inherited.py).
        shared = open_files(reader) if mp.get_start_method() == 'fork' else []
        if shared:
            log.warning('loadr: %s', note(shared))
        self._template['shared_files'] = tuple(shared)
        # One task a worker until every worker has said hello: the first tasks
        # (the first batches, split, see window.ramp_pieces) would otherwise
        # queue behind each other in the workers that started first while the
        # others start with nothing to do.
        self.depth = 1
        self.ledger = Ledger(mp.get_start_method())   # the tasks out; deaths seen
        self.restarts = 0
        self._incarnations = 0
        for wid in range(workers):
            self._start(wid)

    # -- processes ---------------------------------------------------------

    def _start(self, wid: int) -> None:
        self._incarnations += 1
        # Unguessable: the ROUTER unpickles replies only from identities it
        # assigned, so another process of ours that can reach the socket still
        # cannot pose as the next worker (see SECURITY.md).
        identity = b'w%d.%d.%s' % (wid, self._incarnations, secrets.token_hex(8).encode())
        assert self._wants is not None              # the pool is open
        self._wants[wid] = self._first_wants        # a replacement starts afresh
        args = WorkerArgs(wid=wid, identity=identity, **self._template)
        proc = self._mp.Process(target=run, args=(args,), name=f'loadr-worker-{wid}', daemon=True)
        # Ctrl-C waits until the worker is started and recorded: one arriving
        # during fork is swallowed by Python's at-fork hooks (lost in the main
        # process) or hits the child before it ignores SIGINT (a traceback),
        # and one raised before the assignment below would leak the process.
        # The child inherits the mask and unblocks SIGINT once it ignores it.
        # SIGTERM too, until the child has put back its default action: a forked
        # child runs the parent's Python handler until then (Lightning's does not
        # exit), and a SIGTERM it swallowed at start-up left a worker that never
        # ends (multiprocess's exit hook waits for it with no limit).
        with sigint_blocked(signal.SIGTERM):
            # A forked worker's collector must not visit the objects it inherits (memory.py).
            with frozen_for_fork(self._mp.get_start_method() == 'fork'):
                proc.start()
            self.workers[wid] = WorkerProcess(wid, self._incarnations, proc, identity)

    def _by_identity(self, identity: bytes) -> WorkerProcess | None:
        for w in self.workers:
            if w is not None and w.identity == identity:
                return w
        return None

    def _bury(self, w: WorkerProcess, why: str) -> list:
        """Reap a dead (or killed) worker, start its replacement, return events."""
        w.process.join(0.5)
        if w.started:
            log.warning('loadr: %s; starting a replacement%s', why,
                        ', its batches are redone' if w.tasks else '')
        assert self.progress is not None            # the pool is open: it has workers
        row = self.progress[w.wid]
        position, index = int(row[0]), int(row[1])
        # The replacement shares this row: clear it, or a replacement killed
        # before its first sample would be blamed on its predecessor's sample.
        row[:] = -1
        events = self.ledger.died(w.wid, w.tasks, w.started, position, index, why)
        if events and type(events[0]) is protocol.Fatal:
            self.workers[w.wid] = None
            return events
        self.restarts += 1
        self._start(w.wid)
        return events

    def _frozen(self, now: float) -> list:
        """(worker, why) for each worker that has been stopped or frozen for FROZEN_AFTER_S.

        Two signs, both needed: its heartbeat has not moved since it was
        first seen frozen (so a worker that a tracer stops for a moment at
        each system call is left alone), and /proc or its cgroup says it
        cannot run. A still heartbeat alone is no reason: C code holding the
        GIL stills it too, and that is a slow fn, for the task deadline.
        """
        found: list[tuple[WorkerProcess, str]] = []
        beats = self._beats
        assert beats is not None                    # the pool is open: it has workers
        for w in self.workers:
            if w is None or not w.started:
                continue
            beat = int(beats[w.wid])
            if beat != w.beat:
                w.beat, w.frozen_since = beat, None
                continue
            why = pids.frozen(w.process.pid)
            if why is None:
                w.frozen_since = None
            elif w.frozen_since is None:
                w.frozen_since = now
            elif now - w.frozen_since >= FROZEN_AFTER_S:
                found.append((w, why))
        return found

    def _check_workers(self, sentinel: bool = True) -> list:
        """Bury dead, frozen and late workers; ``sentinel``: one of them woke the poll,
        so their exit codes are read now (else at most every EXIT_CHECK_S)."""
        events = []
        now = time.monotonic()
        exits = sentinel or now - self._exits_at >= EXIT_CHECK_S
        if exits:
            self._exits_at = now
        if now - self._liveness_at >= LIVENESS_EVERY_S:
            self._liveness_at = now
            for w, why in self._frozen(now):
                if w.process.exitcode is None:
                    os.kill(w.process.pid, signal.SIGKILL)     # works on stopped processes
                    events += self._bury(w, f'worker {w.wid} (pid {w.process.pid}) was {why} '
                                            f'for {now - w.frozen_since:.1f} s')
        for w in list(self.workers):
            if w is None:
                continue
            code = w.process.exitcode if exits else None
            if code is not None:
                events += self._bury(w, exit_text(w.wid, code))
            elif (self.task_timeout_s is not None and w.head_since is not None
                  and now - w.head_since > self.task_timeout_s):
                # A hung worker (stuck filesystem, SIGSTOP) cannot be asked to
                # stop; SIGKILL works on stopped processes too.
                os.kill(w.process.pid, signal.SIGKILL)
                events += self._bury(
                    w, f'worker {w.wid} missed its {self.task_timeout_s:g} s deadline')
        return events

    # -- tasks -------------------------------------------------------------

    def _room(self, w: WorkerProcess) -> bool:
        """Whether ``w`` takes another task now: fewer than it asks to hold (its status
        cell, at most ``depth``)."""
        wants = self._wants
        assert wants is not None                    # the pool is open: it has workers
        return w.ready and len(w.tasks) < min(self.depth, max(1, int(wants[w.wid])))

    def can_submit(self) -> bool:
        return any(w is not None and self._room(w) for w in self.workers)

    def submit(self, task: protocol.Task) -> bool:
        """Send ``task`` to the least busy ready worker; False if none can take it."""
        candidates = [w for w in self.workers if w is not None and self._room(w)]
        if not candidates:
            return False
        w = min(candidates, key=lambda w: len(w.tasks))
        task = self.ledger.prepare(task)
        frames = protocol.task(task)
        try:
            self._held.send(w.identity, frames)
        except zmq.ZMQError:
            # Its connection is gone: it is dying; _check_workers will bury it.
            w.ready = False
            return False
        if not w.tasks:
            w.head_since = time.monotonic()
        w.tasks.append(task.task_id)
        self.ledger.sent(task)
        return True

    def cancel(self, upto: int) -> None:
        """Cancel every task with an id up to ``upto`` (a load(), a new iteration).

        Workers read this in shared memory before each task and between
        samples: a queued task is not started and one in hand stops after its
        current sample. Each is still answered (DONE, no data), so its slot
        and its place in the worker's queue come back as for any reply.
        """
        if not self.closed:
            assert self._cancelled is not None      # open: _open made it
            self._cancelled[0] = max(int(self._cancelled[0]), upto)

    def poll(self, timeout_ms: int) -> list:
        """Wait up to ``timeout_ms`` for replies or deaths; return the events.

        Events (records of :mod:`~loadr.workers.protocol`): ``Done(task_id, extras,
        replaced)``, ``Failed(task_id, failure)``, ``Lost(task_id)`` (its worker died;
        send it again), ``Fatal(failure)`` (workers cannot start at all).
        """
        sock = self._sock
        assert sock is not None                     # _open made it (close() leaves it)
        woke = self._poller(sock).poll(timeout_ms)
        events = []
        # The socket's own flag, not a receive until Again: an exception a poll
        # cost more than the rest of it. (The flag says a message *may* be read:
        # Again still ends the loop, should it come.)
        # pyzmq types get() as int or bytes, whichever the option; EVENTS is an int.
        while cast(int, sock.get(_EVENTS)) & _POLLIN:
            try:
                msg = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            events += self._receive(msg)
        events += self._check_workers(any(fd is not sock for fd, _ in woke))
        return events

    def waits_on(self) -> list:
        """What :meth:`poll` waits on (its socket and the live workers' sentinels): for a
        caller that waits on these and more at once, then calls ``poll(0)``."""
        return [self._sock] + [w.process.sentinel for w in self.workers if w is not None]

    def _poller(self, sock: zmq.Socket) -> zmq.Poller:
        """``sock`` and the live workers' sentinels, kept until a worker changes."""
        sentinels = tuple(w.process.sentinel for w in self.workers if w is not None)
        if self._polled != sentinels or self._poller_held is None:
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            for fd in sentinels:
                poller.register(fd, zmq.POLLIN)
            self._polled, self._poller_held = sentinels, poller
        return self._poller_held

    def _receive(self, msg: list) -> list:
        w = self._by_identity(msg[0])
        if w is None or len(msg) < 2:
            return []
        try:
            kind, fields = protocol.parse(msg[1])
        except ValueError:
            return []
        if kind == protocol.HELLO:
            w.ready = w.started = True
            self.ledger.started()
            if all(x is not None and x.started for x in self.workers):
                self.depth = self.max_tasks
            return []
        task_id = fields[0]
        if task_id not in w.tasks:
            return []
        w.tasks.remove(task_id)
        w.head_since = time.monotonic() if w.tasks else None
        self.ledger.answered(task_id)
        # The payloads are unpickled here, past the identity check above (SECURITY.md).
        if kind == protocol.DONE:
            if len(msg) < 3:
                return [protocol.Done(task_id, {}, [])]
            return [protocol.Done(task_id, *pickle.loads(msg[2]))]
        if kind == protocol.FAIL:
            return [protocol.Failed(task_id, pickle.loads(msg[2]))]
        return []

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w is not None]

    def memory(self, private: bool = False) -> dict[int, dict]:
        """Worker id -> ``{'pid', 'rss_bytes', 'heap_bytes', 'uss_bytes'}``: what each live
        worker holds (resident; its private anonymous part, the heap that steady memory
        keeps; and all it alone maps, its USS: see :func:`~loadr.workers.memory.private_bytes`;
        None where unknown, left out unless ``private``)."""
        found = {}
        for w in self.workers:
            if w is not None:
                held = resident(w.process.pid)
                if held is not None:
                    found[w.wid] = {'pid': w.process.pid, **held}
                    if private:
                        found[w.wid]['uss_bytes'] = private_bytes(w.process.pid)
        return found

    def private_memory(self, max_age_s: float = MEMORY_EVERY_S) -> dict[int, int]:
        """Worker id -> its USS in bytes (:func:`~loadr.workers.memory.private_bytes`), read
        at most every ``max_age_s``: smaps_rollup costs ~0.6 ms a worker, and stats() may be
        asked for every batch."""
        now = time.monotonic()
        if self._uss is None or now - self._uss[0] >= max_age_s:
            found = {}
            for w in self.workers:
                if w is not None and w.started:
                    uss = private_bytes(w.process.pid)
                    if uss is not None:
                        found[w.wid] = uss
            self._uss = (now, found)
        return dict(self._uss[1])

    def stats_rows(self) -> np.ndarray:
        """A copy of the workers' stage counters, one row per worker id (loadr.stats).

        A replacement worker goes on adding to its predecessor's row, so a
        killed worker's time stays counted (all but the batch it died in).
        """
        if self._stats_rows is not None:
            return self._stats_rows.copy()
        if self._held.last_stats is not None:      # closed: as the workers left them
            return self._held.last_stats.copy()
        return np.zeros((len(self.workers), self.stats_width))

    def slot_buffers(self) -> list:
        """The buffers the batch slots are mapped in (what a lent batch's arrays hang
        from); none once closed."""
        if self.closed:
            return []
        return [seg.buf for seg in self._segments[:self.slot_count]]

    def fresh_views(self, slot: int) -> tuple[np.ndarray, dict]:
        """New arrays over ``slot`` and the one array they all hang from.

        Every view of these arrays keeps ``owner`` alive, so a weak reference
        to it tells when the caller has let go of the last of them.
        """
        buf = self._segments[slot].buf
        assert buf is not None                      # a slot's segment closes with the pool
        owner = np.frombuffer(buf, dtype=np.uint8)
        return owner, self.layout.views(owner)

    # -- shutdown ----------------------------------------------------------

    def close(self) -> None:
        """Stop everything and free everything (in the order of
        :func:`~loadr.workers.held.release`); safe to call twice, and a Ctrl-C meanwhile
        waits until it is done."""
        self.closed = True
        self.views = []
        self.progress = self._cancelled = self._beats = self._wants = self._stats_rows = None
        self.trace_rings = None
        release(self._held)
