"""Shared-memory batch slots: allocate, map, release, never leak.

A slot is one file holding every array of one batch at fixed offsets (the
:class:`Layout`). Ownership, written down once:

- The **main process** makes an owned directory in ``/dev/shm`` and one in
  the temp dir (for its sockets), creates every segment inside the first
  (``Segment.create``) and is the one that removes both, in
  ``Loader.close()`` or its finaliser.
- **Workers** only map segments by path. A worker that finds its parent gone
  removes the two directories too, so a SIGKILLed main process leaves
  nothing behind.
- If the whole process group is killed at once, :func:`reclaim_stale`
  removes its directories the next time any loader starts, and only what
  loadr provably made (:func:`owned_dir`): a directory named
  ``loadr-<pid>-<32 hex digits>``, owned by us, holding a marker file
  (``loadr-owner.json``, ours, mode 0600) that repeats the name's random
  token and records the owner (boot id, pid namespace, pid, start time;
  see :func:`loadr.pids.owner_gone`). A user's ``/tmp/loadr-2024-results``
  fails every one of these checks; a live loader of another pid namespace
  is never judged dead.

The space is reserved with ``posix_fallocate`` when the segment is made, so
a /dev/shm too small for the batches asked for is a clear
:class:`~loadr.errors.ResourceError` before the first batch, not a SIGBUS
in the middle of a write.

Example::

    layout = Layout({'image': (np.dtype('uint8'), (224, 224, 3))}, batch=64)
    home = owned_dir(SHM_DIR)
    seg = Segment.create(os.path.join(home, 'slot0'), layout.nbytes)
    views = layout.views(seg.buf)         # {'image': array of shape (64, 224, 224, 3)}
    seg.close(); remove_owned(home)
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import secrets
import shutil
import stat
import tempfile

import numpy as np

from ..errors import ResourceError
from ..pids import me, owner_gone

__all__ = ['SHM_DIR', 'PREFIX', 'MARKER', 'Layout', 'Segment', 'StatusCells', 'owned_dir',
           'remove_owned', 'owner_of', 'reclaim_stale', 'check_space']

SHM_DIR = '/dev/shm'
PREFIX = 'loadr-'
MARKER = 'loadr-owner.json'
ALIGN_BYTES = 64
TOKEN_HEX = 32                  # 128 random bits: a name nobody picks by chance
_OWNED = re.compile(r'^loadr-(\d+)-([0-9a-f]{%d})$' % TOKEN_HEX)
_MARKER_MAX_BYTES = 4096


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
    """One mapped file in an owned directory."""

    def __init__(self, path: str, size: int, buf: mmap.mmap):
        self.path, self.size, self.buf = path, size, buf

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @classmethod
    def create(cls, path: str, size: int) -> 'Segment':
        """Make, reserve and map a new segment of ``size`` bytes at ``path``."""
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
        return cls(path, size, buf)

    @classmethod
    def attach(cls, path: str) -> 'Segment':
        """Map an existing segment (in a worker)."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(path, size, buf)

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


# -- owned directories ------------------------------------------------------------------


def owned_dir(parent: str) -> str:
    """Make a directory in ``parent`` that :func:`reclaim_stale` can prove is ours.

    Mode 0700; named ``loadr-<pid>-<token>``; a marker file inside repeats
    the token and records this process (:func:`loadr.pids.me`). Until the
    marker is complete the directory is not provably ours, so a reclaim
    running meanwhile leaves it alone.
    """
    while True:
        token = secrets.token_hex(TOKEN_HEX // 2)
        path = os.path.join(parent, f'{PREFIX}{os.getpid()}-{token}')
        try:
            os.mkdir(path, 0o700)
            break
        except FileExistsError:
            continue
    try:
        fd = os.open(os.path.join(path, MARKER),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, 'w') as f:
            json.dump({'loadr': 1, 'token': token, **me()}, f)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def owner_of(path: str) -> dict | None:
    """The owner recorded in ``path``'s marker if ``path`` is provably a directory that
    loadr made (name, type, our uid, a marker of ours repeating the name's token); else None.
    """
    match = _OWNED.match(os.path.basename(path))
    if match is None:
        return None
    uid = os.geteuid()
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            return None                 # a link planted in /tmp, another user's
        fd = os.open(os.path.join(path, MARKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            mark = os.fstat(fd)
            if not stat.S_ISREG(mark.st_mode) or mark.st_uid != uid or mark.st_size > \
                    _MARKER_MAX_BYTES:
                return None
            record = json.loads(os.read(fd, _MARKER_MAX_BYTES))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    if (not isinstance(record, dict) or record.get('loadr') != 1
            or record.get('token') != match.group(2) or record.get('pid') != int(match.group(1))):
        return None
    return record


def remove_owned(path: str) -> None:
    """Remove a directory made by :func:`owned_dir`, with everything in it."""
    shutil.rmtree(path, ignore_errors=True)


def reclaim_stale(parents: tuple | None = None) -> list[str]:
    """Remove the owned directories (segments, sockets) of loaders that provably no
    longer run, from the temp dir and /dev/shm; return their paths.

    Anything else is left as it is: names that only look like ours, directories
    without a valid marker, and those of owners that run or may run (another
    pid namespace).
    """
    removed = []
    for parent in parents or (tempfile.gettempdir(), SHM_DIR):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if not _OWNED.match(name):
                continue
            path = os.path.join(parent, name)
            owner = owner_of(path)
            if owner is not None and owner_gone(owner):
                remove_owned(path)
                removed.append(path)
    return removed
