"""``loadr.torch.DataLoader.state_dict()``: its size and its cost, near and far in the stream.

Targets: under 1 KB and under 50 µs at any step, in any configuration
(torchdata's StatefulDataLoader users report seconds per call at scale).

For each configuration (worker count, world size) and each position (an epoch
and a batch inside it, up to epoch 10^6 of a dataset of 10^9 datapoints), the
DataLoader is moved there with ``load_state_dict``, yields one batch (so an
epoch is in progress, workers and prefetch included), and ``state_dict()`` is
timed: the median of ``--repeats`` rounds of ``--calls`` calls, CPU time per call.
The JSON size is the size of ``json.dumps(state)`` in bytes.

Example::

    python -m benchmarks.state_dict
    python -m benchmarks.state_dict --calls 2000 --repeats 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

N = 10**9                    # datapoints: a dataset far larger than any order could list
POSITIONS = [(0, 0), (3, 17), (1000, 12345), (10**6, 10**6)]     # (epoch, batch in it)
CONFIGS = [(0, 1), (2, 1), (0, 8), (2, 8)]                        # (num_workers, world_size)


class Huge:
    """A reader of ``N`` tiny datapoints, made on demand."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> dict:
        return {'x': np.int64(index), 'y': np.float32(index % 7)}


def measure(workers: int, world: int, calls: int, repeats: int) -> list[tuple]:
    from loadr.torch import DataLoader

    rows = []
    with DataLoader(Huge(), batch_size=32, num_workers=workers, rank=world - 1,
                    world_size=world, seed=1) as dl:
        template = dl.state_dict()
        gb = dl.loader.global_batch
        for epoch, batch in POSITIONS:
            state = json.loads(json.dumps(template))
            state['epoch'] = epoch
            state['loader']['step'] = epoch * N + batch * gb
            dl.load_state_dict(state)
            it = iter(dl)
            next(it)                                  # an epoch in progress
            per_call = []
            for _ in range(repeats):
                start = time.process_time()
                for _ in range(calls):
                    dl.state_dict()
                per_call.append((time.process_time() - start) / calls)
            size = len(json.dumps(dl.state_dict()).encode())
            rows.append((workers, world, epoch, batch, size, statistics.median(per_call) * 1e6))
            del it
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--calls', type=int, default=1000)
    p.add_argument('--repeats', type=int, default=5)
    args = p.parse_args(argv)
    print(f"{'workers':>7} {'world':>5} {'epoch':>8} {'batch':>8} {'bytes':>6} {'us/call':>8}")
    worst_size = worst_us = 0
    for workers, world in CONFIGS:
        for row in measure(workers, world, args.calls, args.repeats):
            print(f'{row[0]:>7} {row[1]:>5} {row[2]:>8} {row[3]:>8} {row[4]:>6} {row[5]:>8.1f}')
            worst_size, worst_us = max(worst_size, row[4]), max(worst_us, row[5])
    print(f'worst: {worst_size} bytes (target < 1024), {worst_us:.1f} us (target < 50)')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
