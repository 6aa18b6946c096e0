"""The long soak: at least 10^6 samples with workers SIGKILLed at random;
nothing lost, nothing leaks.

Every sample is checked (its label is the index the order puts at its
position, its vector is not torn, its seed is right). Every ``--report-every``
batches it prints the open fds and RSS of the main process, the workers'
RSS, the /dev/shm bytes and segments of this process, and the live children;
at the end it fails (exit 1) if any of them grew past the bounds below.

Run from the repository root::

    python benchmarks/soak.py                       # 10^6 samples, ~1 kill per 50 batches
    python benchmarks/soak.py --samples 3000000 --workers 4 --kill-probability 0.05
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.faults.soaking import growth, soak  # noqa: E402

FDS_GROWTH_MAX = 2
RSS_GROWTH_MAX_BYTES = 32 << 20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--samples', type=int, default=1_000_000)
    parser.add_argument('--batch', type=int, default=128)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--kill-probability', type=float, default=0.02,
                        help='chance of a SIGKILL to a random worker before each batch')
    parser.add_argument('--jump-probability', type=float, default=0.01,
                        help='chance of a load() to a random position before each batch')
    parser.add_argument('--report-every', type=int, default=500, help='batches')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)

    print(f'{"batch":>7} {"samples":>9} {"kills":>5} {"restarts":>8} {"s":>7} {"fds":>4} '
          f'{"rss MiB":>8} {"workers MiB":>11} {"shm KiB":>8} {"segs":>4} {"kids":>4}')

    def show(r):
        print(f'{r["batch"]:>7} {r["samples"]:>9} {r["kills"]:>5} {r["restarts"]:>8} '
              f'{r["seconds"]:>7.1f} {r["fds"]:>4} {r["rss"] / 2**20:>8.1f} '
              f'{r["worker_rss"] / 2**20:>11.1f} {r["shm_bytes"] / 1024:>8.0f} '
              f'{r["shm_segments"]:>4} {r["children"]:>4}', flush=True)

    start = time.monotonic()
    figures = soak(args.samples, batch=args.batch, workers=args.workers,
                   kill_probability=args.kill_probability, seed=args.seed,
                   report_every=args.report_every, out=show,
                   jump_probability=args.jump_probability)
    rows = figures['rows']
    result = {
        'samples checked': figures['samples_checked'],
        'batches': figures['batches'],
        'SIGKILLs sent': figures['kills'],
        'workers restarted': figures['restarts'],
        'jumps by load()': figures['jumps'],
        'samples/s': round(figures['samples_checked'] / figures['seconds']),
        'fds growth': growth(rows, 'fds'),
        'rss growth MiB': round(growth(rows, 'rss') / 2**20, 2),
        'shm bytes (min, max)': (min(r['shm_bytes'] for r in rows),
                                 max(r['shm_bytes'] for r in rows)),
        'after close': figures['after_close'],
        'wall s': round(time.monotonic() - start, 1),
    }
    print()
    for key, value in result.items():
        print(f'{key:>22}: {value}')
    ok = (result['fds growth'] <= FDS_GROWTH_MAX
          and growth(rows, 'rss') <= RSS_GROWTH_MAX_BYTES
          and len({r['shm_bytes'] for r in rows}) == 1
          and figures['after_close']['shm_segments'] == 0
          and figures['after_close']['children'] == 0)
    print('\nnothing lost, repeated or torn; resources flat' if ok else '\nRESOURCES GREW')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
