"""MosaicML streaming beside loadr: the JPEG pipeline from local disk and over HTTP.

The images workload of the benchmarks (375×500 JPEGs; Pillow decode, random
224×224 crop, random flip; batch 64; ``--workers`` workers) is read by loadr
from its bag and by MosaicML streaming (``mosaicml-streaming``) from the same
images written with streaming's own ``MDSWriter`` (columns: the JPEG bytes
and the label; its default shard size unless ``--shard-bytes``). Each case is
one epoch from a new dataset and a cold cache, shuffled each loader's own
way (loadr: the true global shuffle; streaming: its default ``py1e``):

- ``local disk``: loadr reads the bag, streaming ``StreamingDataset(local=
  the MDS dir, remote=None)``, both in a temporary directory;
- ``nginx + 20 ms``: that directory served by nginx on loopback through our
  proxy (``tests/remote/proxy.py``, its own process) holding every request
  for ``--delay-ms``, as in ``benchmarks/remote.py``, whose helpers run
  loadr's cases here. Streaming has no HTTP downloader (its remotes are
  ``s3://``, ``gs://``, ``oci://``, Azure, SFTP, Databricks, Hugging Face),
  so it reads ``s3://bench/mds`` with its S3 downloader (boto3) pointed at the
  proxy (``S3_ENDPOINT_URL``): an S3 GET of ``/bench/mds/shard.00000.mds`` is
  a plain GET of that file, which nginx answers, byte ranges included. Its
  cache (``local=``) is a fresh temporary directory. Each DataLoader worker
  makes its own S3 client (:func:`own_connections`); ``--inherit-clients``
  leaves the one forked from the parent, as streaming does, whose shared
  connection costs a failed attempt and its backoff, or a 60 s timeout.

Streaming's sample function is the same ``benchmarks.workloads.image_fn``
(``seed`` = the sample's index), called in ``__getitem__`` of a
``StreamingDataset`` subclass (as streaming's docs show); the batches come
from ``torch.utils.data.DataLoader(dataset, batch_size=64,
num_workers=W)``, as streaming's users run it.

Per case: samples/s over the epoch and the time of the first batch, both
from the dataset's creation (``loadr.open`` / ``StreamingDataset(...)``, so
reading the index is counted); the body bytes the proxy passed divided by
the dataset's bytes on disk (the bag directory, or the MDS directory); and
the CPU milliseconds per sample of the loader (its process and workers, not
the servers'), which other work on the machine disturbs less than samples/s.

Streaming is imported without its package ``__init__``: that imports its
vision datasets (torchvision) and ``StreamingDataLoader`` (transformers),
neither used here, and PyPI's torchvision is built against CUDA torch and
cannot load beside the CPU torch of this venv. Only ``streaming.base``'s
modules are loaded, unchanged, from the installed package. Installing it
without its pins (numpy<2.2, torchvision, transformers, cloud SDKs) keeps
numpy and torch as they are: see ``INSTALL``.

Example::

    python -m benchmarks.streaming_peer --images 1024 --delay-ms 20 --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import resource
import sys
import tempfile
import time
import warnings

from . import remote as R
from . import workloads as W

INSTALL = ("pip install --no-deps 'mosaicml-streaming==0.13.0' && "
           "pip install 'xxhash>=3,<4' zstd python-snappy Brotli catalogue")
BUCKET = 'bench'          # s3://bench/mds is <served root>/bench/mds on nginx
MDS_PREFIX = 'mds'


def load_streaming():
    """``(StreamingDataset, MDSWriter)`` from the installed ``mosaicml-streaming``.

    Raises ImportError when it (or one of the few packages its reading path
    imports) is missing.

    >>> StreamingDataset, MDSWriter = load_streaming()
    >>> StreamingDataset.__name__, MDSWriter.__name__
    ('StreamingDataset', 'MDSWriter')
    """
    if 'streaming' not in sys.modules:
        # The package modules without running their __init__ (which imports
        # torchvision and transformers): submodules then import as usual.
        made = []
        try:
            for name in ('streaming', 'streaming.base'):
                spec = importlib.util.find_spec(name)
                if spec is None:
                    raise ImportError(f'No module named {name!r}')
                sys.modules[name] = importlib.util.module_from_spec(spec)
                made.append(name)
        except ImportError:
            for name in made:
                sys.modules.pop(name, None)
            raise
    try:
        from streaming.base.dataset import StreamingDataset
        from streaming.base.format.mds.writer import MDSWriter
    except ImportError:
        for name in [m for m in sys.modules if m == 'streaming' or m.startswith('streaming.')]:
            sys.modules.pop(name, None)
        raise
    return StreamingDataset, MDSWriter


def pipeline_class(streaming_dataset: type) -> type:
    """A ``StreamingDataset`` whose samples go through ``image_fn`` (seed: the sample index)."""

    class JpegPipeline(streaming_dataset):
        def __getitem__(self, index):
            return W.image_fn(super().__getitem__(index), seed=int(index))

    return JpegPipeline


def write_mds(mds_writer: type, data: W.Data, out: str, shard_bytes: int | None) -> int:
    """Every datapoint of ``data`` (JPEG bytes, label) into an MDS dataset at ``out``; its bytes."""
    kwargs = {} if shard_bytes is None else {'size_limit': shard_bytes}
    with mds_writer(out=out, columns={'image': 'bytes', 'label': 'int'}, **kwargs) as w:
        for i in range(data.n):
            dp = data.reader[i]
            w.write({'image': bytes(dp['image']), 'label': int(dp['label'])})
    return W._dir_bytes(out)


@contextlib.contextmanager
def _environ(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _tempdir_root(path: str):
    """Streaming's file locks go under ``tempfile.gettempdir()``: keep them in ``path``."""
    os.makedirs(path, exist_ok=True)
    old, tempfile.tempdir = tempfile.tempdir, path
    try:
        yield
    finally:
        tempfile.tempdir = old


def _cpu_s() -> float:
    """CPU seconds of this process and its children that have been waited for.

    A DataLoader's workers are joined when its epoch ends, so they count; the
    servers (nginx, the proxy) are still running, so they do not.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def own_connections(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: drop the S3 client this worker inherited from its parent.

    ``StreamingDataset(...)`` downloads ``index.json`` in the parent and keeps
    its boto3 client, whose pooled keep-alive connection every forked worker
    then shares: two workers' requests on one socket read each other's
    answers (a 412 for an ETag that is the other shard's, or a read that
    waits for the 60 s timeout). Each worker makes its own client instead,
    as it would after ``spawn`` (streaming's ``__getstate__`` drops the client).
    """
    from torch.utils.data import get_worker_info
    for stream in get_worker_info().dataset.streams:
        stream._downloader.clean_up()


def run_streaming(name: str, dataset_cls: type, remote: str | None, local: str, workers: int,
                  proxy_url: str | None, inherit_clients: bool = False) -> dict:
    """One epoch of the JPEG pipeline through streaming, timed from the dataset's creation."""
    from torch.utils.data import DataLoader
    if proxy_url:
        R._quiet(proxy_url)
        R._proxy_stats(proxy_url, reset=True)
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    dataset = dataset_cls(remote=remote, local=local, shuffle=True, batch_size=W.IMAGE_BATCH)
    loader = DataLoader(dataset, batch_size=W.IMAGE_BATCH, num_workers=workers,
                        worker_init_fn=None if inherit_clients else own_connections)
    samples, first_s = 0, None
    it = iter(loader)
    try:
        for batch in it:
            samples += len(batch['label'])
            if first_s is None:
                first_s = time.perf_counter() - t0
        total_s = time.perf_counter() - t0
    finally:
        shutdown = getattr(it, '_shutdown_workers', None)
        if shutdown is not None:        # on an error mid-epoch too: no orphan workers
            shutdown()
    cpu_s = _cpu_s() - cpu0             # the workers are joined: their CPU is counted
    stats = R._proxy_stats(proxy_url) if proxy_url else {}
    return {'case': name, 'samples': samples, 'first_batch_s': first_s,
            'samples_per_s': samples / total_s, 'fetched_bytes': stats.get('body_bytes'),
            'requests': stats.get('requests'), 'cpu_ms_per_sample': 1000 * cpu_s / samples}


def run_loadr(name: str, path: str, n: int, workers: int, far_step: int,
              proxy_url: str | None, server_pids=()) -> dict:
    """``benchmarks.remote.run_case``, its times counted from ``loadr.open`` as streaming's are."""
    r = R.run_case(name, path, None, n, workers, -(-n // W.IMAGE_BATCH), far_step, proxy_url,
                   server_pids)
    total_s = r['open_s'] + r['samples'] / r['epoch_samples_per_s']
    return {'case': name, 'samples': r['samples'],
            'first_batch_s': r['open_s'] + r['first_batch_s'],
            'samples_per_s': r['samples'] / total_s, 'fetched_bytes': r['fetched_bytes'],
            'requests': r['requests'], 'cpu_ms_per_sample': r['loader_cpu_ms_per_sample']}


def _table(results: list[dict]) -> str:
    base = results[0]['samples_per_s']
    rows = ['| case | samples/s | vs loadr local | first batch | bytes fetched ÷ dataset bytes '
            '| CPU ms/sample |', '|---|---:|---:|---:|---:|---:|']
    for r in results:
        ratio = ('-' if r['fetched_bytes'] is None
                 else f'{r["fetched_bytes"] / r["dataset_bytes"]:.3f}')
        rows.append(f'| {r["case"]} | {r["samples_per_s"]:.0f} | {r["samples_per_s"] / base:.2f}× '
                    f'| {r["first_batch_s"]:.2f} s | {ratio} | {r["cpu_ms_per_sample"]:.2f} |')
    return '\n'.join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--images', type=int, default=1024, help='images in the dataset')
    p.add_argument('--delay-ms', type=float, default=20.0, help='added to every request')
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--shard-bytes', type=int, default=None,
                   help="MDSWriter's size_limit (default: streaming's own, 64 MiB)")
    p.add_argument('--far-step', type=int, default=10_000_000,
                   help="passed to benchmarks.remote.run_case (its far load(), not reported here)")
    p.add_argument('--inherit-clients', action='store_true',
                   help="streaming's workers keep the S3 client forked from the parent (as "
                        "streaming leaves it; see own_connections)")
    args = p.parse_args(argv)

    try:
        streaming_dataset, mds_writer = load_streaming()
    except ImportError as exc:
        print(f'mosaicml-streaming cannot be imported ({exc}); install it without its pins '
              f'(numpy<2.2, CUDA torch, torchvision, transformers): {INSTALL}', file=sys.stderr)
        return 2
    from tests.remote.servers import S3_ENV, start_nginx

    # Streaming warns about every default it picks (canonical nodes, predownload, ...).
    warnings.filterwarnings('ignore', module=r'streaming\.')
    logging.getLogger('streaming').setLevel(logging.ERROR)
    dataset_cls = pipeline_class(streaming_dataset)
    load = os.getloadavg()

    results = []
    with tempfile.TemporaryDirectory(prefix='loadr-bench-streaming-') as tmp:
        data = W.make_images(tmp, args.images)
        mds = os.path.join(tmp, BUCKET, MDS_PREFIX)
        mds_bytes = write_mds(mds_writer, data, mds, args.shard_bytes)
        shards = sum(name.endswith('.mds') for name in os.listdir(mds))
        sizes = {'loadr': data.nbytes, 'streaming': mds_bytes}
        with _tempdir_root(os.path.join(tmp, '.streaming-tmp')):
            results.append(run_loadr('loadr, local disk', data.path, args.images, args.workers,
                                     args.far_step, None))
            results.append(run_streaming('streaming, local disk', dataset_cls, None, mds,
                                         args.workers, None))
            with start_nginx(tmp, os.path.join(tmp, '.nginx')) as web:
                proxy, url = R._proxy(web.url, args.delay_ms)
                try:
                    results.append(run_loadr(f'loadr, nginx + {args.delay_ms:g} ms',
                                             f'{url}/{os.path.basename(data.path)}', args.images,
                                             args.workers, args.far_step, url,
                                             (web.proc.pid, proxy.pid)))
                    with _environ(**S3_ENV, S3_ENDPOINT_URL=url):
                        results.append(run_streaming(
                            f'streaming, nginx + {args.delay_ms:g} ms (S3 API)', dataset_cls,
                            f's3://{BUCKET}/{MDS_PREFIX}', os.path.join(tmp, 'streaming-cache'),
                            args.workers, url, args.inherit_clients))
                finally:
                    proxy.terminate()
                    proxy.wait(10)
    for r in results:
        r['dataset_bytes'] = sizes[r['case'].split(',')[0]]

    print(f'JPEG pipeline, {args.images} images (375x500), batch {W.IMAGE_BATCH}, '
          f'{args.workers} workers, shuffle, one epoch from a new dataset (cold cache); '
          f'times from the dataset\'s creation; load average before: '
          f'{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}')
    print(f'dataset bytes: loadr bag {data.nbytes / 1e6:.1f} MB; streaming MDS '
          f'{mds_bytes / 1e6:.1f} MB in {shards} shard(s)')
    print()
    print(_table(results))
    print()
    for r in results:
        if r['requests']:
            print(f'{r["case"]}: {r["requests"]} requests, {r["fetched_bytes"] / 1e6:.1f} MB; '
                  f'{r["samples"]} samples')
    return 0


if __name__ == '__main__':
    sys.exit(main())
