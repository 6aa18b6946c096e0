"""CPU per sample of loaders run in alternating bursts in one process: paired figures.

``python -m benchmarks.paired [--before DIR] [--peers torch] [--traced] [--bursts 30]``

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

The workload is the trivial one (``{'label', 'vec'}`` in a list, batch 256):
the one where the loader's own costs are all there is.

Example (a quick run)::

    python -m benchmarks.paired --bursts 2 --burst-batches 10 --n 4096
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
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


def _start_loadr(module, data: W.Data, workers: int, **kw):
    loader = module.Loader(data.reader, batch=data.batch, fns=[W.identity_fn], shuffle=True,
                           seed=SEED, workers=workers, **kw)
    return iter(loader), loader.close


def _start_torch(data: W.Data, workers: int):
    import torch
    from torch.utils.data import DataLoader
    loader = DataLoader(SourceSet(data.reader, W.identity_fn), batch_size=data.batch,
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


def measure(starts: dict, data: W.Data, workers: int, bursts: int, burst_batches: int,
            warmup: int = 40) -> dict:
    """``{name: [CPU us a sample of each burst]}`` (and ``name + ' main'``: this
    process's share) for the contenders ``starts`` (name -> start(data, workers))."""
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
        out = {key: [] for name in running for key in (name, name + ' main')}
        samples = burst_batches * data.batch
        names = list(running)
        for k in range(bursts):
            for name in (names if k % 2 == 0 else names[::-1]):
                it, _, kids = running[name]
                main0, kids0 = time.process_time(), _cpu_s(kids)
                for _ in range(burst_batches):
                    next(it)
                main_s, kids_s = time.process_time() - main0, _cpu_s(kids) - kids0
                out[name].append(1e6 * (main_s + kids_s) / samples)
                out[name + ' main'].append(1e6 * main_s / samples)
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
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--n', type=int, default=50_000, help='datapoints (default 50,000)')
    p.add_argument('--bursts', type=int, default=30)
    p.add_argument('--burst-batches', type=int, default=120)
    p.add_argument('--traced', action='store_true',
                   help="run this loadr with its timeline on too, as 'traced'")
    p.add_argument('--json', help='write the per-burst figures here')
    args = p.parse_args(argv)

    import loadr
    data = W.make_trivial(args.n)
    starts = {'loadr': lambda d, w: _start_loadr(loadr, d, w)}
    if args.before:
        before = _import_before(args.before)
        starts['before'] = lambda d, w: _start_loadr(before, d, w)
    if args.traced:
        import tempfile
        trace = os.path.join(tempfile.mkdtemp(), 'paired.trace.json')
        starts['traced'] = lambda d, w: _start_loadr(loadr, d, w, trace=trace)
    peers = [x for x in args.peers.split(',') if x]
    if 'torch' in peers:
        if not available('torch'):
            print('torch is not installed: left out')
        else:
            starts['torch'] = _start_torch
    out = measure(starts, data, args.workers, args.bursts, args.burst_batches)
    print(f'trivial datapoints, batch {data.batch}, {args.workers} workers: {args.bursts} '
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
