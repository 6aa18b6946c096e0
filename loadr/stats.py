"""Where a loader's time goes: per-stage totals, rates, a table and a verdict.

Each worker keeps a small row of float64 counters (:data:`WORKER_FIELDS`
followed by one counter per fn) that it adds to once per batch; the main
process adds its own time spent waiting for batches. :class:`Stats` is a
snapshot of all of them, taken by ``loader.stats()``: plain numbers, cheap to
take, JSON-able with :meth:`Stats.as_dict`.

Worker stages, in seconds of that worker's time:

- ``read``: the reader (bytes from storage and the reader's own decoding);
- one stage per fn, named after the fn (``decode_jpeg``, ``my_aug``);
- ``write``: checking a datapoint against the spec and copying it into the
  batch slot;
- ``other``: the rest of the time a batch was in hand (the task's messages,
  the loop);
- ``wait``: idle, waiting for work.

Besides the stages a row holds ``cpu`` (CPU seconds of the worker while
busy; read every ``SCHED_EVERY_S`` at most, and when the worker falls idle),
``runq`` (seconds it was ready to run but waited for a core: other
processes' load, from ``/proc/thread-self/schedstat``; 0 where there is
none), ``sampled`` (the busy seconds those two reads cover: the busy time
since the last read is not in them yet) and ``busy_sq`` (the sum of squared
per-task busy times: how much batches vary). Sampled busy time that is
neither CPU nor ``runq`` is time blocked in the kernel: waiting on I/O.
``batches`` counts the tasks a worker did (a batch split between workers
counts once per part).

The per-stage split is timed on a sample of the rows of each batch (every
few rows, sparser the cheaper a row is, and every row once a row costs more
than ``TIME_EVERY_ROW_US``) and scaled to the batch's measured time, so the
clock costs about 1% of a trivial pipeline's worker time; ``busy`` (a batch in hand)
is measured exactly per batch.

Example::

    >>> s = Stats(fn_names=['decode', 'crop'], elapsed_s=10.0, main_wait_s=0.05,
    ...           batches=100, samples=6400,
    ...           workers=[dict(busy=9.0, wait=1.0, read=1.0, write=0.5, other=0.5,
    ...                         fns=[6.0, 1.0], batches=100, samples=6400)])
    >>> s.verdict()
    'not the bottleneck: the training step waited 0.5% of the time'
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .storage import netstats

__all__ = ['Stats', 'WORKER_FIELDS', 'STRIDE', 'MAX_STRIDE', 'TIMED_ROW_COST_US', 'TIMING_SHARE',
           'TIME_EVERY_ROW_US', 'format_table', 'StageClock', 'NOT_BOTTLENECK_FRACTION',
           'fn_names', 'row_width', 'worker_dict', 'cores', 'settle', 'schedstat',
           'process_times', 'FillTimer']

# The fixed counters of a worker's row; one counter per fn follows them.
WORKER_FIELDS = ('busy', 'wait', 'read', 'write', 'batches', 'samples', 'cpu', 'busy_sq',
                 'runq', 'sampled') + netstats.FIELDS     # the remote stage's (issue 26)
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
# Below this fraction of the elapsed time spent waiting for batches the
# loader is called "not the bottleneck".
NOT_BOTTLENECK_FRACTION = 0.02


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

    Fused fns (loadr.decode) are named as they run, e.g.
    ``decode_jpeg+random_resized_crop`` then ``random_resized_crop(fused)``.
    """
    from .decode import fuse
    seen: dict[str, int] = {}
    out = []
    for fn in fuse(fns):
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
        self._idle_since = None
        self._busy_since = None
        self._cpu_since = 0.0
        # A worker's fill is kept here until its task's busy time is known, and
        # both go into the row together: a snapshot taken in between would
        # see stages without the time that holds them.
        self._pending = None
        self._open = False              # a task is in hand and finish() not yet called

    def finish(self) -> None:
        """The task in hand is done but for its reply: count it before the reply goes, so
        that the main process, once it has the reply, sees the task in the row."""
        if self._open:
            self._open = False
            now = time.perf_counter()
            busy = now - self._busy_since
            row = self.row
            if self._pending is not None:
                self._commit(*self._pending)
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

    def _commit(self, read: float, write: float, fns, samples: int, batches: int) -> None:
        row = self.row
        row[READ] += read
        row[WRITE] += write
        row[BATCHES] += batches
        row[SAMPLES] += samples
        for i, t in enumerate(fns, len(WORKER_FIELDS)):
            row[i] += t
        netstats.publish(row, NET)

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

    def account(self, clock: 'StageClock', count: int, t0: float, t1: float, cpu0: float,
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
    out = dict(zip(WORKER_FIELDS, values))
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


@dataclass
class Stats:
    """A snapshot of a loader's accounting; see the module docstring.

    ``elapsed_s`` runs from the first request for a batch; ``main_wait_s`` is
    the time the caller spent blocked waiting for batches, of which
    ``first_batch_s`` for the first one (starting the workers). The share of
    time waited (:attr:`wait_fraction`, the verdict) leaves that start out:
    it describes the steady state. ``workers`` holds one dict per worker
    with the keys of :data:`WORKER_FIELDS` and ``fns`` (seconds per fn, in
    order); ``other`` is derived when missing. ``inline``: ``workers=0``, the
    one row is the pipeline run in the calling process. ``cores`` is how
    many cores the process may use.
    """

    fn_names: list
    elapsed_s: float
    main_wait_s: float
    batches: int
    samples: int
    workers: list = field(default_factory=list)
    cores: int = 0
    first_batch_s: float = 0.0
    inline: bool = False

    def __post_init__(self):
        for w in self.workers:
            w.setdefault('fns', [0.0] * len(self.fn_names))
            if 'other' not in w:
                staged = w.get('read', 0.0) + w.get('write', 0.0) + sum(w['fns'])
                w['other'] = max(0.0, w.get('busy', 0.0) - staged)
        if not self.cores:
            self.cores = cores()

    @classmethod
    def from_rows(cls, rows, fn_names: list, **fields) -> 'Stats':
        """Stats from the workers' raw counter rows (see :class:`StageClock`)."""
        return cls(fn_names=list(fn_names),
                   workers=[worker_dict(r, len(fn_names)) for r in rows], **fields)

    # -- sums ------------------------------------------------------------

    def stages(self) -> dict:
        """Seconds per stage summed over the workers, in pipeline order."""
        out = {'read': 0.0}
        for name in self.fn_names:
            out[name] = 0.0
        out['write'] = out['other'] = out['wait'] = 0.0
        for w in self.workers:
            out['read'] += w.get('read', 0.0)
            for name, t in zip(self.fn_names, w['fns']):
                out[name] += t
            out['write'] += w.get('write', 0.0)
            out['other'] += w.get('other', 0.0)
            out['wait'] += w.get('wait', 0.0)
        return out

    def _sum(self, key: str) -> float:
        return sum(w.get(key, 0.0) for w in self.workers)

    @property
    def busy_s(self) -> float:
        return self._sum('busy')

    @property
    def wait_fraction(self) -> float:
        """The share of the time after the first batch the caller spent waiting for batches."""
        span = self.elapsed_s - self.first_batch_s
        waited = self.main_wait_s - self.first_batch_s
        return min(1.0, max(0.0, waited / span)) if span > 0 else 0.0

    @property
    def step_s(self) -> float:
        """The caller's own time per batch (elapsed minus waiting): its training step."""
        if not self.batches:
            return 0.0
        return max(0.0, self.elapsed_s - self.main_wait_s) / self.batches

    @property
    def worker_s_per_batch(self) -> float:
        """Worker-seconds of busy time per batch made (all stages)."""
        done = self._sum('batches')
        return self.busy_s / done if done else 0.0

    def _sampled_s(self) -> float:
        # The busy time the cpu and runq counters cover (all of it in a row without
        # 'sampled', as an older snapshot's).
        return sum(w.get('sampled', w.get('busy', 0.0)) for w in self.workers)

    @property
    def cpu_share(self) -> float:
        """CPU time over busy time of the workers (the busy time it was read for)."""
        busy = self._sampled_s()
        return self._sum('cpu') / busy if busy > 0 else 1.0

    @property
    def io_share(self) -> float:
        """The share of the workers' busy time blocked in the kernel: neither on a CPU
        nor waiting for one (0: CPU-bound, or short of cores, or not read yet; near 1:
        waiting on I/O). Only the busy time whose CPU time was read counts."""
        busy = self._sampled_s()
        if busy <= 0:
            return 0.0
        return min(1.0, max(0.0, busy - self._sum('cpu') - self._sum('runq')) / busy)

    @property
    def runq_share(self) -> float:
        """The share of the time the workers were ready to run that they waited for a
        core (other processes' load, or more workers than cores): runq / (cpu + runq)."""
        ready = self._sum('cpu') + self._sum('runq')
        return self._sum('runq') / ready if ready > 0 else 0.0

    def with_process_times(self, before: dict, after: dict, pids: list) -> 'Stats':
        """These stats with each worker's ``cpu`` and ``runq`` replaced by what its
        process's clocks (:func:`process_times`, ``before`` and ``after``) counted, the
        whole of its busy time sampled; unchanged unless every one of ``pids`` (the
        workers' pids, in the rows' order) was read both times.

        >>> s = Stats(['f'], 1.0, 0.9, 10, 640, [dict(busy=0.5, cpu=0.0, sampled=0.0)])
        >>> timed = s.with_process_times({7: (1.0, 0.0)}, {7: (1.3, 0.0)}, [7])
        >>> s.io_share, round(timed.io_share, 3)      # 0.2 s of 0.5 neither on a CPU nor queued
        (0.0, 0.4)
        """
        if len(pids) != len(self.workers) or not all(p in before and p in after
                                                     for p in pids):
            return self
        workers = []
        for w, pid in zip(self.workers, pids):
            w = dict(w, cpu=after[pid][0] - before[pid][0], runq=after[pid][1] - before[pid][1])
            w['sampled'] = w.get('busy', 0.0)
            workers.append(w)
        return Stats(self.fn_names, self.elapsed_s, self.main_wait_s, self.batches,
                     self.samples, workers, self.cores, self.first_batch_s, self.inline)

    @property
    def variability(self) -> float:
        """Coefficient of variation of the per-task busy time (0: every batch alike)."""
        n = self._sum('batches')
        if n < 2:
            return 0.0
        mean = self.busy_s / n
        var = max(0.0, self._sum('busy_sq') / n - mean * mean)
        return math.sqrt(var) / mean if mean > 0 else 0.0

    def since(self, earlier: 'Stats') -> 'Stats':
        """What happened between ``earlier`` and this snapshot (same loader).

        >>> a = Stats(['f'], 1.0, 0.5, 10, 640)
        >>> b = Stats(['f'], 3.0, 0.6, 30, 1920)
        >>> d = b.since(a); (d.elapsed_s, d.batches, round(d.main_wait_s, 3))
        (2.0, 20, 0.1)
        """
        workers = []
        for i, w in enumerate(self.workers):
            e = earlier.workers[i] if i < len(earlier.workers) else {}
            d = {k: w.get(k, 0.0) - e.get(k, 0.0) for k in WORKER_FIELDS}
            d.update({k: w.get(k, 0.0) for k in netstats.LEVELS})
            d['fns'] = [a - b for a, b in zip(w['fns'], e.get('fns', [0.0] * len(w['fns'])))]
            if 'uss_bytes' in w:
                d['uss_bytes'] = w['uss_bytes']     # memory is a level, not a count
            workers.append(d)
        return Stats(self.fn_names, self.elapsed_s - earlier.elapsed_s,
                     self.main_wait_s - earlier.main_wait_s, self.batches - earlier.batches,
                     self.samples - earlier.samples, workers, self.cores, 0.0, self.inline)

    def as_dict(self) -> dict:
        """Plain numbers for a JSON line, a logger or a dashboard.

        >>> d = Stats(['f'], 2.0, 0.5, 10, 640).as_dict()
        >>> d['samples_per_s'], sorted(d['stages_s'])
        (320.0, ['f', 'other', 'read', 'wait', 'write'])
        """
        rate = (lambda v: v / self.elapsed_s) if self.elapsed_s > 0 else (lambda v: 0.0)
        workers = []
        for w in self.workers:
            w = dict(w)
            w['fns'] = dict(zip(self.fn_names, w['fns']))
            w['samples_per_s'] = rate(w.get('samples', 0.0))
            w['batches_per_s'] = rate(w.get('batches', 0.0))
            workers.append(w)
        return {
            'time': time.time(), 'elapsed_s': self.elapsed_s, 'batches': self.batches,
            'samples': self.samples, 'samples_per_s': rate(self.samples),
            'batches_per_s': rate(self.batches), 'main_wait_s': self.main_wait_s,
            'first_batch_s': self.first_batch_s, 'main_wait_fraction': self.wait_fraction,
            'worker_busy_s': self.busy_s, 'worker_cpu_share': self.cpu_share,
            'worker_io_share': self.io_share,
            'stages_s': self.stages(), 'workers': workers, 'inline': self.inline,
            'cores': self.cores, 'verdict': self.verdict(),
            'remote': netstats.summary(self.workers, self.samples),
        }

    # -- the verdict -----------------------------------------------------

    def workers_needed(self) -> int:
        """Workers that would keep up with the caller: worker-seconds per batch over the
        caller's own time per batch (its step), rounded up; 0 if unknown."""
        per_batch, step = self.worker_s_per_batch, self.step_s
        if per_batch <= 0:
            return 0
        if step <= 0:
            return 1 << 16          # a caller that does nothing: as many as there are
        return max(1, math.ceil(per_batch / step))

    def verdict(self) -> str:
        """One line: is the loader the bottleneck, and if so, where and what would help."""
        if self.batches == 0 or self.elapsed_s <= 0:
            return 'no batches yet'
        waited = self.wait_fraction
        if waited < NOT_BOTTLENECK_FRACTION:
            return f'not the bottleneck: the training step waited {100 * waited:.1f}% of the time'
        stages = {k: v for k, v in self.stages().items() if k != 'wait'}
        busy = sum(stages.values())
        if not self.workers or busy <= 0:
            return (f'input-bound: the training step waited {100 * waited:.0f}% of the time')
        top, top_s = max(stages.items(), key=lambda kv: kv[1])
        where = 'of the time in the training process' if self.inline else 'of worker time'
        head = (f'input-bound: the training step waited {100 * waited:.0f}% of the time; '
                f'{top} is {_pct(top_s, busy):.0f}% {where}')
        if self.inline:
            return f'{head}; workers={max(1, min(self.cores, self.workers_needed()))} would help'
        have = len(self.workers)
        needed = self.workers_needed()
        more = max(1, min(needed, 1 << 10) - have)
        if self.io_share > IO_BOUND_SHARE:
            return (f'{head}; the workers wait on I/O ({100 * self.io_share:.0f}% of their busy '
                    f'time): {more} more worker{"s" if more > 1 else ""} would help, '
                    f'even beyond the {self.cores} cores')
        # The training process needs a core too, for the share of the time it works
        # (it waited the rest): a caller that only waits leaves a core to a worker.
        spare = math.floor(self.cores - have - (1.0 - waited) + 0.5)
        # Cores that are free by count but busy with other processes' work: the
        # workers waited for one (a second worker then only makes both slower).
        queued = self.runq_share
        if spare >= 1 and queued <= CONTENDED_SHARE:
            more = min(more, spare)
            return f'{head}; {more} more worker{"s" if more > 1 else ""} would help'
        why = (f' (the workers waited for one {100 * queued:.0f}% of the time they were '
               f'ready to run)' if queued > CONTENDED_SHARE else '')
        return (f'{head}; the {self.cores} cores are all in use{why}: make {top} cheaper '
                f'or add cores')


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def format_table(stats: Stats) -> str:
    """A plain-text table of the stages (seconds, share of worker time, per sample)
    and the verdict."""
    stages = stats.stages()
    busy_and_wait = sum(stages.values())
    lines = [f"{'stage':<24}{'seconds':>10}{'share':>8}{'us/sample':>12}"]
    for name, t in stages.items():
        per = 1e6 * t / stats.samples if stats.samples else 0.0
        lines.append(f'{name:<24}{t:>10.3f}{_pct(t, busy_and_wait):>7.1f}%{per:>12.1f}')
    rate = stats.samples / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
    who = 'workers=0 (in the training process)' if stats.inline else \
        f'{len(stats.workers)} workers'
    lines.append(f'{who}, {stats.batches} batches, {stats.samples} '
                 f'samples in {stats.elapsed_s:.2f} s ({rate:,.0f} samples/s); the caller '
                 f'waited {stats.main_wait_s:.2f} s ({100 * stats.wait_fraction:.1f}% after '
                 f'the first batch, which took {stats.first_batch_s:.2f} s)')
    uss = [w['uss_bytes'] for w in stats.workers if w.get('uss_bytes') is not None]
    if uss:
        lines.append('worker private memory (USS): '
                     + ', '.join(f'{b / 2**20:.1f}' for b in uss) + ' MiB')
    remote = netstats.summary(stats.workers, stats.samples)
    lines.extend(netstats.lines(remote))
    lines.append(stats.verdict())
    network = netstats.verdict(remote) if stats.wait_fraction >= NOT_BOTTLENECK_FRACTION \
        else None
    if network:
        lines.append(network)
    return '\n'.join(lines)


# -- workers='auto', prefetch='auto' ----------------------------------------------------

AUTO_HEADROOM = 1.25        # workers for 125% of the measured need: room for jitter
AUTO_IO_FACTOR = 4          # at most this many workers per core, for I/O-bound workers
AUTO_MAX_PREFETCH_PER_WORKER = 4


def settle(stats: Stats, batch: int, workers: int | None, prefetch: int | None,
           max_prefetch: int | None = None) -> tuple[int, int, str]:
    """``(workers, prefetch, why)`` for a loader, from what a calibration measured.

    ``stats`` covers the calibration (the first batches after the first, see
    :meth:`Stats.since`); ``workers``/``prefetch`` are the fixed settings, or
    None where they are ``'auto'``. The rule:

    - workers: the worker-seconds one batch takes (busy time per sample
      times ``batch``) over the caller's own time per batch (its step),
      times ``AUTO_HEADROOM``, rounded up: enough workers to keep up, no
      more. A caller that only waits needs as many as there may be. At most
      the cores the process may use, or up to ``AUTO_IO_FACTOR`` times that
      when the workers mostly wait on I/O (more than half their busy time
      blocked: neither on a CPU nor waiting for one, see
      :attr:`Stats.io_share`; more workers than cores then overlap the
      waits). At least 1.
    - prefetch: two batches per worker (one in hand, one queued: no idle
      gap between tasks), plus more for batches whose time varies (``cv``,
      the coefficient of variation of the per-task time):
      ``ceil(workers * (2 + 2 * cv))``, at most ``AUTO_MAX_PREFETCH_PER_WORKER``
      per worker, and at most ``max_prefetch`` (what the shared-memory budget
      holds).

    >>> w = dict(busy=8.0, wait=0.0, read=1.0, write=0.5, batches=100, samples=6400,
    ...          cpu=7.6, busy_sq=0.64, fns=[6.0])
    >>> s = Stats(['decode'], elapsed_s=5.0, main_wait_s=4.0, batches=50, samples=3200,
    ...           workers=[w], cores=8)
    >>> settle(s, batch=64, workers=None, prefetch=None)[:2]
    (5, 10)
    """
    cores = max(1, stats.cores)
    samples = stats._sum('samples')
    per_batch = stats.busy_s / samples * batch if samples else 0.0
    step = stats.step_s
    io = stats.io_share
    cap = cores
    why = [f'{1e3 * per_batch:.1f} ms of worker time per batch, the caller '
           f'{1e3 * step:.1f} ms per batch']
    if io > IO_BOUND_SHARE:
        cap = cores * min(AUTO_IO_FACTOR, math.ceil(1 / max(1 - io, 1 / AUTO_IO_FACTOR)))
        why.append(f'workers blocked on I/O {100 * io:.0f}% of their busy time: up to {cap} '
                   f'workers on {cores} cores')
    else:
        why.append(f'CPU-bound workers: up to the {cores} cores')
    if workers is None:
        if per_batch <= 0:
            workers = cap
        elif step <= 0:
            workers = cap
        else:
            workers = min(cap, max(1, math.ceil(AUTO_HEADROOM * per_batch / step)))
    if prefetch is None:
        cv = stats.variability
        prefetch = min(AUTO_MAX_PREFETCH_PER_WORKER * workers,
                       max(2, math.ceil(workers * (2 + 2 * cv))))
        why.append(f'batch time varies by {100 * cv:.0f}%')
        if max_prefetch is not None and prefetch > max_prefetch:
            prefetch = max(1, max_prefetch)
            why.append('prefetch as the shared-memory budget holds')
    return workers, prefetch, '; '.join(why)
