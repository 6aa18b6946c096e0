"""Workers' memory with a big in-memory list, loadr shared and not, beside torch.

The list: ``n`` small dicts ``{'label': int, 'name': str,
'box': [4 floats]}`` (1,000,000 take ~520 MiB as Python objects), batch
256, shuffled, ``--workers`` forked workers, ``--epochs`` epochs. Each
contender runs in a fresh process of its own (``--one``), so that none
inherits another's memory; printed per contender:

- the workers' private memory (USS, :func:`loadr.workers.memory.private_bytes`:
  what only that worker maps; shared pages of the list or the batch slots are
  not in it) after the first batch and after each epoch, per worker and summed;
- the main process's extra memory: its USS + shared resident pages after the
  run, less before the loader was made (for loadr shared: the shared copy and
  the batch slots);
- loadr shared: the size of the shared copy and the one-time serialisation;
- samples/s over the epochs after the first batch.

Contenders: ``loadr`` (the list shared, ``LOADR_SHARE=1``), ``loadr-copy``
(``LOADR_SHARE=0``, every worker copying the pages it touches), ``torch``
(DataLoader, persistent workers, default collate).

    python -m benchmarks.memory --n 1000000 --workers 4 --epochs 5
    python -m benchmarks.memory --n 200000 --epochs 2 --only loadr,torch

Readers' tables (the target "a bag of 10^7 records: a worker's private memory
after an epoch of reads <= 100 MiB"): ``--bag-records N`` writes a bag of N
tiny records (``{'label': int, 'name': str}``, loadr's BagWriter) and
``--gulp-videos N`` a gulp directory of N small videos (two 8x8 JPEG frames
and a meta dict each), in ``--dir`` (kept) or a temporary directory, then
reads it with loadr alone (frames left as JPEG bytes), measured as above::

    python -m benchmarks.memory --bag-records 10000000 --workers 2 --epochs 1
    python -m benchmarks.memory --gulp-videos 1000000 --workers 2 --epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CONTENDERS = ('loadr', 'loadr-copy', 'torch')
BATCH = 256


def boxes(n: int) -> list[dict]:
    """The small dicts (what a detection dataset's metadata looks like)."""
    return [{'label': i % 1000, 'name': f'img_{i:08d}.jpg',
             'box': [i * 0.25, (i % 640) * 1.0, 32.0 + i % 7, 48.0 + i % 5]} for i in range(n)]


def _uss(pid: int) -> int:
    from loadr.workers.memory import private_bytes
    return private_bytes(pid) or 0


def _main_memory() -> int:
    """This process's USS plus the shared pages it has resident (a shared copy it made)."""
    found = {}
    with open('/proc/self/smaps_rollup') as f:
        for line in f:
            key, _, value = line.partition(':')
            if key in ('Private_Clean', 'Private_Dirty', 'Shared_Clean', 'Shared_Dirty'):
                found[key] = int(value.split()[0]) * 1024
    return sum(found.values())


def one(name: str, n: int, workers: int, epochs: int) -> dict:
    """Run one contender in this process; what it measured."""
    import gc

    items = boxes(n)
    gc.collect()
    base = _main_memory()
    out = {'name': name, 'n': n, 'workers': workers, 'epochs': epochs, 'epoch_uss': []}
    t0 = time.perf_counter()
    if name == 'torch':
        import torch
        from torch.utils.data import DataLoader

        torch.manual_seed(0)
        loader = DataLoader(items, batch_size=BATCH, shuffle=True, num_workers=workers,
                            persistent_workers=True)
        it = iter(loader)
        next(it)
        out['first_batch_s'] = time.perf_counter() - t0
        time.sleep(0.5)
        pids = [w.pid for w in it._workers]
        out['start_uss'] = [_uss(p) for p in pids]
        t1, samples = time.perf_counter(), 0
        for e in range(epochs):
            for b in (it if e == 0 else loader):
                samples += len(b['label'])
            out['epoch_uss'].append([_uss(p) for p in pids])
        out['samples_per_s'] = samples / (time.perf_counter() - t1)
        out['main_extra'] = _main_memory() - base
        del it, loader
        return out
    os.environ['LOADR_SHARE'] = '1' if name == 'loadr' else '0'
    import loadr

    with loadr.Loader(items, batch=BATCH, seed=0, workers=workers,
                      start_method='fork') as loader:
        _measure(loader, epochs, out, t0, base)
    return out


def _measure(loader, epochs: int, out: dict, t0: float, base: int) -> None:
    """Run ``epochs`` epochs of a loadr Loader, its workers' USS after the first batch and
    after each epoch into ``out``."""
    import loadr

    it = loader.epoch(0)
    first = next(it)
    key = next(iter(first))
    out['first_batch_s'] = time.perf_counter() - t0
    source = loader._source
    if isinstance(source, loadr.SharedList):
        out['shared_bytes'] = source.nbytes
        out['serialise_s'] = source.serialise_s
    time.sleep(0.5)
    pids = loader.worker_pids
    out['start_uss'] = [_uss(p) for p in pids]
    t1, samples = time.perf_counter(), 0
    for e in range(epochs):
        for b in (it if e == 0 else loader.epoch(e)):
            samples += len(b[key])
        out['epoch_uss'].append([_uss(p) for p in pids])
    out['samples_per_s'] = samples / (time.perf_counter() - t1)
    out['main_extra'] = _main_memory() - base
    out['stats_uss'] = [w.get('uss_bytes') for w in loader.stats().workers]


def write_dataset(kind: str, path: str, n: int) -> float:
    """Write ``n`` tiny records (a bag) or small videos (gulp) at ``path``; seconds taken."""
    t0 = time.perf_counter()
    if kind == 'bag':
        from loadr.writers import BagWriter

        with BagWriter(path, {'label': 'int', 'name': 'utf8'}) as w:
            for i in range(n):
                w.append({'label': i % 1000, 'name': f'r{i}'})
    else:
        import numpy as np

        from loadr.codecs import encode_image
        from loadr.writers import GulpWriter

        jpeg = encode_image(np.zeros((8, 8), np.uint8))
        with GulpWriter(path, videos_per_chunk=10_000) as w:
            for i in range(n):
                w.append(f'v{i}', {'label': i % 1000, 'name': f'clip {i}'}, [jpeg, jpeg])
    return time.perf_counter() - t0


def one_reader(kind: str, path: str, workers: int, epochs: int) -> dict:
    """Read the dataset at ``path`` with loadr in this process; what it measured."""
    import gc

    import loadr

    gc.collect()
    base = _main_memory()
    out = {'name': f'loadr {kind}', 'workers': workers, 'epochs': epochs, 'epoch_uss': []}
    t0 = time.perf_counter()
    reader = loadr.open(path, decode_images=False) if kind == 'gulp' else loadr.open(path)
    out['n'] = len(reader)
    out['open_s'] = time.perf_counter() - t0
    with loadr.Loader(reader, batch=BATCH, seed=0, workers=workers,
                      start_method='fork') as loader:
        _measure(loader, epochs, out, t0, base)
    return out


def _readers(args) -> int:
    """``--bag-records`` / ``--gulp-videos``: write the dataset, read it in a fresh process."""
    kind, n = ('bag', args.bag_records) if args.bag_records else ('gulp', args.gulp_videos)
    where = args.dir or tempfile.mkdtemp(prefix=f'loadr-memory-{kind}-')
    path = os.path.join(where, kind)
    try:
        if os.path.exists(path):
            print(f'{kind}: reading the one at {path}', file=sys.stderr, flush=True)
        else:
            took = write_dataset(kind, path, n)
            print(f'{kind}: wrote {n:,} in {took:.1f} s ({_du(path)})', file=sys.stderr,
                  flush=True)
        proc = subprocess.run([sys.executable, '-m', 'benchmarks.memory', '--one', kind,
                               '--dir', path, '--workers', str(args.workers),
                               '--epochs', str(args.epochs)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f'{kind} failed:\n{proc.stderr}', file=sys.stderr)
            return 1
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if not args.dir:
            shutil.rmtree(where, ignore_errors=True)
    what = 'tiny records {label, name}' if kind == 'bag' else \
        'videos of two 8x8 JPEG frames and a meta dict'
    print(f'{result["n"]:,} {what} ({kind}), batch {BATCH}, {args.workers} forked workers, '
          f'{args.epochs} epochs, shuffled; opened in {result["open_s"]:.2f} s')
    print(table([result]))
    if args.json:
        print(json.dumps([result]))
    return 0


def _du(path: str) -> str:
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
                for f in files)
    return f'{total / 2**20:,.0f} MiB'


def _mib(b) -> str:
    return f'{b / 2**20:,.0f}'


def table(results: list[dict]) -> str:
    """A markdown table of the results."""
    epochs = max(len(r['epoch_uss']) for r in results)
    head = ['', 'workers\' USS after start (MiB, all)'] + [
        f'after epoch {e + 1}' for e in range(epochs)] + [
        'each after the last', 'main extra (MiB)', 'shared copy (MiB)', 'serialise (s)',
        'samples/s']
    lines = ['| ' + ' | '.join(head) + ' |', '|---|' + '---:|' * (len(head) - 1)]
    for r in results:
        row = [r['name'], _mib(sum(r['start_uss']))]
        row += [_mib(sum(u)) for u in r['epoch_uss']]
        row += [f"{_mib(min(r['epoch_uss'][-1]))}-{_mib(max(r['epoch_uss'][-1]))}",
                _mib(r['main_extra']),
                _mib(r['shared_bytes']) if 'shared_bytes' in r else '-',
                f"{r['serialise_s']:.2f}" if 'serialise_s' in r else '-',
                f"{r['samples_per_s']:,.0f}"]
        lines.append('| ' + ' | '.join(row) + ' |')
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--n', type=int, default=1_000_000)
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--epochs', type=int, default=5)
    parser.add_argument('--only', default=','.join(CONTENDERS))
    parser.add_argument('--one', help=argparse.SUPPRESS)
    parser.add_argument('--json', action='store_true', help='print the raw results too')
    parser.add_argument('--bag-records', type=int, metavar='N',
                        help='read a bag of N tiny records instead of the list')
    parser.add_argument('--gulp-videos', type=int, metavar='N',
                        help='read a gulp directory of N small videos instead of the list')
    parser.add_argument('--dir', help='where to write that dataset and keep it (read it again '
                                      'if it is there); default: a temporary directory')
    args = parser.parse_args(argv)
    if args.one in ('bag', 'gulp'):
        print(json.dumps(one_reader(args.one, args.dir, args.workers, args.epochs)), flush=True)
        return 0
    if args.one:
        print(json.dumps(one(args.one, args.n, args.workers, args.epochs)), flush=True)
        return 0
    if args.bag_records or args.gulp_videos:
        return _readers(args)
    results = []
    for name in args.only.split(','):
        if name not in CONTENDERS:
            parser.error(f'unknown contender {name!r} (known: {", ".join(CONTENDERS)})')
        proc = subprocess.run([sys.executable, '-m', 'benchmarks.memory', '--one', name,
                               '--n', str(args.n), '--workers', str(args.workers),
                               '--epochs', str(args.epochs)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f'{name} failed:\n{proc.stderr}', file=sys.stderr)
            return 1
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f'{name}: done', file=sys.stderr, flush=True)
    print(f'{args.n:,} dicts {{label, name, box}}, batch {BATCH}, {args.workers} forked workers, '
          f'{args.epochs} epochs, shuffled')
    print(table(results))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == '__main__':
    sys.exit(main())
