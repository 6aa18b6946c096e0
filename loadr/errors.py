"""Every error loadr raises, in one tree.

::

    LoadrError                    anything loadr raises on purpose; .path and .index when known
    ├── DataError                 the data on disk is wrong or unreadable (always names path, index)
    │   ├── FormatError           bytes that do not follow the format: bad header, table, JSON, size
    │   │   └── UnsafeFormatError data that could only be read by unpickling it (refused by default)
    │   ├── ChecksumError         a CRC32 that does not match the bytes it guards
    │   ├── DecodeError           a value that does not decode with its codec (bad JPEG, msgpack, …)
    │   └── ReadError             the OS failed a read (EIO, permission, vanished file)
    ├── WriterError               a writer misused or interrupted (short of n, bad value)
    ├── ConfigError               a pipeline or argument that does not make sense (file, line, hint)
    ├── SpecError                 a datapoint whose keys, shapes or dtypes differ from the spec
    ├── StateError                a saved state that does not belong to this loader
    ├── WorkerError               a worker failed; the original exception is chained to it
    └── ResourceError             the machine cannot give what was asked (e.g. /dev/shm too small)

Errors about data carry the file and the index so a user can find the
record: ``FormatError('index table runs past the end', path='x.bag', index=3)``
prints as ``x.bag [index 3]: index table runs past the end``.

Beside the tree, and outside ``__all__``: :class:`SampleFailure`, how the
assembler tells whoever runs it (the worker loop, or the batch window when
there are no workers) that one sample failed, which never reaches the user
as it is; and :class:`Problem`, what ``loadr check`` reports instead of
raising, named the same way. They live here, at the bottom, so that the side
that makes one and the side that takes it need not import each other.

Example::

    try:
        loadr.open('broken.ffr')[7]
    except loadr.errors.ChecksumError as e:
        print(e.path, e.index)
"""

from __future__ import annotations

import dataclasses
import os
import traceback

__all__ = [
    'LoadrError', 'DataError', 'FormatError', 'UnsafeFormatError', 'ChecksumError',
    'DecodeError', 'ReadError', 'WriterError', 'ConfigError', 'SpecError',
    'StateError', 'WorkerError', 'ResourceError',
]


class LoadrError(Exception):
    """Base of every loadr error; ``path`` and ``index`` name the record when known."""

    def __init__(self, message: str, path: str | os.PathLike | None = None,
                 index: int | None = None):
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.index = index
        super().__init__(message)

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.index is not None:
            where.append(f'[index {self.index}]')
        return f"{' '.join(where)}: {self.message}" if where else self.message

    def __reduce__(self):
        # Errors cross process boundaries (worker -> main); keep every field.
        return (_rebuild, (type(self), self.message, self.path, self.index, self.__dict__))


def _rebuild(cls, message, path, index, state):
    err = cls.__new__(cls)
    LoadrError.__init__(err, message, path, index)
    err.__dict__.update(state)
    return err


class DataError(LoadrError):
    """The data on disk is wrong or unreadable."""


class FormatError(DataError, ValueError):
    """Bytes that do not follow the format."""


class UnsafeFormatError(FormatError):
    """Data that could only be read by unpickling it; pass ``allow_pickle=True`` to accept it."""


class ChecksumError(DataError, ValueError):
    """A stored CRC32 does not match the bytes it guards."""


class DecodeError(DataError, ValueError):
    """A value that its codec cannot decode."""


class ReadError(DataError, OSError):
    """The operating system failed a read."""


class WriterError(LoadrError):
    """A writer used wrongly, or closed before it was complete."""


class ConfigError(LoadrError, ValueError):
    """A pipeline or an argument that does not make sense; ``line``: the line of the
    pipeline file it concerns (set by loadr.config; None when not known)."""

    line: int | None = None


class SpecError(LoadrError, ValueError):
    """A datapoint that does not match the loader's spec."""


class StateError(LoadrError, ValueError):
    """A saved loader state that does not fit this loader."""


class WorkerError(LoadrError):
    """A worker process failed; ``__cause__`` or the raised exception holds the original.

    ``position`` is the stream position of the datapoint that failed (None when not one
    datapoint's) and ``worker_traceback`` the worker's traceback text.
    """

    position: int | None = None
    worker_traceback: str | None = None

    def __str__(self) -> str:
        # The message says where already ("... in loadr worker 2 at dataset index N,
        # stream position P: ..."): no second "[index N]" in front of it.
        return self.message


class ResourceError(LoadrError, OSError):
    """The machine cannot provide what the loader needs."""


class SampleFailure(Exception):
    """Raised by :meth:`loadr.assemble.Assembler.fill` when one sample fails; carries where
    and why, for the worker loop or the batch window to report (never raised to the user)."""

    def __init__(self, exc: BaseException, index: int, position: int):
        super().__init__(f'sample at index {index}, position {position} failed: {exc!r}')
        self.exc, self.index, self.position = exc, index, position
        self.traceback = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem ``loadr.check`` found: the file, the index (or None), what is wrong."""

    path: str
    index: int | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.index is None else f'{self.path} [index {self.index}]'
        return f'{where}: {self.message}'
