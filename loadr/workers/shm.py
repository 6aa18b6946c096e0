"""Shared-memory batch slots: allocate, map, release, never leak, within a budget.

A slot is one segment holding every array of one batch at fixed offsets (the
:class:`Layout`). Segments are ``memfd_create`` memory where the system has
it: anonymous, not capped by the size of the ``/dev/shm`` mount (Docker's
default is 64 MiB, less than one batch of 256 images of 224x224x3), and
freed by the kernel when the last process holding it exits, however it
exits. Elsewhere, or with ``LOADR_SHM=devshm``, they are files in an owned
directory in ``/dev/shm``. Ownership, written down once:

- The **main process** creates every segment (``Segment.create_memfd`` or
  ``Segment.create``) and is the one that gives them back, in
  ``WorkerPool.close()`` or its finaliser. It keeps each memfd open while
  the pool lives; a worker opens it as ``/proc/<main pid>/fd/<n>`` (with
  fork it has the descriptor already), checked by inode.
- **Workers** only map segments. A worker that finds its parent gone removes
  the pool's owned directories (the socket directory, and the /dev/shm one
  if any), so a SIGKILLed main process leaves nothing behind; memfd memory
  goes with the last process anyway.
- If the whole process group is killed at once, :func:`reclaim_stale`
  removes its directories the next time any loader starts, and only what
  loadr provably made (:func:`owned_dir`): a directory named
  ``loadr-<pid>-<32 hex digits>``, owned by us, holding a marker file
  (``loadr-owner.json``, ours, mode 0600) that repeats the name's random
  token and records the owner (boot id, pid namespace, pid, start time;
  see :func:`loadr.pids.owner_gone`). A user's ``/tmp/loadr-2024-results``
  fails every one of these checks; a live loader of another pid namespace
  is never judged dead.

The budget (:func:`shm_budget`: ``shm_bytes``, ``LOADR_SHM_BYTES``, or a
quarter of the memory available, and no more than /dev/shm has free for
the /dev/shm segments) decides how many slots are made (:func:`plan_slots`):
fewer than asked shrinks the prefetch window; fewer than one per worker
plus one is a :class:`~loadr.errors.ResourceError` before the first batch
that gives the sizes and the fix. The space is reserved with
``posix_fallocate`` when a segment is made, so memory that is not there is
that same clear error, not a SIGBUS in the middle of a write.

Example::

    layout = Layout({'image': (np.dtype('uint8'), (224, 224, 3))}, batch=64)
    seg = Segment.create_memfd('slot0', layout.nbytes)
    views = layout.views(seg.buf)         # {'image': array of shape (64, 224, 224, 3)}
    seg.close()
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import re
import secrets
import shutil
import stat
import tempfile
import weakref

import numpy as np

from ..errors import ResourceError
from ..pids import cgroup_dir, me, owner_gone

__all__ = ['SHM_DIR', 'PREFIX', 'MARKER', 'DEFAULT_SHM_FRACTION', 'Layout', 'Segment',
           'StatusCells', 'owned_dir', 'remove_owned', 'owner_of', 'reclaim_stale', 'use_memfd',
           'available_memory', 'shm_budget', 'plan_slots', 'free_bytes', 'READ_AHEAD_ROOM_BYTES']

SHM_DIR = '/dev/shm'
PREFIX = 'loadr-'
MARKER = 'loadr-owner.json'
ALIGN_BYTES = 64
TOKEN_HEX = 32                  # 128 random bits: a name nobody picks by chance
_OWNED = re.compile(rf'^loadr-(\d+)-([0-9a-f]{{{TOKEN_HEX}}})$')
_MARKER_MAX_BYTES = 4096
DEFAULT_SHM_FRACTION = 0.25     # of the memory available, when no budget is given
# The shared memory that slots past the needed ones (room to read further ahead) may take.
READ_AHEAD_ROOM_BYTES = 256 << 20


class Layout:
    """Where each array of a batch lives inside a slot.

    ``fields`` maps key -> (dtype, shape of one datapoint's value); the slot
    holds ``batch`` rows of each.
    """

    def __init__(self, fields: dict, batch: int):
        self.batch = int(batch)
        # key -> (dtype, shape of one datapoint's value, offset in the slot)
        self.fields: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
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
        Layout.__init__(self, state['fields'], state['batch'])


class StatusCells:
    """The status segment's layout, written down once (the pool and each worker map it).

    Per worker the stream position and dataset index in hand (2 int64, -1:
    none; the worker writes), then the id of the last cancelled task (1
    int64; the pool writes, every worker reads), then per worker a heartbeat
    counter (1 int64; the worker's watchdog thread bumps it), then per worker
    the tasks it asks to hold at once (1 int64; the pool sets where it starts,
    a worker that reads ahead sets it to what its round trips need).

    >>> import numpy as np
    >>> cells = StatusCells(bytearray(StatusCells.nbytes(2)), 2)
    >>> cells.heartbeat(1)[0] += 1; cells.heartbeats().tolist()
    [0, 1]
    """

    def __init__(self, buf, workers: int):
        self.buf, self.workers = buf, workers

    @staticmethod
    def nbytes(workers: int) -> int:
        return 16 * workers + 8 + 16 * workers

    # Memoryviews for the worker: it sets progress twice per sample, and a
    # memoryview's item assignment costs a third of numpy's.
    def _cells(self, at: int, nbytes: int) -> memoryview:
        return memoryview(self.buf).cast('B')[at:at + nbytes].cast('q')

    def progress(self, wid: int) -> memoryview:
        return self._cells(16 * wid, 16)

    def cancelled(self) -> memoryview:
        return self._cells(16 * self.workers, 8)

    def heartbeat(self, wid: int) -> memoryview:
        return self._cells(16 * self.workers + 8 + 8 * wid, 8)

    def wants(self, wid: int) -> memoryview:
        return self._cells(24 * self.workers + 8 + 8 * wid, 8)

    # Arrays for the pool, which reads them a row at a time.
    def progress_rows(self) -> np.ndarray:
        return np.ndarray((self.workers, 2), dtype=np.int64, buffer=self.buf)

    def heartbeats(self) -> np.ndarray:
        return np.ndarray((self.workers,), dtype=np.int64, buffer=self.buf,
                          offset=16 * self.workers + 8)

    def wants_rows(self) -> np.ndarray:
        return np.ndarray((self.workers,), dtype=np.int64, buffer=self.buf,
                          offset=24 * self.workers + 8)


class Segment:
    """One mapped shared-memory segment: a memfd, or a file in an owned directory.

    ``spec`` is what a worker needs to map it (:meth:`attach`).
    """

    def __init__(self, path: str, size: int, buf: mmap.mmap, fd: int | None = None,
                 ino: int | None = None):
        self.path, self.size, self.fd, self.ino = path, size, fd, ino
        self.buf: mmap.mmap | None = buf       # None once closed

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def spec(self) -> dict:
        return {'path': self.path, 'size': self.size, 'fd': self.fd, 'ino': self.ino}

    @classmethod
    def create(cls, path: str, size: int) -> Segment:
        """Make, reserve and map a new file segment of ``size`` bytes at ``path``."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ResourceError(f'cannot create shared memory: {exc.strerror}', path) from exc
        try:
            _reserve(fd, size, path)
            buf = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        os.close(fd)
        return cls(path, size, buf)

    @classmethod
    def create_memfd(cls, name: str, size: int) -> Segment:
        """Make, reserve and map a new memfd segment of ``size`` bytes; it stays open
        (``fd``) until :meth:`close`, for workers to open by ``/proc/<pid>/fd/<fd>``."""
        try:
            fd = os.memfd_create(f'{PREFIX}{name}', os.MFD_CLOEXEC)
        except OSError as exc:
            raise ResourceError(f'cannot create shared memory (memfd): {exc.strerror}') from exc
        try:
            os.fchmod(fd, 0o600)
            _reserve(fd, size, None)
            buf = _map_shared(fd, size)
            ino = os.fstat(fd).st_ino
        except BaseException:
            os.close(fd)
            raise
        return cls(f'/proc/{os.getpid()}/fd/{fd}', size, buf, fd, ino)

    @classmethod
    def attach(cls, spec: dict) -> Segment:
        """Map an existing segment (in a worker), from its :attr:`spec`.

        A memfd is the descriptor inherited at fork if it is still the same
        file (inode), else ``/proc/<main pid>/fd/<n>`` opened anew, checked
        by inode too: FileNotFoundError if the main process has let go of it.
        """
        path, ino = spec['path'], spec['ino']
        if spec['fd'] is not None:
            try:
                if os.fstat(spec['fd']).st_ino == ino:
                    return cls(path, spec['size'], mmap.mmap(spec['fd'], spec['size']))
            except OSError:
                pass
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            if ino is not None and info.st_ino != ino:
                raise FileNotFoundError(errno.ENOENT, 'shared memory segment is gone', path)
            buf = mmap.mmap(fd, info.st_size)
        finally:
            os.close(fd)
        return cls(path, info.st_size, buf)

    def close(self) -> None:
        """Unmap (unless a user still holds a view) and, for a memfd, let go of it."""
        if isinstance(self.buf, mmap.mmap):
            try:
                self.buf.close()
            except BufferError:
                # A user still holds a view (a lent batch); the mapping goes when they
                # drop it.
                pass
        self.buf = None         # a memfd mapping goes with the last view of it
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def unlink(self) -> None:
        """Remove a file segment's name (a memfd has none)."""
        if self.ino is None:
            _unlink(self.path)


def load_libc():
    """The C library, its ``mmap`` and ``munmap`` typed for ctypes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _map_shared(fd: int, size: int):
    """A writable buffer over the first ``size`` bytes of ``fd`` that holds no descriptor.

    Python's mmap keeps a duplicate of the descriptor for as long as it
    lives, so a batch lent past close() would keep the memfd open; this
    mapping is undone when the last object using it is collected (numpy
    arrays and memoryviews keep it alive), and never earlier.
    """
    libc = load_libc()
    addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise ResourceError(f'cannot map shared memory: {os.strerror(err)}')
    buf = (ctypes.c_ubyte * size).from_address(addr)
    # Not at interpreter exit: arrays over it may outlive the finalisers then.
    weakref.finalize(buf, libc.munmap, addr, size).atexit = False
    return buf


def _reserve(fd: int, size: int, path: str | None) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        where = f'{SHM_DIR} has' if path is not None else 'the system has'
        free = free_bytes() if path is not None else available_memory()
        raise ResourceError(
            f'no room for a {_mib(size)} batch slot ({where} {_mib(free or 0)} free); '
            'lower batch, workers or prefetch, or free memory', path) from exc


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


def use_memfd() -> bool:
    """Whether segments are memfds: where the system has memfd_create, unless
    ``LOADR_SHM=devshm`` asks for files in /dev/shm.

    >>> use_memfd() in (True, False)
    True
    """
    return hasattr(os, 'memfd_create') and os.environ.get('LOADR_SHM', '') != 'devshm'


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None        # 'max': no limit


def available_memory() -> int | None:
    """Bytes of memory this process could still take: the kernel's MemAvailable, and
    no more than its cgroup's limit (v2 or v1) leaves; None where unknown.

    >>> available_memory() is None or available_memory() > 0
    True
    """
    found = []
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for base, limit, usage in ((cgroup_dir('self', None), 'memory.max', 'memory.current'),
                               (cgroup_dir('self', 'memory'), 'memory.limit_in_bytes',
                                'memory.usage_in_bytes')):
        if base is None:
            continue
        cap, used = _read_int(os.path.join(base, limit)), _read_int(os.path.join(base, usage))
        if cap is not None and used is not None and cap < 2**60:
            found.append(max(0, cap - used))
    return min(found) if found else None


def shm_budget(shm_bytes: int | None = None, memfd: bool = True) -> tuple[int, str]:
    """``(bytes, where it comes from)``: what the slots may take altogether.

    ``shm_bytes`` if given, else ``LOADR_SHM_BYTES``, else
    ``DEFAULT_SHM_FRACTION`` of :func:`available_memory`; for /dev/shm
    files, no more than /dev/shm has free.
    """
    if shm_bytes is None and os.environ.get('LOADR_SHM_BYTES', '').strip():
        text = os.environ['LOADR_SHM_BYTES'].strip()
        if not text.isdigit():
            raise ResourceError(f'LOADR_SHM_BYTES must be a number of bytes, got {text!r}')
        budget, how = int(text), f'LOADR_SHM_BYTES={int(text)}'
    elif shm_bytes is not None:
        budget, how = int(shm_bytes), f'shm_bytes={int(shm_bytes)}'
    else:
        avail = available_memory()
        if avail is None:
            budget, how = 2**62, 'no limit known'
        else:
            budget = int(avail * DEFAULT_SHM_FRACTION)
            how = (f'by default {DEFAULT_SHM_FRACTION:g} of the {_mib(avail)} of memory '
                   'free')
    if not memfd:
        if not os.path.isdir(SHM_DIR):
            raise ResourceError(f'{SHM_DIR} does not exist; loadr needs shared memory for '
                                'workers > 0 (or use workers=0)', SHM_DIR)
        free = free_bytes()
        if free < budget:
            budget, how = free, f'{SHM_DIR} has {_mib(free)} free'
    return budget, how


def plan_slots(slot_bytes: int, wanted: int, workers: int, budget: tuple[int, str],
               extra_bytes: int = 0, needed: int | None = None) -> int:
    """How many slots of ``slot_bytes`` to make: ``wanted``, or as many as the budget
    holds; ResourceError if that is less than one per worker plus one.

    Slots past ``needed`` are room for reading further ahead (a remote reader's
    workers may hold more tasks): at most :data:`READ_AHEAD_ROOM_BYTES` of them.
    Small batches make short tasks, which need that room; large ones make long
    tasks, which hide a round trip with the first slots.

    >>> plan_slots(100, wanted=10, workers=2, budget=(650, 'shm_bytes=650'))
    6
    >>> plan_slots(READ_AHEAD_ROOM_BYTES // 4, wanted=20, workers=2, budget=(2**62, 'x'),
    ...            needed=5)
    9
    >>> plan_slots(100, wanted=10, workers=8, budget=(650, 'x'))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    loadr.errors.ResourceError: the batches need at least 900 B of shared memory (...), more \
than the budget of 650 B (x); lower batch or workers, or set LOADR_SHM_BYTES=900 (or more) in \
the environment
    """
    fits = max(0, budget[0] - extra_bytes) // max(1, slot_bytes)
    least = workers + 1
    if fits < least:
        # The need counts what the budget is charged with (the workers' status cells
        # too, ``extra_bytes``), so that it is always more than the budget; in bytes
        # where MiB would round the two to one figure.
        need = least * slot_bytes + extra_bytes
        text = size_text if size_text(need) != size_text(budget[0]) else '{} B'.format
        status = f', and {text(extra_bytes)} of worker status cells' if extra_bytes else ''
        raise ResourceError(
            f'the batches need at least {text(need)} of shared memory (one batch slot of '
            f'{text(slot_bytes)} for each of the {workers} workers, plus one{status}), more '
            f'than the budget of {text(budget[0])} ({budget[1]}); lower batch or workers, or '
            f'{_more_room(budget[1], need)}')
    if needed is not None and wanted > needed:
        wanted = max(needed, min(wanted, needed + READ_AHEAD_ROOM_BYTES // max(1, slot_bytes)))
    return min(wanted, fits)


def _more_room(how: str, need: int) -> str:
    """How to give the slots ``need`` bytes, where the budget came from ``how``: a
    Loader takes no budget argument, the environment sets it for any process."""
    if how.startswith(SHM_DIR):
        return f'make {SHM_DIR} larger (docker run --shm-size) or free room in it'
    return f'set LOADR_SHM_BYTES={need} (or more) in the environment'


def size_text(n: int) -> str:
    """``n`` bytes for a message: '900 B', or '36.8 MiB' from 1 MiB up."""
    return f'{n} B' if n < 2**20 else _mib(n)


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
