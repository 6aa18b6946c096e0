"""The worker loop: receive a task, read, decode, run the fns, fill the slot, reply.

A worker is a ``multiprocess`` process started by :class:`~loadr.workers.pool.WorkerPool`.
It maps the shared-memory slots by name, connects one DEALER socket to the
main process and serves tasks until told to stop. A watchdog thread ends it
(after unlinking the shared memory) within ``PARENT_CHECK_S`` of its parent
dying, however busy the loop is, and bumps the worker's heartbeat counter in
the status segment each time it wakes: a stopped or frozen process stops all
its threads, so a counter that stands still tells the pool to look.

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
from dataclasses import dataclass

__all__ = ['WorkerArgs', 'run', 'tasks_held', 'PARENT_CHECK_S', 'MAX_TASKS_PER_WORKER',
           'MAX_TASKS_READING_AHEAD']

PARENT_CHECK_S = 0.2
RECV_POLL_MS = 500
MAX_TASKS_PER_WORKER = 2          # one in hand, one queued: no idle gap between tasks
# ... and one more where the reader reads ahead (remote files): a worker starts
# the reads of every task it holds, so each task's reads begin a task earlier.
MAX_TASKS_READING_AHEAD = 3


def tasks_held(reader) -> int:
    """The tasks a worker holds at once (in hand and queued) for ``reader``.

    >>> tasks_held([]), tasks_held(type('Remote', (), {'prefetches': True})())
    (2, 3)
    """
    return MAX_TASKS_READING_AHEAD if getattr(reader, 'prefetches', False) \
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
    layout: object
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
    init_fn: object = None      # called as init_fn(wid) once, before the first task


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


def run(args: WorkerArgs) -> None:
    """Serve tasks until STOP; never lets an exception escape unreported."""
    import zmq

    from ..assemble import Assembler, Cancelled, SampleFailure
    from ..order import ORDER_VERSION, order_for
    from . import memory, protocol
    from ..stats import StageClock, row_width, schedstat
    from .shm import Segment, StatusCells

    # Ctrl-C belongs to the main process; it stops us in order. The pool
    # started us with SIGINT blocked, so none got in before this line.
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
    cells = StatusCells(status.buf, args.workers)
    _watch_parent(args, cells.heartbeat(args.wid))
    if not _parent_alive(args):
        return
    views = [args.layout.views(seg.buf) for seg in segments]
    # Memoryviews, not ndarrays: progress is set twice per sample, and a
    # memoryview's item assignment costs a third of numpy's.
    progress = cells.progress(args.wid)
    cancelled = cells.cancelled()       # the last cancelled task id
    asm = Assembler(args.reader, args.fns, args.spec, args.on_error)
    # This worker's stage counters: a float64 row after the status cells (pool.py).
    width = 8 * row_width(len(args.fns))
    at = StatusCells.nbytes(args.workers) + width * args.wid
    clock = asm.clock = StageClock(memoryview(status.buf).cast('B')[at:at + width].cast('d'),
                                   len(args.fns), sched=schedstat())
    orders: dict[int, object] = {}
    order_version = ORDER_VERSION if args.order_version is None else args.order_version

    ctx = zmq.Context(1)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, args.identity)
    sock.connect(args.endpoint)
    sock.send_multipart(protocol.hello(os.getpid()))
    # One poller for the life of the worker (Socket.poll makes one a call).
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    # The user's per-worker set-up (torch's worker_init_fn). If it fails, every
    # task fails with its error, so it reaches the caller at the first batch.
    init_failure = None
    if args.init_fn is not None:
        try:
            args.init_fn(args.wid)
        except Exception as exc:
            init_failure = protocol.Failure.capture(exc, None, None, args.wid)
            init_failure.message = f'init_fn({args.wid}) failed: {init_failure.message}'
    warm = getattr(args.reader, 'warm', None)
    if warm is not None:
        try:
            warm()          # e.g. a remote bag's index tables, in one round trip
        except Exception as exc:   # a hint: the reads report what is wrong
            logging.getLogger('loadr').debug('loadr: warming the reader failed: %r', exc)

    def order_of(seed: int):
        order = orders.get(seed)
        if order is None:
            order = orders[seed] = order_for(args.reader, seed, args.shuffle, order_version)
        return order

    # A remote reader's records are read ahead: tasks are taken off the socket
    # early (MAX_TASKS_READING_AHEAD), so that their reads start early.
    reads_ahead = bool(getattr(args.reader, 'prefetches', False))
    pending: collections.deque = collections.deque()
    last_task, trimmed = time.monotonic(), True
    clock.idle()
    try:
        while True:
            if pending:
                frames = pending.popleft()
            elif not poller.poll(RECV_POLL_MS):
                clock.waiting()
                if (args.steady_memory and not trimmed
                        and time.monotonic() - last_task > memory.IDLE_TRIM_S):
                    memory.trim()   # idle: give back the heap kept for speed
                    trimmed = True
                continue
            else:
                frames = sock.recv_multipart()
            last_task, trimmed = time.monotonic(), False
            clock.working()
            kind, fields = protocol.parse(frames[0])
            if kind == protocol.STOP:
                break
            if kind == protocol.MEND:
                clock.idle()
                continue
            task_id, slot, row, seed, start, count, flags = fields
            if task_id <= cancelled[0]:
                sock.send_multipart(protocol.done(task_id, {}, []))
                clock.idle()
                continue
            if init_failure is not None:
                sock.send_multipart(protocol.fail(task_id, init_failure))
                clock.idle()
                continue
            order = order_of(seed)
            if reads_ahead:
                # This task's records, then those of every task queued here already.
                asm.prefetch(order, start, count)
                while sock.poll(0):
                    pending.append(sock.recv_multipart())
                    kind2, fields2 = protocol.parse(pending[-1][0])
                    if kind2 == protocol.TASK and fields2[0] > cancelled[0]:
                        asm.prefetch(order_of(fields2[3]), fields2[4], fields2[5])
            try:
                arrays = views[slot] if row == 0 else \
                    {key: view[row:row + count] for key, view in views[slot].items()}
                extras, replaced = asm.fill(order, start, count, arrays, progress,
                                            batch_read=not flags & protocol.READ_ONE_BY_ONE,
                                            cancel=(cancelled, task_id))
                reply = protocol.done(task_id, extras, replaced)
            except Cancelled:
                reply = protocol.done(task_id, {}, [])
            except SampleFailure as f:
                failure = protocol.Failure.capture(_noted(f.exc, args), f.index, f.position,
                                                   args.wid, f.traceback)
                reply = protocol.fail(task_id, failure)
            except Exception as exc:
                index = int(progress[1])
                failure = protocol.Failure.capture(_noted(exc, args),
                                                   index if index >= 0 else None,
                                                   int(progress[0]), args.wid)
                reply = protocol.fail(task_id, failure)
            clock.finish()
            if len(reply) == 1:
                sock.send(reply[0])     # the common reply: no send_multipart checks
            else:
                sock.send_multipart(reply)
            clock.idle()
    finally:
        sock.close(0)
        ctx.term()
        if getattr(args.reader, 'caches', False):
            try:
                args.reader.cache_flush()   # the last batch's ranges, for the next run
            except Exception as exc:
                logging.getLogger('loadr').debug(
                    'loadr: the cache could not take the last ranges: %r', exc)
