"""The per-stage accounting behind :class:`loadr.stats.Stats`: each worker's row of
counters (:data:`WORKER_FIELDS`, then one per fn), the clock that fills it
(:class:`StageClock`), the sampled timing of a batch's rows (:class:`FillTimer`),
and what the kernel says of a process's CPU time (:func:`process_times`,
:func:`schedstat`). The docstring of :mod:`loadr.stats` describes the stages."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..storage import netstats

if TYPE_CHECKING:      # _trace imports this module
    from ._trace import TaskRing

# The fixed counters of a worker's row; one counter per fn follows them.
WORKER_FIELDS = ('busy', 'wait', 'read', 'write', 'batches', 'samples', 'cpu', 'busy_sq',
                 'runq', 'sampled') + netstats.FIELDS     # then the remote stage's
BUSY, WAIT, READ, WRITE, BATCHES, SAMPLES, CPU, BUSY_SQ, RUNQ, SAMPLED = range(10)
NET = 10
# A timed row costs about TIMED_ROW_COST_US more than another (clock reads
# and bookkeeping, measured: 1-2 us in CPython 3.11). Rows are timed every
# TIMED_ROW_COST_US / (TIMING_SHARE * row_us) rows (at most MAX_STRIDE
# apart; STRIDE before the first batch has been measured), so timing costs
# about TIMING_SHARE of the work, and every row is timed once a row costs
# TIME_EVERY_ROW_US (= TIMED_ROW_COST_US / TIMING_SHARE) or more.
TIMED_ROW_COST_US = 2.0
TIMING_SHARE = 0.0025
STRIDE = 8
MAX_STRIDE = 256
TIME_EVERY_ROW_US = TIMED_ROW_COST_US / TIMING_SHARE
def _fn_name(fn) -> str:
    name = getattr(fn, 'stats_name', None) or getattr(fn, '__name__', None)
    if name is None or name == '<lambda>':
        name = type(fn).__name__ if name is None else 'lambda'
    return str(name)


def fn_names(fns) -> list[str]:
    """Stage names for ``fns``: their names, made unique with ``#2``, ``#3``.

    >>> def crop(dp, seed): return dp
    >>> fn_names([crop, crop])
    ['crop', 'crop#2']

    Give the fns as they run: fused ones (``loadr.decode.fuse``) name themselves
    with ``stats_name``, e.g. ``decode_jpeg+random_resized_crop`` then
    ``random_resized_crop(fused)``.
    """
    seen: dict[str, int] = {}
    out = []
    for fn in fns:
        name = _fn_name(fn)
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f'{name}#{seen[name]}')
    return out


def row_width(fns: int) -> int:
    """float64 counters in the row of a worker with ``fns`` fns."""
    return len(WORKER_FIELDS) + fns


class StageClock:
    """A worker's counters, filled per batch by the assembler and the worker loop.

    ``row`` is the worker's float64 row (a memoryview or numpy array over
    shared memory, or a plain array) of :func:`row_width` counters:
    ``WORKER_FIELDS`` then one counter per fn. In a worker the loop calls
    :meth:`working` when a task arrives and :meth:`idle` once its reply is
    sent; the assembler calls :meth:`add_fill` once per filled batch. With
    ``inline=True`` (``workers=0``: no loop, no waiting for work) the fill's
    own time is the busy time.

    >>> import numpy as np
    >>> clock = StageClock(np.zeros(row_width(1)), fns=1, inline=True)
    >>> clock.add_fill(read=0.2, write=0.1, fns=[0.6], samples=64, fill_s=1.0)
    >>> clock.totals()['busy'], clock.totals()['fns']
    (1.0, [0.6])
    """

    def __init__(self, row, fns: int, inline: bool = False, sched=None):
        self.row = row
        self.nfns = fns
        self.inline = inline
        # () -> (CPU seconds, seconds waiting for a core) of this thread so far
        # (schedstat()): one read a task. Without it, the process's CPU time.
        self._sched = sched
        self._sched_seen = sched() if sched is not None else (0.0, 0.0)
        self._sched_at = time.perf_counter()
        self._unsampled = 0.0           # busy seconds since the last read of sched
        self._idle_since: float | None = None
        self._busy_since: float | None = None
        self._cpu_since = 0.0
        # A worker's fill is kept here until its task's busy time is known, and
        # both go into the row together: a snapshot taken in between would
        # see stages without the time that holds them.
        self._pending: tuple | None = None
        self._open = False              # a task is in hand and finish() not yet called
        # A TaskRing (loadr.stats.Tracer) takes each task's span and stages; None: no trace.
        self.trace: TaskRing | None = None
        self._net_since = list(netstats.counters())     # see netstats.PER_CLOCK

    def finish(self) -> None:
        """The task in hand is done but for its reply: count it before the reply goes, so
        that the main process, once it has the reply, sees the task in the row."""
        if self._open and self._busy_since is not None:     # (working() sets both)
            self._open = False
            now = time.perf_counter()
            busy = now - self._busy_since
            row = self.row
            if self._pending is not None:
                self._commit(*self._pending)
                if self.trace is not None:
                    self.trace.task(self._busy_since, now, self._pending)
                self._pending = None
            row[BUSY] += busy
            row[BUSY_SQ] += busy * busy
            self._busy_since = now
            if self._sched is not None:
                # Read at most every SCHED_EVERY_S (a read right after a batch's work
                # costs ~15 us); what it counts since the last read is the tasks'
                # (the idle loop between them only polls).
                self._unsampled += busy
                if now - self._sched_at >= SCHED_EVERY_S:
                    self._read_sched(now)
            else:
                cpu = time.process_time()
                row[CPU] += cpu - self._cpu_since
                row[SAMPLED] += busy
                self._cpu_since = cpu

    def _read_sched(self, now: float) -> None:
        # The busy time since the last read goes into SAMPLED with the CPU and runq
        # time read now: io_share compares only what was read (a short run whose
        # CPU was not read yet looked 100% blocked on I/O).
        row = self.row
        self._sched_at = now
        seen = self._sched_seen
        self._sched_seen = cpu, runq = self._sched()
        row[CPU] += cpu - seen[0]
        row[RUNQ] += runq - seen[1]
        row[SAMPLED] += self._unsampled
        self._unsampled = 0.0

    def idle(self) -> None:
        """The worker starts waiting for work; the task in hand, if any, is done."""
        if self._open:
            self.finish()
        now = time.perf_counter()
        if self._busy_since is not None:
            self.row[BUSY] += now - self._busy_since        # the reply's own time
            self._busy_since = None
        self._idle_since = now

    def waiting(self) -> None:
        """Still idle: count the wait so far (a snapshot then sees it before work comes)."""
        if self._idle_since is not None:
            now = time.perf_counter()
            self.row[WAIT] += now - self._idle_since
            self._idle_since = now
            if self._unsampled and self._sched is not None:
                self._read_sched(now)       # idle: the last tasks' CPU time, for free

    def working(self) -> None:
        """Work arrived: what was waited since :meth:`idle` is counted."""
        now = time.perf_counter()
        if self._idle_since is not None:
            self.row[WAIT] += now - self._idle_since
            self._idle_since = None
        self._busy_since = now
        self._open = True
        if self._sched is None:
            self._cpu_since = time.process_time()

    def add_fill(self, read: float, write: float, fns, samples: int, fill_s: float = 0.0,
                 cpu_s: float = 0.0, batches: int = 1) -> None:
        """One filled batch (``batches=0``: a cancelled or failed one): its stage times
        (seconds), and with ``inline`` its own time."""
        if not self.inline:
            self._pending = (read, write, fns, samples, batches)
            return
        self._commit(read, write, fns, samples, batches)
        row = self.row
        row[BUSY] += fill_s
        row[BUSY_SQ] += fill_s * fill_s
        row[CPU] += cpu_s
        row[SAMPLED] += fill_s
        if self.trace is not None:
            now = time.perf_counter()
            self.trace.task(now - fill_s, now, (read, write, fns, samples, batches))

    def _commit(self, read: float, write: float, fns, samples: int, batches: int) -> None:
        row = self.row
        row[READ] += read
        row[WRITE] += write
        row[BATCHES] += batches
        row[SAMPLES] += samples
        for i, t in enumerate(fns, len(WORKER_FIELDS)):
            row[i] += t
        netstats.publish(row, NET, self._net_since)

    def totals(self) -> dict:
        return worker_dict(self.row, self.nfns)


class FillTimer:
    """The stage accounting of an assembler's fills: which rows are timed, and the split.

    One row in :attr:`every` is read with :attr:`laps` in place of the fns
    after the read: the same fns, each wrapped in a :class:`_Lap` that adds
    the time since the last lap to its stage, with one lap before them (the
    read's) and one after (the row's whole time, :attr:`sampled`). The row is
    read by the same code as any other (the assembler's one reader of a row);
    :meth:`row` starts its clock. The other rows pay one countdown test.
    :meth:`account` scales the timed rows' shares to the batch's measured loop
    time and adds the batch to a :class:`StageClock`; the writes, timed whole,
    are 'write'.

    ``fns`` are the assembler's fns; a reading fn (``fns[0].reads``) is its
    own stage, so the read's time is fn 0's.

    >>> def crop(dp, seed): return dp
    >>> timer = FillTimer([crop])
    >>> timer.start()
    0
    >>> timer.row()
    >>> dp = {'i': 3}
    >>> for lap in timer.laps: dp = lap(dp, seed=0)
    >>> dp, timer.sampled > 0, len(timer.acc)
    ({'i': 3}, True, 2)
    """

    def __init__(self, fns):
        fns = list(fns)
        reads = bool(fns) and bool(getattr(fns[0], 'reads', False))
        self.read_slot = 1 if reads else 0
        after = fns[1:] if reads else fns
        self.acc = [0.0] * (1 + len(fns))      # seconds of the timed rows: [read, fn 0, ...]
        self.split = [0.0] * len(self.acc)     # shares of a row's time, per stage
        self.sampled = 0.0                     # seconds of the timed rows, whole
        self.began = self.last = 0.0           # when the row, and the stage, in hand began
        self.every = STRIDE
        self.countdown = 0                     # rows until the next timed one, across batches
        self.laps = ([_Lap(None, self.read_slot, self)]
                     + [_Lap(fn, slot, self) for slot, fn in enumerate(after, self.read_slot + 1)]
                     + [_Lap(None, None, self)])

    def start(self) -> int:
        """A batch begins: its accumulators cleared; the rows until the first timed one."""
        self.acc[:] = [0.0] * len(self.acc)
        self.sampled = 0.0
        return min(self.countdown, self.every - 1)

    def row(self) -> None:
        """A timed row begins (its read next)."""
        self.began = self.last = time.perf_counter()

    def account(self, clock: StageClock, count: int, t0: float, t1: float, cpu0: float,
                filled: bool, write_s: float) -> None:
        """Scale the timed rows' stages to the whole loop and add the batch to ``clock``.

        ``t0``: the fill's start; ``t1``: its rows' start (what is before, the
        batch read, is 'read'); ``write_s``: the time its writes took, measured
        whole. The loop's time less the writes is split as the timed rows split
        (what is outside their clocks, the loop itself, lands in 'other' via
        busy). A batch with no timed row (a small one between two) is split as
        the last timed rows were.
        """
        end = time.perf_counter()
        loop, sampled = max(0.0, end - t1 - write_s), self.sampled
        if sampled > 0:
            self.split = [t / sampled for t in self.acc]
            if count:
                # Time rows sparsely enough that a timed row's clock reads cost about
                # TIMING_SHARE of the work (every row once rows are that slow);
                # the row time is taken from batches with a timed row only.
                per_row_us = 1e6 * loop / count
                self.every = max(1, min(MAX_STRIDE, int(
                    TIMED_ROW_COST_US / (TIMING_SHARE * max(per_row_us, 1e-3)))))
        split = self.split
        clock.add_fill(t1 - t0 + split[0] * loop, write_s, [t * loop for t in split[1:]],
                       count if filled else 0, end - t0,
                       time.process_time() - cpu0 if clock.inline else 0.0, int(filled))


class _Lap:
    """A fn of a timed row: calls ``fn`` (none: a lap of its own) and adds the time since
    the last lap to stage ``slot`` (none: the row's whole time, to ``sampled``)."""

    __slots__ = ('fn', 'slot', 'timer')

    def __init__(self, fn, slot: int | None, timer: FillTimer):
        self.fn, self.slot, self.timer = fn, slot, timer

    def __call__(self, dp, seed=None):
        if self.fn is not None:
            dp = self.fn(dp, seed=seed)
        timer = self.timer
        now = time.perf_counter()
        if self.slot is None:
            timer.sampled += now - timer.began
        else:
            timer.acc[self.slot] += now - timer.last
            timer.last = now
        return dp

    def __repr__(self) -> str:          # errors name the fn, as for a row not timed
        return repr(self.fn)


def worker_dict(row, fns: int) -> dict:
    """One worker's row as ``{field: value, 'fns': [...]}`` (plain floats)."""
    values = [float(v) for v in row]
    out: dict = dict(zip(WORKER_FIELDS, values))
    out['fns'] = values[len(WORKER_FIELDS):len(WORKER_FIELDS) + fns]
    return out


def cores() -> int:
    """The cores this process may run on (its affinity), at least 1.

    >>> cores() >= 1
    True
    """
    import os
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# Above this share of busy time blocked (neither on a CPU nor waiting for
# one) the workers mostly wait on I/O (storage, network): more workers than
# cores can help then.
IO_BOUND_SHARE = 0.5
# Above this share of their ready time waiting for a core (Stats.runq_share), the
# cores are in use (by other processes, if not by the workers): no more workers help.
CONTENDED_SHARE = 0.2
SCHED_EVERY_S = 0.05
def process_times(pids) -> dict:
    """``{pid: (seconds on a CPU, seconds waiting for one)}`` so far, of the main thread
    of each process (a worker works in it), from ``/proc/<pid>/schedstat``; a pid that
    cannot be read is left out.

    >>> import os
    >>> times = process_times([os.getpid()])
    >>> times == {} or times[os.getpid()][0] > 0
    True
    """
    out = {}
    for pid in pids:
        try:
            with open(f'/proc/{pid}/schedstat', 'rb') as f:
                cpu, runq = f.read().split()[:2]
            out[pid] = int(cpu) / 1e9, int(runq) / 1e9
        except (OSError, ValueError):
            pass
    return out


def schedstat():
    """A function giving this thread's ``(seconds on a CPU, seconds waiting for one)``
    so far, in one read of ``/proc/thread-self/schedstat``; None where there is none.

    >>> read = schedstat()
    >>> read is None or all(t >= 0 for t in read())
    True
    """
    import os
    try:
        fd = os.open('/proc/thread-self/schedstat', os.O_RDONLY | os.O_CLOEXEC)
        cpu, runq = os.pread(fd, 128, 0).split()[:2]
        int(cpu), int(runq)
    except (OSError, ValueError):
        return None

    def read() -> tuple[float, float]:
        try:
            cpu, runq = os.pread(fd, 128, 0).split()[:2]
            return int(cpu) / 1e9, int(runq) / 1e9
        except (OSError, ValueError):
            return 0.0, 0.0
    return read
