"""The loaders measured: loadr and its peers, each started the way its users start it.

A *contender* is a name and a ``start(data, workers)`` that returns
``(iterator of batches, close)``. Every contender of a workload reads the
same data (loadr's reader, or a Python list, or the same files through the
peer's own reader where it has one) and calls the same per-sample function
from :mod:`benchmarks.workloads`:

- ``loadr``: ``loadr.Loader(reader, batch, fns=[fn], workers=W)``;
  for video ``fns=[sample_frames(num=8, mode='tsn'), video_fn]`` so only the
  8 chosen frames are read.
- ``torch``: ``torch.utils.data.DataLoader(dataset, batch, shuffle=True,
  num_workers=W)`` with the default collate; the dataset calls the fn.
- ``granular``: ``granular.Loader(source, batch, fns=[fn], workers=W)``
  (its default spawn start and prefetch); images come through granular's
  own ``DatasetReader`` from the same bag files, JPEGs left encoded.
- ``grain``: ``grain.python.DataLoader`` with an ``IndexSampler``, a
  ``MapWithIndex`` calling the fn and ``Batch``; ``worker_count=W``.
- ``torch+gulpio2``: video read with gulpio2's ``GulpDirectory[id]`` (whole
  video, frames kept as JPEG bytes), the 8 frames picked as loadr picks
  them, then the same ``video_fn``; ``torch+gulpio2 (decode all)`` uses
  gulpio2's default decoder (simplejpeg) on every frame, as its users get.
- ``limit`` (trivial, images, video): W plain loops at once, each in a
  process of its own (forked), reading random datapoints and calling the fn,
  no loader at all, with glibc's malloc thresholds set as loadr's workers set
  them (``loadr.workers.memory.set_steady``: buffers reused, not mmapped and
  trimmed per sample): the ceiling for W workers, CPU per sample included.
  ``--limit-plain`` measures the loop without the thresholds instead.
- ``limit`` (raw): one ``os.pread`` per record in this process, no checksum,
  multiplied by W in the report.

Example::

    it, close = CONTENDERS['loadr'].start(data, workers=2)
    batch = next(it)
    close()
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import numpy as np

from . import workloads as W

__all__ = ['Contender', 'contenders_for', 'available', 'SourceSet', 'GulpioSet']

SEED = 0


@dataclasses.dataclass(frozen=True)
class Contender:
    """One loader in one workload."""

    name: str
    start: Callable            # (data, workers) -> (iterator, close)
    per_worker_limit: bool = False   # a single-process figure, times W in the report
    note: str = ''
    ceiling: bool = False            # W plain loops at once (their own processes)


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ---------------------------------------------------------------------------
# Datasets for the peers (module level, so spawn-started workers import them)


class SourceSet:
    """``source[i]`` through ``fn(dp, seed=i)``: a map-style dataset for torch and grain."""

    def __init__(self, source, fn, raw: bool = False):
        self.source, self.fn, self.raw = source, fn, raw

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index):
        index = int(index)
        return self.fn(self.source[index], seed=index)


def _keep_bytes(jpeg: bytes) -> bytes:
    return jpeg


class GulpioSet:
    """Videos read with gulpio2 (whole video), 8 frames picked as loadr picks them."""

    def __init__(self, path: str, ids: list, decode_all: bool = False):
        self.path, self.ids, self.decode_all = path, list(ids), decode_all
        self._dir = None

    def __getstate__(self):
        return {'path': self.path, 'ids': self.ids, 'decode_all': self.decode_all, '_dir': None}

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index):
        from gulpio2 import GulpDirectory
        index = int(index)
        if self._dir is None:
            if self.decode_all:
                self._dir = GulpDirectory(self.path)
            else:
                self._dir = GulpDirectory(self.path, jpeg_decoder=_keep_bytes)
        frames, meta = self._dir[self.ids[index]]
        chosen = [frames[p] for p in W.tsn_positions(len(frames), index)]
        if self.decode_all:
            return {'frames': np.stack(chosen), 'label': int(meta['label'])}
        return W.video_fn({'frames': chosen, 'meta': meta}, seed=index)


# ---------------------------------------------------------------------------
# Starting each loader


def _fn_for(data: W.Data):
    return {'trivial': W.identity_fn, 'images': W.image_fn, 'raw': W.raw_fn,
            'video': W.video_fn}[data.name]


def _loadr_start(data: W.Data, workers: int):
    import loadr
    from loadr.fns import sample_frames
    fns = [_fn_for(data)]
    if data.name == 'video':
        fns = [sample_frames(key='frames', num=W.FRAMES_PER_CLIP, mode='tsn'), W.video_fn]
    loader = loadr.Loader(data.reader, batch=data.batch, fns=fns, shuffle=True, seed=SEED,
                          workers=workers)
    return iter(loader), loader.close


def _torch_start_with(dataset, data: W.Data, workers: int):
    import torch
    from torch.utils.data import DataLoader
    # persistent_workers: the same workers serve every epoch, as users run it
    # for more than one epoch (the stream here may run past the dataset's end).
    loader = DataLoader(dataset, batch_size=data.batch, shuffle=True, num_workers=workers,
                        drop_last=True, persistent_workers=workers > 0,
                        generator=torch.Generator().manual_seed(SEED))

    def stream():
        while True:
            yield from loader

    def close():
        it = getattr(loader, '_iterator', None)
        shutdown = getattr(it, '_shutdown_workers', None)
        if shutdown is not None:
            shutdown()
    return stream(), close


def _torch_start(data: W.Data, workers: int):
    return _torch_start_with(SourceSet(data.reader, _fn_for(data)), data, workers)


def _gulpio_start(decode_all: bool):
    def start(data: W.Data, workers: int):
        return _torch_start_with(GulpioSet(data.path, data.reader.ids, decode_all), data,
                                 workers)
    return start


def _granular_source(data: W.Data):
    if data.name == 'images':
        import granular
        # granular's own reader on the same bag files; 'jpg' values stay encoded so
        # that image_fn does the decoding, as in every other loader.
        return granular.DatasetReader(data.path, {'jpg': None, 'int': granular.decoders['int']})
    return data.reader


def _granular_start(data: W.Data, workers: int):
    import granular
    loader = granular.Loader(_granular_source(data), batch=data.batch, fns=[_fn_for(data)],
                             shuffle=True, workers=workers, seed=SEED)
    return iter(loader), loader.close


def _grain_start(data: W.Data, workers: int):
    import grain.python as gp

    from .grain_fns import transform
    sampler = gp.IndexSampler(num_records=len(data.reader), shard_options=gp.NoSharding(),
                              shuffle=True, num_epochs=None, seed=SEED)
    loader = gp.DataLoader(data_source=data.reader, sampler=sampler,
                           operations=[transform(_fn_for(data), data.name == 'images'),
                                       gp.Batch(batch_size=data.batch, drop_remainder=True)],
                           worker_count=workers)
    it = iter(loader)

    def close():
        # The iterator stops its worker processes when it is collected.
        nonlocal it
        inner = getattr(it, '_iterator', None)
        stop = getattr(inner, 'close', None) or getattr(inner, 'stop', None)
        if callable(stop):
            stop()
        it = None
    return it, close


def _plain_loop(data: W.Data, seed: int = SEED):
    """The fn alone, one sample after another; yields 'batches' (lists) of data.batch."""
    from loadr.fns import sample_frames
    fn = _fn_for(data)
    reader = data.reader
    rng = np.random.default_rng(seed)
    sample = sample_frames(num=W.FRAMES_PER_CLIP, mode='tsn')

    def gen():
        while True:
            out = []
            for index in rng.integers(0, len(reader), data.batch).tolist():
                if data.name == 'video':
                    dp = sample.read(reader, index, seed=index)
                else:
                    dp = reader[index]
                out.append(fn(dp, seed=index))
            yield out
    return gen()


# Whether the ceiling's loops run with loadr's steady-memory malloc thresholds
# (run.py's --limit-plain turns it off, to show what they are worth).
STEADY_LIMIT = True


def _ceiling_loop(data: W.Data, k: int, conn, steady: bool) -> None:
    """One of the ceiling's loops (a forked process): a byte down ``conn`` per batch."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # the parent stops it
    if steady:
        from loadr.workers.memory import set_steady
        set_steady()
    for _ in _plain_loop(data, SEED + k):
        conn.send_bytes(b'.')


def _ceiling_start(data: W.Data, workers: int):
    """W plain loops at once, each its own process: yields once per batch any of them makes."""
    import multiprocessing as mp
    from multiprocessing.connection import wait
    ctx = mp.get_context('fork')
    conns, procs = [], []
    try:
        for k in range(workers):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_ceiling_loop, args=(data, k, send, STEADY_LIMIT),
                               daemon=True, name=f'bench-ceiling-{k}')
            proc.start()
            send.close()
            conns.append(recv)
            procs.append(proc)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise

    def gen():
        while True:
            ready = wait(conns, timeout=60)
            if not ready:
                raise RuntimeError('the plain loops made no batch in 60 s')
            for conn in ready:
                conn.recv_bytes()        # EOFError if a loop died: the run fails, reported
                yield None

    def close():
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.join(10)
        for conn in conns:
            conn.close()
    return gen(), close


def _pread_limit_start(data: W.Data, workers: int):
    """Raw reads: one os.pread per 4 KiB record at the same offsets, no checksum, no loader."""
    import os
    info = [data.reader.locate(i) for i in range(min(len(data.reader), 1))]
    path, first = info[0]['path'], info[0]['offset']
    fd = os.open(path, os.O_RDONLY)
    rng = np.random.default_rng(SEED)

    def gen():
        while True:
            idx = rng.integers(0, len(data.reader), data.batch).tolist()
            yield [np.frombuffer(os.pread(fd, W.RECORD_BYTES, first + i * W.RECORD_BYTES),
                                 np.uint8) for i in idx]
    return gen(), lambda: os.close(fd)


def contenders_for(workload: str, peers: list[str] | None = None) -> list[Contender]:
    """The contenders of ``workload`` whose libraries are installed (``peers`` filters names)."""
    out = [Contender('loadr', _loadr_start)]
    if workload == 'video':
        if available('torch') and available('gulpio2'):
            out.append(Contender('torch+gulpio2', _gulpio_start(False),
                                 note='gulpio2 reads whole videos; same video_fn'))
            out.append(Contender('torch+gulpio2 (decode all)', _gulpio_start(True),
                                 note="gulpio2's default: simplejpeg decodes every frame"))
    else:
        if available('torch'):
            out.append(Contender('torch', _torch_start))
        if available('granular'):
            out.append(Contender('granular', _granular_start))
        if available('grain'):
            out.append(Contender('grain', _grain_start))
    if workload == 'raw':
        out.append(Contender('limit', _pread_limit_start, per_worker_limit=True,
                             note='os.pread of each 4 KiB record, no checksum, one process x W'))
    else:
        how = ("glibc's malloc thresholds set as loadr's workers set them" if STEADY_LIMIT
               else 'malloc as it comes')
        out.append(Contender('limit', _ceiling_start, ceiling=True,
                             note=f'the fn in W plain loops at once, one process each, {how}'))
    if peers is not None:
        out = [c for c in out if c.name in peers or c.name.split('+')[0] in peers
               or c.name.split(' ')[0] in peers]
    return out
