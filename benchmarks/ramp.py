"""When the first batches come: the start of a stream with many workers.

``python -m benchmarks.ramp [--workers 16] [--ms 2.5] [--batch 64] [--runs 3]``

A worker here does not compute: its fn sleeps ``--ms`` per sample, so
``--workers 16`` behaves like 16 workers on 16 free cores even on a 2-core
machine (the figures are those of the schedule, not of any CPU). For each
loader (loadr, and torch's DataLoader when torch is installed) it starts a
stream, takes ``4 * workers`` batches and prints, in units of ``batch * ms /
workers`` (the time between batches once every worker is busy): when the
first batch came, the gap from the first to the second, the largest gap in
the first ``2 * workers`` batches, and when the last came (seconds from the
start, workers' start-up included). On a real
machine the same measure with decoding is ``python -m benchmarks
--device-report`` ("time to the second batch").

Example (a quick run)::

    python -m benchmarks.ramp --workers 4 --ms 1 --batch 16 --runs 1
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
import warnings

import numpy as np

__all__ = ['main', 'arrivals', 'sleepy']


def sleepy(dp: dict, seed=None, seconds: float = 0.0) -> dict:
    """The datapoint, after ``seconds`` asleep (a worker's time, without its CPU)."""
    time.sleep(seconds)
    return dp


def _items(n: int) -> list:
    vecs = np.random.default_rng(0).standard_normal((n, 4), dtype=np.float32)
    return [{'label': i, 'vec': vecs[i]} for i in range(n)]


def _loadr(items, batch, workers, fn):
    import loadr
    loader = loadr.Loader(items, batch=batch, fns=[fn], shuffle=True, seed=0, workers=workers)
    return iter(loader), loader.close


def _torch(items, batch, workers, fn):
    from torch.utils.data import DataLoader

    class Set:
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return fn(items[i])

    with warnings.catch_warnings():     # "more workers than cores": intended here
        warnings.simplefilter('ignore', UserWarning)
        loader = DataLoader(Set(), batch_size=batch, shuffle=True, num_workers=workers,
                            drop_last=True)
        it = iter(loader)

    def close():
        it._shutdown_workers()
    return it, close


def arrivals(start, items, batch: int, workers: int, ms: float, count: int) -> list[float]:
    """Seconds from the first batch to each of ``count`` batches (the first: its own time
    from the start, as the first element)."""
    fn = functools.partial(sleepy, seconds=ms / 1000)
    t0 = time.perf_counter()
    it, close = start(items, batch, workers, fn)
    try:
        times = []
        for _ in range(count):
            next(it)
            times.append(time.perf_counter())
    finally:
        close()
    return [times[0] - t0] + [t - times[0] for t in times[1:]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog='python -m benchmarks.ramp',
                                 description=__doc__.split('\n')[0])
    ap.add_argument('--workers', type=int, default=16)
    ap.add_argument('--ms', type=float, default=2.5, help='sleep per sample, ms')
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--runs', type=int, default=3)
    args = ap.parse_args(argv)
    w, b = args.workers, args.batch
    count = 4 * w
    items = _items(max(4096, 2 * count * b))
    unit = b * args.ms / 1000 / w
    loaders = {'loadr': _loadr}
    try:
        import torch  # noqa: F401
        loaders['torch'] = _torch
    except ImportError:
        print('torch is not installed: loadr alone')
    print(f'workers {w}, batch {b}, {args.ms} ms per sample asleep; unit = {unit * 1000:.1f} ms '
          f'(batch x ms / workers), median of {args.runs} runs')
    print(f"{'loader':8} {'first (s)':>10} {'2nd gap':>8} {'max gap, first 2W':>18} "
          f"{'batch 4W at (s)':>16}")
    for name, start in loaders.items():
        rows = [arrivals(start, items, b, w, args.ms, count) for _ in range(args.runs)]
        first = statistics.median(r[0] for r in rows)
        second = statistics.median(r[1] for r in rows)
        biggest = statistics.median(max(np.diff([0.0] + r[1:2 * w])) for r in rows)
        last = statistics.median(r[0] + r[-1] for r in rows)
        print(f'{name:8} {first:>10.3f} {second / unit:>7.1f}u {biggest / unit:>17.1f}u '
              f'{last:>16.3f}')
        print(f'{"":8} {"":>10} {second * 1000:>6.0f}ms {biggest * 1000:>16.0f}ms')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
