"""The worker loop (worker.py), driven in this process: its steps over plain buffers, and
serve() over a real socket pair, with no worker process."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq

from loadr.assemble import Assembler
from loadr.order import Order
from loadr.spec import OBJECT, infer_spec
from loadr.stats import row_width
from loadr.workers import memory, protocol
from loadr.workers.protocol import Task
from loadr.workers.shm import Layout, StatusCells
from loadr.workers.worker import Link, Steps, WorkerArgs, serve

from ..loader_helpers import noisy, trivial

pytestmark = pytest.mark.timeout(60)

BATCH = 8


def make_steps(data, fns=(noisy,), wid=0, workers=1, slots=2, shuffle=True, on_error='raise',
               init_fn=None, steady_memory=False):
    """The Steps a worker ``wid`` would run, over bytearrays instead of shared memory."""
    spec = infer_spec(Assembler(data, list(fns), None).datapoint(0, 0))
    fields = {k: (d, s) for k, (d, s) in spec.items() if d != OBJECT}
    layout = Layout(fields, BATCH)
    args = WorkerArgs(wid=wid, endpoint='', identity=b'', reader=data, fns=list(fns), spec=spec,
                      layout=layout, slot_specs=[], status_spec={}, owned_dirs=[],
                      parent_pid=0, parent_start=None, n=len(data), shuffle=shuffle,
                      on_error=on_error, workers=workers, steady_memory=steady_memory,
                      init_fn=init_fn)
    status = bytearray(StatusCells.nbytes(workers) + 8 * workers * row_width(len(fns)))
    steps = Steps(args, [bytearray(layout.nbytes) for _ in range(slots)], status)
    steps.cancelled[0] = -1
    steps.progress[0] = steps.progress[1] = -1
    return steps


def expected_rows(data, seed, start, count, fns=(noisy,), shuffle=True):
    """Rows ``start ..`` of seed ``seed``'s stream, made in this process."""
    order = Order(len(data), seed, shuffle)
    spec = infer_spec(Assembler(data, list(fns), None).datapoint(0, 0))
    asm = Assembler(data, list(fns), spec)
    fields = {k: (d, s) for k, (d, s) in spec.items() if d != OBJECT}
    arrays = {k: np.zeros((count, *s), d) for k, (d, s) in fields.items()}
    asm.fill(order, start, count, arrays)
    return arrays


def reply_of(frames):
    kind, fields = protocol.parse(frames[0])
    return kind, fields[0], frames[1:]


def test_a_task_fills_its_rows_of_its_slot_and_replies_done():
    data = trivial(64)
    steps = make_steps(data)
    reply = steps.fill(Task(task_id=3, slot=1, row=2, seed=5, start=16, count=4))
    assert reply_of(reply) == (protocol.DONE, 3, [])       # no list keys: one frame
    want = expected_rows(data, 5, 16, 4)
    for key, view in steps.views[1].items():
        np.testing.assert_array_equal(view[2:6], want[key])
        assert not view[:2].any() and not view[6:].any()    # the other rows are untouched
    assert not any(v.any() for v in steps.views[0].values())
    assert steps.progress[0] == 19                         # the last position in hand


def test_a_cancelled_task_is_answered_empty_and_a_live_one_is_left_to_fill():
    steps = make_steps(trivial(64))
    steps.cancelled[0] = 5
    assert reply_of(steps.skipped(Task(5, 0, 0, 0, 0, BATCH))) == (protocol.DONE, 5, [])
    assert reply_of(steps.skipped(Task(2, 0, 0, 0, 0, BATCH))) == (protocol.DONE, 2, [])
    assert steps.skipped(Task(6, 0, 0, 0, 0, BATCH)) is None


def test_a_failing_init_fn_fails_every_task_with_its_error():
    def init(wid):
        raise RuntimeError(f'no GPU for worker {wid}')

    steps = make_steps(trivial(64), wid=1, workers=2, init_fn=init)
    steps.start()
    for task_id in (0, 1):
        kind, got, rest = reply_of(steps.skipped(Task(task_id, 0, 0, 0, 0, BATCH)))
        failure = protocol.pickle.loads(rest[0])
        assert (kind, got, failure.worker) == (protocol.FAIL, task_id, 1)
        assert failure.message == 'init_fn(1) failed: no GPU for worker 1'
        assert isinstance(failure.exception(), RuntimeError)


def test_a_failing_sample_fails_its_task_naming_its_index_and_position():
    def bad(dp, seed):
        if dp['label'] == 13:
            raise ValueError('thirteen')
        return dp

    steps = make_steps(trivial(64), fns=(bad,), shuffle=False)
    kind, task_id, rest = reply_of(steps.fill(Task(4, 0, 0, 0, 8, BATCH)))
    failure = protocol.pickle.loads(rest[0])
    assert (kind, task_id) == (protocol.FAIL, 4)
    assert (failure.index, failure.position, failure.worker) == (13, 13, 0)
    assert isinstance(failure.exception(), ValueError)


class BatchReads(list):
    """A list with its own batch read, which counts its calls."""

    calls = 0

    def read_batch(self, indices):
        self.calls += 1
        return [self[i] for i in indices]


def test_the_read_one_by_one_flag_bypasses_the_readers_batch_read():
    data = BatchReads(trivial(64))
    steps = make_steps(data)
    steps.fill(Task(0, 0, 0, 1, 0, BATCH))
    assert data.calls == 1
    steps.fill(Task(1, 1, 0, 1, 0, BATCH, flags=protocol.READ_ONE_BY_ONE))
    assert data.calls == 1
    for key, view in steps.views[1].items():                # the same rows either way
        np.testing.assert_array_equal(view, steps.views[0][key])


class ReadsAhead(list):
    """A list that says it reads ahead, and notes the indices it is asked to."""

    prefetches = True

    def __init__(self, items):
        super().__init__(items)
        self.asked = []

    def prefetch(self, indices):
        self.asked.append(indices)


def test_reading_ahead_starts_the_task_in_hand_then_the_live_queued_ones():
    data = ReadsAhead(trivial(64))
    steps = make_steps(data, shuffle=False)
    assert steps.reads_ahead
    steps.cancelled[0] = 1
    queued = [protocol.task(Task(1, 1, 0, 0, 16, 2)),       # cancelled: not read ahead
              protocol.mend(),
              protocol.task(Task(2, 1, 0, 0, 24, 2))]
    steps.read_ahead(Task(0, 0, 0, 0, 8, 2), queued)
    assert data.asked == [[8, 9, 24, 25]]                    # in one call
    steps.fill(Task(0, 0, 0, 0, 8, 2))                      # its reads were started: not again
    assert data.asked == [[8, 9, 24, 25]]


def test_a_queued_task_is_read_ahead_once_however_many_tasks_come_before_it():
    """Three tasks held: the last is queued through two read-aheads, then taken in hand
    and filled; its reads are asked for once (a second ask re-plans every sample's
    ranges and leaves claims on the read-ahead buffer that no read gives back)."""
    data = ReadsAhead(trivial(64))
    steps = make_steps(data, shuffle=False)
    tasks = [Task(k, k, 0, 0, 8 * k, 2) for k in range(4)]
    frames = [protocol.task(t) for t in tasks]
    steps.read_ahead(tasks[0], frames[1:3])
    steps.fill(tasks[0])
    steps.read_ahead(tasks[1], frames[2:4])
    steps.fill(tasks[1])
    steps.read_ahead(tasks[2], frames[3:4])
    steps.fill(tasks[2])
    assert data.asked == [[0, 1, 8, 9, 16, 17], [24, 25]]


def test_an_idle_worker_trims_its_heap_once_after_the_idle_time():
    for steady in (True, False):
        steps = make_steps(trivial(16), steady_memory=steady)
        steps.working()
        steps.waiting()
        assert not steps.trimmed                            # not idle long enough
        steps.last_task -= memory.IDLE_TRIM_S + 1
        steps.waiting()
        assert steps.trimmed is steady                      # only under steady memory


def test_serve_answers_tasks_over_a_socket_until_stop():
    data = trivial(64)
    steps = make_steps(data)
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b'w0')
    router.bind('inproc://tasks')
    dealer.connect('inproc://tasks')
    loop = threading.Thread(target=serve, args=(steps, Link(dealer)))
    try:
        loop.start()
        steps.cancelled[0] = 1
        for frames in (protocol.task(Task(0, 0, 0, 7, 0, BATCH)),     # cancelled once sent
                       protocol.mend(),                              # ignored
                       protocol.task(Task(2, 1, 0, 7, BATCH, BATCH)),
                       protocol.stop()):
            router.send_multipart([b'w0', *frames])
        replies = [router.recv_multipart() for _ in range(2)]
        loop.join(10)
        assert not loop.is_alive()
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()
    assert [(r[0], *reply_of(r[1:])) for r in replies] == [(b'w0', protocol.DONE, 0, []),
                                                           (b'w0', protocol.DONE, 2, [])]
    assert not any(v.any() for v in steps.views[0].values())     # the cancelled task
    want = expected_rows(data, 7, BATCH, BATCH)
    for key, view in steps.views[1].items():
        np.testing.assert_array_equal(view, want[key])
