"""The formats users already have: WebDataset shards and Parquet, read in place.

``python -m benchmarks.formats`` prints:

- **random access**: ``read_batch`` of 64 random indices at a time over
  every sample, page cache warm, one process: loadr's WebDataset reader on
  shards of ~100 KB JPEG samples (``jpg`` + ``cls``) against loadr's bag
  reader (``decode_images=False``) holding the same images and labels; the
  target is >= 80% of bag.
- **shuffled epoch, 2 workers**: a :class:`loadr.Loader` (global shuffle,
  ``workers=2``, batch 64, the raw ``jpg`` bytes and ``cls``) against the
  ``webdataset`` package's own pipeline on the same files (shard shuffle,
  a 1,000-sample shuffle buffer, ``WebLoader`` with 2 workers, batches of
  64); samples/s of one epoch each, in one run.
- **index build**: ``--index-shards`` tars of ``--index-per-shard`` samples
  (a ``jpg`` of ``--image-kb`` and a ``cls`` each), written as sparse files
  (the member data are holes, so 1,000 shards of 1,000 samples fit any
  disk), indexed by ``build_index`` from scratch: seconds, and the fraction of
  the tars' bytes the scan read (the headers).
- **Parquet**: one file of ``--parquet-mb`` MB of ~100 KB binary rows in row
  groups of ``--row-group-mb``; one shuffled epoch through a Loader
  (``workers=0``, so the reads are counted in this process): row group reads
  per row group, the peak resident memory added, samples/s.

Timings are wall-clock on whatever machine runs it (a shared one disturbs
them); the JSON of every figure goes to ``--json``.

Example::

    python -m benchmarks.formats                                  # the defaults below
    python -m benchmarks.formats --index-shards 1000 --index-per-shard 1000
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import sys
import tarfile
import tempfile
import time

import numpy as np

import loadr
from loadr import fns as F
from loadr.readers.webdataset import build_index

__all__ = ['main']

BATCH = 64


def _jpegs(count: int, kb: int) -> list[bytes]:
    from PIL import Image
    side = int(320 * (kb / 100) ** 0.5)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (side, side, 3), np.uint8)).save(buf, 'JPEG',
                                                                               quality=90)
        out.append(buf.getvalue())
    return out


def _write_shards(root: str, images: list[bytes], n: int, per_shard: int) -> str:
    """Shards as the webdataset package writes them (loadr's writer where it is missing)."""
    os.makedirs(root)
    try:
        import webdataset as wds
    except ImportError:
        wds = None
    for s in range(0, n, per_shard):
        path = os.path.join(root, f'train-{s // per_shard:06d}.tar')
        if wds is None:
            with tarfile.open(path, 'w') as t:
                for k in range(s, min(n, s + per_shard)):
                    for ext, data in (('jpg', images[k % len(images)]),
                                      ('cls', b'%d' % (k % 1000))):
                        info = tarfile.TarInfo(f'{k:08d}.{ext}')
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
            continue
        with wds.TarWriter(path) as w:
            for k in range(s, min(n, s + per_shard)):
                w.write({'__key__': f'{k:08d}', 'jpg': images[k % len(images)], 'cls': k % 1000})
    return root


def _best_rate(reader, n: int, runs: int) -> float:
    rng = np.random.default_rng(1)
    best = 0.0
    for _ in range(runs):
        order = rng.permutation(n).tolist()
        t0 = time.perf_counter()
        for a in range(0, n, BATCH):
            reader.read_batch(order[a:a + BATCH])
        best = max(best, n / (time.perf_counter() - t0))
    return best


def random_access(tmp: str, n: int, kb: int, per_shard: int, runs: int) -> dict:
    images = _jpegs(64, kb)
    shards = _write_shards(os.path.join(tmp, 'shards'), images, n, per_shard)
    wds_reader = loadr.open(shards)
    bag = os.path.join(tmp, 'bag')
    with loadr.writers.BagWriter(bag, {'cls': 'int', 'jpg': 'jpg'}) as w:
        for k in range(n):
            w.append({'cls': k % 1000, 'jpg': images[k % len(images)]})
    bag_reader = loadr.open(bag, decode_images=False)
    for r in (wds_reader, bag_reader):                      # warm the page cache
        _best_rate(r, n, 1)
    out = {'samples': n, 'image_bytes': int(np.mean([len(i) for i in images])),
           'webdataset_samples_per_s': _best_rate(wds_reader, n, runs),
           'bag_samples_per_s': _best_rate(bag_reader, n, runs)}
    out['ratio'] = out['webdataset_samples_per_s'] / out['bag_samples_per_s']
    out['shards'] = shards
    return out


def shuffled_epoch(shards: str, n: int) -> dict:
    reader = loadr.open(shards)
    out = {}
    with loadr.Loader(reader, batch=BATCH, fns=[F.select(['jpg', 'cls'])], seed=0,
                      workers=2) as loader:
        it = iter(loader)
        next(it)                                            # workers started
        t0 = time.perf_counter()
        got = BATCH
        for batch in it:
            got += len(batch['cls'])
            if got >= n:
                break
        out['loadr_samples_per_s'] = (got - BATCH) / (time.perf_counter() - t0)
    try:
        import webdataset as wds
    except ImportError:
        out['webdataset_package'] = 'not installed'
        return out
    tars = sorted(os.path.join(shards, t) for t in os.listdir(shards) if t.endswith('.tar'))
    pipeline = wds.WebDataset(tars, shardshuffle=len(tars), empty_check=False,
                              nodesplitter=wds.split_by_node).shuffle(1000).to_tuple(
                                  'jpg', 'cls').batched(BATCH)
    loader = wds.WebLoader(pipeline, batch_size=None, num_workers=2)
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    got = BATCH
    for batch in it:
        got += len(batch[1])
    out['webdataset_samples_per_s'] = (got - BATCH) / (time.perf_counter() - t0)
    return out


def _sparse_tar(path: str, per_shard: int, kb: int, first: int) -> None:
    """A tar whose member data are holes: its headers are real, its bytes mostly unallocated."""
    size = kb * 1024
    with open(path, 'wb') as f:
        pos = 0
        for k in range(first, first + per_shard):
            for ext, length in (('jpg', size), ('cls', 3)):
                info = tarfile.TarInfo(f'{k:09d}.{ext}')
                info.size = length
                head = info.tobuf(tarfile.GNU_FORMAT)
                f.seek(pos)
                f.write(head)
                pos += len(head) + -(-length // 512) * 512
        f.seek(pos)
        f.write(bytes(1024))


def index_build(tmp: str, shards: int, per_shard: int, kb: int) -> dict:
    root = os.path.join(tmp, 'sparse')
    os.makedirs(root)
    t0 = time.perf_counter()
    for s in range(shards):
        _sparse_tar(os.path.join(root, f'train-{s:06d}.tar'), per_shard, kb, s * per_shard)
    made = time.perf_counter() - t0
    last = [0.0]

    def progress(done, total):
        now = time.perf_counter()
        if now - last[0] > 5:
            last[0] = now
            print(f'  index: {done / total:.0%} of {total / 2**30:.1f} GiB', file=sys.stderr)
    t0 = time.perf_counter()
    built = build_index(f'{root}/train-{{000000..{shards - 1:06d}}}.tar', progress=progress)
    seconds = time.perf_counter() - t0
    total = sum(i.tar_size for _, i in built)
    read = sum(i.bytes_read for _, i in built)
    t0 = time.perf_counter()
    r = loadr.open(root)
    opened = time.perf_counter() - t0
    out = {'shards': shards, 'samples_per_shard': per_shard, 'member_kb': kb,
           'samples': len(r), 'tar_bytes': total, 'bytes_read': read,
           'fraction_read': read / total, 'seconds': seconds, 'write_seconds': made,
           'open_with_sidecars_seconds': opened}
    shutil.rmtree(root)
    return out


def parquet_epoch(tmp: str, mb: int, group_mb: int, kb: int) -> dict:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return {'skipped': 'pyarrow is not installed'}
    path = os.path.join(tmp, 'data.parquet')
    rows = mb * 1024 // kb
    per_group = group_mb * 1024 // kb
    rng = np.random.default_rng(2)
    with pq.ParquetWriter(path, pa.schema([('image', pa.binary()), ('label', pa.int64())]),
                          compression='none') as w:
        for a in range(0, rows, per_group):
            count = min(per_group, rows - a)
            blob = rng.integers(0, 255, count * kb * 1024, np.uint8).tobytes()
            images = [blob[i * kb * 1024:(i + 1) * kb * 1024] for i in range(count)]
            w.write_table(pa.table({'image': images, 'label': list(range(a, a + count))}),
                          row_group_size=count)
            del blob, images
    reader = loadr.open(path)
    groups = reader.details()['row_groups']
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    seen = 0
    with loadr.Loader(reader, batch=BATCH, fns=[F.select(['image', 'label'])], seed=0,
                      workers=0) as loader:
        for batch in loader:
            seen += len(batch['label'])
            if seen >= rows:
                break
    seconds = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {'file_mb': os.path.getsize(path) / 2**20, 'rows': rows, 'row_groups': groups,
            'row_group_mb': group_mb, 'window_mb': reader.window_bytes / 2**20,
            'row_group_reads': reader.row_group_reads,
            'reads_per_row_group': reader.row_group_reads / groups,
            'peak_rss_added_mb': (rss1 - rss0) / 1024, 'samples_per_s': seen / seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m benchmarks.formats', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--images', type=int, default=4000, help='samples of the random-access run')
    p.add_argument('--image-kb', type=int, default=100)
    p.add_argument('--per-shard', type=int, default=500)
    p.add_argument('--runs', type=int, default=3)
    p.add_argument('--index-shards', type=int, default=100)
    p.add_argument('--index-per-shard', type=int, default=1000)
    p.add_argument('--parquet-mb', type=int, default=1024)
    p.add_argument('--row-group-mb', type=int, default=128)
    p.add_argument('--skip', default='', help='comma-separated: random,epoch,index,parquet')
    p.add_argument('--tmp', default=None, help='where the data is written (default: a temp dir)')
    p.add_argument('--json', default=None, help='write every figure here as JSON')
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(',')))
    tmp = tempfile.mkdtemp(prefix='loadr-formats-', dir=args.tmp)
    results = {}
    try:
        if not {'random', 'epoch'} <= skip:
            ra = random_access(tmp, args.images, args.image_kb, args.per_shard, args.runs)
            shards = ra.pop('shards')
            if 'random' not in skip:
                results['random_access'] = ra
                print(f"random access, read_batch of {BATCH}, {ra['samples']} samples of "
                      f"{ra['image_bytes'] / 1000:.0f} KB JPEG + cls, page cache warm: "
                      f"webdataset {ra['webdataset_samples_per_s']:,.0f} samples/s, bag "
                      f"{ra['bag_samples_per_s']:,.0f} samples/s: {ra['ratio']:.0%} of bag "
                      f"(target >= 80%)")
            if 'epoch' not in skip:
                ep = shuffled_epoch(shards, args.images)
                results['shuffled_epoch'] = ep
                print(f"shuffled epoch, 2 workers, batch {BATCH}, raw jpg + cls: loadr (global "
                      f"shuffle) {ep['loadr_samples_per_s']:,.0f} samples/s; webdataset package "
                      f"(shard shuffle + buffer 1000, WebLoader 2 workers) "
                      f"{ep.get('webdataset_samples_per_s', float('nan')):,.0f} samples/s")
        if 'index' not in skip:
            ix = index_build(tmp, args.index_shards, args.index_per_shard, args.image_kb)
            results['index_build'] = ix
            print(f"index build: {ix['shards']} shards x {ix['samples_per_shard']} samples "
                  f"(jpg {ix['member_kb']} KB + cls): {ix['seconds']:.1f} s "
                  f"({ix['samples'] / ix['seconds']:,.0f} samples/s), read "
                  f"{ix['bytes_read'] / 2**20:.1f} MiB of {ix['tar_bytes'] / 2**30:.1f} GiB "
                  f"({ix['fraction_read']:.2%} of the bytes); open with the sidecars: "
                  f"{ix['open_with_sidecars_seconds']:.2f} s")
        if 'parquet' not in skip:
            pqr = parquet_epoch(tmp, args.parquet_mb, args.row_group_mb, args.image_kb)
            results['parquet'] = pqr
            if 'skipped' in pqr:
                print(f"parquet: skipped ({pqr['skipped']})")
            else:
                print(f"parquet: {pqr['file_mb']:.0f} MB, {pqr['row_groups']} row groups of "
                      f"{pqr['row_group_mb']} MB; one shuffled epoch (workers 0, window "
                      f"{pqr['window_mb']:.0f} MB): {pqr['row_group_reads']} row group reads "
                      f"({pqr['reads_per_row_group']:.1f} per row group), peak RSS +"
                      f"{pqr['peak_rss_added_mb']:.0f} MB, {pqr['samples_per_s']:,.0f} "
                      f"samples/s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == '__main__':
    sys.exit(main())
