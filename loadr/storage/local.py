"""Local files, read with ``pread`` through descriptors cached per process.

Files replaced under an open reader: the local storage remembers each
file's identity (device and inode) when it first sees it, keeps the file
open (so the inode cannot be reused while the reader lives) and carries the
record when it is pickled. Every process that opens the file later (a
worker, a forked child) compares, and the process that has it open looks
again every :data:`RECHECK_INTERVAL_S`. A dataset replaced on disk (new
files renamed over the old, as every writer does, or deleted and written
again) raises FormatError ("file changed since the reader was made") in
every process, instead of old data in one and new in another. Size and
modification time are left out on purpose: bytes changed in place are
caught where they are read (a truncated read, FFRecord's CRCs, the digests
of ``loadr check --write-digests``), and those name the record.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable

from ..errors import FormatError, LoadrError, ReadError
from . import forks
from .base import Storage
from .errors import mapped, read_error
from .staging import StagedDir, StagedFile

__all__ = ['LocalStorage', 'RECHECK_INTERVAL_S']

# How often a process that holds a file open looks whether it was replaced.
# A stat of every open file costs about a microsecond each; once a second is
# nothing next to the reads, and bounds how long old data can be served.
RECHECK_INTERVAL_S = 1.0
# Files looked at per recheck, in turn, so a dataset of many files costs no more.
RECHECK_MAX_FILES = 64

_O_CLOEXEC = getattr(os, 'O_CLOEXEC', 0)



def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino


def _changed(path: str, was: tuple, now: tuple, index: int | None) -> FormatError:
    return FormatError(f'file changed since the reader was made (replaced by another file: '
                       f'inode {now[1]}, was {was[1]}); open the dataset again to read the '
                       f'new version', path, index)


class LocalStorage(Storage):
    """Local files, read with ``pread`` through descriptors cached per process.

    Picklable: the descriptors stay behind and the copy opens its own on
    first use (checking each file is the one the original saw). After
    ``fork`` the child notices and opens its own. ``loadr.readers.Files``
    is this class.

    Example::

        files = LocalStorage()
        header = files.read('data.ffr', 0, 12)
    """

    def __init__(self):
        self._fds: dict[str, int] = {}
        self._generation = forks.generation
        # path -> (device, inode) as first seen by whoever made us; pickled
        self._seen: dict[str, tuple[int, ...]] = {}
        self._opened: list[str] = []          # paths with a descriptor here, in open order
        self._recheck_at = time.monotonic() + RECHECK_INTERVAL_S
        self._cursor = 0

    def __getstate__(self):
        return {'seen': dict(self._seen)}

    def __setstate__(self, state):
        LocalStorage.__init__(self)
        self._seen = dict(state.get('seen', {}))

    # -- descriptors ------------------------------------------------------------------

    def fd(self, path: str, index: int | None = None) -> int:
        """The cached descriptor of ``path``; ReadError (naming ``index``) if it cannot open."""
        if self._generation != forks.generation:
            self._forget()
        fd = self._fds.get(path)
        if fd is None:
            return self._open(path, index)
        if time.monotonic() > self._recheck_at:
            self._recheck(index)
        return fd

    def _open(self, path: str, index: int | None) -> int:
        try:
            fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
            now = _identity(os.fstat(fd))
        except OSError as exc:
            raise read_error(exc, path, index) from exc
        was = self._seen.setdefault(path, now)
        if was != now:
            os.close(fd)
            raise _changed(path, was, now, index)
        self._fds[path] = fd
        self._opened.append(path)
        return fd

    def _recheck(self, index: int | None) -> None:
        """Look whether some of the open files were replaced; the next batch the next time."""
        self._recheck_at = time.monotonic() + RECHECK_INTERVAL_S
        opened = self._opened
        for _ in range(min(len(opened), RECHECK_MAX_FILES)):
            self._cursor = (self._cursor + 1) % len(opened)
            path = opened[self._cursor]
            try:
                now = _identity(os.stat(path))
            except OSError as exc:
                raise read_error(exc, path, index) from exc
            if now != self._seen[path]:
                raise _changed(path, self._seen[path], now, index)

    def _forget(self) -> None:
        """In a forked child: drop (and close our copies of) the parent's descriptors."""
        self._close_fds()
        self._generation = forks.generation

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}
        self._opened = []

    # -- reading ----------------------------------------------------------------------

    def size(self, path: str, index: int | None = None) -> int:
        """Bytes in ``path``; its identity is remembered from now on.

        The file is opened if it can be (which keeps its identity); one that
        exists but cannot be opened fails at its first read instead, which
        names the datapoint.
        """
        try:
            fd = self.fd(path, index)
        except ReadError:
            fd = None
        try:
            st = os.stat(path) if fd is None else os.fstat(fd)
        except OSError as exc:
            raise read_error(exc, path, index) from exc
        now = _identity(st)
        was = self._seen.setdefault(path, now)
        if was != now:
            raise _changed(path, was, now, index)
        return st.st_size

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

    def read_many(self, ranges: Iterable[tuple]) -> list[bytes]:
        """The bytes of each ``(path, offset, length, index)``, in order, one pread each.

        Anything amiss with one range (an OSError, a short read) is read again
        by :meth:`read`, which raises the error naming its file and index.
        """
        ranges = ranges if isinstance(ranges, list) else list(ranges)
        if ranges:
            paths, offsets, lengths, indices = zip(*ranges)
            if paths.count(paths[0]) == len(paths):
                # All in one file (a random batch): the preads run in map(), not in a
                # Python loop, which cost as much as a 4 KiB pread.
                fd = self.fd(paths[0], indices[0])
                try:
                    out = list(map(os.pread, itertools.repeat(fd), lengths, offsets))
                except (OSError, ValueError, OverflowError):
                    out = None              # the loop below finds which one and says so
                if out is not None and tuple(map(len, out)) == lengths:
                    return out
        out = []
        append, pread = out.append, os.pread
        last, fd = None, -1
        for path, offset, length, index in ranges:
            if path is not last:
                fd, last = self.fd(path, index), path
            try:
                data = pread(fd, length, offset)
            except (OSError, ValueError, OverflowError):
                data = b''
            if len(data) != length:
                data = self.read(path, offset, length, index)
            append(data)
        return out

    def read_all(self, path: str, index: int | None = None,
                 max_bytes: int | None = None) -> bytes:
        """The whole of a small file (a spec, a metadata table), its identity checked.

        At most ``max_bytes + 1`` bytes, so the caller can tell a file that
        is too large. Not cached: the descriptor is closed again.
        """
        try:
            with open(path, 'rb') as f:
                now = _identity(os.fstat(f.fileno()))
                was = self._seen.setdefault(path, now)
                if was != now:
                    raise _changed(path, was, now, index)
                return f.read() if max_bytes is None else f.read(max_bytes + 1)
        except OSError as exc:
            if isinstance(exc, LoadrError):
                raise
            raise read_error(exc, path, index) from exc

    def modified(self, path: str) -> float | None:
        """``path``'s modification time (seconds since the epoch), or None if it has none."""
        try:
            return os.stat(path).st_mtime_ns / 1e9
        except OSError:
            return None

    def list(self, path: str) -> list:
        """The names in directory ``path``, sorted; ReadError if it cannot be listed."""
        with mapped(path):
            return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        """True if anything (a dangling link included) has this name."""
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def occupied(self, path: str) -> bool:
        """True if ``path`` holds anything but an empty directory (a writer must not go there)."""
        if not os.path.lexists(path):
            return False
        if os.path.isdir(path) and not os.path.islink(path):
            try:
                return bool(os.listdir(path))
            except OSError:
                return True
        return True

    def close(self) -> None:
        if self._generation == forks.generation:
            self._close_fds()
        else:                   # another process's descriptors: not ours to close
            self._fds = {}
            self._opened = []

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- writing ----------------------------------------------------------------------

    def open_write(self, path: str) -> StagedFile:
        """A new file written under a hidden sibling of ``path``; ``commit()`` puts it there."""
        return StagedFile(os.fspath(path))

    def stage_dir(self, path: str, parents: bool = False) -> StagedDir:
        """A new directory built under a hidden sibling of ``path``; ``commit()`` renames it.

        ``parents`` creates the missing directories above ``path`` first.
        """
        return StagedDir(os.fspath(path), parents)

