"""The cost and the accuracy of a Mix's order, against a single reader and a per-item coin.

``python -m benchmarks.mix`` prints two tables:

1. **Order cost per sample**: ``order.indices(start, batch)`` plus
   ``order.seeds(start, batch)`` over consecutive batches (what the Loader and
   each worker do per batch). It compares a :class:`loadr.mix.MixOrder` with the
   :class:`loadr.order.Order` of a single reader of the same total size. It is
   measured in this process and in a forked child that gets the order pickled,
   as a worker does. The timer is CPU time (``time.process_time``), the best of
   ``--repeats``, so other programs on a shared machine disturb it less.
2. **Proportion error**: how far each source's count is from ``weight * 1024``
   in the aligned windows of 1,024 positions, and from ``weight * p`` along the
   way. Our schedule is set against a weighted random choice per item, which
   is what torchdata's weighted sampler and granular's ``sources.Mix`` do.
   The baseline here is numpy's ``Generator.choice(p=weights)``.

Example::

    python -m benchmarks.mix                  # both tables
    python -m benchmarks.mix --positions 100000 --repeats 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import pickle
import time

import numpy as np

from loadr.mix import BLOCK, MixOrder
from loadr.order import Order

__all__ = ['order_cost', 'proportion_errors', 'main']

COST_CASES = {
    'web 10^9 + curated 10^3 (0.8/0.2)': ({'web': 10**9, 'curated': 10**3},
                                          {'web': 0.8, 'curated': 0.2}),
    'two of 10^5 and 10^3 (0.999/0.001)': ({'big': 10**5, 'tiny': 10**3},
                                           {'big': 0.999, 'tiny': 0.001}),
    'seven of 10^6': ({f's{i}': 10**6 + i for i in range(7)},
                      {f's{i}': w for i, w in enumerate([.31, .22, .17, .13, .09, .05, .03])}),
}
WEIGHT_SETS = {
    '0.8/0.2': {'web': 0.8, 'curated': 0.2},
    '0.999/0.001': {'big': 0.999, 'tiny': 0.001},
    'seven': {f's{i}': w for i, w in enumerate([.31, .22, .17, .13, .09, .05, .03])},
    'thirds': {'a': 1, 'b': 1, 'c': 1},
}


def _per_sample_us(order, batch: int, repeats: int, batches: int = 100) -> float:
    position = [10**9]

    def run():
        for _ in range(batches):
            position[0] += batch
            order.indices(position[0], batch)
            order.seeds(position[0], batch)

    best = float('inf')
    run()                                   # warm the caches (tables, permutations)
    for _ in range(repeats):
        t0 = time.process_time()
        run()
        best = min(best, time.process_time() - t0)
    return best / (batches * batch) * 1e6


def _in_child(payload: bytes, batch: int, repeats: int, queue) -> None:
    order = pickle.loads(payload)
    queue.put(_per_sample_us(order, batch, repeats))


def _child_us(order, batch: int, repeats: int) -> float:
    ctx = multiprocessing.get_context('fork')
    queue = ctx.Queue()
    proc = ctx.Process(target=_in_child, args=(pickle.dumps(order), batch, repeats, queue))
    proc.start()
    result = queue.get(timeout=600)
    proc.join()
    return result


def order_cost(batch: int = 256, repeats: int = 5) -> list[dict]:
    """µs per sample of the order, mix against single reader, in this process and a child."""
    rows = []
    for name, (sizes, weights) in COST_CASES.items():
        mix = MixOrder(list(sizes), list(sizes.values()), [(0, weights)], seed=0)
        single = Order(sum(sizes.values()), seed=0)
        rows.append({'case': name,
                     'single_main': _per_sample_us(single, batch, repeats),
                     'mix_main': _per_sample_us(mix, batch, repeats),
                     'single_child': _child_us(single, batch, repeats),
                     'mix_child': _child_us(mix, batch, repeats)})
    return rows


def _errors(sources: np.ndarray, weights: np.ndarray) -> dict:
    n = len(sources) - len(sources) % BLOCK
    sources = sources[:n]
    windows = np.stack([np.bincount(row, minlength=len(weights))
                        for row in sources.reshape(-1, BLOCK)])
    off = np.abs(windows - weights * BLOCK)
    drift = 0.0
    for s, w in enumerate(weights):
        drift = max(drift, float(np.abs(np.cumsum(sources == s) - w * np.arange(1, n + 1)).max()))
    return {'window_max': float(off.max()), 'window_mean': float(off.mean()), 'drift_max': drift}


def _per_item_choice(weights: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    # A weighted coin per item: what torchdata's weighted sampler and granular's
    # sources.Mix do (neither is installed here, so numpy stands in for both).
    return np.random.default_rng(seed).choice(len(weights), size=count, p=weights)


def proportion_errors(positions: int = 10**6) -> list[dict]:
    """Per weight set: loadr's schedule and a per-item weighted choice, window by window."""
    rows = []
    for name, weights in WEIGHT_SETS.items():
        total = sum(weights.values())
        w = np.array([v / total for v in weights.values()])
        order = MixOrder(list(weights), [1000] * len(weights), [(0, weights)], seed=0)
        rows.append({'weights': name, 'how': 'loadr schedule',
                     **_errors(order.sources(0, positions), w)})
        rows.append({'weights': name, 'how': 'per-item weighted choice',
                     **_errors(_per_item_choice(w, positions), w)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m benchmarks.mix', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--batch', type=int, default=256)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--positions', type=int, default=10**6)
    args = parser.parse_args(argv)

    print(f'### Order cost per sample (µs; batch {args.batch}, CPU time, best of '
          f'{args.repeats})\n')
    print('| case | single reader, main | mix, main | single reader, worker | mix, worker |')
    print('|---|---:|---:|---:|---:|')
    for r in order_cost(args.batch, args.repeats):
        print(f"| {r['case']} | {r['single_main']:.2f} | {r['mix_main']:.2f} | "
              f"{r['single_child']:.2f} | {r['mix_child']:.2f} |")
    print(f'\n### Proportion error over {args.positions:,} positions (samples off; windows are '
          f'the aligned [k*1024, (k+1)*1024))\n')
    print('| weights | how | worst window | mean window | worst running drift |')
    print('|---|---|---:|---:|---:|')
    for r in proportion_errors(args.positions):
        print(f"| {r['weights']} | {r['how']} | {r['window_max']:.2f} | {r['window_mean']:.2f} | "
              f"{r['drift_max']:.1f} |")
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
