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

A timeline of the same work, task by task, in the Trace Event format that
ui.perfetto.dev and chrome://tracing open: :class:`Tracer` (``Loader(trace=...)``,
``loader.trace(path)``). A picture of a run's snapshots: :func:`plot`.

The Loader keeps its side in a :class:`Tally` (the caller's waits, the
batches handed out, the counters of pools it closed), and under
``workers='auto'`` a :class:`Calibration` that measures the first batches
for :func:`settle`.

Example::

    >>> s = Stats(fn_names=['decode', 'crop'], elapsed_s=10.0, main_wait_s=0.05,
    ...           batches=100, samples=6400,
    ...           workers=[dict(busy=9.0, wait=1.0, read=1.0, write=0.5, other=0.5,
    ...                         fns=[6.0, 1.0], batches=100, samples=6400)])
    >>> s.verdict()
    'not the bottleneck: the training step waited 0.5% of the time'
"""

from ._accounting import (
                          CONTENDED_SHARE,
                          IO_BOUND_SHARE,
                          MAX_STRIDE,
                          STRIDE,
                          TIME_EVERY_ROW_US,
                          TIMED_ROW_COST_US,
                          TIMING_SHARE,
                          WORKER_FIELDS,
                          FillTimer,
                          StageClock,
                          cores,
                          fn_names,
                          process_times,
                          row_width,
                          schedstat,
                          worker_dict,
)
from ._plot import PLOT_SIZE, plot
from ._settle import AUTO_BATCHES, AUTO_MAX_S, Calibration, settle
from ._snapshot import NOT_BOTTLENECK_FRACTION, Stats, format_table
from ._tally import Tally
from ._trace import (
                          TRACE_EVENTS,
                          WORKER_RECORDS,
                          TaskRing,
                          Tracer,
                          new_records,
                          record_width,
                          ring_rows,
)

__all__ = ['Stats', 'WORKER_FIELDS', 'STRIDE', 'MAX_STRIDE', 'TIMED_ROW_COST_US', 'TIMING_SHARE',
           'TIME_EVERY_ROW_US', 'format_table', 'StageClock', 'NOT_BOTTLENECK_FRACTION',
           'IO_BOUND_SHARE', 'CONTENDED_SHARE', 'fn_names', 'row_width', 'worker_dict', 'cores',
           'settle', 'schedstat', 'process_times', 'FillTimer',
           'Calibration', 'AUTO_BATCHES', 'AUTO_MAX_S', 'Tally',
           'Tracer', 'TaskRing', 'TRACE_EVENTS', 'WORKER_RECORDS', 'record_width', 'ring_rows',
           'new_records',
           'plot', 'PLOT_SIZE']
