"""Remote workers: what the trainer pays for rows made elsewhere, and how agents scale.

``python -m benchmarks.remote_workers [--samples 2048] [--ms 10]``

Agents run as local processes (``loadr.remote.Subprocesses``: the same tcp
protocol, CURVE on, as agents on Ray nodes), so every figure is over
loopback. It prints, beside each target of the remote-workers work:

- receive: GB/s of 224x224x3 rows into the trainer with ``workers=0`` and 2
  agents, and the trainer's CPU seconds per GB, with CURVE off
  (``Subprocesses(curve=False)``, loopback only) and on;
- the trainer's CPU per sample with rows from agents, against the CPU of
  decoding that sample (a 375x500 JPEG to 224x224) in the trainer;
- a sleep-bound fn (``--ms`` a sample): batches/s with 1 and 2 agents, and
  1 local worker + 1 agent against 2 local workers;
- a lost agent: seconds from its SIGKILL to the next batch.

No test asserts a time: the machine may be shared.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import resource
import signal
import time

import numpy as np

__all__ = ['main']

ROW = (224, 224, 3)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rows_fn(dp, seed=None):
    """A 224x224x3 row made with no work: what the receiving side alone costs."""
    return {'image': np.full(ROW, dp['i'] % 251, np.uint8)}


def sleepy(dp, seed=None, seconds=0.01):
    time.sleep(seconds)
    return {'i': np.int64(dp['i'])}


def _jpeg() -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (375, 500, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, 'JPEG', quality=90)
    return buf.getvalue()


def _run(items, fns, batch, count, **kw):
    """(seconds, trainer CPU seconds, samples) of ``count`` batches after the first."""
    import loadr

    with loadr.Loader(items, batch=batch, fns=fns, seed=0, **kw) as loader:
        it = iter(loader)
        next(it)
        t0, c0 = time.perf_counter(), _cpu()
        for _ in range(count):
            next(it)
        return time.perf_counter() - t0, _cpu() - c0, count * batch


def receive(samples: int, curve: bool = True) -> dict:
    import loadr.remote

    items = [{'i': i} for i in range(samples)]
    s, cpu, n = _run(items, [rows_fn], 32, max(1, samples // 32 - 2), workers=0,
                     remote=loadr.remote.Subprocesses(agents=2, curve=curve))
    gb = n * int(np.prod(ROW)) / 1e9
    return {'GB/s': gb / s, 'trainer CPU s/GB': cpu / gb, 'cpu_per_sample_s': cpu / n}


def decode_cpu(samples: int) -> float:
    """CPU seconds per sample of decoding a 375x500 JPEG to 224x224 in this process."""
    from loadr import fns as F

    fn = F.decode_jpeg(key='image', size=[224, 224])
    dp = {'image': _jpeg()}
    c0 = _cpu()
    count = max(8, samples // 8)
    for i in range(count):
        fn(dict(dp), seed=i)
    return (_cpu() - c0) / count


def scaling(samples: int, ms: float) -> dict:
    import loadr.remote

    fn = functools.partial(sleepy, seconds=ms / 1000)
    items = [{'i': i} for i in range(samples)]
    count = max(2, samples // 16 - 2)
    out = {}
    for name, kw in (('1 agent', dict(workers=0, remote=loadr.remote.Subprocesses(agents=1))),
                     ('2 agents', dict(workers=0, remote=loadr.remote.Subprocesses(agents=2))),
                     ('1 local + 1 agent', dict(workers=1,
                                                remote=loadr.remote.Subprocesses(agents=1))),
                     ('2 local', dict(workers=2))):
        s, _, _ = _run(items, [fn], 16, count, **kw)
        out[name] = count / s
    return out


def loss(samples: int, ms: float) -> float:
    """Seconds from an agent's SIGKILL to the next batch."""
    import loadr
    import loadr.remote

    fn = functools.partial(sleepy, seconds=ms / 1000)
    items = [{'i': i} for i in range(samples)]
    with loadr.Loader(items, batch=16, fns=[fn], seed=0, workers=0,
                      remote=loadr.remote.Subprocesses(agents=2)) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        pid = loader._pool.remote.links[0].info['pid']
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        next(it)
        return time.perf_counter() - t0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--samples', type=int, default=2048)
    parser.add_argument('--ms', type=float, default=10.0)
    args = parser.parse_args(argv)
    got = receive(args.samples)
    plain = receive(args.samples, curve=False)
    dec = decode_cpu(args.samples)
    scale = scaling(min(args.samples, 512), args.ms)
    lost = loss(min(args.samples, 512), args.ms)
    ratio = scale['2 agents'] / scale['1 agent']
    local = scale['1 local + 1 agent'] / scale['2 local']
    print('| target | measured |')
    print('|---|---|')
    print(f"| trainer CPU per sample from agents <= 0.1x local decode | "
          f"{got['cpu_per_sample_s'] * 1e6:.0f} us vs {dec * 1e6:.0f} us "
          f"({got['cpu_per_sample_s'] / dec:.2f}x) |")
    print(f"| receive >= 1 GB/s with CURVE off; CURVE's cost per GB | {plain['GB/s']:.2f} GB/s "
          f"({plain['trainer CPU s/GB']:.2f} trainer CPU-s/GB); with CURVE {got['GB/s']:.2f} "
          f"GB/s ({got['trainer CPU s/GB']:.2f} CPU-s/GB: +"
          f"{got['trainer CPU s/GB'] - plain['trainer CPU s/GB']:.2f} CPU-s/GB) |")
    print(f"| 1 -> 2 agents >= 1.8x batches/s ({args.ms:g} ms a sample) | {ratio:.2f}x "
          f"({scale['1 agent']:.1f} -> {scale['2 agents']:.1f}) |")
    print(f"| 1 local + 1 agent within 10% of 2 local | {local:.2f}x "
          f"({scale['1 local + 1 agent']:.1f} vs {scale['2 local']:.1f} batches/s) |")
    print(f'| an agent lost: next batch within 2 s | {lost:.2f} s |')


if __name__ == '__main__':
    main()
