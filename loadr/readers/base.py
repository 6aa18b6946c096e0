"""The Reader protocol and the small parts every format shares.

The contract every reader keeps (and ``tests/readers/common.py`` checks):

- ``len(r)`` datapoints, addressed ``0 .. len(r) - 1``; ``r[i]`` returns a
  dict. Any other index (negative, too large, not an int) raises IndexError
  or TypeError.
- ``r[i, mask]`` reads only the keys in ``mask``; for a sequence key the mask
  value may be ``True`` (all of it), a ``range`` or a list of positions, and
  only those elements are read from disk. ``r.available(i)`` returns
  ``{key: True | range(n)}`` without reading values.
- ``r.read_batch(indices)`` returns ``[r[i] for i in indices]``, possibly
  faster.
- Deterministic: the same index gives the same bytes, from any process.
- Picklable: files are opened lazily, once per process; no file handle
  crosses a process boundary. Reads use ``os.pread`` so threads and forked
  children never share a file position.
- Every failure on bad data raises a :mod:`loadr.errors` error that names the
  file and the index.

Example::

    r = loadr.open('data/train')
    print(len(r), r.spec)
    first = r[0]
"""

from __future__ import annotations

import dataclasses
import errno
import os
from typing import Any, Callable, Iterable, Sequence

from ..errors import FormatError, ReadError

__all__ = ['Reader', 'Files', 'Format', 'Problem', 'check_index', 'read_error']


def check_index(i: Any, n: int) -> int:
    """Return ``i`` as an int in ``[0, n)`` or raise IndexError/TypeError.

    >>> check_index(3, 10)
    3
    """
    if isinstance(i, bool) or not hasattr(i, '__index__'):
        raise TypeError(f'datapoint index must be an integer, not {type(i).__name__}')
    i = i.__index__()
    if not 0 <= i < n:
        raise IndexError(f'index {i} out of range for {n} datapoints')
    return i


class Files:
    """Per-process cache of read-only file descriptors, read with ``pread``.

    Picklable: the descriptors stay behind and the copy opens its own on
    first use. After ``fork`` the child notices the new pid and reopens.

    Example::

        files = Files()
        header = files.read('data.ffr', 0, 12)
    """

    def __init__(self):
        self._fds: dict[str, int] = {}
        self._pid = os.getpid()

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def fd(self, path: str, index: int | None = None) -> int:
        """The cached descriptor of ``path``; ReadError (naming ``index``) if it cannot open."""
        if self._pid != os.getpid():
            self._fds = {}
            self._pid = os.getpid()
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, 'O_CLOEXEC', 0))
            except OSError as exc:
                raise read_error(exc, path, index) from exc
            self._fds[path] = fd
        return fd

    def size(self, path: str) -> int:
        fd = self.fd(path)          # raises its own ReadError; wrapping it again doubled the text
        try:
            return os.fstat(fd).st_size
        except OSError as exc:
            raise read_error(exc, path, None) from exc

    def read(self, path: str, offset: int, length: int, index: int | None = None) -> bytes:
        """Read exactly ``length`` bytes at ``offset``; a short read is a FormatError."""
        if offset < 0 or length < 0:
            raise FormatError(f'negative offset {offset} or length {length}', path, index)
        fd = self.fd(path, index)
        try:
            data = os.pread(fd, length, offset)
            while len(data) < length:
                more = os.pread(fd, length - len(data), offset + len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise read_error(exc, path, index) from exc
        if len(data) != length:
            raise FormatError(
                f'file is truncated: wanted {length} bytes at offset {offset}, '
                f'got {len(data)}', path, index)
        return data

    def close(self) -> None:
        if self._pid == os.getpid():
            for fd in self._fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fds = {}

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def read_error(exc: OSError, path: str, index: int | None) -> ReadError:
    """A ReadError for an OSError, naming the file, the index and the errno."""
    name = errno.errorcode.get(exc.errno or 0, 'error')
    err = ReadError(f'cannot read ({name}): {exc.strerror or exc}', path, index)
    err.errno = exc.errno
    return err


class Reader:
    """Base class for loadr's readers; see the module docstring for the contract.

    Subclasses implement ``__len__``, ``_get(i, mask)``, ``available(i)`` and
    ``spec``; this class handles index checking and masks.
    """

    spec: dict

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _get(self, index: int, mask: dict | None) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def available(self, index: int) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getitem__(self, key) -> dict:
        if isinstance(key, tuple):
            if len(key) != 2:
                raise TypeError('use reader[index] or reader[index, mask]')
            index, mask = key
            if not isinstance(mask, dict):
                raise TypeError(f'mask must be a dict, not {type(mask).__name__}')
        else:
            index, mask = key, None
        return self._get(check_index(index, len(self)), mask)

    def read_batch(self, indices: Iterable[int]) -> list[dict]:
        """Datapoints for ``indices``, in order. Example: ``r.read_batch([4, 0, 9])``."""
        return [self[i] for i in indices]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def close(self) -> None:
        files = getattr(self, '_files', None)
        if files is not None:
            files.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        path = getattr(self, 'path', '?')
        return f'{type(self).__name__}({str(path)!r}, {len(self)} datapoints)'


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem ``loadr.check`` found: the file, the index (or None), what is wrong."""

    path: str
    index: int | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.index is None else f'{self.path} [index {self.index}]'
        return f'{where}: {self.message}'


@dataclasses.dataclass(frozen=True)
class Format:
    """One row of the detection table in ``loadr.readers``.

    ``detect(path) -> bool`` must be cheap and must not raise; ``check(path)``
    returns every :class:`Problem` it finds.
    """

    name: str
    detect: Callable[[str], bool]
    reader: type
    writer: type
    check: Callable[[str], Sequence[Problem]]
