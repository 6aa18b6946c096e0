"""What the per-stage accounting (loadr.stats) costs a worker, part by part.

``python -m benchmarks.stats_cost [--batch 256]``

Timing a whole loader with and without the accounting cannot resolve 1%
on a shared machine (paired runs differ by more than that with nothing
changed). The accounting is fixed code, though, so each of its parts is
timed alone here, best of several repeats, and added up per task:

- the worker loop's calls around a task (``working``, ``finish``, which
  writes the task's stages into the row, and ``idle``);
- ``FillTimer.account`` once per task (with its ``add_fill``);
- the timed rows (one every ``FillTimer.every`` rows): their extra cost over a plain row;
- the fill's few clock reads before its loop.

The sum is then set against a task of ``--batch`` trivial datapoints (the
workload with the least work per sample, so the worst case) filled with no
accounting at all.

Example (a quick run)::

    python -m benchmarks.stats_cost --batch 64 --repeat 2
"""

from __future__ import annotations

import argparse
import time
import timeit

import numpy as np

from loadr.assemble import Assembler, _Fill
from loadr.order import Order
from loadr.spec import OBJECT, infer_spec
from loadr.stats import StageClock, row_width, schedstat

from . import workloads as W

__all__ = ['main', 'parts']

PREAMBLE_READS = 4          # perf_counter calls in fill outside its loop, with the clock on


def _best(fn, number: int, repeat: int) -> float:
    """Microseconds per call, best of ``repeat``."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def parts(batch: int = 256, repeat: int = 7) -> dict:
    """The accounting's parts in microseconds, its sum per task, and the task's own time."""
    data = W.make_trivial(max(4096, 4 * batch))
    fns = [W.identity_fn]
    spec = infer_spec(Assembler(data.reader, fns, None).datapoint(0, 0))
    asm = Assembler(data.reader, fns, spec)
    arrays = {k: np.zeros((batch, *s), d) for k, (d, s) in spec.items() if d != OBJECT}
    order = Order(len(data.reader), 0)
    # A worker's counters live in shared memory, as a memoryview of float64.
    clock = StageClock(memoryview(bytearray(8 * row_width(len(fns)))).cast('d'), len(fns),
                       sched=schedstat())

    task = _best(lambda: asm.fill(order, 0, batch, arrays), 50, repeat)   # no clock
    asm.clock = clock
    for start in range(0, 20 * batch, batch):          # settles _every on this workload
        asm.fill(order, start, batch, arrays)
    every = asm.timer.every

    pending = (0.1, 0.1, [0.1], batch, 1)

    def around_a_task():
        clock.working()
        # What account's add_fill leaves for finish() to write (add_fill itself is
        # timed with account below: called here too, it was counted twice).
        clock._pending = pending
        clock.finish()
        clock.idle()

    t1 = time.perf_counter()

    timer = asm.timer

    def account():
        timer.sampled = 1e-5
        timer.account(clock, batch, t1, t1, 0.0, True, 0.0)

    # One row, timed and not, by the assembler's one reader of a row (the writes
    # come after, alike).
    job = _Fill(order, 0, [5], [0], [None], arrays, {}, None, ((-1,), 0))

    def timed_row():
        job.pending.clear()
        job.countdown = 0
        asm._read_rows(job, 0, 1)

    def plain_row():
        job.pending.clear()
        job.countdown = 1 << 62
        asm._read_rows(job, 0, 1)

    timed = _best(timed_row, 20000, repeat)
    plain = _best(plain_row, 20000, repeat)
    out = {
        'around_a_task_us': _best(around_a_task, 20000, repeat),
        'account_us': _best(account, 20000, repeat),
        'timed_rows_us': max(0.0, timed - plain) * batch / every,
        'preamble_us': PREAMBLE_READS * _best(time.perf_counter, 200000, repeat),
    }
    out['per_task_us'] = sum(out.values())
    out.update(task_us=task, every=every, batch=batch,
               share=out['per_task_us'] / task)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog='python -m benchmarks.stats_cost',
                                 description=__doc__.split('\n')[0])
    ap.add_argument('--batch', type=int, default=256)
    ap.add_argument('--repeat', type=int, default=7)
    args = ap.parse_args(argv)
    p = parts(args.batch, args.repeat)
    print(f"trivial datapoints, batch {p['batch']}: a task takes {p['task_us']:.0f} us "
          f"with no accounting; a row is timed every {p['every']} rows")
    print('| part | us per task |')
    print('|---|---:|')
    for key, name in (('around_a_task_us', "the worker loop's calls around a task"),
                      ('account_us', 'FillTimer.account'),
                      ('timed_rows_us', 'timed rows, over plain ones'),
                      ('preamble_us', "the fill's clock reads")):
        print(f'| {name} | {p[key]:.2f} |')
    print(f"| **all** | **{p['per_task_us']:.2f}** ({100 * p['share']:.2f}% of the task) |")
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
