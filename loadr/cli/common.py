"""What every command of ``loadr`` shares: the exit codes, output to stdout and stderr,
and counts and sizes in words."""

from __future__ import annotations

import os
import sys


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _out(*parts, **kwargs) -> None:
    print(*parts, **kwargs, flush=True)


def _err(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _plural(n: int, word: str) -> str:
    return f'{n} {word}' + ('' if n == 1 else 's')


def _size(nbytes: int) -> str:
    for unit, scale in (('GB', 1 << 30), ('MB', 1 << 20), ('kB', 1 << 10)):
        if nbytes >= scale:
            return f'{nbytes / scale:.1f} {unit}'
    return f'{nbytes} B'


def _disk_size(path: str) -> tuple[int, int]:
    """(bytes, files) under ``path`` (a file or a directory)."""
    if os.path.isfile(path):
        return os.path.getsize(path), 1
    total = files = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
                files += 1
            except OSError:
                pass
    return total, files


def _batch_size(batch: dict) -> int:
    for value in batch.values():
        return len(value)
    return 0


def _describe_spec(spec: dict) -> str:
    import numpy as np
    parts = []
    for key, (dtype, shape) in spec.items():
        parts.append(f'{key} list' if dtype == np.dtype(object) else f'{key} {dtype}{list(shape)}')
    return ', '.join(parts)


def _epoch_batches(loader) -> int:
    """Batches in one epoch (``len(loader)`` in 0.1; ``batches_per_epoch()`` where it exists)."""
    per_epoch = getattr(loader, 'batches_per_epoch', None)
    return per_epoch() if per_epoch is not None else len(loader)
