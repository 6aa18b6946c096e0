"""workers='auto' / prefetch='auto' against a grid search on the same machine.

For one workload (see :mod:`benchmarks.workloads`) and a simulated training
step (``--step-ms``: the caller sleeps that long per batch; 0: a caller that
only takes batches), it measures the steady samples/s of every setting of a
grid (workers x prefetch), then of a loader made with ``workers='auto',
prefetch='auto'``: the setting it settled on, how long settling took, and its
samples/s after settling, the same way. It prints both and the ratio of the
settled setting's rate to the grid's best.

Runs alternate over the grid ``--repeats`` times and keep each setting's best
rate, so a busy shared machine disturbs them less. The grid's best is the
largest of many noisy figures, so it is biased upwards (the winner's curse:
on a shared machine settings that differ by nothing differ by 20%). So after
the grid the best setting and the auto loader run once more, alternately,
``--final`` times each, and the ratio of their medians is the figure that
says whether auto settles as well as a search would.

Example::

    python -m benchmarks.auto                          # trivial workload, 2 repeats
    python -m benchmarks.auto --workload images --n 512 --batches 20 --step-ms 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import loadr
from loadr.stats import cores

from . import workloads

__all__ = ['rate', 'main']


def rate(data, fn, workers, prefetch, batches: int, warmup: int, step_s: float):
    """``(samples/s, loader)`` over ``batches`` batches after ``warmup``; the loader closed."""
    with loadr.Loader(data.reader, batch=data.batch, fns=[fn], seed=0, workers=workers,
                      prefetch=prefetch) as loader:
        it = iter(loader)
        for _ in range(warmup):
            next(it)
            if step_s:
                time.sleep(step_s)
        t0 = time.perf_counter()
        rows = 0
        for _ in range(batches):
            rows += len(next(it)['label'])
            if step_s:
                time.sleep(step_s)
        return rows / (time.perf_counter() - t0), loader


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--workload', choices=('trivial', 'images'), default='trivial')
    p.add_argument('--n', type=int, default=None, help='datapoints (default: per workload)')
    p.add_argument('--batches', type=int, default=None, help='timed batches per setting')
    p.add_argument('--step-ms', type=float, default=0.0, help="the caller's step per batch")
    p.add_argument('--workers', default=None, help='grid of workers (default 1..2*cores)')
    p.add_argument('--prefetch', default='2,4,8', help='grid of prefetch (default 2,4,8)')
    p.add_argument('--repeats', type=int, default=2)
    p.add_argument('--final', type=int, default=5,
                   help='alternate runs of the best setting and of auto, after the grid')
    args = p.parse_args(argv)
    n_cores = cores()
    grid_w = ([int(x) for x in args.workers.split(',')] if args.workers
              else list(range(1, 2 * n_cores + 1)))
    grid_p = [int(x) for x in args.prefetch.split(',')]
    step_s = args.step_ms / 1e3
    with tempfile.TemporaryDirectory() as tmp:
        if args.workload == 'trivial':
            data, fn = workloads.make_trivial(args.n or 200_000), workloads.identity_fn
            batches = args.batches or 200
        else:
            data, fn = workloads.make_images(tmp, args.n or 512), workloads.image_fn
            batches = args.batches or 20
        # The auto loader's warm-up covers its calibration (and restart, if any);
        # every setting of the grid gets the same, so that all are timed alike.
        auto_warmup = 40
        grid: dict = {}
        auto_runs = []
        for _ in range(args.repeats):
            for w in grid_w:
                for pf in grid_p:
                    r, _ = rate(data, fn, w, pf, batches, auto_warmup, step_s)
                    grid[(w, pf)] = max(grid.get((w, pf), 0.0), r)
            t0 = time.perf_counter()
            r, loader = rate(data, fn, 'auto', 'auto', batches, auto_warmup, step_s)
            auto_runs.append((r, loader.settled, time.perf_counter() - t0))
        best = max(grid, key=grid.get)
        final_best, final_auto = [], []
        for _ in range(args.final):
            final_best.append(rate(data, fn, best[0], best[1], batches, auto_warmup, step_s)[0])
            r, loader = rate(data, fn, 'auto', 'auto', batches, auto_warmup, step_s)
            final_auto.append(r)
            auto_runs.append((r, loader.settled, 0.0))
    print(f'{args.workload}: batch {data.batch}, step {args.step_ms:g} ms, {n_cores} cores, '
          f'{batches} timed batches, best of {args.repeats}')
    print(f'{"workers":>7} {"prefetch":>8} {"samples/s":>10}')
    for (w, pf), r in sorted(grid.items()):
        mark = '  <- best of the grid' if (w, pf) == best else ''
        print(f'{w:>7} {pf:>8} {r:>10,.0f}{mark}')
    r_auto, settled, _ = max(auto_runs, key=lambda x: x[0])
    print(f'auto settled on workers={settled["workers"]} prefetch={settled["prefetch"]} '
          f'after {settled["after_batches"]} batches ({settled["after_s"]:.2f} s): '
          f'{settled["why"]}')
    for r, s, _ in auto_runs:
        print(f'  run: workers={s["workers"]} prefetch={s["prefetch"]}, {r:,.0f} samples/s')
    print(f'auto: {r_auto:,.0f} samples/s = {r_auto / grid[best]:.2f} x the best of the grid '
          f'({grid[best]:,.0f} samples/s at workers={best[0]} prefetch={best[1]})')
    if final_best:
        mb, ma = statistics.median(final_best), statistics.median(final_auto)
        print(f'then {args.final} alternate runs each: workers={best[0]} prefetch={best[1]} '
              f'median {mb:,.0f} samples/s, auto median {ma:,.0f}: auto = {ma / mb:.2f} x '
              'the best setting')


if __name__ == '__main__':
    main()
