"""The pool's bookkeeping (ledger.py): tasks out, and what a worker's death makes of them,
driven with made-up exit codes and no process."""

from __future__ import annotations

import pytest

from loadr.workers.ledger import MAX_DEATHS_PER_POSITION, MAX_STARTUP_FAILURES, Ledger, exit_text
from loadr.workers.protocol import READ_ONE_BY_ONE, Failed, Fatal, Lost, Task

pytestmark = pytest.mark.timeout(60)


def sent(ledger, *tasks):
    for task in tasks:
        ledger.sent(ledger.prepare(task))
    return [t.task_id for t in tasks]


def test_exit_codes_read_as_a_signal_or_an_exit_status():
    assert exit_text(2, -9) == 'worker 2 killed by signal 9'
    assert exit_text(0, -11) == 'worker 0 killed by signal 11'
    assert exit_text(1, 1) == 'worker 1 exited with code 1'


def test_an_answered_task_leaves_the_ledger_with_the_header_it_was_sent_with():
    ledger = Ledger('fork')
    sent(ledger, Task(4, 1, 8, 0, 72, 8))
    assert ledger.answered(4) == Task(4, 1, 8, 0, 72, 8)
    assert ledger.answered(4) is None and not ledger.tasks      # a second reply: unknown


def test_the_tasks_of_a_dead_worker_are_lost_the_sample_in_hand_suspected():
    ledger = Ledger('fork')
    ids = sent(ledger, Task(0, 0, 0, 0, 64, 64), Task(1, 1, 0, 0, 128, 64))
    events = ledger.died(0, ids, True, position=70, index=12, why=exit_text(0, -9))
    assert events == [Lost(0), Lost(1)]
    assert ledger.deaths == {70: 1} and not ledger.tasks
    # A position outside the task in hand (the worker was between samples of another
    # task's read ahead) suspects nothing.
    ids = sent(ledger, Task(2, 0, 0, 0, 64, 64))
    assert ledger.died(0, ids, True, 500, 3, exit_text(0, 1)) == [Lost(2)]
    assert ledger.deaths == {70: 1}


def test_a_sample_that_kills_workers_again_and_again_fails_its_task_naming_it():
    ledger = Ledger('fork')
    for k in range(1, MAX_DEATHS_PER_POSITION + 1):
        ids = sent(ledger, Task(10 * k, 0, 0, 0, 64, 64), Task(10 * k + 1, 2, 0, 0, 128, 64))
        events = ledger.died(1, ids, True, 70, 12, exit_text(1, -11))
        if k < MAX_DEATHS_PER_POSITION:
            assert events == [Lost(10 * k), Lost(10 * k + 1)]
    failed, lost = events
    assert (type(failed), failed.task_id, lost) == (Failed, 30, Lost(31))
    f = failed.failure
    assert (f.type_name, f.index, f.position, f.worker) == ('loadr.errors.WorkerError', 12, 70, 1)
    assert f.message == ('dataset index 12 (stream position 70) killed a worker 3 times; '
                         'last: worker 1 killed by signal 11')


def test_a_death_inside_the_batch_read_redoes_that_batch_one_sample_at_a_time():
    ledger = Ledger('fork')
    ids = sent(ledger, Task(0, 0, 0, 0, 64, 64))
    # Position at the task's start, no index in hand: inside the reader's batch read.
    assert ledger.died(0, ids, True, 64, -1, exit_text(0, -9)) == [Lost(0)]
    assert ledger.read_one_by_one == {64} and not ledger.deaths
    again = ledger.prepare(Task(5, 0, 0, 0, 64, 64))
    assert again.flags == READ_ONE_BY_ONE
    assert ledger.prepare(Task(6, 1, 0, 0, 128, 64)).flags == 0     # other batches: as ever
    ledger.sent(again)
    ledger.answered(5)                                              # made, sample by sample
    assert not ledger.read_one_by_one
    assert ledger.prepare(Task(7, 0, 0, 0, 64, 64)).flags == 0


@pytest.mark.parametrize('method,hint', [('fork', False), ('spawn', True)])
def test_workers_that_die_before_starting_end_in_one_fatal_event(method, hint):
    ledger = Ledger(method)
    for k in range(MAX_STARTUP_FAILURES - 1):
        assert ledger.died(k, [], False, -1, -1, exit_text(k, 1)) == []
    ledger.started()                            # a hello in between: counting starts again
    for k in range(MAX_STARTUP_FAILURES - 1):
        assert ledger.died(k, [], False, -1, -1, exit_text(k, 1)) == []
    (fatal,) = ledger.died(0, [], False, -1, -1, exit_text(0, 1))
    assert type(fatal) is Fatal and fatal.failure.worker == 0
    assert fatal.failure.message.startswith(
        f'{MAX_STARTUP_FAILURES} workers died before starting; last: worker 0 exited with code 1')
    assert ("if __name__ == '__main__':" in fatal.failure.message) is hint
