"""The pool's bookkeeping: which tasks are out, and what a worker's death means for them.

No processes and no sockets here: :class:`~loadr.workers.pool.WorkerPool`
records each task it sends and each reply, and when a worker dies it hands
over what it knows (the worker's tasks in the order sent, the stream
position and dataset index that worker had in hand, why it died); the
ledger says which events follow. A test drives it with made-up exit codes.

Example::

    ledger = Ledger('fork')
    ledger.sent(Task(task_id=0, slot=0, row=0, seed=0, start=64, count=64))
    ledger.died(0, [0], True, position=70, index=12, why=exit_text(0, -9))
    # [Lost(task_id=0)]: sample 70 is suspected once; at the third death, Failed
"""

from __future__ import annotations

from .protocol import READ_ONE_BY_ONE, Failed, Failure, Fatal, Lost, Task

__all__ = ['Ledger', 'exit_text', 'MAX_DEATHS_PER_POSITION', 'MAX_STARTUP_FAILURES']

MAX_DEATHS_PER_POSITION = 3
MAX_STARTUP_FAILURES = 3          # workers dying before they say hello: give up, say why


def exit_text(wid: int, code: int) -> str:
    """Why worker ``wid`` is gone, from its exit code (negative: the signal that ended it).

    >>> exit_text(1, -9), exit_text(0, 3)
    ('worker 1 killed by signal 9', 'worker 0 exited with code 3')
    """
    how = f'killed by signal {-code}' if code < 0 else f'exited with code {code}'
    return f'worker {wid} {how}'


class Ledger:
    """The tasks sent and not yet answered, the deaths seen at each stream position, the
    batches to redo one sample at a time, and the workers that died before starting."""

    def __init__(self, start_method: str):
        self.start_method = start_method
        self.tasks: dict[int, Task] = {}        # task id -> the header sent
        self.deaths: dict[int, int] = {}        # stream position -> workers it killed
        self.read_one_by_one: set[int] = set()  # task starts to read sample by sample
        self.startup_failures = 0

    def prepare(self, task: Task) -> Task:
        """``task`` as it is to be sent: flagged READ_ONE_BY_ONE where a worker died inside
        the reader's batch read of it."""
        if self.read_one_by_one and task.start in self.read_one_by_one:
            return task._replace(flags=task.flags | READ_ONE_BY_ONE)
        return task

    def sent(self, task: Task) -> None:
        """``task`` went out (as :meth:`prepare` made it)."""
        self.tasks[task.task_id] = task

    def answered(self, task_id: int) -> Task | None:
        """Task ``task_id`` was answered: the header it was sent with (None if unknown)."""
        task = self.tasks.pop(task_id, None)
        if task is not None and self.read_one_by_one:
            self.read_one_by_one.discard(task.start)
        return task

    def started(self) -> None:
        """A worker said hello: the workers can start after all."""
        self.startup_failures = 0

    def died(self, wid: int, task_ids: list, started: bool, position: int, index: int,
             why: str) -> list:
        """The events of worker ``wid``'s death: ``task_ids`` (its tasks in the order sent)
        are Lost, or Failed when the sample in hand has now killed MAX_DEATHS_PER_POSITION
        workers; one Fatal (and nothing else) when MAX_STARTUP_FAILURES workers in a row
        died before saying hello. ``position`` and ``index`` are what it had in hand (-1:
        nothing; an index of -1 at a task's first position: inside the batch read)."""
        if not started:
            self.startup_failures += 1
            if self.startup_failures >= MAX_STARTUP_FAILURES:
                hint = ''
                if self.start_method != 'fork':
                    hint = (f' (with start_method={self.start_method!r} the main module is '
                            'imported again in each worker: guard the script with '
                            "if __name__ == '__main__':)")
                return [Fatal(Failure(
                    'loadr.errors.WorkerError',
                    f'{self.startup_failures} workers died before starting; last: {why}{hint}',
                    '', None, None, wid))]
        events: list[Failed | Lost] = []
        for n, task_id in enumerate(task_ids):
            task = self.tasks.pop(task_id)
            start, count = task.start, task.count
            if n == 0 and position == start and index < 0:
                # It died inside the reader's batch read, where no sample is in
                # hand: redo the batch one sample at a time, so that if a sample
                # kills workers it is found and named below.
                self.read_one_by_one.add(start)
            elif n == 0 and start <= position < start + count:
                # The sample in hand when it died is the prime suspect.
                self.deaths[position] = self.deaths.get(position, 0) + 1
                if self.deaths[position] >= MAX_DEATHS_PER_POSITION:
                    events.append(Failed(task_id, Failure(
                        'loadr.errors.WorkerError',
                        f'dataset index {index} (stream position {position}) killed a worker '
                        f'{self.deaths[position]} times; last: {why}',
                        '', index, position, wid)))
                    continue
            events.append(Lost(task_id))
        return events
