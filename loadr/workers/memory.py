"""Steady memory in workers: glibc malloc thresholds, trimming when idle, and how much is kept.

A typical fn allocates a few buffers of ~0.5 MB per sample (a decoded
375x500 RGB image is 563 KB). glibc serves every allocation above its mmap
threshold (128 KiB, raised dynamically up to 32 MiB) with a fresh ``mmap``
and gives it back with ``munmap``, and trims the heap top above 128 KiB: each
sample then pays for page faults on memory it just returned, which on a VM
cost more than the JPEG decode (622-712 samples/s against
1,050-1,190 with the thresholds below, 2 workers). Workers therefore set, at
start:

- ``M_MMAP_THRESHOLD`` = 64 MiB: buffers up to that come from the heap and are
  reused from sample to sample;
- ``M_TRIM_THRESHOLD`` = 256 MiB: the heap top is returned to the system only
  when more than that is free.

What a worker keeps is then bounded by its peak heap use plus 256 MiB of free
heap top; a worker that has had no task for ``IDLE_TRIM_S`` gives back all
it can (``malloc_trim(0)``), so an idle loader holds little. ``WorkerPool.
memory()`` reports each worker's resident memory. Opt out with
``LOADR_STEADY_MEMORY=0`` (or the pool's ``steady_memory=False``). Other C
libraries (musl) are left as they are.

Example::

    if steady_memory_default():
        set_steady()            # in the worker, before the first sample
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os

__all__ = ['STEADY_MMAP_THRESHOLD_BYTES', 'STEADY_TRIM_THRESHOLD_BYTES', 'IDLE_TRIM_S',
           'steady_memory_default', 'set_steady', 'trim', 'mmapped_chunks', 'resident',
           'private_bytes', 'frozen_for_fork']

STEADY_MMAP_THRESHOLD_BYTES = 64 * 2**20
STEADY_TRIM_THRESHOLD_BYTES = 256 * 2**20
IDLE_TRIM_S = 2.0
_M_TRIM_THRESHOLD = -1          # from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_OFF = ('0', 'false', 'no', 'off')


def steady_memory_default() -> bool:
    """True unless the environment says ``LOADR_STEADY_MEMORY=0`` (or false, no, off).

    >>> steady_memory_default() in (True, False)
    True
    """
    return os.environ.get('LOADR_STEADY_MEMORY', '1').strip().lower() not in _OFF


def _glibc():
    try:
        version = os.confstr('CS_GNU_LIBC_VERSION')     # None: no such name here
        if version is None or not version.startswith('glibc'):
            return None
        return ctypes.CDLL(None)
    except (ValueError, OSError, AttributeError):
        return None


def set_steady() -> bool:
    """Set the steady-memory malloc thresholds in this process; False where the C
    library is not glibc or refuses them."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD_BYTES)
                and libc.mallopt(_M_TRIM_THRESHOLD, STEADY_TRIM_THRESHOLD_BYTES))


def trim() -> bool:
    """Give free heap memory back to the system (glibc ``malloc_trim(0)``); True if some was."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def mmapped_chunks() -> int | None:
    """How many allocations glibc serves with their own mmap now (``mallinfo2().hblks``);
    None where unknown. A probe of the thresholds: under the steady setting a 40 MiB
    buffer does not add one.

    >>> isinstance(mmapped_chunks(), (int, type(None)))
    True
    """
    libc = _glibc()
    if libc is None or not hasattr(libc, 'mallinfo2'):
        return None

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks',
            'uordblks', 'fordblks', 'keepcost')]

    libc.mallinfo2.restype = Mallinfo2
    return int(libc.mallinfo2().hblks)


def resident(pid: int) -> dict | None:
    """``{'rss_bytes', 'heap_bytes'}`` of ``pid``: all resident memory, and its private
    anonymous part (heap and mmapped buffers; not the shared batch slots); None if gone.

    >>> resident(os.getpid())['rss_bytes'] > 0
    True
    """
    found = {}
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key in ('VmRSS', 'RssAnon'):
                    found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if 'VmRSS' not in found:
        return None                 # a zombie
    return {'rss_bytes': found['VmRSS'], 'heap_bytes': found.get('RssAnon', found['VmRSS'])}


def private_bytes(pid: int) -> int | None:
    """The memory only ``pid`` maps (USS: its private pages, clean and dirty, as psutil
    counts them), from ``/proc/<pid>/smaps_rollup``; None if gone or unknown.

    Pages of the shared memory (batch slots, a SharedList) that another
    process maps too are not in it: what a worker adds by copying shows here.

    >>> private_bytes(os.getpid()) > 0
    True
    """
    total, seen = 0, False
    try:
        with open(f'/proc/{pid}/smaps_rollup') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key in ('Private_Clean', 'Private_Dirty', 'Private_Hugetlb'):
                    total += int(value.split()[0]) * 1024
                    seen = True
    except (OSError, ValueError, IndexError):
        return None
    return total if seen else None


@contextlib.contextmanager
def frozen_for_fork(fork: bool = True):
    """Around a fork: the main process's objects are moved out of the collector's
    reach (``gc.freeze``) for the child, and given back to the parent's after.

    A full collection in a worker visits every tracked object it inherited
    (every dict and list of a dataset held as Python objects) and writes its
    collector header: every page of them is copied, though the worker reads
    none of them (31 MiB of 200,000 small dicts, measured). Frozen objects
    are never visited in the child; the parent unfreezes at once (both O(1)),
    so its own collections go on as before, with the young objects of the
    moment counted as old. A process that froze objects itself
    (``gc.get_freeze_count() > 0``) manages that itself: left as it is.
    """
    if not fork or gc.get_freeze_count() > 0:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
