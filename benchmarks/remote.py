"""Remote storage: the JPEG pipeline over HTTP at 20 ms per request, against local disk.

The images workload of the benchmarks (375×500 JPEGs in a bag; Pillow
decode, random 224×224 crop, random flip; batch 64; true global shuffle) is
read three ways, each by a new Loader (no warm cache), for one epoch:

- ``local disk``: the bag in a temporary directory;
- ``nginx + 20 ms``: the same directory served by nginx on loopback, through
  our proxy (``tests/remote/proxy.py``, in its own process) that holds every
  request for ``--delay-ms`` before passing it on, as a far server would;
- ``moto s3`` (``--s3``): moto's S3 server behind the same delaying proxy
  (its own process), read in the same runs as the others, so that its ratios
  compare with HTTP's (requests per sample, bytes fetched / needed, the
  CPU split). moto spends milliseconds of CPU per request: on a small
  machine it takes the loader's cores, which the CPU column shows.
  ``--s3-direct``: moto with no proxy, as before (``--s3-batches`` batches).

Per case: samples/s over the epoch (from the loader's creation) and in the
steady state (after the first batch), the bytes the proxy passed (the
records' bytes are what the batches need; index tables are read once per
process on top), and the time of the first batch after ``load()`` of a state
at a far step. Needs nginx (``apt-get install nginx``) and the ``test``
extra (fsspec, aiohttp; moto for ``--s3``).

Example::

    python -m benchmarks.remote --images 1024 --delay-ms 20 --workers 2
    python -m benchmarks.remote --images 1024 --cache 0.05 0.3   # + the local cache

``--cache``: each epoch read by a new loader through a local cache of a
fraction of the record bytes, evicting the furthest next use or, to compare,
the least recently used; bytes fetched per epoch.

The one- and two-worker figures: ``--shardlen``, ``--batch``, ``--batches``,
``--skip`` (batches before the steady rate), ``--runs`` (local and remote read
interleaved, medians printed) and ``--also KEY=VALUE`` (one more remote case
with that storage setting, e.g. ``small_file_bytes=0``, no small file read
whole and kept, in the same runs). Printed per remote case: requests per
sample, bytes fetched / needed, the most requests in flight (at the proxy
and in a worker), the round-trip time, and the time reads waited on the
network (``loader.stats()``'s remote stage), of which the reads no read
ahead covered::

    python -m benchmarks.remote --images 960 --shardlen 32 --batch 32 --workers 1 \
        --open-shards 0 --runs 3 --skip 3 --also small_file_bytes=0

``--open-shards N`` (default 1000; 0: not measured): the time ``loadr.open``
takes for a bag dataset of ``N`` shards (four files each: spec.json,
refs.bag and two value bags) through nginx and the proxy at ``--delay-ms``,
the requests it sent, and that its datapoints equal the local read.
``--open-only`` measures that alone::

    python -m benchmarks.remote --open-only --open-shards 1000 --delay-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from . import workloads as W

SEED = 0


def _proxy(upstream: str, delay_ms: float):
    """Our fault proxy in a process of its own (no GIL shared with the loader); (process, url)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, '-m', 'tests.remote.proxy', '--upstream', upstream,
                             '--delay-ms', str(delay_ms)], cwd=root, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    url = proc.stdout.readline().strip()
    if not url.startswith('http://'):
        proc.kill()
        raise RuntimeError('the proxy did not start')
    return proc, url


def _stop(proc) -> None:
    proc.terminate()
    proc.wait(10)


def _proxy_stats(url: str, reset: bool = False) -> dict:
    with urllib.request.urlopen(f'{url}/__proxy__/{"reset" if reset else "stats"}',
                                timeout=10) as r:
        return json.loads(r.read())


def _quiet(url: str, most_s: float = 10.0) -> None:
    """Wait until the proxy passes no more bytes (0.25 s without a change): the requests a
    closed loader left in flight (its read-ahead, the far load()'s batches) would otherwise
    be counted in the next case's bytes."""
    end = time.monotonic() + most_s
    last = None
    while time.monotonic() < end:
        now = _proxy_stats(url)
        seen = (now['requests'], now['body_bytes'])
        if seen == last:
            return
        last = seen
        time.sleep(0.25)


def _record_bytes(path: str) -> int:
    """Bytes of every record of the bag dataset at ``path`` (tables and spec left out)."""
    from loadr.readers.bag import Bag
    return sum(Bag(os.path.join(top, name)).index_offset
               for top, _, names in os.walk(path) for name in names if name.endswith('.bag'))


def _servers(pids) -> set[int]:
    """The server processes (and their children) among ours: not the loader's CPU."""
    import psutil
    out = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            out |= {pid, *(c.pid for c in proc.children(recursive=True))}
        except psutil.Error:
            pass
    return out


def run_case(name: str, path: str, options: dict | None, n: int, workers: int, batches: int,
             far_step: int, proxy_url: str | None, server_pids=(), batch: int = W.IMAGE_BATCH,
             skip: int = 0, second_epoch: bool = False) -> dict:
    """One epoch (or ``batches`` batches) of the JPEG pipeline read from ``path``.

    CPU seconds are split between the loader (this process and its workers)
    and the servers (nginx or moto, and the proxy), all on the same cores.
    ``skip``: batches read before the timed ones (the timed rate starts after them).
    ``second_epoch``: then the next epoch from the same loader, timed on its own (the
    read-ahead and the process's small files warm, no cache).
    """
    import loadr
    from loadr.storage import netstats

    from .measure import tree_cpu_s

    if proxy_url:
        _quiet(proxy_url)
        _proxy_stats(proxy_url, reset=True)
    t_open = time.perf_counter()
    reader = loadr.open(path, decode_images=False, storage_options=options)
    opened_s = time.perf_counter() - t_open
    servers = _servers(server_pids)
    cpu0 = tree_cpu_s()
    loader = loadr.Loader(reader, batch=batch, fns=[W.image_fn], shuffle=True,
                          seed=SEED, workers=workers)
    try:
        t0 = time.perf_counter()
        samples = 0
        first_s = None
        for k, batch in enumerate(loader.epoch(0)):
            samples += len(batch['label'])
            if first_s is None:
                first_s = time.perf_counter() - t0
            if k == 0 or k == skip - 1:     # the steady rate: after `skip` batches, or one
                t_first, first_samples = time.perf_counter(), samples
                at_first = loader.stats()
            if k + 1 == batches:
                break
        t_end = time.perf_counter()
        total_s = t_end - t0
        cpu1 = tree_cpu_s()         # before close: the workers' CPU dies with them
        spent = {pid: v - cpu0.get(pid, 0.0) for pid, v in cpu1.items()}
        server_cpu = sum(v for pid, v in spent.items() if pid in servers)
        loader_cpu = sum(v for pid, v in spent.items() if pid not in servers)
        main_cpu = spent.get(os.getpid(), 0.0)
        stats = _proxy_stats(proxy_url) if proxy_url else {}
        net = loader.stats().as_dict().get('remote')
        later = loader.stats().since(at_first)
        steady_net = netstats.summary(later.workers, later.samples) if later.samples else None
        fetched, requests = stats.get('body_bytes'), stats.get('requests')
        second = None
        if second_epoch:
            t2, n2 = time.perf_counter(), 0
            for batch in loader.epoch(1):
                n2 += len(batch['label'])
            second = n2 / (time.perf_counter() - t2)
        # The first batch after load() at a far step, on the running loader.
        state = loader.save()
        state['step'] = far_step
        loader.load(state)
        t_far = time.perf_counter()
        next(iter(loader))
        far_s = time.perf_counter() - t_far
    finally:
        loader.close()
    steady = (samples - first_samples) / (t_end - t_first) if samples > first_samples else None
    return {'case': name, 'samples': samples, 'open_s': opened_s, 'first_batch_s': first_s,
            'epoch_samples_per_s': samples / total_s, 'steady_samples_per_s': steady,
            'second_epoch_samples_per_s': second,
            'fetched_bytes': fetched, 'far_first_batch_s': far_s,
            'max_in_flight': stats.get('max_in_flight'), 'net': net, 'steady_net': steady_net,
            'requests': requests, 'loader_cpu_ms_per_sample': 1000 * loader_cpu / samples,
            'main_cpu_ms_per_sample': 1000 * main_cpu / samples,
            'server_cpu_ms_per_sample': 1000 * server_cpu / samples}


def run_cache(url: str, needed: int, fraction: float, policy: str, workers: int,
              epochs: int, cache_dir: str) -> list[int]:
    """Bytes the proxy passed in each epoch, each epoch read by a new loader (as a
    resumed run) through a local cache of ``fraction`` of the record bytes."""
    import loadr

    reader = loadr.open(f'{url}/images', decode_images=False, cache_dir=cache_dir,
                        cache_bytes=int(fraction * needed), cache_policy=policy)
    fetched = []
    for epoch in range(epochs):
        _quiet(url)
        _proxy_stats(url, reset=True)
        with loadr.Loader(reader, batch=W.IMAGE_BATCH, fns=[W.image_fn], shuffle=True,
                          seed=SEED, workers=workers) as loader:
            for _ in loader.epoch(epoch):
                pass
        fetched.append(_proxy_stats(url)['body_bytes'])
    return fetched


def make_shards(root: str, shards: int, per_shard: int = 2) -> str:
    """A bag dataset of ``shards`` shards of ``per_shard`` small datapoints; its path."""
    from loadr.writers import BagWriter
    path = os.path.join(root, 'shards')
    with BagWriter(path, {'blob': 'bytes', 'label': 'int'}, shardlen=per_shard) as w:
        for i in range(shards * per_shard):
            w.append({'blob': i.to_bytes(4, 'little') * 16, 'label': i})
    return path


def run_open(tmp: str, shards: int, delay_ms: float) -> dict:
    """Seconds ``loadr.open`` takes for ``shards`` shards behind nginx + the delaying proxy."""
    import loadr
    from tests.remote.servers import start_nginx

    path = make_shards(tmp, shards)
    local = loadr.open(path)
    files = sum(len(names) for _, _, names in os.walk(path))
    with start_nginx(tmp, os.path.join(tmp, '.nginx-open')) as web:
        proxy, url = _proxy(web.url, delay_ms)
        try:
            _proxy_stats(url, reset=True)
            t0 = time.perf_counter()
            reader = loadr.open(f'{url}/shards')
            open_s = time.perf_counter() - t0
            requests = _proxy_stats(url)['requests']
            reader.prefetch(range(len(reader)))
            same = (len(reader) == len(local)
                    and all(reader[i] == local[i] for i in range(len(local))))
        finally:
            proxy.terminate()
            proxy.wait(10)
    return {'shards': shards, 'files': files, 'delay_ms': delay_ms, 'open_s': open_s,
            'requests': requests, 'same_as_local': same}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--images', type=int, default=1024, help='images in the dataset')
    p.add_argument('--delay-ms', type=float, default=20.0, help='added to every request')
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--batch', type=int, default=W.IMAGE_BATCH)
    p.add_argument('--shardlen', type=int, default=None,
                   help='images per shard (default: one shard)')
    p.add_argument('--batches', type=int, default=None,
                   help='batches read per case (default: one epoch)')
    p.add_argument('--second-epoch', action='store_true',
                   help='also time the next epoch from the same loader')
    p.add_argument('--skip', type=int, default=1,
                   help='batches before the steady rate is timed (default 1)')
    p.add_argument('--also', nargs='*', default=[], metavar='KEY=VALUE',
                   help='one more remote case per item (over S3 too with --s3), with this '
                        'storage setting (e.g. small_file_bytes=0: the read-ahead as before; '
                        's3_presigned=false: a get_object per range), interleaved')
    p.add_argument('--runs', type=int, default=1,
                   help='local and remote read this many times, interleaved; medians')
    p.add_argument('--far-step', type=int, default=10_000_000,
                   help='the step load() jumps to (default 10 million samples in)')
    p.add_argument('--s3', action='store_true',
                   help="also read from moto's S3 server behind the proxy at --delay-ms")
    p.add_argument('--s3-direct', action='store_true',
                   help="also read --s3-batches batches from moto's S3 server, no proxy")
    p.add_argument('--s3-batches', type=int, default=4)
    p.add_argument('--cache', type=float, nargs='*', default=None, metavar='FRACTION',
                   help='also compare the local cache (cache_dir) evicting the furthest '
                        'next use with an LRU of the same size, per epoch, at these '
                        'fractions of the record bytes (default 0.05)')
    p.add_argument('--cache-epochs', type=int, default=3)
    p.add_argument('--open-shards', type=int, default=1000,
                   help='also time loadr.open of a bag of this many shards (0: not)')
    p.add_argument('--open-only', action='store_true', help='only time the open (--open-shards)')
    p.add_argument('--json', action='store_true', help='print the results as JSON too')
    args = p.parse_args(argv)

    from tests.remote.servers import S3_ENV, start_moto, start_nginx, upload

    opened = None
    if args.open_shards:
        with tempfile.TemporaryDirectory(prefix='loadr-bench-open-') as tmp:
            opened = run_open(tmp, args.open_shards, args.delay_ms)
        print(f"loadr.open of a bag of {opened['shards']} shards ({opened['files']} files) "
              f"through nginx + {args.delay_ms:g} ms a request: {opened['open_s']:.2f} s, "
              f"{opened['requests']} requests; datapoints as local: {opened['same_as_local']}")
        if args.open_only:
            if args.json:
                print(json.dumps({'args': vars(args), 'open': opened}))
            return 0

    results, cache_runs = [], []
    with tempfile.TemporaryDirectory(prefix='loadr-bench-remote-') as tmp:
        data = W.make_images(tmp, args.images, args.shardlen)
        needed = _record_bytes(data.path)
        batches = args.batches or -(-args.images // args.batch)
        with contextlib.ExitStack() as stack:
            web = stack.enter_context(start_nginx(tmp, os.path.join(tmp, '.nginx')))
            s3 = s3_proxy = None
            if args.s3:
                os.environ.update(S3_ENV)
                s3 = stack.enter_context(start_moto(os.path.join(tmp, '.moto-proxied')))
                upload(s3.url, 'bench', data.path, 'images')
                s3_proxy, s3_url = _proxy(s3.url, args.delay_ms)
                stack.callback(_stop, s3_proxy)
            proxy, url = _proxy(web.url, args.delay_ms)
            stack.callback(_stop, proxy)
            for _ in range(args.runs):
                results.append(run_case('local disk', data.path, None, args.images,
                                        args.workers, batches, args.far_step, None,
                                        batch=args.batch, skip=args.skip,
                                        second_epoch=args.second_epoch))
                results.append(run_case(f'nginx + {args.delay_ms:g} ms', f'{url}/images',
                                        None, args.images, args.workers, batches,
                                        args.far_step, url, (web.proc.pid, proxy.pid),
                                        batch=args.batch, skip=args.skip,
                                        second_epoch=args.second_epoch))
                for item in args.also:
                    key, _, value = item.partition('=')
                    results.append(run_case(
                        f'nginx {args.delay_ms:g}ms {item}', f'{url}/images',
                        {'loadr': {key: json.loads(value)}}, args.images, args.workers, batches,
                        args.far_step, url, (web.proc.pid, proxy.pid), batch=args.batch,
                        skip=args.skip, second_epoch=args.second_epoch))
                for item in [None, *args.also] if s3 is not None else ():
                    # The --also settings over S3 too (e.g. s3_presigned=false: a botocore
                    # get_object per range instead of presigned GETs).
                    key, _, value = (item or '').partition('=')
                    results.append(run_case(
                        f'moto s3 + {args.delay_ms:g} ms' + (f' {item}' if item else ''),
                        's3://bench/images', {'endpoint_url': s3_url, **(
                            {'loadr': {key: json.loads(value)}} if item else {})},
                        args.images, args.workers, batches,
                        args.far_step, s3_url, (s3.proc.pid, s3_proxy.pid),
                        batch=args.batch, skip=args.skip, second_epoch=args.second_epoch))
            fractions = [] if args.cache is None else (args.cache or [0.05])
            for fraction in fractions:
                for policy in ('furthest', 'lru'):
                    cache_runs.append((fraction, policy, run_cache(
                        url, needed, fraction, policy, args.workers, args.cache_epochs,
                        os.path.join(tmp, f'cache-{fraction}-{policy}'))))
        if args.s3_direct:
            os.environ.update(S3_ENV)
            with start_moto(os.path.join(tmp, '.moto')) as s3:
                upload(s3.url, 'bench', data.path, 'images')
                results.append(run_case('moto s3 (direct)', 's3://bench/images',
                                        {'endpoint_url': s3.url}, args.images, args.workers,
                                        args.s3_batches, args.far_step, None, (s3.proc.pid,),
                                        batch=args.batch))
    local = results[0]['epoch_samples_per_s']
    print(f'JPEG pipeline, {args.images} images (375x500), batch {args.batch}, '
          f'{args.workers} workers, shuffle, {batches} batches from a new loader '
          f'(steady: after {args.skip}), shards of {args.shardlen or args.images}; '
          f'record bytes {needed / 1e6:.1f} MB; {args.runs} interleaved runs')
    head = (f'{"case":<20} {"samples/s":>10} {"steady/s":>9} {"vs local":>8} '
            f'{"1st batch":>9} {"fetched/needed":>14} {"far load() 1st":>14} '
            f'{"CPU ms/sample loader+servers":>29}')
    print(head)
    print('-' * len(head))
    for r in results:
        ratio = f'{r["fetched_bytes"] / needed:.3f}' if r['fetched_bytes'] is not None else '-'
        print(f'{r["case"]:<20} {r["epoch_samples_per_s"]:>10.0f} '
              f'{r["steady_samples_per_s"] or 0:>9.0f} {r["epoch_samples_per_s"] / local:>7.2f}x '
              f'{r["first_batch_s"]:>8.2f}s {ratio:>14} {r["far_first_batch_s"]:>13.2f}s '
              f'{r["loader_cpu_ms_per_sample"]:>20.2f} + {r["server_cpu_ms_per_sample"]:.2f}')
    for r in results:
        if r['requests']:
            net = r['net'] or {}
            print(f'{r["case"]}: {r["requests"] / r["samples"]:.2f} requests per sample '
                  f'(the proxy saw, the open included); at most {r["max_in_flight"]} in '
                  f'flight at the proxy; CPU of the main process '
                  f'{r["main_cpu_ms_per_sample"]:.2f} ms per sample')
            if net:
                print(f'  loader: {net["requests_per_sample"]:.2f} requests per sample, '
                      f'round trip {1e3 * net["rtt_s"]:.1f} ms, at most '
                      f'{net["max_in_flight"]} in flight in a worker, up to '
                      f'{net.get("tasks_ahead", "?")} tasks held; reads waited on the '
                      f'network {net["wait_s"]:.2f} s ({100 * net["wait_share"]:.0f}% of '
                      f'worker time) in {net["waits"]} waits, {net["uncovered"]} not read '
                      f'ahead (uncovered round trips)')
            steady = r['steady_net']
            if steady:
                after = args.skip if 1 <= args.skip <= batches else 1
                print(f'  after the first {after} batches: waited on the network '
                      f'{steady["wait_s"]:.2f} s ({100 * steady["wait_share"]:.0f}% of worker '
                      f'time) in {steady["waits"]} waits, {steady["uncovered"]} not read ahead')
    by_case: dict = {}
    for r in results:
        by_case.setdefault(r['case'], []).append(r)
    if len(by_case.get('local disk', [])) > 1 or args.runs > 1:
        import statistics
        print(f'\nMedians of {args.runs} interleaved runs:')
        med = {c: (statistics.median(x['epoch_samples_per_s'] for x in rs),
                   statistics.median(x['steady_samples_per_s'] or 0 for x in rs))
               for c, rs in by_case.items()}
        for c, (epoch, steady) in med.items():
            rs = by_case[c]
            fetched = [x['fetched_bytes'] / needed for x in rs if x['fetched_bytes']]
            extra = (f'; bytes fetched / needed {statistics.median(fetched):.3f}, requests '
                     f'per sample {statistics.median(x["requests"] / x["samples"] for x in rs):.2f}'
                     ) if fetched else ''
            seconds = [x['second_epoch_samples_per_s'] for x in rs
                       if x.get('second_epoch_samples_per_s')]
            local2 = [x['second_epoch_samples_per_s'] for x in by_case['local disk']
                      if x.get('second_epoch_samples_per_s')]
            if seconds and local2:
                second = statistics.median(seconds)
                extra += (f'; second epoch {second:.0f} '
                          f'({second / statistics.median(local2):.2f}x)')
            print(f'{c:<20} {epoch:>7.0f} samples/s ({epoch / med["local disk"][0]:.2f}x), '
                  f'steady {steady:>5.0f} ({steady / med["local disk"][1]:.2f}x){extra}')
    if cache_runs:
        print('\nLocal cache, each epoch by a new loader (a resumed run), bytes the proxy '
              'passed (MB), epoch 0 from a cold cache:')
        print(f'{"cache":>6} {"policy":>9} ' + ' '.join(f'{"epoch " + str(e):>8}'
                                                  for e in range(args.cache_epochs)))
        by = {}
        for fraction, policy, fetched in cache_runs:
            by[fraction, policy] = fetched
            print(f'{fraction:>6.0%} {policy:>9} ' + ' '.join(f'{b / 1e6:>8.1f}' for b in fetched))
        for fraction in sorted({f for f, _, _ in cache_runs}):
            furthest, lru = by.get((fraction, 'furthest')), by.get((fraction, 'lru'))
            if furthest and lru and len(furthest) > 1:
                later = ', '.join(f'epoch {e}: {furthest[e] / lru[e]:.3f}'
                                  for e in range(1, len(furthest)))
                print(f'{fraction:.0%}: bytes fetched, furthest / LRU: {later} (no policy '
                      f'saves more than the cache holds, {fraction:.0%} of an epoch: every '
                      f'hit sat in the cache across the epoch boundary)')
    if args.json:
        print(json.dumps({'args': vars(args), 'record_bytes': needed, 'results': results,
                          'cache': cache_runs, 'open': opened}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
