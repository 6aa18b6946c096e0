"""CPU per sample of loaders run in alternating bursts in one process: paired figures.

``python -m benchmarks.paired [--workload trivial|images] [--before DIR] [--peers torch]
[--traced] [--bursts 30]``

On a shared machine whole runs a minute apart differ by more than a hot-path
change saves (loadr's trivial CPU per sample moved from 6 to 12 us between
runs of the same code). Here every contender is started once, in this
process, and the contenders then take turns: a burst of ``--burst-batches``
batches each, ``--bursts`` times, in an order that flips every round. Each
burst's CPU time is this process's plus that contender's own workers', so a
slow minute of the host slows every contender alike, and the paired ratios
(contender ÷ loadr, burst by burst) keep little of the noise.

The contenders:

- ``loadr``: the loadr this runs from;
- ``before``: the loadr package of another checkout (``--before DIR``, e.g.
  ``git worktree add /tmp/before <rev>``), imported as ``loadr_before``;
- ``torch``: torch's DataLoader, persistent workers (``--peers torch``);
- ``traced``: this loadr with its timeline on (``--traced``; ``Loader(trace=...)``,
  written to a temporary file at the end): what tracing costs.

Between its bursts a contender's workers fill their prefetch window and then
wait, which costs nothing; the batches they made meanwhile are handed out at
the start of its next burst, and it ends with a full window again, so each
burst pays for about the batches it hands out.

The workloads (``--workload``), both those of the side-by-side suite
(:mod:`benchmarks.workloads`, the same dataset builders and per-sample functions):

- ``trivial`` (the default): ``{'label', 'vec'}`` in a list, batch 256: the
  one where the loader's own costs are all there is. Defaults: 50,000
  datapoints, 30 bursts of 120 batches.
- ``images``: a bag of distinct 375×500 q90 JPEGs (made in a temporary
  directory, removed at the end), Pillow decode + random 224 crop + flip
  (``image_fn``), batch 64. Every loadr contender opens the same files with
  its own package's reader (``before`` with ``loadr_before.open``), so an
  older checkout runs its own reading code. Defaults: 1,024 images, 16 bursts
  of 24 batches (about a minute on 2 cores; a burst is ~2 s of CPU, so the
  10 ms ticks of the workers' CPU clocks are ~1% of it). A burst here is only a few
  prefetch windows long, so each round ends when every contender's workers
  are idle again, and a contender's workers are charged from the start of
  its burst to the start of its next one: the refill of its prefetch window
  is counted too.

Example (a quick run)::

    python -m benchmarks.paired --bursts 2 --burst-batches 10 --n 4096
    python -m benchmarks.paired --workload images --bursts 2 --burst-batches 2 --n 256
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import psutil

from . import workloads as W
from .peers import SEED, SourceSet, available

__all__ = ['main', 'measure']


def _import_before(path: str):
    """The loadr package of another checkout, as the module ``loadr_before``."""
    package = os.path.join(os.path.abspath(path), 'loadr')
    spec = importlib.util.spec_from_file_location(
        'loadr_before', os.path.join(package, '__init__.py'),
        submodule_search_locations=[package])
    module = importlib.util.module_from_spec(spec)
    sys.modules['loadr_before'] = module
    spec.loader.exec_module(module)
    return module


# Per workload: its per-sample function, and the defaults of --n, --bursts,
# --burst-batches and the warm-up batches (images: a run of a minute or two on 2 cores).
FNS = {'trivial': W.identity_fn, 'images': W.image_fn}
DEFAULTS = {'trivial': {'n': 50_000, 'bursts': 30, 'burst_batches': 120, 'warmup': 40},
            'images': {'n': 1024, 'bursts': 16, 'burst_batches': 24, 'warmup': 8}}


def _reader_for(module, data: W.Data):
    # On disk, each loadr package opens the files itself, so 'before' measures
    # its own reader (and never gets objects of this loadr's classes).
    if data.path is None:
        return data.reader
    return module.open(data.path, decode_images=False)


def _start_loadr(module, data: W.Data, workers: int, **kw):
    loader = module.Loader(_reader_for(module, data), batch=data.batch, fns=[FNS[data.name]],
                           shuffle=True, seed=SEED, workers=workers, **kw)
    return iter(loader), loader.close


def _start_torch(data: W.Data, workers: int):
    import torch
    from torch.utils.data import DataLoader
    loader = DataLoader(SourceSet(data.reader, FNS[data.name]), batch_size=data.batch,
                        shuffle=True, num_workers=workers, drop_last=True,
                        persistent_workers=workers > 0,
                        generator=torch.Generator().manual_seed(SEED))

    def stream():
        while True:
            yield from loader

    def close():
        shutdown = getattr(getattr(loader, '_iterator', None), '_shutdown_workers', None)
        if shutdown is not None:
            shutdown()
    return stream(), close


def _cpu_s(procs: list) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _settle(procs: list, deadline_s: float = 30.0, step_s: float = 0.25) -> None:
    """Return once ``procs`` use (almost) no CPU over ``step_s``, or after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    last = _cpu_s(procs)
    while time.monotonic() < end:
        time.sleep(step_s)
        now = _cpu_s(procs)
        if now - last < 0.05 * step_s:
            return
        last = now


def measure(starts: dict, data: W.Data, workers: int, bursts: int, burst_batches: int,
            warmup: int = 40, refill: bool = False) -> dict:
    """``{name: [CPU us a sample of each burst]}`` (and ``name + ' main'``: this
    process's share) for the contenders ``starts`` (name -> start(data, workers)).

    With ``refill``, every round (and the warm-up) ends when all workers are
    idle, and a contender's workers are charged from the start of its burst to
    the start of its next one, so the batches they make to refill its prefetch
    window count: for bursts only a few prefetch windows long."""
    me = psutil.Process()
    running = {}
    try:
        for name, start in starts.items():
            before = {p.pid for p in me.children(recursive=True)}
            it, close = start(data, workers)
            running[name] = (it, close, None)
            for _ in range(warmup):
                next(it)
            kids = [p for p in me.children(recursive=True) if p.pid not in before]
            running[name] = (it, close, kids)
        every_kid = [p for _, _, kids in running.values() for p in kids]
        if refill:
            _settle(every_kid)
        out = {key: [] for name in running for key in (name, name + ' main')}
        samples = burst_batches * data.batch
        names = list(running)
        main_s = {name: [] for name in names}
        starts_at = {name: [] for name in names}    # the workers' CPU at each burst's start
        ends_at = {name: [] for name in names}      # ... and at its end
        for k in range(bursts):
            for name in (names if k % 2 == 0 else names[::-1]):
                it, _, kids = running[name]
                main0 = time.process_time()
                starts_at[name].append(_cpu_s(kids))
                for _ in range(burst_batches):
                    next(it)
                main_s[name].append(time.process_time() - main0)
                ends_at[name].append(_cpu_s(kids))
            if refill:
                # Every burst's refill done before the next round: the order flips
                # each round, so without this a contender's back-to-back bursts
                # (end of one round, start of the next) would alternately be
                # charged with no refill and with two.
                _settle(every_kid)
        for name in names:
            kids = running[name][2]
            if refill:
                ends = starts_at[name][1:] + [_cpu_s(kids)]
            else:
                ends = ends_at[name]
            for main, start, end in zip(main_s[name], starts_at[name], ends):
                out[name].append(1e6 * (main + end - start) / samples)
                out[name + ' main'].append(1e6 * main / samples)
        return out
    finally:
        for _, close, _ in running.values():
            close()


def _quartiles(values: list) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4, method='inclusive') if len(values) > 1 else values * 3
    return q[0], statistics.median(values), q[2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m benchmarks.paired', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--before', help="another checkout's directory: its loadr runs as 'before'")
    p.add_argument('--peers', default='', help="'torch' to run torch's DataLoader too")
    p.add_argument('--workload', choices=sorted(DEFAULTS), default='trivial',
                   help='trivial (default) or images (JPEG decode, crop, flip)')
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--n', type=int,
                   help='datapoints (default 50,000; images: 1,024)')
    p.add_argument('--bursts', type=int, help='rounds (default 30; images: 16)')
    p.add_argument('--burst-batches', type=int,
                   help='batches a burst (default 120; images: 24)')
    p.add_argument('--traced', action='store_true',
                   help="run this loadr with its timeline on too, as 'traced'")
    p.add_argument('--json', help='write the per-burst figures here')
    args = p.parse_args(argv)
    defaults = DEFAULTS[args.workload]
    for key in ('n', 'bursts', 'burst_batches'):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])

    import loadr
    root = None
    try:
        if args.workload == 'images':
            root = tempfile.mkdtemp(prefix='loadr-paired-')
            data = W.make_images(root, args.n)
        else:
            data = W.make_trivial(args.n)
        starts = {'loadr': lambda d, w: _start_loadr(loadr, d, w)}
        if args.before:
            before = _import_before(args.before)
            starts['before'] = lambda d, w: _start_loadr(before, d, w)
        if args.traced:
            trace = os.path.join(tempfile.mkdtemp(), 'paired.trace.json')
            starts['traced'] = lambda d, w: _start_loadr(loadr, d, w, trace=trace)
        peers = [x for x in args.peers.split(',') if x]
        if 'torch' in peers:
            if not available('torch'):
                print('torch is not installed: left out')
            else:
                starts['torch'] = _start_torch
        out = measure(starts, data, args.workers, args.bursts, args.burst_batches,
                      warmup=defaults['warmup'], refill=args.workload == 'images')
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    what = ('trivial datapoints' if args.workload == 'trivial' else
            f'images ({args.n} 375x500 q90 JPEGs in a bag; Pillow decode, random crop '
            f'{W.CROP}, flip)')
    print(f'{what}, batch {data.batch}, {args.workers} workers: {args.bursts} '
          f'bursts of {args.burst_batches} batches each, alternated; CPU us a sample '
          f'(this process and the contender\'s workers)\n')
    print('| contender | median [p25–p75] | this process | ÷ loadr, paired (median) |')
    print('|---|---:|---:|---:|')
    for name in starts:
        lo, mid, hi = _quartiles(out[name])
        ratio = statistics.median(a / b for a, b in zip(out[name], out['loadr']))
        print(f'| {name} | {mid:.2f} [{lo:.2f}–{hi:.2f}] | '
              f'{statistics.median(out[name + " main"]):.2f} | {ratio:.3f} |')
    if args.json:
        with open(args.json, 'w', encoding='utf-8') as f:
            json.dump(out, f)
    return 0


if __name__ == '__main__':
    sys.exit(main())
