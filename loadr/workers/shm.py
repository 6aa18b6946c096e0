"""Shared-memory batch slots: allocate, map, release, never leak.

A slot is one file in ``/dev/shm`` holding every array of one batch at
fixed offsets (the :class:`Layout`). Ownership, written down once:

- The **main process** creates every segment (``Segment.create``) and is the
  one that unlinks them, in ``Loader.close()`` or its finaliser.
- **Workers** only map segments by name. A worker that finds its parent gone
  unlinks them too, so a SIGKILLed main process leaves nothing behind.
- Names are ``loadr-<owner pid>-<token>-<what>``; :func:`reclaim_stale`
  removes the segments of owners that no longer run, the next time any
  loader starts, and likewise the owners' private socket directories
  (:func:`private_dir`, ``<tmp>/loadr-<owner pid>-<random>``).

The space is reserved with ``posix_fallocate`` when the segment is made, so
a /dev/shm too small for the batches asked for is a clear
:class:`~loadr.errors.ResourceError` before the first batch, not a SIGBUS
in the middle of a write.

Example::

    layout = Layout({'image': (np.dtype('uint8'), (224, 224, 3))}, batch=64)
    seg = Segment.create(segment_name('slot0'), layout.nbytes)
    views = layout.views(seg.buf)         # {'image': array of shape (64, 224, 224, 3)}
    seg.close(); seg.unlink()
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import shutil
import stat
import tempfile

import numpy as np

from ..errors import ResourceError
from ..pids import running

__all__ = ['SHM_DIR', 'PREFIX', 'Layout', 'Segment', 'StatusCells', 'segment_name',
           'reclaim_stale', 'private_dir', 'check_space']

SHM_DIR = '/dev/shm'
PREFIX = 'loadr-'
ALIGN_BYTES = 64
_NAME = re.compile(r'^loadr-(\d+)-[0-9a-f]+-')
_DIR_NAME = re.compile(r'^loadr-(\d+)-[A-Za-z0-9_]+$')


def segment_name(what: str, token: str | None = None) -> str:
    """A fresh segment name carrying our prefix and pid: ``loadr-<pid>-<token>-<what>``."""
    return f'{PREFIX}{os.getpid()}-{token or secrets.token_hex(4)}-{what}'


class Layout:
    """Where each array of a batch lives inside a slot.

    ``fields`` maps key -> (dtype, shape of one datapoint's value); the slot
    holds ``batch`` rows of each.
    """

    def __init__(self, fields: dict, batch: int):
        self.batch = int(batch)
        self.fields = {}
        offset = 0
        for key, (dtype, shape) in fields.items():
            dtype, shape = np.dtype(dtype), tuple(int(s) for s in shape)
            size = self.batch * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self.fields[key] = (dtype, shape, offset)
            offset += -(-size // ALIGN_BYTES) * ALIGN_BYTES
        self.nbytes = max(offset, ALIGN_BYTES)

    def views(self, buf) -> dict[str, np.ndarray]:
        """Arrays of shape ``(batch, *shape)`` over ``buf``, one per key."""
        return {key: np.ndarray((self.batch, *shape), dtype=dtype, buffer=buf, offset=offset)
                for key, (dtype, shape, offset) in self.fields.items()}

    def __getstate__(self):
        return {'batch': self.batch,
                'fields': {k: (d.str, s) for k, (d, s, _) in self.fields.items()}}

    def __setstate__(self, state):
        self.__init__(state['fields'], state['batch'])


class StatusCells:
    """The status segment's layout, written down once (the pool and each worker map it).

    Per worker the stream position and dataset index in hand (2 int64, -1:
    none; the worker writes), then the id of the last cancelled task (1
    int64; the pool writes, every worker reads), then per worker a heartbeat
    counter (1 int64; the worker's watchdog thread bumps it).

    >>> import numpy as np
    >>> cells = StatusCells(bytearray(StatusCells.nbytes(2)), 2)
    >>> cells.heartbeat(1)[0] += 1; cells.heartbeats().tolist()
    [0, 1]
    """

    def __init__(self, buf, workers: int):
        self.buf, self.workers = buf, workers

    @staticmethod
    def nbytes(workers: int) -> int:
        return 16 * workers + 8 + 8 * workers

    # Memoryviews for the worker: it sets progress twice per sample, and a
    # memoryview's item assignment costs a third of numpy's.
    def progress(self, wid: int) -> memoryview:
        return memoryview(self.buf)[16 * wid:16 * wid + 16].cast('q')

    def cancelled(self) -> memoryview:
        at = 16 * self.workers
        return memoryview(self.buf)[at:at + 8].cast('q')

    def heartbeat(self, wid: int) -> memoryview:
        at = 16 * self.workers + 8 + 8 * wid
        return memoryview(self.buf)[at:at + 8].cast('q')

    # Arrays for the pool, which reads them a row at a time.
    def progress_rows(self) -> np.ndarray:
        return np.ndarray((self.workers, 2), dtype=np.int64, buffer=self.buf)

    def heartbeats(self) -> np.ndarray:
        return np.ndarray((self.workers,), dtype=np.int64, buffer=self.buf,
                          offset=16 * self.workers + 8)


class Segment:
    """One mapped file in /dev/shm."""

    def __init__(self, name: str, size: int, buf: mmap.mmap):
        self.name, self.size, self.buf = name, size, buf

    @property
    def path(self) -> str:
        return os.path.join(SHM_DIR, self.name)

    @classmethod
    def create(cls, name: str, size: int) -> 'Segment':
        """Make, reserve and map a new segment of ``size`` bytes."""
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ResourceError(f'cannot create shared memory: {exc.strerror}', path) from exc
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
                    raise
                raise ResourceError(
                    f'{SHM_DIR} has no room for a {_mib(size)} batch slot '
                    f'({_mib(free_bytes())} free); enlarge it, or lower batch or prefetch',
                    path) from exc
            buf = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        os.close(fd)
        return cls(name, size, buf)

    @classmethod
    def attach(cls, name: str) -> 'Segment':
        """Map an existing segment (in a worker)."""
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, buf)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:
            # A user still holds a view (ring mode); the mapping goes when they drop it.
            pass

    def unlink(self) -> None:
        _unlink(self.path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _mib(n: int) -> str:
    return f'{n / 2**20:.1f} MiB'


def free_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def check_space(nbytes: int) -> None:
    """Raise ResourceError now if /dev/shm cannot hold ``nbytes`` more."""
    if not os.path.isdir(SHM_DIR):
        raise ResourceError(f'{SHM_DIR} does not exist; loadr needs POSIX shared memory '
                            'for workers > 0 (or use workers=0)', SHM_DIR)
    free = free_bytes()
    if nbytes > free:
        raise ResourceError(
            f'the batches need {_mib(nbytes)} of shared memory but {SHM_DIR} has '
            f'{_mib(free)} free; enlarge it (docker: --shm-size), or lower batch or prefetch',
            SHM_DIR)


def private_dir() -> str:
    """A new directory for the sockets, mode 0700, named after our pid (see reclaim_stale)."""
    return tempfile.mkdtemp(prefix=f'{PREFIX}{os.getpid()}-')


def _orphans(parent: str, pattern: re.Pattern) -> list[str]:
    """Names in ``parent`` that match ``pattern`` and whose owner pid (group 1) is gone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return [name for name in names
            if (match := pattern.match(name)) and not running(int(match.group(1)))]


def _reclaim_dirs() -> list[str]:
    removed = []
    parent = tempfile.gettempdir()
    for name in _orphans(parent, _DIR_NAME):
        path = os.path.join(parent, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        # Ours only: a real directory (not a link planted in /tmp) that we own.
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def reclaim_stale() -> list[str]:
    """Unlink loadr segments and socket directories whose owner process is gone;
    return their names (directories as paths)."""
    removed = _reclaim_dirs()
    for name in _orphans(SHM_DIR, _NAME):
        _unlink(os.path.join(SHM_DIR, name))
        removed.append(name)
    return removed
