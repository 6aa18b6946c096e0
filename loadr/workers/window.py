"""The batch window: which batches are being made, where, and for which iteration.

The Loader hands the window a :class:`Schedule` (the batches of one
iteration, from a start step) and asks for its batches one by one, in
order. The window keeps up to ``prefetch`` of them in flight in the worker
pool, each in its own shared-memory slot, joins the parts of a batch made by
several workers, and hands the slots out (lent, held or copied) when their
batch is due. :class:`InlineWindow` is the same contract with no workers:
each batch is made in this process when it is asked for.

Invariants (everything below keeps them; tests/workers/test_window.py checks them):

- A *generation* is one run of one schedule. :meth:`Window.begin` makes a new
  one and returns its number; only the newest is *live*. Each iteration owns
  the number it was given and is never handed another: when it finds its
  generation no longer live (another iterator began, or the loader was moved
  with ``load()``), it begins a new one itself, from the loader's step.
- A task is *stale* when its generation is not live. Its reply is dropped, so
  a batch is only ever made of replies to its own generation's tasks. Stale
  tasks are cancelled in the workers at once (task ids grow, so one number,
  the newest stale id, cancels them all and never a live one).
- Every slot is in exactly one place: free; *written* (tasks in flight fill
  it); *finished* (its batch waits to be handed out); *held* (ring mode: the
  caller's view until the next call); *lent* (a weak reference to the
  caller's arrays); or *let go* (its generation was left while tasks still
  write into it). Who frees it: the last task to end frees a let-go slot (a
  worker may still be writing until it replies); leaving a generation frees
  its finished slots and lets go of its written ones; the next call frees a
  held slot; polling the weak reference frees a lent one, once the caller
  has dropped every array of that batch; a copied batch frees its slot at
  once.

Example::

    window = Window(pool, prefetch=4, workers=2, list_keys=[], ring=False)
    gen = window.begin(Schedule(step0=0, batch=64, seed=0))
    done = window.next(gen)         # a Finished batch, or None past the end
    done.arrays                     # {key: array of done.plan.count rows}
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..errors import SampleFailure
from . import protocol
from .pools import Event, SlotPool

__all__ = ['ramp_pieces', 'Plan', 'Schedule', 'Task', 'Pending', 'Finished', 'BatchFailed',
           'Window', 'InlineWindow', 'POLL_MS', 'LEASED_SLOTS']

POLL_MS = 50
# Batches the caller may hold at once that are lent from shared memory, not
# copied; a training loop holds one (the last) while asking for the next.
LEASED_SLOTS = 2


def ramp_pieces(workers: int, j: int) -> int:
    """How many tasks batch ``j`` after a (re)start is split into, between ``workers``.

    The first batch is split between all the workers, so it comes after
    1/workers of a batch's time; the next ones between half as many, a
    quarter, ... while that is at least two; then each batch is one task.
    Whole batches alone would start every worker at once and end them at
    once: the second batch would come a whole batch's time after the first
    (0.15 s with 16 workers). Halving instead lets them come 2, 4, 8, ...
    units apart (a unit: a batch's time / workers) and leaves the workers out
    of step, so the whole batches after them come in smaller groups. The
    cost, once per start: a few more tasks, and workers that end their share
    at different times (with 16 workers the 64th batch comes ~6 units later).
    ``benchmarks/ramp.py`` measures both.

    >>> [ramp_pieces(16, j) for j in range(6)], [ramp_pieces(2, j) for j in range(3)]
    ([16, 8, 4, 2, 1, 1], [2, 1, 1])
    """
    if j == 0:
        return max(1, workers)
    share = workers >> j if j < workers.bit_length() else 0
    return share if share >= 2 else 1


class Plan(NamedTuple):
    """One batch of a schedule: ``count`` positions from ``start``; then the stream is at
    ``next_step``."""

    start: int
    # A field named like tuple.count: mypy flags the shadowing; reads give the int.
    count: int  # type: ignore[assignment]
    next_step: int


class Schedule(NamedTuple):
    """The batches of one iteration: global batches from ``step0`` on, this shard's part of each.

    ``end`` is the first position after the epoch (None: the endless
    stream). A global batch covers ``B*S`` positions (``S = num_shards``);
    shard ``s`` takes positions ``[s*B, (s+1)*B)`` of it. The last global
    batch of an epoch, with ``left < B*S`` positions, is split evenly: shard
    ``s`` takes ``[left*s//S, left*(s+1)//S)``, so every shard yields the same
    number of batches (one may be short, or empty when ``left < S``). With
    ``drop_last`` that batch is not made, on any shard.

    >>> s = Schedule(step0=0, batch=3, seed=0, shard_id=3, num_shards=4, end=41)
    >>> s.plan(0), s.plan(3), s.plan(4)
    (Plan(start=9, count=3, next_step=12), Plan(start=39, count=2, next_step=41), None)
    """

    step0: int
    batch: int
    seed: int
    shard_id: int = 0
    num_shards: int = 1
    end: int | None = None
    drop_last: bool = False

    def plan(self, j: int) -> Plan | None:
        """Batch ``j`` of this schedule, or None when the epoch is over."""
        size = self.batch * self.num_shards
        g = self.step0 + j * size
        if self.end is None or g + size <= self.end:
            return Plan(g + self.shard_id * self.batch, self.batch, g + size)
        left = self.end - g
        if left <= 0 or self.drop_last:
            return None
        # The last, partial global batch: split evenly, so every shard makes
        # the same number of batches.
        lo = left * self.shard_id // self.num_shards
        hi = left * (self.shard_id + 1) // self.num_shards
        return Plan(g + lo, hi - lo, self.end)


class Task(NamedTuple):
    """One part of batch ``j`` of generation ``gen``: ``header`` is what the pool sends
    (fill ``count`` rows of ``slot`` from ``row`` on with positions ``start ..``)."""

    gen: int
    j: int
    header: protocol.Task


@dataclass(slots=True)
class Pending:
    """A batch being made: by one task, or (the first after a start) by several."""

    plan: Plan
    slot: int
    left: int                                    # its tasks still in flight
    pieces: dict = field(default_factory=dict)   # first row -> (extras, replaced)
    failure: protocol.Failure | None = None

    def merged(self, list_keys: list) -> tuple[dict, list]:
        """The list keys' values and the replaced indices, in row order."""
        if len(self.pieces) == 1:
            return next(iter(self.pieces.values()))
        extras: dict[str, list] = {k: [] for k in list_keys}
        replaced: list = []
        for row in sorted(self.pieces):
            piece_extras, piece_replaced = self.pieces[row]
            for k in list_keys:
                extras[k].extend(piece_extras.get(k, ()))
            replaced.extend(piece_replaced)
        return extras, replaced


@dataclass(slots=True)
class Finished:
    """A batch made: waiting in the window, then handed out by ``next()`` with its arrays."""

    plan: Plan
    slot: int | None            # None: no slot (an empty batch, or made in this process)
    extras: dict                # list key -> values, in row order
    replaced: list              # (index, position, reason) replaced under on_error='skip'
    arrays: dict | None = None  # its arrays, once handed out by next()


class BatchFailed(Exception):
    """A batch could not be made; ``failure`` says where and why, ``exc`` is the original
    exception when it was raised in this process."""

    def __init__(self, failure: protocol.Failure, exc: BaseException | None = None):
        super().__init__(failure.message)
        self.failure, self.exc = failure, exc


class _Generations:
    """Generation bookkeeping shared by both windows."""

    def __init__(self):
        self.gen = 0                    # the live generation; 0: none yet
        self.schedule: Schedule | None = None

    def _live_schedule(self) -> Schedule:
        """The live generation's schedule (a batch is only asked of the live one)."""
        assert self.schedule is not None, 'no generation is live: begin() first'
        return self.schedule

    def live(self, gen: int) -> bool:
        """Whether generation ``gen`` is still the one being made."""
        return gen == self.gen

    def begin(self, schedule: Schedule) -> int:
        """Start a new generation that makes ``schedule``; every older one is stale now."""
        self.reset()
        self.schedule = schedule
        return self.gen

    def reset(self) -> None:
        """Leave the live generation (load(), an iteration's end): none is live after."""
        self._leave()
        self.gen += 1
        self.schedule = None

    def end(self, gen: int) -> None:
        """An iteration stops: if its generation is still live, leave it."""
        if gen == self.gen:
            self.reset()

    def _leave(self) -> None:
        pass


class InlineWindow(_Generations):
    """``workers=0``: every batch is made in this process, when it is asked for.

    ``make_order(seed)`` gives the order to read through (kept while the seed is the same).
    """

    def __init__(self, assembler, fields: dict, make_order):
        super().__init__()
        self.asm = assembler
        self.fields = fields            # array key -> (dtype, shape)
        self.make_order = make_order
        self.order: object = None           # make_order(order_seed), once made
        self.order_seed: int | None = None
        self.j = 0

    def begin(self, schedule: Schedule) -> int:
        gen = super().begin(schedule)
        self.j = 0
        if self.order is None or self.order_seed != schedule.seed:
            self.order, self.order_seed = self.make_order(schedule.seed), schedule.seed
        return gen

    def next(self, gen: int) -> Finished | None:
        """Batch after batch of generation ``gen``'s schedule; None past its end.

        Each batch's arrays are made for it alone: the caller's to keep."""
        plan = self._live_schedule().plan(self.j)
        if plan is None:
            return None
        self.j += 1
        arrays = {k: np.empty((plan.count, *s), d) for k, (d, s) in self.fields.items()}
        if not plan.count:
            return Finished(plan, None, {k: [] for k in self.asm.list_keys}, [], arrays)
        try:
            extras, replaced = self.asm.fill(self.order, plan.start, plan.count, arrays)
        except SampleFailure as f:
            self.reset()
            raise BatchFailed(protocol.Failure.capture(f.exc, f.index, f.position, None,
                                                       f.traceback), f.exc) from None
        return Finished(plan, None, extras, replaced, arrays)

class Window(_Generations):
    """Batches made by the worker pool, ``prefetch`` ahead (see the module docstring).

    The window uses every slot of the pool (``pool.slot_count``); any
    :class:`~loadr.workers.pools.SlotPool` will do.
    """

    def __init__(self, pool: SlotPool, prefetch: int, workers: int, list_keys: list, ring: bool):
        super().__init__()
        self.pool = pool
        self.prefetch, self.workers, self.ring = prefetch, workers, ring
        self.list_keys = list(list_keys)
        slots = pool.slot_count
        self.free: list[int] = list(range(slots))
        self.tasks: dict[int, Task] = {}        # task id -> task, in flight, any generation
        self.writers: dict[int, int] = {}       # slot -> tasks in flight writing into it
        self.let_go: set[int] = set()           # slots to free once their writers end
        self.held: int | None = None            # ring mode: the slot the caller looks at
        # Lent slots -> a weak reference to the array every view of that batch
        # hangs from. Polled, not called back: a finaliser could swallow a
        # Ctrl-C that lands in it, and run in any thread.
        self.lent: dict[int, weakref.ref] = {}
        self.next_task_id = 0
        # The live generation's batches, by their number j in its schedule.
        self.pending: dict[int, Pending] = {}
        self.finished: dict[int, Finished] = {}
        self.failures: dict[int, protocol.Failure] = {}  # raised when batch j is due
        self.resend: list[int] = []             # its task ids whose worker died
        self.j_send = self.j_next = 0

    # -- generations ---------------------------------------------------------

    def begin(self, schedule: Schedule) -> int:
        gen = super().begin(schedule)
        self.j_send = self.j_next = 0
        return gen

    def _leave(self) -> None:
        for done in self.finished.values():
            if done.slot is not None:
                self.free.append(done.slot)
        self.finished.clear()
        for tid in self.resend:                 # in no worker's hands: they end here
            self._end_task(tid)
        self.resend.clear()
        for p in self.pending.values():
            self._let_go_of(p.slot)
        self.pending.clear()
        self.failures.clear()
        if self.held is not None:
            self.free.append(self.held)
            self.held = None
        # Batches being made for the generation left would only delay the next
        # one: the workers drop them (see WorkerPool.cancel).
        if self.tasks:
            self.pool.cancel(max(self.tasks))

    # -- slots -----------------------------------------------------------------

    def _end_task(self, tid: int) -> Task:
        task = self.tasks.pop(tid)
        slot = task.header.slot
        self.writers[slot] -= 1
        if not self.writers[slot]:
            del self.writers[slot]
            if slot in self.let_go:
                self.let_go.discard(slot)
                self.free.append(slot)
        return task

    def _let_go_of(self, slot: int) -> None:
        if slot in self.writers:
            self.let_go.add(slot)           # freed by the last of its tasks to end
        else:
            self.free.append(slot)

    def _reclaim(self) -> None:
        if self.held is not None:
            self.free.append(self.held)
            self.held = None
        for slot, owner in list(self.lent.items()):
            if owner() is None:
                del self.lent[slot]
                self.free.append(slot)

    def census(self) -> dict[int, str]:
        """Where each slot is (free, written, finished, held, lent, let go); for tests."""
        where: dict[int, str] = {}

        def put(slot: int, place: str) -> None:
            if slot in where:
                raise AssertionError(f'slot {slot} is {where[slot]} and {place}')
            where[slot] = place

        for slot in self.free:
            put(slot, 'free')
        for slot in self.let_go:
            put(slot, 'let go')
        for p in self.pending.values():
            put(p.slot, 'written')
        for done in self.finished.values():
            if done.slot is not None:
                put(done.slot, 'finished')
        if self.held is not None:
            put(self.held, 'held')
        for slot in self.lent:
            put(slot, 'lent')
        return where

    # -- making batches ----------------------------------------------------------

    def _submit(self, j: int, plan: Plan) -> None:
        pieces = min(ramp_pieces(self.workers, j), plan.count)
        slot = self.free.pop()
        self.pending[j] = Pending(plan, slot, pieces)
        seed, writers = self._live_schedule().seed, self.writers
        for k in range(pieces):
            row = plan.count * k // pieces
            rows = plan.count * (k + 1) // pieces - row
            tid = self.next_task_id
            self.next_task_id += 1
            header = protocol.Task(tid, slot, row, seed, plan.start + row, rows)
            # A task and its count as a writer go in together (a Ctrl-C between
            # two tasks leaves no slot counted for a task that was never made).
            self.tasks[tid] = Task(self.gen, j, header)
            writers[slot] = writers.get(slot, 0) + 1
            if not self.pool.submit(header):
                self.resend.append(tid)

    def _fill(self) -> None:
        pool = self.pool
        while self.resend and pool.can_submit():
            if not pool.submit(self.tasks[self.resend[0]].header):
                break
            self.resend.pop(0)
        while self.free and self.j_send < self.j_next + self.prefetch and pool.can_submit():
            plan = self._live_schedule().plan(self.j_send)
            if plan is None:
                break
            if plan.count:
                self._submit(self.j_send, plan)
            else:
                self.finished[self.j_send] = Finished(plan, None,
                                                      {k: [] for k in self.list_keys}, [])
            self.j_send += 1

    def _on_event(self, event: Event) -> None:
        """Take one of the pool's events (protocol.Done, Failed, Lost or Fatal)."""
        if isinstance(event, protocol.Fatal):
            self.reset()
            raise BatchFailed(event.failure)
        tid = event.task_id
        task = self.tasks.get(tid)
        if task is None:
            return
        if isinstance(event, protocol.Lost) and task.gen == self.gen:
            self.resend.append(tid)             # the same part again, to another worker
            return
        self._end_task(tid)
        if task.gen != self.gen:
            return                              # stale: its slot was let go when it was left
        p = self.pending[task.j]
        if isinstance(event, protocol.Done):
            p.pieces[task.header.row] = (event.extras, event.replaced)
        elif p.failure is None:
            assert isinstance(event, protocol.Failed)   # a live generation's Lost is resent above
            p.failure = event.failure
        p.left -= 1
        if p.left:
            return
        del self.pending[task.j]
        if p.failure is not None:
            self.free.append(p.slot)            # every part has ended
            self.failures[task.j] = p.failure
        else:
            self.finished[task.j] = Finished(p.plan, p.slot, *p.merged(self.list_keys))

    def next(self, gen: int) -> Finished | None:
        """The next batch of generation ``gen`` (the live one), in order, with its arrays
        (see :meth:`_hand_out`); None past the end of its schedule.

        Raises :class:`BatchFailed` when that batch failed: only then, so the
        batches before it are all handed out first.
        """
        if gen != self.gen:
            raise RuntimeError(f'generation {gen} is stale (live: {self.gen})')
        while True:
            self._reclaim()
            self._fill()
            j = self.j_next
            if j in self.failures:
                failure = self.failures.pop(j)
                self.reset()                    # the window is left with the error
                raise BatchFailed(failure)
            done = self.finished.pop(j, None)
            if done is not None:
                self.j_next += 1
                done.arrays = self._hand_out(done)
                return done
            if self._live_schedule().plan(j) is None:
                return None
            for event in self.pool.poll(POLL_MS):
                self._on_event(event)

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every stale task to end; True if none is left.

        Replies to the live generation that arrive meanwhile are kept for :meth:`next`.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            stale = any(t.gen != self.gen for t in self.tasks.values())
            if not stale or time.monotonic() >= deadline:
                return not stale
            for event in self.pool.poll(POLL_MS):
                self._on_event(event)

    def _hand_out(self, done: Finished) -> dict:
        """The arrays of a finished batch, ``done.plan.count`` rows each.

        Ring mode: views of the slot, valid until the next call. Otherwise
        lent (the slot comes back once the caller has dropped every array of
        the batch) while the caller holds fewer than ``LEASED_SLOTS`` lent
        batches, else copied, so the prefetch window never shrinks under a
        caller that keeps its batches.
        """
        count, slot = done.plan.count, done.slot
        if slot is None:
            return {k: np.empty((0, *s), d) for k, (d, s, _) in self.pool.layout.fields.items()}
        full = count == self.pool.layout.batch
        if self.ring:
            self.held = slot
            views = self.pool.views[slot]
            return dict(views) if full else {k: v[:count] for k, v in views.items()}
        if len(self.lent) < LEASED_SLOTS:
            owner, views = self.pool.fresh_views(slot)
            self.lent[slot] = weakref.ref(owner)
            return views if full else {k: v[:count] for k, v in views.items()}
        arrays = {k: v[:count].copy() for k, v in self.pool.views[slot].items()}
        self.free.append(slot)
        return arrays
