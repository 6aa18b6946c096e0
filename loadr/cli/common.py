"""What every command of ``loadr`` shares: the exit codes, output to stdout and stderr,
and counts and sizes in words."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..storage import is_url

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def print_out(*parts: object, **kwargs: Any) -> None:
    """A result, to stdout (flushed: the lines keep their order with stderr's)."""
    print(*parts, **kwargs, flush=True)


def print_err(*parts: object) -> None:
    """Progress, a note or an error, to stderr."""
    print(*parts, file=sys.stderr, flush=True)


def storage_options_of(args, path) -> dict | None:
    """The command's ``--storage-option`` values (``args.storage_options``, a dict) where
    ``path`` is a URL; None for a local path, which takes none.

    >>> import argparse
    >>> args = argparse.Namespace(storage_options={'anon': True})
    >>> storage_options_of(args, 's3://b/x'), storage_options_of(args, 'data/train')
    ({'anon': True}, None)
    """
    options = getattr(args, 'storage_options', None)
    return options if options and is_url(path) else None


def plural(n: int, word: str) -> str:
    """``'1 file'``, ``'3 files'``.

    >>> plural(1, 'file'), plural(3, 'file')
    ('1 file', '3 files')
    """
    return f'{n} {word}' + ('' if n == 1 else 's')


def size_text(nbytes: float) -> str:
    """A size in bytes as people read it.

    >>> size_text(512), size_text(3 << 20)
    ('512 B', '3.0 MB')
    """
    for unit, scale in (('GB', 1 << 30), ('MB', 1 << 20), ('kB', 1 << 10)):
        if nbytes >= scale:
            return f'{nbytes / scale:.1f} {unit}'
    return f'{nbytes} B'


def disk_size(path: str) -> tuple[int, int]:
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


def batch_size(batch: dict) -> int:
    """The datapoints in ``batch`` (the length of its first value; 0 for none)."""
    for value in batch.values():
        return len(value)
    return 0


def epoch_batches(loader) -> int:
    """Batches in one epoch (``len(loader)`` in 0.1; ``batches_per_epoch()`` where it exists)."""
    per_epoch = getattr(loader, 'batches_per_epoch', None)
    return per_epoch() if per_epoch is not None else len(loader)
