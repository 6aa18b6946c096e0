"""The process pool that reads and encodes the inputs, and the one writer that stores
them, in the order of the sorted file list whatever the worker count."""

from __future__ import annotations

import os
import signal
from typing import Any

from ..errors import ConfigError, DecodeError, WriterError

POOL_CHUNK = 4


def _ignore_sigint():
    # Ctrl-C belongs to the main process, which stops the pool in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _results(task, jobs: list, workers: int):
    """``task(job)`` for each job, in order, on ``workers`` processes (0 or 1: here)."""
    if workers <= 1 or len(jobs) <= 1:
        yield from map(task, jobs)
        return
    import multiprocess
    method = 'fork' if 'fork' in multiprocess.get_all_start_methods() else 'spawn'
    pool = multiprocess.get_context(method).Pool(workers, initializer=_ignore_sigint)
    try:
        yield from pool.imap(task, jobs, chunksize=POOL_CHUNK)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def check_out(out: str, fmt: str) -> None:
    """Refuse an unknown output format or an output path that exists and is not empty."""
    if fmt not in ('bag', 'gulp'):
        raise ConfigError(f"--format must be 'bag' or 'gulp', got {fmt!r}")
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ConfigError('the output already exists; remove it or pick another path', out)


def default_workers(workers: int | None) -> int:
    """The number of workers: ``workers``, or the CPUs up to 8 when None."""
    return max(1, min(8, os.cpu_count() or 1)) if workers is None else int(workers)


def write_records(out, fmt, jobs, task, workers, entries, label2idx, progress, skip_bad,
                  videos_per_chunk, shardlen, video: bool, image_type: str = 'jpg') -> dict:
    """Run ``task`` over ``jobs`` and write each result with its ``entries`` row.

    An image task gives ``(bytes, changes, notes)``; they are collected per
    file for the summary.
    """
    from ..writers import BagWriter, GulpWriter
    writer: Any     # a BagWriter or a GulpWriter: their append methods differ, as used below
    if fmt == 'bag':
        spec = ({'id': 'utf8', 'frames': 'jpg[]', 'label': 'int', 'meta': 'msgpack'} if video
                else {'image': image_type, 'label': 'int', 'label_name': 'utf8', 'path': 'utf8'})
        writer = BagWriter(out, spec, shardlen=shardlen)
    else:
        writer = GulpWriter(out, videos_per_chunk=videos_per_chunk, label2idx=label2idx or None)
    written, skipped, changed, notes = 0, [], [], []
    with writer:
        for (status, value), (source, id_, label, meta) in zip(
                _results(task, jobs, workers), entries, strict=True):
            if status != 'ok':
                if not skip_bad:
                    raise DecodeError(f'{value} (nothing was written; --skip-bad leaves such '
                                      f'files out)', source)
                skipped.append(f'{source}: {value}')
                if progress is not None:
                    progress.update(1)
                continue
            if not video:
                value, its_changes, its_notes = value
                if its_changes:
                    changed.append((id_, its_changes))
                if its_notes:
                    notes.append((id_, its_notes))
            idx = label2idx.get(label, -1) if label is not None else -1
            if fmt == 'gulp':
                gulp_meta = dict(meta)
                if label is not None:
                    gulp_meta['label_idx'] = idx
                writer.append(id_, gulp_meta, value if video else [value])
            elif video:
                writer.append({'id': id_, 'frames': value, 'label': idx, 'meta': meta})
            else:
                writer.append({'image': value, 'label': idx, 'label_name': label, 'path': id_})
            written += 1
            if progress is not None:
                progress.update(1, samples=len(value) if video else 1)
        if written == 0:
            raise WriterError('every input was skipped; nothing written', out)
    return {'out': out, 'format': fmt, 'written': written, 'skipped': skipped,
            'labels': len(label2idx), 'changed': changed, 'notes': notes}
