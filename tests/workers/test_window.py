"""The batch window (window.py): generations, slots, failures, lost workers; over a real
worker pool, and over a scripted pool in this process that checks the invariants at every
step."""

from __future__ import annotations

import contextlib
import gc
import os
import signal

import numpy as np
import pytest

from loadr.assemble import Assembler
from loadr.order import Order
from loadr.spec import OBJECT, infer_spec
from loadr.workers.pool import WorkerPool
from loadr.workers.protocol import Done, Failed, Failure, Fatal, Lost, Task
from loadr.workers.shm import Layout
from loadr.workers.window import (
    LEASED_SLOTS,
    BatchFailed,
    InlineWindow,
    Plan,
    Schedule,
    Window,
    ramp_pieces,
)

from ..loader_helpers import batch_digest, noisy, slowed, trivial

SETTLE_S = 30


@contextlib.contextmanager
def window_over(data, fns=(noisy,), workers=2, prefetch=3, slots=None, ring=False,
                on_error='raise'):
    """A Window over a real WorkerPool of ``workers`` forked processes; closed after."""
    asm = Assembler(data, fns, None)
    spec = infer_spec(asm.datapoint(0, 0))
    fields = {k: (d, s) for k, (d, s) in spec.items() if d != OBJECT}
    list_keys = [k for k, (d, _) in spec.items() if d == OBJECT]
    slots = prefetch + (1 if ring else LEASED_SLOTS) if slots is None else slots
    pool = WorkerPool(data, fns, spec, Layout(fields, 8), workers, slots, len(data), True,
                      on_error, 'fork', None)
    try:
        yield Window(pool, prefetch, workers, list_keys, ring)
    finally:
        pool.close()


def reference(data, schedule, fns=(noisy,), count=None):
    """The digests of a schedule's batches made in this process (InlineWindow)."""
    asm = Assembler(data, fns, None)
    spec = infer_spec(asm.datapoint(0, 0))
    fields = {k: (d, s) for k, (d, s) in spec.items() if d != OBJECT}
    inline = InlineWindow(Assembler(data, fns, spec), fields,
                          lambda seed: Order(len(data), seed))
    gen = inline.begin(schedule)
    out = []
    while count is None or len(out) < count:
        done = inline.next(gen)
        if done is None:
            break
        out.append(digest(done.arrays, done))
    return out


def digest(arrays, done):
    return batch_digest({**{str(k): v for k, v in arrays.items()},
                         **{str(k): v for k, v in done.extras.items()}})


def take_digest(window, gen):
    done = window.next(gen)
    return None if done is None else digest(done.arrays, done)


def assert_all_slots_free(window):
    gc.collect()
    window._reclaim()
    assert window.settle(SETTLE_S)
    census = window.census()
    assert sorted(census) == list(range(len(window.pool.views)))
    assert set(census.values()) == {'free'}, census
    assert not window.writers and not window.let_go


def test_schedules_cover_the_stream_shard_by_shard():
    endless = [Schedule(5, 4, 0, s, 3).plan(2) for s in range(3)]
    assert endless == [Plan(29, 4, 41), Plan(33, 4, 41), Plan(37, 4, 41)]
    epoch = Schedule(0, 5, 0, end=23)
    assert [epoch.plan(j) for j in range(6)] == [
        Plan(0, 5, 5), Plan(5, 5, 10), Plan(10, 5, 15), Plan(15, 5, 20), Plan(20, 3, 23), None]
    assert Schedule(0, 5, 0, end=23, drop_last=True).plan(4) is None


def test_the_last_global_batch_of_an_epoch_is_split_evenly_between_shards():
    # N=41, batch 3, 4 shards: 3 full global batches of 12, then 5 positions
    # left, split 1, 1, 1, 2: every shard makes 4 batches and no position is
    # made twice or lost.
    shards = [Schedule(0, 3, 0, s, 4, end=41) for s in range(4)]
    plans = [[p for j in range(6) if (p := s.plan(j)) is not None] for s in shards]
    assert [len(p) for p in plans] == [4, 4, 4, 4]
    assert [p[-1].count for p in plans] == [1, 1, 1, 2]
    positions = sorted(i for p in plans for plan in p
                       for i in range(plan.start, plan.start + plan.count))
    assert positions == list(range(41))
    # Fewer positions left than shards: some shards get an empty batch, still planned.
    last = [Schedule(0, 3, 0, s, 4, end=38).plan(3) for s in range(4)]
    assert [p.count for p in last] == [0, 1, 0, 1]
    assert all(Schedule(0, 3, 0, s, 4, end=38, drop_last=True).plan(3) is None
               for s in range(4))


def test_a_generation_sees_only_its_own_tasks():
    data = trivial(200)
    first, second = Schedule(0, 8, 3), Schedule(800, 8, 3)
    with window_over(data, fns=[slowed(0.002)], prefetch=4) as window:
        g1 = window.begin(first)
        assert take_digest(window, g1) is not None     # batches 1-4 are now in flight
        g2 = window.begin(second)
        assert g2 != g1 and window.live(g2) and not window.live(g1)
        with pytest.raises(RuntimeError, match='stale'):
            window.next(g1)
        got = [take_digest(window, g2) for _ in range(12)]
        window.end(g2)
        assert not window.live(g2)
        assert_all_slots_free(window)
    assert got == reference(data, second, fns=[slowed(0)], count=12)


def test_generations_left_quickly_one_after_another_mix_nothing():
    # Every begin() leaves tasks in flight behind; the replies that come in
    # for them later must neither fill the new generation's batches nor leak
    # their slots.
    data = trivial(300)
    with window_over(data, fns=[slowed(0.001)], prefetch=3) as window:
        for step in range(0, 400, 40):
            gen = window.begin(Schedule(step, 8, 1))
            take_digest(window, gen)
        last = Schedule(1000, 8, 1)
        gen = window.begin(last)
        got = [take_digest(window, gen) for _ in range(10)]
        window.reset()
        assert_all_slots_free(window)
    assert got == reference(data, last, fns=[slowed(0)], count=10)


def test_lent_batches_come_back_when_dropped_and_copies_beyond_that():
    data = trivial(100)
    with window_over(data, prefetch=2) as window:
        gen = window.begin(Schedule(0, 8, 2))
        kept = [window.next(gen).arrays for _ in range(LEASED_SLOTS + 2)]
        owned = [a['vec'].flags.owndata for a in kept]
        assert owned == [False] * LEASED_SLOTS + [True, True]
        assert set(window.census().values()) >= {'lent'}
        del kept
        gc.collect()
        arrays = window.next(gen).arrays      # polls the lent slots: both come back
        assert list(window.census().values()).count('lent') == 1
        del arrays
        window.reset()
        assert_all_slots_free(window)


def test_ring_mode_holds_one_slot_until_the_next_call():
    data = trivial(100)
    with window_over(data, prefetch=2, ring=True) as window:
        gen = window.begin(Schedule(0, 8, 2))
        window.next(gen)
        held = window.held
        assert window.census()[held] == 'held'
        window.next(gen)
        assert list(window.census().values()).count('held') == 1
        assert held not in window.lent
        window.reset()
        assert window.held is None
        assert_all_slots_free(window)


def test_a_failed_batch_raises_when_due_and_leaves_the_generation():
    def fail_at_20(dp, seed):
        if dp['label'] == 20:
            raise ValueError('bad sample')
        return noisy(dp, seed)

    data = trivial(100)
    with window_over(data, fns=[fail_at_20], prefetch=4) as window:
        gen = window.begin(Schedule(0, 8, 0))
        # Shuffled order: find the batch that holds index 20.
        bad = int(np.flatnonzero(Order(100, 0).indices(0, 96) == 20)[0]) // 8
        for _ in range(bad):
            assert window.next(gen) is not None
        with pytest.raises(BatchFailed) as info:
            window.next(gen)
        assert info.value.failure.index == 20
        assert not window.live(gen)
        assert_all_slots_free(window)


def test_the_task_of_a_killed_worker_is_sent_again():
    data = trivial(400)
    schedule = Schedule(0, 8, 4)
    with window_over(data, fns=[slowed(0.002)], prefetch=3) as window:
        gen = window.begin(schedule)
        got = []
        for k in range(20):
            if k in (2, 9):
                os.kill(window.pool.pids[k % 2], signal.SIGKILL)
            got.append(take_digest(window, gen))
        assert window.pool.restarts >= 2
        window.reset()
        assert_all_slots_free(window)
    assert got == reference(data, schedule, fns=[slowed(0)], count=20)


def test_an_epoch_schedule_ends_and_empty_batches_take_no_slot():
    data = trivial(38)
    schedule = Schedule(0, 3, 1, shard_id=0, num_shards=4, end=38)
    with window_over(data, prefetch=3) as window:
        gen = window.begin(schedule)
        counts = []
        while (done := window.next(gen)) is not None:
            counts.append(done.plan.count)
            assert len(done.arrays['vec']) == done.plan.count
        assert counts == [3, 3, 3, 0]
        window.end(gen)
        assert_all_slots_free(window)


def test_settle_waits_for_stale_tasks():
    data = trivial(100)
    with window_over(data, fns=[slowed(0.01)], prefetch=3) as window:
        gen = window.begin(Schedule(0, 8, 0))
        window.next(gen)                      # the next batches are now in flight
        assert window.tasks
        window.end(gen)
        assert window.settle(SETTLE_S)
        assert not window.tasks


def test_ramp_pieces_halve_from_the_worker_count_down_to_whole_batches():
    assert [ramp_pieces(16, j) for j in range(7)] == [16, 8, 4, 2, 1, 1, 1]
    assert [ramp_pieces(6, j) for j in range(4)] == [6, 3, 1, 1]
    assert [ramp_pieces(2, j) for j in range(3)] == [2, 1, 1]
    assert [ramp_pieces(1, j) for j in range(3)] == [1, 1, 1]
    assert ramp_pieces(16, 10**6) == 1


def test_the_first_batches_are_split_and_made_the_same_as_in_one_process():
    # 8 workers: batches 0, 1, 2 in 8, 4 and 2 tasks, then one task a batch;
    # restarted at another step, the ramp starts again.
    data = trivial(700)
    with window_over(data, fns=[slowed(0.001)], workers=8, prefetch=16) as window:
        for step0 in (0, 37):
            schedule = Schedule(step0, 8, 5)        # the layout holds 8 rows
            first_task = window.next_task_id
            gen = window.begin(schedule)
            got = [take_digest(window, gen) for _ in range(12)]
            made = window.next_task_id - first_task
            assert made == sum(ramp_pieces(8, j) for j in range(window.j_send)), made
            assert got == reference(data, schedule, fns=[slowed(0)], count=12)
            window.end(gen)
        assert_all_slots_free(window)


def test_a_worker_is_given_one_task_at_a_time_until_every_worker_has_started():
    data = trivial(100)
    with window_over(data, workers=3) as window:
        pool = window.pool
        assert pool.depth == 1 and pool.max_tasks > 1
        gen = window.begin(Schedule(0, 4, 0))
        take_digest(window, gen)
        while not all(w.started for w in pool.workers):
            pool.poll(50)
        assert pool.depth == pool.max_tasks


# -- a scripted pool: the invariants at every step, with no process and no timing ------------

class ScriptedPool:
    """A pool in this process, for the window: a task is kept when submitted, and answered
    at the next poll, where it writes its stream positions into its rows (a worker's
    work, exactly checkable) unless the test held it back, scripted another event for
    it, or cancelled it (answered empty, as a worker does). Every poll first checks the
    window's invariants."""

    def __init__(self, slots=5, capacity=4, batch=8):
        self.layout = Layout({'label': (np.dtype(np.int64), ())}, batch)
        self.slot_count = slots
        self.buffers = [np.zeros(self.layout.nbytes, np.uint8) for _ in range(slots)]
        self.views = [self.layout.views(b) for b in self.buffers]
        self.capacity = capacity        # tasks out at once
        self.out: dict[int, Task] = {}  # submitted, not answered yet
        self.held: set[int] = set()     # task ids not answered until released
        self.script: dict[int, list] = {}   # task id -> events to answer it with, in turn
        self.queued: list = []              # events for the next poll, before any answer
        self.cancelled = -1
        self.sent: list[Task] = []
        self.window = None
        self.polls = 0

    def can_submit(self) -> bool:
        return len(self.out) < self.capacity

    def submit(self, header: Task) -> bool:
        if len(self.out) >= self.capacity:
            return False
        assert header.task_id not in self.out, 'a task sent twice at once'
        self.out[header.task_id] = header
        self.sent.append(header)
        return True

    def cancel(self, upto: int) -> None:
        self.cancelled = max(self.cancelled, upto)

    def fresh_views(self, slot):
        owner = np.frombuffer(self.buffers[slot], dtype=np.uint8)
        return owner, self.layout.views(owner)

    def answer(self, header: Task):
        scripted = self.script.get(header.task_id)
        if scripted:
            return scripted.pop(0)
        if header.task_id > self.cancelled:
            rows = self.views[header.slot]['label'][header.row:header.row + header.count]
            rows[:] = np.arange(header.start, header.start + header.count)
        return Done(header.task_id, {}, [])

    def poll(self, timeout_ms: int) -> list:
        self.polls += 1
        assert self.polls < 10_000, 'the window waits for nothing'
        check(self.window)
        events, self.queued = self.queued, []
        return events + [self.answer(self.out.pop(tid)) for tid in sorted(self.out, reverse=True)
                         if tid not in self.held]


def check(window) -> None:
    """The window's invariants (see its module docstring)."""
    census = window.census()                # raises if a slot is in two places
    assert sorted(census) == list(range(window.pool.slot_count)), census
    writers: dict = {}
    for task in window.tasks.values():
        writers[task.header.slot] = writers.get(task.header.slot, 0) + 1
        if task.gen != window.gen:          # stale: cancelled, its slot let go
            assert task.header.task_id <= window.pool.cancelled
            assert census[task.header.slot] == 'let go'
    assert writers == window.writers
    for slot in window.let_go:
        assert slot in window.writers       # freed by its last writer, not before
    assert set(window.pool.out) <= set(window.tasks)


def assert_all_free(window) -> None:
    """Once the stale tasks have ended (answered at the next poll), every slot is free."""
    gc.collect()
    window._reclaim()
    assert window.settle(1)
    check(window)
    assert set(window.census().values()) == {'free'} and not window.tasks


def scripted(workers=2, prefetch=3, slots=None, ring=False, capacity=4):
    slots = prefetch + (1 if ring else LEASED_SLOTS) if slots is None else slots
    pool = ScriptedPool(slots, capacity)
    pool.window = Window(pool, prefetch, workers, [], ring)
    return pool.window


def positions(done) -> list:
    return done.arrays['label'].tolist()


def test_scripted_batches_come_whole_and_in_order_whatever_the_order_of_replies():
    window = scripted(workers=4, prefetch=3)
    gen = window.begin(Schedule(0, 8, 0))
    got = [positions(window.next(gen)) for _ in range(6)]
    assert got == [list(range(8 * j, 8 * j + 8)) for j in range(6)]
    # The first batches after a start are split between the workers (ramp_pieces).
    pieces = [sum(1 for t in window.pool.sent if t.start // 8 == j) for j in range(3)]
    assert pieces == [4, 2, 1]
    window.reset()
    assert_all_free(window)


def test_scripted_a_stale_reply_fills_nothing_and_its_slot_is_freed_by_its_last_task():
    window = scripted(workers=2, prefetch=3)
    pool = window.pool
    g1 = window.begin(Schedule(0, 8, 0))
    pool.held = {0, 1}                      # batch 0's two halves: not answered yet
    window._fill()
    stale_slot = window.tasks[0].header.slot
    g2 = window.begin(Schedule(800, 8, 0))  # g1's tasks are stale now
    assert window.census()[stale_slot] == 'let go'
    assert pool.cancelled >= max(t.task_id for t in pool.sent)
    assert positions(window.next(g2)) == list(range(800, 808))
    assert window.census()[stale_slot] == 'let go'      # its writers are still out
    pool.held = {1}
    window.next(g2)
    assert window.census()[stale_slot] == 'let go'      # one of two ended
    pool.held = set()
    got = [positions(window.next(g2)) for _ in range(4)]
    assert got == [list(range(800 + 8 * j, 808 + 8 * j)) for j in range(2, 6)]
    assert 0 not in window.tasks and 1 not in window.tasks
    assert not window.live(g1)
    window.reset()
    assert_all_free(window)


def test_scripted_a_lost_task_is_sent_again_and_its_batch_made_whole():
    window = scripted(workers=2, prefetch=3)
    pool = window.pool
    pool.script = {1: [Lost(1)], 4: [Lost(4), Lost(4)]}
    gen = window.begin(Schedule(0, 8, 0))
    got = [positions(window.next(gen)) for _ in range(5)]
    assert got == [list(range(8 * j, 8 * j + 8)) for j in range(5)]
    assert [t.task_id for t in pool.sent].count(1) == 2
    assert [t.task_id for t in pool.sent].count(4) == 3
    window.reset()
    assert_all_free(window)


def test_scripted_a_failed_batch_raises_when_due_after_the_batches_before_it():
    window = scripted(workers=1, prefetch=4)
    pool = window.pool
    failure = Failure('builtins.ValueError', 'bad', '', 17, 17, 0)
    pool.script = {2: [Failed(2, failure)]}
    gen = window.begin(Schedule(0, 8, 0))
    assert positions(window.next(gen)) == list(range(0, 8))
    assert positions(window.next(gen)) == list(range(8, 16))
    with pytest.raises(BatchFailed) as info:
        window.next(gen)
    assert info.value.failure is failure
    assert not window.live(gen)
    window.reset()
    assert_all_free(window)


def test_scripted_a_fatal_event_raises_at_once_and_leaves_the_generation():
    window = scripted()
    pool = window.pool
    failure = Failure('loadr.errors.WorkerError', 'workers died before starting', '', None,
                      None, 0)
    pool.queued = [Fatal(failure)]
    pool.held = set(range(100))             # (a real pool that cannot start answers nothing)
    gen = window.begin(Schedule(0, 8, 0))
    with pytest.raises(BatchFailed) as info:
        window.next(gen)
    assert info.value.failure is failure and not window.live(gen)
    pool.held = set()
    window.reset()
    assert_all_free(window)


def test_scripted_a_task_the_pool_refuses_is_sent_once_a_worker_can_take_it():
    window = scripted(workers=4, prefetch=2, capacity=3)
    pool = window.pool
    real = pool.can_submit
    pool.can_submit = lambda: True          # the pool said yes, then refused (a worker died)
    gen = window.begin(Schedule(0, 8, 0))
    window._fill()
    assert window.resend                    # batch 0's 4th piece and more: refused
    pool.can_submit = real
    got = [positions(window.next(gen)) for _ in range(4)]
    assert got == [list(range(8 * j, 8 * j + 8)) for j in range(4)]
    assert not window.resend
    window.reset()
    assert_all_free(window)


def test_scripted_ring_mode_and_lent_batches_keep_every_slot_in_one_place():
    for ring in (True, False):
        window = scripted(workers=2, prefetch=2, ring=ring)
        gen = window.begin(Schedule(0, 8, 0))
        kept = []
        for j in range(8):
            done = window.next(gen)
            assert positions(done) == list(range(8 * j, 8 * j + 8))
            kept.append(done.arrays)
            check(window)
            if j == 4:
                kept.clear()                # lent slots come back once dropped
                gc.collect()
        window.reset()
        del kept, done
        assert_all_free(window)


def test_both_pools_offer_what_the_protocol_names():
    from loadr.workers.pools import Pool, SlotPool

    assert isinstance(ScriptedPool(), SlotPool)
    data = trivial(20)
    with window_over(data, workers=1) as window:
        assert isinstance(window.pool, Pool)
        assert isinstance(window.pool, SlotPool)
