"""Steady memory in workers, measured: a user's own Pillow fn with and without the glibc
malloc thresholds that loadr's workers set (loadr/workers/memory.py).

The fn is what a user writes: decode a 375x500 q90 JPEG (~110 KB, each one
distinct), ``np.asarray(img.convert('RGB'))``, a random 224x224 crop, a
random flip. Rounds alternate the setting (``LOADR_STEADY_MEMORY``), so a
machine that gets busier along the way hurts both alike.

    python -m benchmarks.steady_memory --images 500 --workers 2 --batches 40 --rounds 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

import numpy as np
from PIL import Image

import loadr
from loadr.pids import proc_stat


def make_images(n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct 375x500 JPEGs (q90, ~110 KB: a gradient under noise) with a label."""
    rng = np.random.default_rng(seed)
    h, w = 375, 500
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for i in range(n):
        phase = rng.uniform(0, 255, 3)
        base = np.stack([(xx * 255 / w + phase[0]) % 256, (yy * 255 / h + phase[1]) % 256,
                         ((xx + yy) * 127 / (h + w) + phase[2]) % 256], -1)
        img = np.clip(base + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format='JPEG', quality=90)
        out.append({'jpeg': buf.getvalue(), 'label': i % 10})
    return out


def user_fn(dp, seed):
    """Decode, to RGB array, random 224 crop, random flip: a user's own fn."""
    rng = np.random.default_rng(seed)
    a = np.asarray(Image.open(io.BytesIO(dp['jpeg'])).convert('RGB'))
    y = int(rng.integers(0, a.shape[0] - 224 + 1))
    x = int(rng.integers(0, a.shape[1] - 224 + 1))
    a = a[y:y + 224, x:x + 224]
    if rng.random() < 0.5:
        a = a[:, ::-1]
    return {'image': np.ascontiguousarray(a), 'label': np.int64(dp['label'])}


def _cpu_ticks(pids: list) -> int:
    return sum(proc_stat(pid)[1] for pid in pids)


def _minor_faults(pids: list) -> int:
    total = 0
    for pid in pids:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            text = f.read()
        total += int(text[text.rfind(b')') + 2:].split()[7])
    return total


def rate(data: list, workers: int, batch: int, batches: int,
         steady: bool) -> tuple[float, float, float, int]:
    """Samples per second over ``batches`` batches after a warm-up; the workers' CPU
    time (ms) and minor page faults per sample (less at the mercy of other load than
    the rate); and their heap (private resident) bytes at the end."""
    os.environ['LOADR_STEADY_MEMORY'] = '1' if steady else '0'
    with loadr.Loader(data, batch=batch, fns=[user_fn], seed=1, workers=workers) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        pids = loader.worker_pids
        ticks, faults, start = _cpu_ticks(pids), _minor_faults(pids), time.perf_counter()
        for _ in range(batches):
            next(it)
        took = time.perf_counter() - start
        cpu_s = (_cpu_ticks(pids) - ticks) / os.sysconf('SC_CLK_TCK')
        faults = _minor_faults(pids) - faults
        heap = sum(m['heap_bytes'] for m in loader._pool.memory().values())
    samples = batches * batch
    return samples / took, 1e3 * cpu_s / samples, faults / samples, heap


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--images', type=int, default=500)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--batch', type=int, default=64)
    parser.add_argument('--batches', type=int, default=40)
    parser.add_argument('--rounds', type=int, default=3)
    args = parser.parse_args(argv)
    data = make_images(args.images)
    size = statistics.mean(len(d['jpeg']) for d in data)
    print(f'{args.images} distinct JPEGs of {size / 1e3:.0f} KB, {args.workers} workers, '
          f'batch {args.batch}, {args.batches} batches per run')
    results = {True: [], False: []}
    for r in range(args.rounds):
        for steady in ((True, False) if r % 2 == 0 else (False, True)):
            per_s, cpu_ms, faults, heap = rate(data, args.workers, args.batch, args.batches,
                                               steady)
            results[steady].append((per_s, cpu_ms, faults))
            print(f"  round {r}: steady memory {'on ' if steady else 'off'} {per_s:7.0f} "
                  f'samples/s, {cpu_ms:.2f} ms CPU and {faults:.0f} minor faults per sample, '
                  f'workers\' heap {heap / 2**20:.0f} MiB', flush=True)
    for steady in (True, False):
        rates = [x[0] for x in results[steady]]
        cpus = [x[1] for x in results[steady]]
        faults = [x[2] for x in results[steady]]
        print(f"steady memory {'on ' if steady else 'off'}: median {statistics.median(rates):.0f} "
              f'samples/s (min {min(rates):.0f}, max {max(rates):.0f}); median '
              f'{statistics.median(cpus):.2f} ms CPU and {statistics.median(faults):.0f} minor '
              'faults per sample')


if __name__ == '__main__':
    main()
