"""``python -m benchmarks.decode_loaders``: samples/s of the JPEG pipelines, W workers.

:mod:`benchmarks.decode` gives CPU per sample on one core; this runs the same
pipelines as users run them, in loaders with ``--workers`` processes, wall
clock, on the same in-memory JPEGs (distinct q90 pictures, cycled):

- ``loadr fused``: ``Loader(..., fns=[decode_jpeg(), random_resized_crop(224),
  flip()])`` (or ``resize(256)``, ``center_crop(224)``), fused as it runs by default;
- ``loadr unfused``: the same with ``decode_jpeg(fuse=False)``;
- ``plain loop ×W``: W processes each running the plain Pillow loop (full
  decode, crop, resize, flip) on the same crop boxes, nothing returned: the
  ceiling of a user's own fn, with no loader around it;
- ``torch + Pillow fn``: torch's DataLoader, ``num_workers=W``, whose
  dataset runs the plain Pillow loop (the same boxes) and returns the array:
  the same pipeline written with Pillow, as a user without loadr writes it
  (where torch imports);
- ``torch + torchvision``: torch's DataLoader, ``num_workers=W``, with
  torchvision's ``RandomResizedCrop`` (or ``Resize``, ``CenterCrop``) and
  ``RandomHorizontalFlip`` on PIL images (where torchvision imports).

Each figure is the median of ``--runs`` runs of ``--batches`` batches of 64
after two batches of warm-up; the ratios are loadr fused ÷ each other row.

Example::

    python -m benchmarks.decode_loaders --workers 2
    python -m benchmarks.decode_loaders --workers 2 16 --only 1600 --batches 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from . import decode as D

__all__ = ['main', 'run']

BATCH = 64
WARM = 2


def _data(hw: tuple, distinct: int, n: int) -> list:
    jpegs = [D._jpeg(p) for p in D.pictures(distinct, *hw)]
    return [{'image': jpegs[i % distinct], 'label': i} for i in range(n)]


def _timed(stream, batches: int) -> float:
    """Samples/s over ``batches`` batches of ``stream`` after WARM of them."""
    for _ in range(WARM):
        next(stream)
    t0 = time.perf_counter()
    samples = 0
    for _ in range(batches):
        b = next(stream)
        samples += len(b['label'])
    return samples / (time.perf_counter() - t0)


def _loadr(data, kind: str, workers: int, batches: int, fuse: bool) -> float:
    import loadr
    import loadr.fns as F
    fns = D._pipeline(kind)
    fns[0] = F.decode_jpeg(fuse=fuse)
    loader = loadr.Loader(data, batch=BATCH, fns=fns, shuffle=True, seed=0, workers=workers)
    try:
        def stream():
            epoch = 0
            while True:
                yield from loader.epoch(epoch)
                epoch += 1
        return _timed(stream(), batches)
    finally:
        loader.close()


def _plain_worker(args) -> int:
    data, plans, kind, start, count = args
    for i in range(start, start + count):
        D.plain_loop(data[i % len(data)]['image'], plans[i % len(plans)], kind)
    return count


def _plain(data, kind: str, hw: tuple, workers: int, batches: int) -> float:
    import multiprocess as mp
    distinct = len({id(d['image']) for d in data})
    plans = D._plans(kind, hw, range(256))
    jpegs = [{'image': d['image']} for d in data[:distinct]]
    per = BATCH * batches // workers
    with mp.get_context('fork').Pool(workers) as pool:
        pool.map(_plain_worker, [(jpegs, plans, kind, 0, 8)] * workers)     # warm
        t0 = time.perf_counter()
        done = sum(pool.map(_plain_worker, [(jpegs, plans, kind, w * per, per)
                                            for w in range(workers)]))
        return done / (time.perf_counter() - t0)


class _TorchSet:
    def __init__(self, data, ops):
        self.data, self.ops = data, ops

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        import io

        from PIL import Image
        dp = self.data[int(i)]
        img = Image.open(io.BytesIO(dp['image'])).convert('RGB')
        return {'image': np.asarray(self.ops(img)), 'label': dp['label']}


class _PillowSet:
    """The plain Pillow loop as a map-style dataset: sample i gets box i of the plans."""

    def __init__(self, data, plans, kind):
        self.data, self.plans, self.kind = data, plans, kind

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        dp = self.data[int(i)]
        arr = D.plain_loop(dp['image'], self.plans[int(i) % len(self.plans)], self.kind)
        # Writable, as torch's collate wants (np.asarray of a PIL image is read-only): the
        # copy a user's own np.array(img) makes.
        return {'image': np.require(arr, requirements='W'), 'label': dp['label']}


def _torch(data, kind: str, workers: int, batches: int, hw: tuple | None = None
           ) -> float | None:
    """torch's DataLoader over the plain Pillow loop (``hw`` given) or torchvision's
    transforms; None where torch (or torchvision) does not import."""
    try:
        import torch
        if hw is None:
            import torchvision.transforms as T
    except Exception:               # not installed, or a torchvision that cannot load its torch
        return None
    from torch.utils.data import DataLoader
    if hw is not None:
        dataset = _PillowSet(data, D._plans(kind, hw, range(256)), kind)
    elif kind == 'center':
        dataset = _TorchSet(data, T.Compose([T.Resize(256), T.CenterCrop(D.OUT),
                                             T.RandomHorizontalFlip()]))
    else:
        dataset = _TorchSet(data, T.Compose([T.RandomResizedCrop(D.OUT),
                                             T.RandomHorizontalFlip()]))
    dl = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                    drop_last=True, persistent_workers=True,
                    generator=torch.Generator().manual_seed(0))

    def stream():
        while True:
            yield from dl
    try:
        return _timed(stream(), batches)
    finally:
        it = getattr(dl, '_iterator', None)
        if it is not None:
            it._shutdown_workers()


CASES = [c for c in D.CASES if c[2] != 'video']


def run(workers: int, batches: int, runs: int, only: str | None = None,
        distinct: int = 32) -> list[dict]:
    """One row per case: samples/s of each loader (medians of ``runs``)."""
    rows = []
    for name, hw, kind in CASES:
        if only and only not in name:
            continue
        data = _data(hw, distinct, BATCH * (batches + WARM) * 2)
        figs: dict[str, list] = {c: [] for c in COLUMNS}
        for _ in range(runs):       # interleaved, so that a busy moment hits every row
            figs['loadr fused'].append(_loadr(data, kind, workers, batches, True))
            figs['loadr unfused'].append(_loadr(data, kind, workers, batches, False))
            figs['plain loop'].append(_plain(data, kind, hw, workers, batches))
            for col, t in (('torch + Pillow fn', _torch(data, kind, workers, batches, hw)),
                           ('torch + torchvision', _torch(data, kind, workers, batches))):
                if t is not None:
                    figs[col].append(t)
        med = {k: statistics.median(v) for k, v in figs.items() if v}
        rows.append({'case': name, 'workers': workers, **med})
    return rows


COLUMNS = ('loadr fused', 'loadr unfused', 'plain loop', 'torch + Pillow fn',
           'torch + torchvision')
PEERS = ('plain loop', 'torch + Pillow fn', 'torch + torchvision')


def markdown(rows: list[dict]) -> str:
    """The rows as a table: samples/s, and loadr fused ÷ each peer."""
    out = ['| case | workers | ' + ' | '.join(COLUMNS) + ' | '
           + ' | '.join(f'fused ÷ {p}' for p in PEERS) + ' |',
           '|---|---:|' + '---:|' * (len(COLUMNS) + len(PEERS))]
    for r in rows:
        cells = [f'{r[c]:,.0f}' if c in r else '—' for c in COLUMNS]
        ratios = [f'{r["loadr fused"] / r[c]:.2f}×' if c in r else '—' for c in PEERS]
        out.append(f'| {r["case"]} | {r["workers"]} | ' + ' | '.join(cells + ratios) + ' |')
    return '\n'.join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m benchmarks.decode_loaders', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--workers', type=int, nargs='+', default=[2])
    p.add_argument('--batches', type=int, default=12, help='timed batches of 64 per run')
    p.add_argument('--runs', type=int, default=3)
    p.add_argument('--only', default=None, help='cases whose name contains this')
    args = p.parse_args(argv)
    rows = []
    for w in args.workers:
        rows += run(w, args.batches, args.runs, args.only)
        print(markdown(rows), flush=True)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
