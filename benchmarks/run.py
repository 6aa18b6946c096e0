"""The benchmark run: every workload, every loader, runs interleaved; then report.

One *run* of a loader starts it, takes the first batch (time to first
batch), a few warm-up batches, then times batches for at least
``min_time_s`` (and at least ``MIN_BATCHES``), while a monitor thread keeps
the peaks of RSS and /dev/shm; then the loader is closed. Each loader gets
``runs`` runs, and run ``r`` of every loader is done before run ``r + 1``
of any, in an order rotated each round, so that drift of a shared machine
(other jobs, thermal state) falls on every loader alike.

Example::

    python -m benchmarks                       # everything, default sizes (< 10 min, 2 cores)
    python -m benchmarks --scale 4 --runs 7    # bigger datasets, longer runs
    python -m benchmarks --only images --peers loadr,torch --no-publish
    python -m benchmarks --workers 1,2,4,8,16  # the scaling table at these worker counts
    python -m benchmarks --device-report       # for a lent GPU machine (benchmarks/device.py)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

from . import measure, peers, report
from . import workloads as W

__all__ = ['main', 'run_once', 'run_workload', 'measure_resume', 'Config']

MIN_BATCHES = 3
MIN_TIME_S = 0.7                 # timed stretch of one run at scale 1
WARMUP_BATCHES = 2
MAX_BATCHES = 5000
SCALING_RUNS = 3
FAR_N = 10**9
FAR_STEP = 10**12
RESUME_STEADY_BATCHES = 40
GRANULAR_ORDER_N = 10**7
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = ('trivial', 'images', 'video', 'raw')


class Config:
    """Sizes and counts for one invocation, from the command line."""

    def __init__(self, scale: float = 1.0, runs: int = 5, workers: int = 2,
                 scaling: list[int] | None = None):
        self.scale = scale
        self.runs = runs
        self.workers = workers
        self.min_time_s = max(0.05, MIN_TIME_S * scale)
        cores = os.cpu_count() or 1
        self.scaling = scaling or sorted({w for w in (1, 2, 4, 8, 16) if w <= max(cores, 2)})
        self.sizes = {
            'trivial': max(4 * W.TRIVIAL_BATCH, int(50_000 * scale)),
            'images': max(4 * W.IMAGE_BATCH, int(2048 * scale)),
            'video': max(4 * W.VIDEO_BATCH, int(256 * scale)),
            'raw': max(4 * W.RAW_BATCH, int(32_768 * scale)),
        }

    def as_dict(self) -> dict:
        return {'scale': self.scale, 'runs': self.runs, 'workers': self.workers,
                'min_time_s': self.min_time_s, 'warmup_batches': WARMUP_BATCHES,
                'min_batches': MIN_BATCHES, 'scaling_workers': self.scaling,
                'dataset_sizes': self.sizes}


def make_data(name: str, root: str, n: int) -> W.Data:
    """The data of workload ``name`` with ``n`` datapoints, under ``root``."""
    if name == 'trivial':
        return W.make_trivial(n)
    return {'images': W.make_images, 'video': W.make_video, 'raw': W.make_raw}[name](root, n)


def _log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# One run of one loader


def run_once(contender: peers.Contender, data: W.Data, workers: int, min_time_s: float) -> dict:
    """Start the loader, time the first batch and a steady stretch, close it; the figures."""
    gc.collect()
    mon = measure.Monitor()
    mon.__enter__()
    close = None
    try:
        t0 = time.perf_counter()
        it, close = contender.start(data, workers)
        next(it)
        ttfb = time.perf_counter() - t0
        for _ in range(WARMUP_BATCHES):
            next(it)
        cpu0 = measure.tree_cpu_s()
        t1 = time.perf_counter()
        batches = 0
        while True:
            next(it)
            batches += 1
            elapsed = time.perf_counter() - t1
            if (batches >= MIN_BATCHES and elapsed >= min_time_s) or batches >= MAX_BATCHES:
                break
        cpu = measure.cpu_delta_s(cpu0, measure.tree_cpu_s())
    finally:
        mon.__exit__(None, None, None)
        if close is not None:
            close()
    samples = batches * data.batch
    rate = samples / elapsed
    out = {'samples_per_s': rate * (workers if contender.per_worker_limit else 1),
           'batches': batches, 'seconds': elapsed}
    out['cpu_ms_per_sample'] = 1e3 * cpu / samples
    if not (contender.per_worker_limit or contender.ceiling):
        out.update({
            'ttfb_s': ttfb,
            'rss_main_mib': mon.peak_main_bytes / measure.MIB,
            'rss_workers_mib': mon.peak_workers_bytes / measure.MIB,
            'shm_mib': max(0, mon.peak_shm_bytes) / measure.MIB,
        })
    return out


def _summary(runs: list[dict]) -> dict:
    out = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values and isinstance(values[0], (int, float)):
            out[key] = {'median': statistics.median(values), 'min': min(values),
                        'max': max(values)}
    return out


def run_workload(data: W.Data, contenders: list[peers.Contender], workers: int, runs: int,
                 min_time_s: float) -> dict:
    """``runs`` rounds; in each, every contender once, in an order rotated per round."""
    results = {c.name: [] for c in contenders}
    for r in range(runs):
        shift = r % len(contenders)
        for c in contenders[shift:] + contenders[:shift]:
            try:
                results[c.name].append(run_once(c, data, workers, min_time_s))
            except Exception as exc:        # a peer that breaks is reported, not fatal
                _log(f'  {data.name}/{c.name} (workers={workers}) failed: '
                     f'{type(exc).__name__}: {exc}')
                results[c.name].append({'error': f'{type(exc).__name__}: {exc}'})
        _log(f'  {data.name} workers={workers} round {r + 1}/{runs}: ' + ', '.join(
            f"{name} {res[-1].get('samples_per_s', float('nan')):,.0f}/s"
            for name, res in results.items()))
    out = {}
    for c in contenders:
        ok = [x for x in results[c.name] if 'error' not in x]
        errors = [x['error'] for x in results[c.name] if 'error' in x]
        out[c.name] = {'runs': results[c.name], 'summary': _summary(ok) if ok else {},
                       'errors': errors, 'note': c.note, 'limit': c.per_worker_limit,
                       'ceiling': c.ceiling}
    return out


# ---------------------------------------------------------------------------
# Resume far into a huge dataset


def _rss_mib() -> float:
    import psutil
    return psutil.Process().memory_info().rss / measure.MIB


def _loadr_resume(n: int, workers: int, runs: int) -> dict:
    import loadr
    ds = W.FarDataset(n)
    gc.collect()
    rss0 = _rss_mib()
    with loadr.Loader(ds, batch=W.TRIVIAL_BATCH, fns=[W.identity_fn], seed=0,
                      workers=workers) as loader:
        it = iter(loader)
        for _ in range(10):
            next(it)
        steady = []
        for _ in range(RESUME_STEADY_BATCHES):
            t = time.perf_counter()
            next(it)
            steady.append(time.perf_counter() - t)
        resumes, loads, near, correct = [], [], [], True
        for r in range(runs):
            # A jump to where the stream already is: the cost of restarting the
            # pipeline alone, to compare the far jump with.
            state = loader.save()
            t = time.perf_counter()
            loader.load(state)
            next(it)
            near.append(time.perf_counter() - t)
            for _ in range(5):
                next(it)
            state = loader.save()
            state['step'] = FAR_STEP + r * 7 * W.TRIVIAL_BATCH
            t = time.perf_counter()
            loader.load(state)
            t_load = time.perf_counter() - t
            batch = next(it)
            resumes.append(time.perf_counter() - t)
            loads.append(t_load)
            if r == 0:
                # The batch after load() is the one at that step (compared with workers=0).
                ref = loadr.Loader(ds, batch=W.TRIVIAL_BATCH, fns=[W.identity_fn], seed=0,
                                   workers=0)
                ref.load(state)
                correct = bool(np.array_equal(next(iter(ref))['label'], batch['label']))
            for _ in range(5):
                next(it)
        rss = _rss_mib()
    # One batch from start to end with nothing else in flight (prefetch=1): the
    # latency a restarted pipeline pays before its first batch.
    with loadr.Loader(ds, batch=W.TRIVIAL_BATCH, fns=[W.identity_fn], seed=0, workers=workers,
                      prefetch=1) as single:
        it = iter(single)
        for _ in range(3):
            next(it)
        lat = []
        for _ in range(10):
            t = time.perf_counter()
            next(it)
            lat.append(time.perf_counter() - t)
    return {'batch_latency_s': statistics.median(lat), 'n': n, 'step': FAR_STEP,
            'resume_s': resumes, 'load_call_s': loads,
            'resume_near_s': near,
            'steady_batch_s': statistics.median(steady), 'steady_batch_max_s': max(steady),
            'correct_batch': correct, 'rss_main_mib': rss, 'rss_growth_mib': rss - rss0}


def _granular_order_cost(n: int) -> dict:
    """Time and memory of granular's per-epoch order (its ``Loader._order``) for ``n`` items."""
    import granular

    class Shape:                    # the two attributes _order reads
        shuffle, length = True, n
    order = granular.Loader._order.__wrapped__
    gc.collect()
    rss0 = _rss_mib()
    t = time.perf_counter()
    perm = order(Shape(), 1, 0)
    seconds = time.perf_counter() - t
    grown = _rss_mib() - rss0
    del perm
    return {'n': n, 'order_s': seconds, 'order_mib': grown}


def measure_resume(workers: int, runs: int, with_granular: bool) -> dict:
    """loadr: load() at step 10^12 of a 10^9-item dataset, then the next batch.

    granular's Loader is not resumed here (its load() first waits for every
    sample in flight, seconds on a busy machine); what limits it at large N is
    its per-epoch order, whose cost is measured instead.
    """
    # The small one first, so that the big one cannot look flat by reusing its memory.
    small = _loadr_resume(1000, workers, 1)
    out = {'loadr': _loadr_resume(FAR_N, workers, runs), 'loadr_small': small}
    if with_granular and peers.available('granular'):
        try:
            out['granular_order'] = _granular_order_cost(GRANULAR_ORDER_N)
        except Exception as exc:
            out['granular_error'] = f'{type(exc).__name__}: {exc}'
    return out


# ---------------------------------------------------------------------------
# The whole thing


def _preimport(names: list[str]) -> None:
    # Import costs are not the loaders' time to first batch: pay them up front.
    for module in ('torch', 'granular', 'grain.python', 'gulpio2', 'PIL.Image', 'loadr'):
        if module.split('.')[0] in names or module in ('PIL.Image', 'loadr'):
            if peers.available(module.split('.')[0]):
                __import__(module)


def worker_counts(text: str, cores: int | None = None) -> tuple[int, list[int] | None]:
    """``--workers``: (the main table's count, the scaling table's counts or None).

    >>> worker_counts('2')
    (2, None)
    >>> worker_counts('1,2,4,8,16', cores=2)
    (2, [1, 2, 4, 8, 16])
    >>> worker_counts('4,8', cores=2)
    (4, [4, 8])
    """
    counts = [int(x) for x in text.split(',') if x.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit(f'--workers wants positive counts, got {text!r}')
    if len(counts) == 1:
        return counts[0], None
    cores = cores or os.cpu_count() or 1
    fit = [c for c in counts if c <= cores]
    return (max(fit) if fit else counts[0]), sorted(set(counts))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='python -m benchmarks', description=__doc__.split('\n')[0])
    p.add_argument('--scale', type=float, default=1.0,
                   help='multiply dataset sizes and the timed stretch of each run (default 1)')
    p.add_argument('--runs', type=int, default=5, help='runs per loader (default 5)')
    p.add_argument('--workers', default='2',
                   help='workers for the main table (default 2); a list, e.g. 1,2,4,8,16, '
                        'is the scaling table\'s worker counts, and the main table then uses '
                        'the largest of them not above the core count')
    p.add_argument('--scaling', default=None,
                   help='worker counts for the scaling plot, e.g. 1,2,4 (default: 1, 2 and '
                        'powers of two up to the core count; --workers with a list sets it)')
    p.add_argument('--limit-plain', action='store_true',
                   help="run the limit's plain loops without loadr's steady-memory malloc "
                        'thresholds (default: with them, as loadr\'s workers run)')
    p.add_argument('--only', default=','.join(WORKLOADS),
                   help=f'workloads to run, from {",".join(WORKLOADS)} (default all)')
    p.add_argument('--peers', default=None,
                   help='loaders to run, e.g. loadr,torch,limit (default every one installed)')
    p.add_argument('--skip', default='',
                   help='parts to leave out: scaling, resume, readers, decode')
    p.add_argument('--out', default=os.path.join(HERE, 'out'),
                   help='where table.md, results.json and scaling.png go (default benchmarks/out)')
    p.add_argument('--no-publish', action='store_true',
                   help='do not rewrite BENCHMARKS.md and benchmarks/scaling.png')
    p.add_argument('--tmp', default=None, help='where to make the data (default a temp dir)')
    p.add_argument('--device-report', action='store_true',
                   help='the report for a lent many-core GPU machine instead (benchmarks/'
                        'device.py): image scaling of loadr, torch and the ceiling by '
                        '--workers (default 1,2,4,8,16 up to the cores), time to the second '
                        'batch, and with CUDA the host-to-device copy and a ResNet-50 fed by '
                        'loadr; writes device.md, device.json, device_scaling.png to --out')
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device_report:
        from . import device
        warnings.filterwarnings('ignore', message='The given NumPy array is not writable')
        return device.main(args)
    only = [w for w in args.only.split(',') if w]
    bad = [w for w in only if w not in WORKLOADS]
    if bad:
        raise SystemExit(f'unknown workload {bad[0]!r}; choose from {", ".join(WORKLOADS)}')
    chosen = [p for p in args.peers.split(',') if p] if args.peers else None
    skip = {s for s in args.skip.split(',') if s}
    scaling = [int(x) for x in args.scaling.split(',')] if args.scaling else None
    workers, listed = worker_counts(args.workers)
    if listed:
        scaling = listed
    if args.limit_plain:
        peers.STEADY_LIMIT = False
    cfg = Config(args.scale, args.runs, workers, scaling)
    warnings.filterwarnings('ignore', message='The given NumPy array is not writable')
    started = time.perf_counter()
    names = chosen or ['torch', 'granular', 'grain', 'gulpio2']
    _preimport(names)
    results = {'command': 'python -m benchmarks ' + ' '.join(sys.argv[1:] if argv is None
                                                              else argv),
               'machine': measure.machine_info(), 'config': cfg.as_dict(),
               'workloads': {}, 'scaling': {}, 'resume': None, 'readers': None,
               'missing_peers': [m for m in ('torch', 'granular', 'grain', 'gulpio2')
                                 if not peers.available(m)]}
    root = tempfile.mkdtemp(prefix='loadr-bench-', dir=args.tmp)
    try:
        datas = {}
        for name in only:
            t = time.perf_counter()
            datas[name] = make_data(name, root, cfg.sizes[name])
            _log(f'made {name}: {datas[name].n} datapoints, '
                 f'{datas[name].nbytes / measure.MIB:.1f} MiB in {time.perf_counter() - t:.1f} s')
        for name in only:
            contenders = peers.contenders_for(name, chosen)
            results['workloads'][name] = {
                'batch': datas[name].batch, 'n': datas[name].n, 'workers': cfg.workers,
                'loaders': run_workload(datas[name], contenders, cfg.workers, cfg.runs,
                                        cfg.min_time_s)}
        if 'scaling' not in skip:
            for name in [w for w in ('images', 'trivial') if w in only]:
                contenders = peers.contenders_for(name, chosen)
                per_workers = {}
                for workers in cfg.scaling:
                    if workers == cfg.workers:
                        per_workers[workers] = results['workloads'][name]['loaders']
                    else:
                        per_workers[workers] = run_workload(datas[name], contenders, workers,
                                                            min(cfg.runs, SCALING_RUNS),
                                                            cfg.min_time_s)
                results['scaling'][name] = {
                    c.name: {str(w): per_workers[w][c.name]['summary'].get(
                        'samples_per_s', {}).get('median') for w in cfg.scaling}
                    for c in contenders}
        if 'resume' not in skip:
            _log('resume ...')
            results['resume'] = measure_resume(
                cfg.workers, cfg.runs, with_granular=chosen is None or 'granular' in chosen)
        if 'readers' not in skip:
            from . import readers
            _log('readers ...')
            results['readers'] = readers.run(root, cfg.scale, cfg.runs)
        if 'decode' not in skip:
            from . import decode
            _log('decode ...')
            results['decode'] = decode.run(cfg.scale, min(cfg.runs, 3))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results['machine']['load_average_end'] = [round(x, 2) for x in os.getloadavg()]
    results['wall_s'] = time.perf_counter() - started
    os.makedirs(args.out, exist_ok=True)
    results['targets'] = report.targets(results)
    text = report.markdown(results)
    with open(os.path.join(args.out, 'table.md'), 'w', encoding='utf-8') as f:
        f.write(text)
    with open(os.path.join(args.out, 'results.json'), 'w', encoding='utf-8') as f:
        json.dump(results, f, indent=1, default=str)
    plot = report.plot_scaling(results, os.path.join(args.out, 'scaling.png'))
    if not args.no_publish:
        if plot:
            shutil.copyfile(plot, os.path.join(HERE, 'scaling.png'))
        if not report.write_benchmarks_md(results, text, os.path.join(ROOT, 'BENCHMARKS.md')):
            _log('BENCHMARKS.md lacks the run markers (benchmarks/report.py): left as it is')
    print(text)
    _log(f'done in {results["wall_s"]:.0f} s; wrote {args.out}/table.md, results.json'
         + (', scaling.png' if plot else ''))
    return 0
