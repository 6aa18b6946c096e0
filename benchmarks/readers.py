"""Random batch reads from the page cache, reader by reader, in one process.

Each reader holds the same 4 KiB records (random bytes; for gulp, each
record is a one-frame video whose "JPEG" is the record):

- ``ffrecord``: one ``.ffr`` file, CRC32 checked on every read
  (``FFRecordReader(check_data=True)``), through ``read(indices)`` (raw
  bytes) and ``read_batch(indices)`` (datapoints);
- ``bag``: a bag dataset with one ``bytes`` key, ``read_batch(indices)``;
- ``gulp``: a gulp directory of one-frame videos, ``read_batch(indices)``
  with ``decode_images=False``.

A batch is 256 random indices. The references, same indices, same process:
``os.pread`` of each record at its offset with nothing else (the page-cache
limit for one read per record), and reading the whole FFRecord file in
1 MiB preads (the page cache's sequential bandwidth). Bag and gulp have no
checksums to check.

Run alone::

    python -m benchmarks.readers               # prints the table
    python -m benchmarks.readers --scale 4 --runs 7
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from . import workloads as W

__all__ = ['run', 'markdown', 'main']

BATCH = W.RAW_BATCH
SEQUENTIAL_BLOCK_BYTES = 1 << 20
JPEG_SOI = b'\xff\xd8'


def _records(n: int) -> list[bytes]:
    rng = np.random.default_rng(4)
    block = rng.integers(0, 256, (256, W.RECORD_BYTES), dtype=np.uint8)
    out = []
    for i in range(n):
        row = block[i % len(block)].copy()
        row[2:10] = np.frombuffer(i.to_bytes(8, 'little'), np.uint8)
        row[:2] = (0xFF, 0xD8)          # gulp wants frames that start like a JPEG
        out.append(row.tobytes())
    return out


def make(root: str, n: int) -> dict:
    """The three datasets of ``n`` 4 KiB records under ``root``; their loadr readers."""
    from loadr.readers.bag import BagReader
    from loadr.readers.ffrecord import FFRecordReader
    from loadr.readers.gulp import GulpReader
    from loadr.writers import BagWriter, FFRecordWriter, GulpWriter
    records = _records(n)
    ffr = os.path.join(root, 'readers.ffr')
    with FFRecordWriter(ffr, n) as w:
        for rec in records:
            w.write_one(rec)
    bag = os.path.join(root, 'readers-bag')
    with BagWriter(bag, {'data': 'bytes'}) as w:
        for rec in records:
            w.append({'data': rec})
    gulp = os.path.join(root, 'readers-gulp')
    with GulpWriter(gulp, videos_per_chunk=max(1, n // 4)) as w:
        for i, rec in enumerate(records):
            w.append(str(i), {}, [rec])
    return {'ffrecord': FFRecordReader(ffr, check_data=True), 'bag': BagReader(bag),
            'gulp': GulpReader(gulp, decode_images=False), 'ffr_path': ffr}


def _time(fn, batches: list) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) to read every batch."""
    t, c = time.perf_counter(), time.process_time()
    for b in batches:
        fn(b)
    return time.perf_counter() - t, time.process_time() - c


def run(root: str, scale: float = 1.0, runs: int = 5, n: int | None = None) -> dict:
    """Records/s and MB/s of each way of reading, median and range of ``runs`` (interleaved)."""
    n = n or max(4 * BATCH, int(32_768 * scale))
    data = make(root, n)
    ffr, bag, gulp = data['ffrecord'], data['bag'], data['gulp']
    first = ffr.locate(0)['offset']
    fd = os.open(data['ffr_path'], os.O_RDONLY)
    size = os.fstat(fd).st_size
    rng = np.random.default_rng(5)
    count = max(20, int(200 * scale))
    batches = [rng.integers(0, n, BATCH).tolist() for _ in range(count)]

    def pread(b):
        for i in b:
            os.pread(fd, W.RECORD_BYTES, first + i * W.RECORD_BYTES)

    def sequential(_):
        for offset in range(0, size, SEQUENTIAL_BLOCK_BYTES):
            os.pread(fd, SEQUENTIAL_BLOCK_BYTES, offset)

    ways = {
        'os.pread per record (limit)': pread,
        'ffrecord read() [crc]': ffr.read,
        'ffrecord read_batch() [crc]': ffr.read_batch,
        'bag read_batch()': bag.read_batch,
        'gulp read_batch()': gulp.read_batch,
    }
    try:
        for fn in ways.values():                 # warm every cache once
            fn(batches[0])
        sequential(None)
        rates = {name: [] for name in ways}
        cpu_rates = {name: [] for name in ways}
        seq = []
        for r in range(runs):
            names = list(ways)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                wall, cpu = _time(ways[name], batches)
                rates[name].append(count * BATCH / wall)
                cpu_rates[name].append(count * BATCH / max(cpu, 1e-9))
            t = time.perf_counter()
            sequential(None)
            seq.append(size / (time.perf_counter() - t))
    finally:
        os.close(fd)
    out = {'records': n, 'record_bytes': W.RECORD_BYTES, 'batch': BATCH,
           'batches_per_run': count, 'runs': runs, 'ways': {}}
    for name, values in rates.items():
        out['ways'][name] = {'records_per_s': {'median': statistics.median(values),
                                               'min': min(values), 'max': max(values)},
                             'mb_per_s': statistics.median(values) * W.RECORD_BYTES / 1e6,
                             'records_per_cpu_s': statistics.median(cpu_rates[name])}
    out['sequential_mb_per_s'] = {'median': statistics.median(seq) / 1e6,
                                  'min': min(seq) / 1e6, 'max': max(seq) / 1e6}
    # The share of the limit is taken on CPU time: on a shared machine a
    # process's CPU seconds are steadier than its wall seconds.
    limit = out['ways']['os.pread per record (limit)']['records_per_cpu_s']
    limit_wall = out['ways']['os.pread per record (limit)']['records_per_s']['median']
    for row in out['ways'].values():
        row['of_limit'] = row['records_per_cpu_s'] / limit
        row['of_limit_wall'] = row['records_per_s']['median'] / limit_wall
    return out


def markdown(res: dict) -> str:
    """The table of :func:`run`'s result."""
    lines = [f"Random batch reads, one process, page cache: {res['batch']} random indices per "
             f"batch, {res['record_bytes']} B records, {res['records']} records, median "
             f"[range] of {res['runs']} runs.", '',
             '| reader | records/s (wall) | MB/s | records per CPU-s | of the pread limit '
             '(CPU; wall) |', '|---|---:|---:|---:|---:|']
    for name, row in res['ways'].items():
        r = row['records_per_s']
        lines.append(f"| {name} | {r['median']:,.0f} [{r['min']:,.0f}–{r['max']:,.0f}] | "
                     f"{row['mb_per_s']:,.0f} | {row['records_per_cpu_s']:,.0f} | "
                     f"{100 * row['of_limit']:.0f}%; {100 * row['of_limit_wall']:.0f}% |")
    s = res['sequential_mb_per_s']
    lines.append(f"| sequential 1 MiB preads (page-cache bandwidth) | — | "
                 f"{s['median']:,.0f} [{s['min']:,.0f}–{s['max']:,.0f}] | — | — |")
    return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m benchmarks.readers',
                                description=__doc__.split('\n')[0])
    p.add_argument('--scale', type=float, default=1.0)
    p.add_argument('--runs', type=int, default=5)
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix='loadr-readers-')
    try:
        res = run(root, args.scale, args.runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(markdown(res))
    return 0


if __name__ == '__main__':
    sys.exit(main())
