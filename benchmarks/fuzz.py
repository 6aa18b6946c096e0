"""The big fuzz: at least 10,000 distinct mutated inputs per format through every reader, judged.

The inputs and the judging are ``tests/fuzz/harness.py``'s (the CI fuzz runs
a few hundred per format with the same code): mutated copies of the
reference fixtures (byte flips, truncation, insertion, lying headers, broken
JSON/msgpack structure, random bytes), each opened and read in full with
several reader options under a deadline, then ``loadr.check``-ed. The only
allowed outcomes are correct data or a loadr error; the first other outcome
stops the run and is printed with the input that caused it (exit 1).

Run from the repository root (the fixtures are found as the tests find them)::

    python benchmarks/fuzz.py                          # 10,000 per format, a random seed

Inputs are distinct: one whose files are byte for byte an earlier one's
(hypothesis repeats small cases) is skipped and counted under "repeats".
"opened" and "refused@open" count reader opens (one per reader option).
    python benchmarks/fuzz.py --per-format 20000 --formats bag --seed 7 --shrink
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.fuzz.harness import FORMATS, TARGETS, Failure, Stats, Workspace, run_fuzz  # noqa: E402

# How a format's inputs are split between its fixtures.
SHARES = {'ffrecord': 0.6, 'ffrecord_multi': 0.4, 'gulp': 1.0,
          'bag': 0.4, 'bag_types': 0.3, 'bag_sharded': 0.3}
BATCH = 500        # inputs per hypothesis run (one seed each), so progress shows as it goes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--per-format', type=int, default=10_000)
    parser.add_argument('--formats', nargs='+', default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument('--seed', type=int, default=None, help='default: random')
    parser.add_argument('--shrink', action='store_true', help='minimise a failing input')
    args = parser.parse_args(argv)
    seed = random.randrange(2**32) if args.seed is None else args.seed
    print(f'seed {seed}', flush=True)
    rng = random.Random(seed)
    tracemalloc.start()
    totals = []
    with tempfile.TemporaryDirectory(prefix='loadr-fuzz-') as root:
        for fmt in args.formats:
            stats = Stats()
            start = time.monotonic()
            cpu = time.process_time()
            for name in FORMATS[fmt]:
                ws = Workspace(TARGETS[name], root)
                want = round(args.per_format * SHARES[name])
                done = 0
                while done < want:          # distinct inputs: a repeat is skipped, not counted
                    # Whole batches: a small one repeats hypothesis's simplest inputs.
                    count = BATCH
                    before = stats.inputs
                    try:
                        run_fuzz(ws, count, stats, seed=rng.randrange(2**32),
                                 shrink=args.shrink, skip_seen=True)
                    except Failure as exc:
                        print(f'\nFAILED on {name} after {stats.inputs} inputs:\n{exc}',
                              flush=True)
                        return 1
                    done += stats.inputs - before
                    print(f'  {fmt:>8} {name:<15} {done:>6}/{want} distinct inputs '
                          f'({stats.duplicates} repeats skipped)  '
                          f'{time.monotonic() - start:7.0f} s', flush=True)
            totals.append((fmt, stats, time.monotonic() - start, time.process_time() - cpu))
    print()
    header = (f'{"format":>8} {"inputs":>7} {"repeats":>8} {"opened":>7} {"refused@open":>12} '
              f'{"dp ok":>7} {"dp refused":>10} {"dp =pristine":>12} {"reads":>8} '
              f'{"cut reads":>9} {"max s":>6} {"peak MiB":>8} {"cpu s":>7} {"wall s":>7}')
    print(header)
    for fmt, s, wall, cpu in totals:
        print(f'{fmt:>8} {s.inputs:>7} {s.duplicates:>8} {s.opened:>7} '
              f'{s.refused_at_open:>12} {s.datapoints_ok:>7} {s.datapoints_refused:>10} '
              f'{s.compared:>12} {s.reads:>8} {s.refused_reads:>9} {s.max_seconds:>6.2f} '
              f'{s.max_peak_bytes / 2**20:>8.2f} {cpu:>7.0f} {wall:>7.0f}')
    for fmt, s, _, _ in totals:
        print(f'{fmt:>8} errors: {dict(s.errors.most_common())}')
    print('\nno input gave anything but correct data or a loadr error')
    return 0


if __name__ == '__main__':
    sys.exit(main())
