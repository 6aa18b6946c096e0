"""How long a Mix of many sources with unrelated weights takes to build and to start.

``python -m benchmarks.mix_build`` prints, for each number of sources, with
weights drawn at random (``random.Random(0).random()``: floats whose
fractions share no denominator, the hard case):

- ``Mix()``: building the Mix (checking the weights and building the
  schedule, once, in the main process);
- ``first batch``: a :class:`loadr.Loader` (``workers=0``, batch 256) made on
  that Mix, to its first batch;
- ``pickle``: the bytes of the built order, as a worker receives it, and the
  time to load it there (nothing is built again);
- ``resume far``: the order's indices at position 10^12 from a cold start
  (floor sums for every source);
- ``order µs/sample``: ``order.indices`` over consecutive batches of 256 once
  warm (CPU time; with many sources nearly every sample comes from another
  source's own order);
- ``windows``: the largest distance of a source's count from ``1024 * w`` in
  the aligned windows of 1,024 over the first 100 windows (at most 1 by
  construction).

Times are wall-clock seconds, the best of ``--repeats``, on whatever machine
runs it (a shared one disturbs them).

Example::

    python -m benchmarks.mix_build                      # 1,000, 3,000 and 10,000 sources
    python -m benchmarks.mix_build --sources 10000 --repeats 1
"""

from __future__ import annotations

import argparse
import pickle
import random
import time

import numpy as np

import loadr
from loadr.mix import BLOCK

__all__ = ['measure', 'main']


class _Tiny:
    """A source of ``n`` datapoints ``{'x': i}``, made at no cost."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {'x': i}


def _best(fn, repeats: int):
    best, out = float('inf'), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(count: int, repeats: int = 3) -> dict:
    """The figures of one Mix of ``count`` sources (see the module docstring)."""
    rng = random.Random(0)
    names = [f's{i}' for i in range(count)]
    weights = {name: rng.random() for name in names}
    sources = {name: _Tiny(100 + i % 7) for i, name in enumerate(names)}
    build_s, mix = _best(lambda: loadr.Mix(sources, weights=weights), repeats)

    def first_batch():
        with loadr.Loader(loadr.Mix(sources, weights=weights), batch=256, seed=0,
                          workers=0) as loader:
            return next(iter(loader))

    first_s, _ = _best(first_batch, repeats)
    order = mix.make_order(0)
    payload = pickle.dumps(order)
    load_s, _ = _best(lambda: pickle.loads(payload), repeats)
    far_s, _ = _best(lambda: mix.make_order(0).indices(10**12, 256), repeats)
    order.indices(10**6, 256)
    for b in range(50):                     # warm: the sources' epoch tables
        order.indices(10**6 + 256 * b, 256)
    t0 = time.process_time()
    for b in range(50):
        order.indices(10**6 + 256 * b, 256)
    per_sample_us = (time.process_time() - t0) / (50 * 256) * 1e6
    total = sum(weights.values())
    w = np.array([weights[name] / total for name in names])
    src = order.sources(0, 100 * BLOCK).reshape(-1, BLOCK)
    windows = max(float(np.abs(np.bincount(row, minlength=count) - w * BLOCK).max())
                  for row in src)
    return {'sources': count, 'build_s': build_s, 'first_batch_s': first_s,
            'pickle_bytes': len(payload), 'unpickle_s': load_s, 'resume_far_s': far_s,
            'order_us': per_sample_us, 'window_max': windows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m benchmarks.mix_build', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--sources', default='1000,3000,10000',
                        help='comma-separated numbers of sources')
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args(argv)
    print('| sources | Mix() s | first batch s | pickled order | unpickle s | resume far s '
          '| order µs/sample | window max |')
    print('|---:|---:|---:|---:|---:|---:|---:|---:|')
    for count in (int(c) for c in args.sources.split(',')):
        r = measure(count, args.repeats)
        print(f"| {r['sources']:,} | {r['build_s']:.3f} | {r['first_batch_s']:.3f} | "
              f"{r['pickle_bytes'] / 1024:.0f} KiB | {r['unpickle_s']:.4f} | "
              f"{r['resume_far_s']:.3f} | {r['order_us']:.1f} | {r['window_max']:.3f} |",
              flush=True)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
