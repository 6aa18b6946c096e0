"""The worker loop: receive a task, read, decode, run the fns, fill the slot, reply.

A worker is a ``multiprocess`` process started by :class:`~loadr.workers.pool.WorkerPool`.
It maps the shared-memory slots by name, connects one DEALER socket to the
main process and serves tasks until told to stop. A watchdog thread ends it
(after unlinking the shared memory) within ``PARENT_CHECK_S`` of its parent
dying, however busy the loop is, and bumps the worker's heartbeat counter in
the status segment each time it wakes: a stopped or frozen process stops all
its threads, so a counter that stands still tells the pool to look.

:func:`run` sets the process up and hands over to :func:`serve`, a short
loop over the steps of :class:`Steps` (the worker's state: its assembler,
slot views, status cells and orders) and a :class:`Link` (its socket).
Steps works over any buffers, so a test drives it with no process.

Example (what the pool runs in each new process)::

    run(WorkerArgs(...))
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..assemble import Assembler, Cancelled
from ..errors import SampleFailure
from ..order import ORDER_VERSION, order_for
from ..sources import hooks_of
from ..stats import StageClock, TaskRing, record_width, ring_rows, row_width, schedstat
from ..storage import netstats
from . import memory, protocol
from .shm import Layout, Segment, StatusCells

__all__ = ['WorkerArgs', 'Steps', 'Link', 'serve', 'run', 'tasks_held', 'most_tasks_held',
           'PARENT_CHECK_S', 'MAX_TASKS_PER_WORKER', 'MAX_TASKS_READING_AHEAD']

PARENT_CHECK_S = 0.2
RECV_POLL_MS = 500
MAX_TASKS_PER_WORKER = 2          # one in hand, one queued: no idle gap between tasks
# ... and at first one more where the reader reads ahead (remote files): a worker
# starts the reads of every task it holds, so each task's reads begin a task
# earlier. Then as many as its round trips need (netstats.tasks_ahead).
MAX_TASKS_READING_AHEAD = netstats.FEWEST_TASKS_AHEAD
# How fast a worker's measure of its task time follows a change (per task).
TASK_TIME_WEIGHT = 0.3


def tasks_held(reader) -> int:
    """The tasks a worker holds at once (in hand and queued) for ``reader``, at first.

    >>> class Remote:
    ...     prefetches = True
    ...     def __len__(self): return 0
    ...     def prefetch(self, indices): pass
    >>> tasks_held([]), tasks_held(Remote())
    (2, 3)
    """
    return MAX_TASKS_READING_AHEAD if hooks_of(reader).prefetch is not None \
        else MAX_TASKS_PER_WORKER


def most_tasks_held(reader) -> int:
    """The most tasks a worker may ask to hold for ``reader``: a reader that reads ahead
    asks for more when its round trips last longer than a task
    (:func:`~loadr.storage.netstats.tasks_ahead`).

    >>> most_tasks_held([])
    2
    """
    return netstats.MOST_TASKS_AHEAD if hooks_of(reader).prefetch is not None \
        else MAX_TASKS_PER_WORKER


@dataclass
class WorkerArgs:
    """Everything a worker needs; pickled (by dill) into the new process."""

    wid: int
    endpoint: str
    identity: bytes
    reader: object
    fns: list
    spec: dict
    layout: Layout
    slot_specs: list            # Segment.spec of each slot, then of the status segment
    status_spec: dict
    owned_dirs: list            # the pool's directories (socket; /dev/shm segments): shm.py
    parent_pid: int
    parent_start: int | None    # its start time (pids.proc_stat): a pid alone can be reused
    n: int
    shuffle: bool
    on_error: str
    order_version: int | None = None    # None: the default (loadr.order.ORDER_VERSION)
    workers: int = 1
    steady_memory: bool = True  # glibc malloc thresholds for a steady heap (memory.py)
    shared_files: tuple = ()    # files the dataset held open at the fork (inherited.py)
    # Called as init_fn(wid) once, before the first task.
    init_fn: Callable[[int], object] | None = None
    trace_records: int = 0      # a ring of this many task records for a trace; 0: none


def _parent_alive(args: WorkerArgs) -> bool:
    """Whether the main process that made us still runs.

    It is our parent with fork and spawn (the cheap check); with forkserver
    our parent is the fork server, so the main process is found by pid and
    start time.
    """
    from ..pids import same_process

    return os.getppid() == args.parent_pid or same_process(args.parent_pid, args.parent_start)


def _watch_parent(args: WorkerArgs, beat) -> None:
    from .shm import remove_owned

    def watch():
        while True:
            time.sleep(PARENT_CHECK_S)
            beat[0] += 1            # "this process runs" (see the pool's frozen check)
            if not _parent_alive(args):
                # The main process died without closing us: nobody else will
                # remove what it made (segments, sockets), so we do, then leave.
                for path in args.owned_dirs:
                    remove_owned(path)
                os._exit(0)

    threading.Thread(target=watch, name='loadr-parent-watch', daemon=True).start()


def _noted(exc: BaseException, args: WorkerArgs) -> BaseException:
    """``exc``, noting the files the dataset shares with the other workers, if any: the
    likely cause of garbage read (the note travels with the exception, and shows under
    its traceback in the main process)."""
    if args.shared_files and hasattr(exc, 'add_note'):
        from .inherited import note
        text = note(list(args.shared_files))
        if text not in getattr(exc, '__notes__', ()):
            exc.add_note(text)
    return exc


class Steps:
    """A worker's state between tasks, and the steps of its loop (:func:`serve`).

    Made over the slots' and the status segment's buffers (any buffers: a test
    passes bytearrays and drives the steps without a process or a socket).
    """

    def __init__(self, args: WorkerArgs, slot_bufs: list, status_buf):
        self.args = args
        cells = StatusCells(status_buf, args.workers)
        self.views = [args.layout.views(buf) for buf in slot_bufs]
        # Memoryviews, not ndarrays: progress is set twice per sample, and a
        # memoryview's item assignment costs a third of numpy's.
        self.progress = cells.progress(args.wid)
        self.cancelled = cells.cancelled()      # the last cancelled task id
        self.wants = cells.wants(args.wid)      # the tasks we ask the pool to hold at once
        self.asm = Assembler(args.reader, args.fns, args.spec, args.on_error)
        # This worker's stage counters: a float64 row after the status cells (pool.py).
        width = 8 * row_width(len(args.fns))
        at = StatusCells.nbytes(args.workers) + width * args.wid
        self.clock = self.asm.clock = StageClock(
            memoryview(status_buf).cast('B')[at:at + width].cast('d'), len(args.fns),
            sched=schedstat())
        if args.trace_records:
            # The trace's ring of task records: after every worker's counters (pool.py).
            shape = (ring_rows(args.trace_records), record_width(len(args.fns)))
            at = StatusCells.nbytes(args.workers) + width * args.workers \
                + 8 * shape[0] * shape[1] * args.wid
            self.clock.trace = TaskRing(np.ndarray(shape, np.float64, status_buf, at))
        self.orders: dict[int, object] = {}
        self.order_version = ORDER_VERSION if args.order_version is None \
            else args.order_version
        # A remote reader's records are read ahead: tasks are taken off the socket
        # early (MAX_TASKS_READING_AHEAD), so that their reads start early.
        self.reads_ahead = self.asm.hooks.prefetch is not None
        self.task_s: float | None = None        # a task's time, its network waits left out
        self.task_bytes: float | None = None    # the bytes fetched a task
        if self.reads_ahead:
            netstats.holding(MAX_TASKS_READING_AHEAD)
        self.init_failure: protocol.Failure | None = None
        self.last_task, self.trimmed = time.monotonic(), True

    def start(self) -> None:
        """The user's per-worker set-up (torch's worker_init_fn), then the reader's warm-up.

        If init_fn fails, every task fails with its error, so it reaches the
        caller at the first batch."""
        args = self.args
        if args.init_fn is not None:
            try:
                args.init_fn(args.wid)
            except Exception as exc:
                failure = protocol.Failure.capture(exc, None, None, args.wid)
                failure.message = f'init_fn({args.wid}) failed: {failure.message}'
                self.init_failure = failure
        warm = self.asm.hooks.warm
        if warm is not None:
            try:
                warm()          # e.g. a remote bag's index tables, in one round trip
            except Exception as exc:   # a hint: the reads report what is wrong
                logging.getLogger('loadr').debug('loadr: warming the reader failed: %r', exc)

    def order_of(self, seed: int):
        order = self.orders.get(seed)
        if order is None:
            order = self.orders[seed] = order_for(self.args.reader, seed, self.args.shuffle,
                                                  self.order_version)
        return order

    def waiting(self) -> None:
        """No task came: after IDLE_TRIM_S of that, give back the heap kept for speed."""
        self.clock.waiting()
        if (self.args.steady_memory and not self.trimmed
                and time.monotonic() - self.last_task > memory.IDLE_TRIM_S):
            memory.trim()
            self.trimmed = True

    def working(self) -> None:
        """A message came."""
        self.last_task, self.trimmed = time.monotonic(), False
        self.clock.working()

    def skipped(self, task: protocol.Task) -> list | None:
        """The reply to a task that is not to be made (cancelled, or init_fn failed);
        None for a task to make."""
        if task.task_id <= self.cancelled[0]:
            return protocol.done(task.task_id, {}, [])
        if self.init_failure is not None:
            return protocol.fail(task.task_id, self.init_failure)
        return None

    def read_ahead(self, task: protocol.Task, queued: list) -> None:
        """Start the reads of ``task`` and of every live task in ``queued`` (frames),
        with one call of the reader's (their requests planned together)."""
        tasks = [(self.order_of(task.seed), task.start, task.count)]
        for frames in queued:
            _, more = protocol.parse(frames[0])
            if isinstance(more, protocol.Task) and more.task_id > self.cancelled[0]:
                tasks.append((self.order_of(more.seed), more.start, more.count))
        self.asm.prefetch_tasks(tasks)

    def fill(self, task: protocol.Task) -> list:
        """Make ``task``'s rows in its slot: the reply (DONE, or FAIL naming the sample)."""
        progress, wid = self.progress, self.args.wid
        count, row = task.count, task.row
        if self.clock.trace is not None:
            self.clock.trace.current = (task.task_id, task.start, count)
        if self.reads_ahead:
            t0, waited0, bytes0 = time.perf_counter(), netstats.wait_s(), \
                netstats.fetched_bytes()
        try:
            arrays = self.views[task.slot] if row == 0 else \
                {key: view[row:row + count] for key, view in self.views[task.slot].items()}
            extras, replaced = self.asm.fill(
                self.order_of(task.seed), task.start, count, arrays, progress,
                batch_read=not task.flags & protocol.READ_ONE_BY_ONE,
                cancel=(self.cancelled, task.task_id))
            reply = protocol.done(task.task_id, extras, replaced)
            if self.reads_ahead:
                self._size_read_ahead(time.perf_counter() - t0 - (netstats.wait_s() - waited0),
                                      netstats.fetched_bytes() - bytes0)
        except Cancelled:
            reply = protocol.done(task.task_id, {}, [])
        except SampleFailure as f:
            failure = protocol.Failure.capture(_noted(f.exc, self.args), f.index, f.position,
                                               wid, f.traceback)
            reply = protocol.fail(task.task_id, failure)
        except Exception as exc:
            index = int(progress[1])
            failure = protocol.Failure.capture(_noted(exc, self.args),
                                               index if index >= 0 else None,
                                               int(progress[0]), wid)
            reply = protocol.fail(task.task_id, failure)
        self.clock.finish()
        return reply

    def _size_read_ahead(self, task_s: float, task_bytes: float) -> None:
        """After a task that took ``task_s`` (its network waits left out) while ``task_bytes``
        came in (for the tasks read ahead): ask the pool for as many tasks as the round
        trips need and the read-ahead buffer holds (:func:`netstats.tasks_ahead`)."""
        if task_s > 0:
            self.task_s = task_s if self.task_s is None else \
                (1 - TASK_TIME_WEIGHT) * self.task_s + TASK_TIME_WEIGHT * task_s
        self.task_bytes = task_bytes if self.task_bytes is None else \
            (1 - TASK_TIME_WEIGHT) * self.task_bytes + TASK_TIME_WEIGHT * task_bytes
        rtt = netstats.rtt_p90_s()
        if rtt > 0 and self.task_s:
            held = netstats.tasks_ahead(rtt, self.task_s, self.task_bytes)
            self.wants[0] = held
            netstats.holding(held)

    def flush(self) -> None:
        """On the way out: a caching reader keeps the last batch's ranges for the next run."""
        flush = self.asm.hooks.cache_flush
        if flush is not None:
            try:
                flush()
            except Exception as exc:
                logging.getLogger('loadr').debug(
                    'loadr: the cache could not take the last ranges: %r', exc)


class Link:
    """The worker's end of the socket: messages in (with those taken early), replies out."""

    def __init__(self, sock):
        import zmq

        self.sock = sock
        # One poller for the life of the worker (Socket.poll makes one a call).
        self.poller = zmq.Poller()
        self.poller.register(sock, zmq.POLLIN)
        self.early: collections.deque = collections.deque()

    def take(self, timeout_ms: int = RECV_POLL_MS) -> list | None:
        """The next message's frames; None if none came within ``timeout_ms``."""
        if self.early:
            return self.early.popleft()
        if not self.poller.poll(timeout_ms):
            return None
        return self.sock.recv_multipart()

    def queued(self) -> list:
        """The messages waiting now, taken off the socket early (:meth:`take` gives them
        next, in order)."""
        more = []
        while self.sock.poll(0):
            more.append(self.sock.recv_multipart())
        self.early.extend(more)
        return more

    def send(self, reply: list) -> None:
        if len(reply) == 1:
            self.sock.send(reply[0])        # the common reply: no send_multipart checks
        else:
            self.sock.send_multipart(reply)


def serve(steps: Steps, link: Link) -> None:
    """Answer the tasks that come over ``link`` until STOP."""
    clock = steps.clock
    clock.idle()
    while True:
        frames = link.take()
        if frames is None:
            steps.waiting()
            continue
        steps.working()
        kind, task = protocol.parse(frames[0])
        if kind == protocol.STOP:
            return
        if kind == protocol.TASK:
            assert isinstance(task, protocol.Task)     # parse() makes a Task of a TASK
            reply = steps.skipped(task)
            if reply is None:
                if steps.reads_ahead:
                    steps.read_ahead(task, link.queued())
                reply = steps.fill(task)
            link.send(reply)
        clock.idle()                        # after a reply, or a MEND (nothing to do)


def _take_signals() -> None:
    """Ctrl-C belongs to the main process; SIGTERM ends a worker, always."""
    # Ctrl-C stops us in order through the main process. The pool started us with
    # SIGINT blocked, so none got in before this line.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the main process's Python SIGTERM handler (Lightning's
    # Trainer installs one that does not exit). multiprocess's exit hook SIGTERMs its
    # daemon children and joins them with no limit: a worker that survives SIGTERM
    # would hang the interpreter's exit. SIGTERM ends a worker, always.
    # The pool started us with SIGTERM blocked too, so that none reached the
    # inherited handler before this line; one that came meanwhile ends us now.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, 'pthread_sigmask'):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def run(args: WorkerArgs) -> None:
    """Serve tasks until STOP; never lets an exception escape unreported."""
    import zmq

    _take_signals()
    if not _parent_alive(args):
        return
    if args.steady_memory:
        memory.set_steady()         # before the reader and fns allocate anything
    try:
        segments = [Segment.attach(spec) for spec in args.slot_specs]
        status = Segment.attach(args.status_spec)
    except FileNotFoundError:
        # Only the pool unlinks them: it closed (Ctrl-C while we started). Leave quietly.
        return
    _watch_parent(args, StatusCells(status.buf, args.workers).heartbeat(args.wid))
    if not _parent_alive(args):
        return
    steps = Steps(args, [seg.buf for seg in segments], status.buf)
    ctx = zmq.Context(1)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, args.identity)
    sock.connect(args.endpoint)
    sock.send_multipart(protocol.hello(os.getpid()))
    steps.start()
    try:
        serve(steps, Link(sock))
    finally:
        sock.close(0)
        ctx.term()
        steps.flush()
