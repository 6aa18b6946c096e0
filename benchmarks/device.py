"""``python -m benchmarks --device-report``: the figures for a lent many-core GPU machine.

Meant for a 16-core host with a GPU; on any other machine it does
the CPU parts and says what it left out. On the image workload (distinct
375×500 q90 JPEGs, Pillow decode + random crop 224 + flip, batch 64):

1. **Scaling**: samples/s and CPU ms per sample (whole process tree) by
   worker count (``--workers 1,2,4,8,16``; default: those up to the core
   count) for loadr, torch's DataLoader and the ceiling (W plain loops at
   once with loadr's steady-memory malloc settings), with a plot; loadr ÷
   ceiling, and loadr's CPU per sample against the plain loop's.
2. **Time to the second batch**: loadr and torch at the largest worker
   count: first batch after start, then the gap to the second.
3. **Host-to-device copy** (CUDA only): GB/s of a 256×224×224×3 uint8 batch
   from loadr's pinned slots (``loadr.torch.DataLoader(pin_memory=True)``)
   against the same bytes in pageable memory.
4. **Where loadr's time goes** at the largest worker count: per sample, each
   stage of the workers (``loader.stats()``: read, the fn, the write into
   shared memory, the rest of a task, waiting for work; their CPU and their
   time waiting for a core), the main process's CPU, against the plain
   loop's; and, where ``py-spy`` is installed, the functions one worker
   spends its time in (sampled for a few seconds).
5. **Feeding a model** (CUDA only): ResNet-50 (torchvision if installed,
   else a small stand-in, named in the output), bf16 autocast,
   channels_last, batch 256, fed by ``loadr.torch.DataLoader(device='cuda')``
   with 14 workers (fewer on smaller machines) against synthetic data already
   on the GPU: images/s of each and their ratio.

Example::

    python -m benchmarks --device-report                    # on the lent machine
    python -m benchmarks --device-report --scale 0.1 --runs 1   # a quick check anywhere
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from . import measure, peers, report
from . import workloads as W

__all__ = ['main', 'scaling', 'second_batch', 'stage_profile', 'top_functions', 'h2d_copy',
           'feed_model', 'markdown', 'default_worker_counts']

COPY_SHAPE = (256, 224, 224, 3)
MODEL_BATCH = 256
MODEL_WORKERS = 14
MODEL_STEPS = 30                 # timed steps at scale 1 (after warm-up)
MODEL_WARMUP = 5
COPY_REPEATS = 20
SECOND_BATCH_RUNS = 5
PROFILE_WARMUP = 10              # batches before the stage profile starts
PY_SPY_S = 5                     # seconds py-spy samples one worker
PY_SPY_TOP = 12                  # functions listed


def _log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def default_worker_counts(cores: int | None = None) -> list[int]:
    """1, 2, 4, 8, 16 up to the core count (at least 1 and 2).

    >>> default_worker_counts(16), default_worker_counts(2)
    ([1, 2, 4, 8, 16], [1, 2])
    """
    cores = cores or os.cpu_count() or 1
    return [w for w in (1, 2, 4, 8, 16) if w <= max(cores, 2)]


# ---------------------------------------------------------------------------
# 1. Scaling


def scaling(data: W.Data, counts: list[int], runs: int, min_time_s: float,
            names: list[str] | None = None) -> dict:
    """samples/s and CPU ms/sample (median of ``runs``) of each loader at each worker count."""
    from .run import run_workload
    contenders = peers.contenders_for('images', names or ['loadr', 'torch', 'limit'])
    out: dict = {'samples_per_s': {}, 'cpu_ms_per_sample': {}, 'ttfb_s': {}}
    for workers in counts:
        res = run_workload(data, contenders, workers, runs, min_time_s)
        for name, row in res.items():
            for key in out:
                out[key].setdefault(name, {})[str(workers)] = \
                    row['summary'].get(key, {}).get('median')
    return out


# ---------------------------------------------------------------------------
# 2. Time to the second batch


def second_batch(data: W.Data, workers: int, runs: int = SECOND_BATCH_RUNS,
                 names: tuple = ('loadr', 'torch')) -> dict:
    """Seconds to the first batch after start, and from the first to the second (median)."""
    out = {}
    for c in peers.contenders_for('images', list(names)):
        if c.name not in names:
            continue
        firsts, gaps = [], []
        for _ in range(runs):
            close = None
            try:
                t0 = time.perf_counter()
                it, close = c.start(data, workers)
                next(it)
                t1 = time.perf_counter()
                next(it)
                t2 = time.perf_counter()
            finally:
                if close is not None:
                    close()
            firsts.append(t1 - t0)
            gaps.append(t2 - t1)
        out[c.name] = {'first_s': statistics.median(firsts), 'second_gap_s':
                       statistics.median(gaps), 'second_gap_max_s': max(gaps)}
    return out


# ---------------------------------------------------------------------------
# Where loadr's time goes


def top_functions(collapsed: str, top: int = PY_SPY_TOP) -> list[tuple[str, float]]:
    r"""``(function, share of samples)`` by own time, from py-spy's ``--format raw``
    output (collapsed stacks: ``frame;frame;...;leaf count`` a line).

    >>> top_functions('main;fill;decode (a.py:3) 2\nmain;decode (a.py:4) 1\nmain;write 1\n')
    [('decode (a.py)', 0.75), ('write', 0.25)]
    """
    counts: dict[str, int] = {}
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(' ')
        if not stack or not n.isdigit():
            continue
        # A frame reads 'name (file:line)': one function, whatever its line.
        leaf = re.sub(r':\d+\)$', ')', stack.rsplit(';', 1)[-1])
        counts[leaf] = counts.get(leaf, 0) + int(n)
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    return [(name, n / total) for name, n in ranked] if total else []


def _py_spy(pid: int, seconds: float) -> dict:
    """The functions worker ``pid`` spends its time in, sampled by py-spy if installed."""
    import subprocess
    exe = shutil.which('py-spy')
    if exe is None:
        return {'skipped': 'py-spy is not installed (pip install py-spy)'}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'stacks.txt')
        cmd = [exe, 'record', '--pid', str(pid), '--duration', str(int(seconds)), '--rate', '250',
               '--format', 'raw', '--output', out, '--nonblocking']
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
        if proc.returncode != 0 or not os.path.exists(out):
            return {'skipped': f'py-spy failed: {(proc.stderr or proc.stdout).strip()[-300:]}'}
        with open(out, encoding='utf-8') as f:
            return {'top': top_functions(f.read()), 'seconds': seconds}


def stage_profile(data: W.Data, workers: int, seconds: float, spy_s: float = PY_SPY_S) -> dict:
    """Per sample, in ms: loadr's stages at ``workers`` (from ``loader.stats()``) over
    ``seconds`` of steady state, and the CPU of the main process and of the workers."""
    import psutil

    import loadr
    with loadr.Loader(data.reader, batch=data.batch, fns=[W.image_fn], shuffle=True,
                      seed=peers.SEED, workers=workers) as loader:
        it = iter(loader)
        for _ in range(PROFILE_WARMUP):
            next(it)
        me = psutil.Process()
        kids = [psutil.Process(pid) for pid in loader._pool.pids]

        def cpu(procs):
            return sum(t.user + t.system for t in (p.cpu_times() for p in procs))

        before, main0, kids0 = loader.stats(), cpu([me]), cpu(kids)
        spy = None
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            next(it)
            if spy is None and spy_s > 0 and time.perf_counter() - t0 > 0.1 * seconds:
                # Sampled while the loader runs: a thread, so batches keep coming.
                import threading
                spy = {}
                thread = threading.Thread(
                    target=lambda into=spy: into.update(_py_spy(kids[0].pid, spy_s)),
                    daemon=True)
                thread.start()
        if spy is not None:
            while thread.is_alive():            # keep the workers busy until it is done
                next(it)
            thread.join()
        d = loader.stats().since(before)
        main_s, kids_s = cpu([me]) - main0, cpu(kids) - kids0
    n = max(1, d.samples)

    def per(seconds: float) -> float:
        return 1e3 * seconds / n
    stages = {k: per(v) for k, v in d.stages().items()}
    return {'workers': workers, 'samples': d.samples, 'stages_ms': stages,
            'busy_ms': per(d.busy_s), 'cpu_ms': per(d._sum('cpu')),
            'runq_ms': per(d._sum('runq')), 'main_cpu_ms': per(main_s),
            'workers_cpu_ms': per(kids_s), 'py_spy': spy or {'skipped': 'not run'}}


# ---------------------------------------------------------------------------
# 3. Host-to-device copy


class _SameImage:
    """``n`` datapoints holding the same uint8[224, 224, 3] (no per-sample work)."""

    def __init__(self, n: int):
        self.n = n
        self.image = np.random.default_rng(0).integers(0, 256, COPY_SHAPE[1:], np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        return {'image': self.image, 'label': np.int64(index % 1000)}


def _copy_rate(tensor, repeats: int) -> float:
    """GB/s of ``tensor.to('cuda', non_blocking=True)``, best of ``repeats``."""
    import torch
    best = float('inf')
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        tensor.to('cuda', non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return tensor.numel() * tensor.element_size() / best / 1e9


def h2d_copy(repeats: int = COPY_REPEATS) -> dict:
    """Host-to-device GB/s of one 256×224×224×3 uint8 batch: loadr's pinned slot vs pageable."""
    try:
        import torch
    except ImportError:
        return {'skipped': 'torch is not installed'}
    if not torch.cuda.is_available():
        return {'skipped': 'CUDA is not available'}
    from loadr.torch import DataLoader
    out = {'bytes': int(np.prod(COPY_SHAPE))}
    with DataLoader(_SameImage(4 * COPY_SHAPE[0]), batch_size=COPY_SHAPE[0], num_workers=2,
                    pin_memory=True) as dl:
        it = iter(dl)                                # kept: the batch is lent from a slot
        batch = next(it)['image']
        out['loadr_slot_pinned'] = bool(batch.is_pinned())
        out['loadr_pinned_gb_s'] = _copy_rate(batch, repeats)
        pageable = batch.clone()                     # the same bytes, ordinary memory
        out['pageable_gb_s'] = _copy_rate(pageable, repeats)
        out['torch_pin_memory_gb_s'] = _copy_rate(pageable.pin_memory(), repeats)
        del batch, it
    return out


# ---------------------------------------------------------------------------
# 4. Feeding a model


def _model(name: str):
    import torch
    if name == 'resnet50':
        import torchvision
        return torchvision.models.resnet50(weights=None)
    # The stand-in where torchvision is missing: a few convolutions, same input and output.
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 1000))


def model_name() -> str:
    """'resnet50' where torchvision is installed, else 'stand-in'."""
    return 'resnet50' if peers.available('torchvision') else 'stand-in'


def _train_rate(model, opt, batches, steps: int, warmup: int, device: str) -> float:
    """Images/s of ``steps`` training steps (bf16 autocast, channels_last) on ``batches``."""
    import torch
    import torch.nn.functional as F
    cuda = device.startswith('cuda')

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.split(':')[0], dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    images = 0
    for k in range(warmup + steps):
        if k == warmup:
            sync()
            t = time.perf_counter()
            images = 0
        x, y = next(batches)
        step(x, y)
        images += len(y)
    sync()
    return images / (time.perf_counter() - t)


def feed_model(data: W.Data, workers: int, batch: int = MODEL_BATCH, steps: int = MODEL_STEPS,
               warmup: int = MODEL_WARMUP, device: str = 'cuda', name: str | None = None) -> dict:
    """Training images/s fed by loadr.torch.DataLoader vs synthetic data on the device.

    ``device='cpu'`` runs the same code on the CPU (for a check of the code, not a figure).
    """
    try:
        import torch
    except ImportError:
        return {'skipped': 'torch is not installed'}
    if device.startswith('cuda') and not torch.cuda.is_available():
        return {'skipped': 'CUDA is not available'}
    from loadr.torch import DataLoader
    name = name or model_name()
    model = _model(name).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def synthetic():
        x = torch.rand(batch, 3, W.CROP, W.CROP, device=device).to(
            memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=device)
        while True:
            yield x, y

    out = {'model': name, 'batch': batch, 'workers': workers, 'device': device,
           'steps': steps}
    out['synthetic_images_per_s'] = _train_rate(model, opt, synthetic(), steps, warmup, device)
    dl = DataLoader(data.reader, batch_size=batch, fns=[W.image_fn], num_workers=workers,
                    drop_last=True, device=device if device.startswith('cuda') else None)

    def fed():
        while True:
            for b in dl:
                # uint8 NHWC seen as NCHW is channels_last already; float keeps the layout.
                x = b['image'].permute(0, 3, 1, 2).float().div_(255)
                yield x, (b['label'] % 1000).to(device)

    try:
        out['loadr_images_per_s'] = _train_rate(model, opt, fed(), steps, warmup, device)
    finally:
        dl.close()
    out['loadr_of_synthetic'] = out['loadr_images_per_s'] / out['synthetic_images_per_s']
    return out


# ---------------------------------------------------------------------------
# Report


def _row(name: str, values: dict, counts: list[int], spec: str) -> str:
    cells = [format(values[str(c)], spec) if values.get(str(c)) is not None else '—'
             for c in counts]
    return f'| {name} | ' + ' | '.join(cells) + ' |'


def markdown(res: dict) -> str:
    """The device report's tables."""
    counts = res['worker_counts']
    sc = res['scaling']
    head = '| loader | ' + ' | '.join(f'W={c}' for c in counts) + ' |'
    rule = '|---|' + '---:|' * len(counts)
    lines = ['## Device report', '', f"Command: `{res['command']}`", '',
             f"Machine: {report._machine_line(res['machine'])}", '',
             f"CUDA: {res['cuda']}.", '',
             f"### images: {res['n']} distinct 375×500 q90 JPEGs; Pillow decode + random crop "
             f"224 + flip; batch {W.IMAGE_BATCH}; median of {res['runs']} interleaved runs", '',
             'samples/s:', '', head, rule]
    lines += [_row(name, row, counts, ',.0f') for name, row in sc['samples_per_s'].items()]
    ceiling, loadr_rate = sc['samples_per_s'].get('limit', {}), sc['samples_per_s'].get('loadr')
    if ceiling and loadr_rate:
        lines.append(_row('loadr ÷ ceiling', {
            w: (loadr_rate[w] / ceiling[w]) if loadr_rate.get(w) and ceiling.get(w) else None
            for w in ceiling}, counts, '.2f'))
    lines += ['', 'CPU ms per sample (whole process tree):', '', head, rule]
    cpu = sc['cpu_ms_per_sample']
    lines += [_row(name, row, counts, '.3f') for name, row in cpu.items()]
    if cpu.get('limit') and cpu.get('loadr'):
        lines.append(_row("loadr ÷ plain loop", {
            w: (cpu['loadr'][w] / cpu['limit'][w]) if cpu['loadr'].get(w) and
            cpu['limit'].get(w) else None for w in cpu['limit']}, counts, '.2f'))
    lines += ['', 'limit: the ceiling, W plain loops at once (one process each, steady-memory '
              'malloc thresholds).', '']
    sb = res.get('second_batch') or {}
    if sb:
        lines += [f"### Time to the second batch (W={res['second_batch_workers']}, median of "
                  f"{res['second_batch_runs']} starts)", '',
                  '| loader | first batch s | second batch after the first, s (max) |',
                  '|---|---:|---:|']
        for name, row in sb.items():
            lines.append(f"| {name} | {row['first_s']:.3f} | {row['second_gap_s']:.3f} "
                         f"({row['second_gap_max_s']:.3f}) |")
        lines.append('')
    sp = res.get('profile')
    if sp:
        plain = (cpu.get('limit') or {}).get(str(sp['workers']))
        lines += [f"### Where loadr's time goes (W={sp['workers']}, {sp['samples']:,} samples; "
                  'ms per sample)', '', '| part | ms/sample |', '|---|---:|']
        for name, ms in sp['stages_ms'].items():
            lines.append(f'| worker stage: {name} | {ms:.3f} |')
        lines += [f"| workers busy (all stages but wait) | {sp['busy_ms']:.3f} |",
                  f"| workers on a CPU / waiting for one | {sp['cpu_ms']:.3f} / "
                  f"{sp['runq_ms']:.3f} |",
                  f"| workers' CPU (psutil) | {sp['workers_cpu_ms']:.3f} |",
                  f"| main process CPU | {sp['main_cpu_ms']:.3f} |"]
        if plain:
            lines.append(f'| the plain loop, CPU (the ceiling above) | {plain:.3f} |')
        lines.append('')
        spy = sp['py_spy']
        if 'top' in spy:
            lines += [f"One worker sampled by py-spy for {spy['seconds']:g} s, by own time:", '',
                      '| function | share |', '|---|---:|']
            lines += [f'| `{name}` | {100 * share:.1f}% |' for name, share in spy['top']]
            lines.append('')
        else:
            lines += [f"py-spy: {spy['skipped']}.", '']
    cp = res['h2d']
    lines += ['### Host-to-device copy of a 256×224×224×3 uint8 batch', '']
    if 'skipped' in cp:
        lines += [f"Not measured: {cp['skipped']}.", '']
    else:
        lines += [f'| from | GB/s (best of {COPY_REPEATS}) |', '|---|---:|',
                  f"| loadr's pinned slot (pin_memory=True; pinned: {cp['loadr_slot_pinned']}) | "
                  f"{cp['loadr_pinned_gb_s']:.1f} |",
                  f"| pageable memory | {cp['pageable_gb_s']:.1f} |",
                  f"| torch .pin_memory() copy | {cp['torch_pin_memory_gb_s']:.1f} |", '']
    fm = res['model']
    lines += ['### Feeding a model: training images/s, bf16, channels_last', '']
    if 'skipped' in fm:
        lines += [f"Not measured: {fm['skipped']}.", '']
    else:
        lines += [f"{fm['model']}, batch {fm['batch']}, {fm['steps']} steps, "
                  f"{fm['workers']} loadr workers, on {fm['device']}.", '',
                  '| fed by | images/s |', '|---|---:|',
                  f"| synthetic data on the device | {fm['synthetic_images_per_s']:,.0f} |",
                  f"| loadr.torch.DataLoader (JPEG pipeline) | {fm['loadr_images_per_s']:,.0f} |",
                  f"| loadr ÷ synthetic | {fm['loadr_of_synthetic']:.2f} |", '']
    lines.append(f"Whole run: {res.get('wall_s', 0):.0f} s.")
    return '\n'.join(lines) + '\n'


def main(args) -> int:
    """Run the device report with run.py's parsed arguments (scale, runs, workers, out, tmp)."""
    from .run import worker_counts
    started = time.perf_counter()
    _, listed = worker_counts(args.workers)
    counts = listed or default_worker_counts()
    try:
        import torch
        cuda = (f'{torch.cuda.get_device_name(0)}, torch {torch.__version__}'
                if torch.cuda.is_available() else 'not available: the copy and model parts '
                'are left out')
    except ImportError:
        cuda = 'torch is not installed: only loadr and the ceiling are measured'
    names = ['loadr', 'torch', 'limit'] if peers.available('torch') else ['loadr', 'limit']
    if args.peers:                                  # --peers picks among these
        names = [n for n in names if n in args.peers.split(',')]
    runs = args.runs
    min_time_s = max(0.05, 0.7 * args.scale)
    n = max(4 * W.IMAGE_BATCH, int(2048 * args.scale))
    res = {'command': 'python -m benchmarks ' + ' '.join(args.argv), 'cuda': cuda,
           'machine': measure.machine_info(), 'worker_counts': counts, 'runs': runs, 'n': n}
    root = tempfile.mkdtemp(prefix='loadr-device-', dir=args.tmp)
    try:
        t = time.perf_counter()
        data = W.make_images(root, n)
        _log(f'made images: {n} distinct JPEGs, {data.nbytes / measure.MIB:.0f} MiB in '
             f'{time.perf_counter() - t:.0f} s')
        res['scaling'] = scaling(data, counts, runs, min_time_s, names)
        res['second_batch_workers'] = max(counts)
        _log('second batch ...')
        res['second_batch_runs'] = max(1, min(SECOND_BATCH_RUNS, runs))
        res['second_batch'] = second_batch(data, max(counts), res['second_batch_runs'],
                                           tuple(n for n in names if n != 'limit'))
        _log('where the time goes ...')
        res['profile'] = stage_profile(data, max(counts), max(1.0, 3 * min_time_s),
                                       PY_SPY_S if args.scale >= 0.5 else 0)
        _log('host-to-device copy ...')
        res['h2d'] = h2d_copy()
        _log('model ...')
        cores = os.cpu_count() or 1
        workers = MODEL_WORKERS if cores >= 16 else max(1, cores - 2)
        res['model'] = feed_model(data, workers, steps=max(5, int(MODEL_STEPS * args.scale)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res['machine']['load_average_end'] = [round(x, 2) for x in os.getloadavg()]
    res['wall_s'] = time.perf_counter() - started
    os.makedirs(args.out, exist_ok=True)
    text = markdown(res)
    with open(os.path.join(args.out, 'device.md'), 'w', encoding='utf-8') as f:
        f.write(text)
    with open(os.path.join(args.out, 'device.json'), 'w', encoding='utf-8') as f:
        json.dump(res, f, indent=1, default=str)
    plot = report.plot_scaling({'scaling': {'images': res['scaling']['samples_per_s']},
                                'machine': res['machine']},
                               os.path.join(args.out, 'device_scaling.png'))
    print(text)
    _log(f"done in {res['wall_s']:.0f} s; wrote {args.out}/device.md, device.json"
         + (', device_scaling.png' if plot else ''))
    return 0
