"""The cache's directory: its layout, the names of its entries, its budget, its view.

Layout of the directory (one per dataset: the index of an entry means a
record of that dataset)::

    .loadr-cache                 marker, JSON {"version": 2, ...}; without it a
                                 non-empty directory is refused (ConfigError)
    .loadr-cache.lock            fcntl.flock'ed around every change
    .loadr-cache.log             the journal of changes (see loadr.storage.cache)
    <sha1 hex 24><crc hex 8>-<index>-<len>   one entry: the bytes of one range;
                                 the hash is of (path, offset, length), the
                                 CRC-32 of the bytes
    .loadr-cache-tmp-<host>-<pid>-<random>   an entry being written

Each process keeps a :class:`View` of the entries (name, index, length in
numpy arrays), built once from the directory and kept up to date from the
journal (:class:`~loadr.storage.cache.RangeCache`).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import socket

import numpy as np

try:
    # ISA-L's CRC-32 (a dependency where it has wheels, as for FFRecord): ~6x zlib's, the same
    # values, so a directory written with one is read with the other.
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency wherever it has wheels
    from zlib import crc32

__all__ = ['MARKER_NAME', 'LOCK_NAME', 'JOURNAL_NAME', 'TMP_PREFIX', 'CACHE_VERSION',
           'entry_name', 'default_budget', 'DEFAULT_SHARE', 'DEFAULT_CAP', 'View', 'crc32']

log = logging.getLogger('loadr')

MARKER_NAME = '.loadr-cache'
LOCK_NAME = '.loadr-cache.lock'
JOURNAL_NAME = '.loadr-cache.log'
TMP_PREFIX = '.loadr-cache-tmp-'
# 2: entries carry their CRC-32 in their name. A version-1 directory's entries
# (no checksum, nothing to verify them by) are deleted when a process adopts it.
CACHE_VERSION = 2
# cache_dir without cache_bytes (default_budget): this share of the free space of
# the filesystem, counting what loadr's entries already hold there as free, at most
# DEFAULT_CAP per dataset.
DEFAULT_SHARE = 0.10
DEFAULT_CAP = 50 << 30
HASH_HEX = 24
CRC_HEX = 8
# <key: 24 hex><crc32 of the bytes: 8 hex>-<index>-<length>
_ENTRY = re.compile(r'([0-9a-f]{24})([0-9a-f]{8})-(\d{1,19})-(\d{1,19})\Z')
# The entries of a version-1 directory: no checksum.
_OLD_ENTRY = re.compile(r'[0-9a-f]{24}-\d{1,19}-\d{1,19}\Z')
JOURNAL_HEAD = b'loadr-cache-journal 2 '
_INT64_MAX = np.iinfo(np.int64).max
O_CLOEXEC = getattr(os, 'O_CLOEXEC', 0)


def parse_entry(name: str):
    """The match of an entry's name; None for any other name (19 digits can pass int64:
    loadr never makes such a name, so it is not provably ours)."""
    m = _ENTRY.match(name)
    if m is None or max(int(m.group(3)), int(m.group(4))) > _INT64_MAX:
        return None
    return m


def old_entry(name: str) -> bool:
    """A version-1 entry's name (see _entry)."""
    if _OLD_ENTRY.match(name) is None:
        return False
    return max(map(int, name[HASH_HEX + 1:].split('-'))) <= _INT64_MAX


def host() -> str:
    return re.sub(r'[^A-Za-z0-9_.]', '_', socket.gethostname())[:64] or 'host'


def key_of(path: str, offset: int, length: int) -> str:
    text = f'{path}\0{int(offset)}\0{int(length)}'.encode('utf-8', 'surrogateescape')
    return hashlib.sha1(text).hexdigest()[:HASH_HEX]


def entry_name(path: str, offset: int, length: int, index: int, data) -> str:
    """The file name of the entry holding ``data``, the ``length`` bytes at ``offset`` of ``path``.

    The key (a hash of the path, the offset and the length), then the CRC-32 of
    the bytes, the index and the length:

    >>> entry_name('s3://b/x.bag', 0, 4, 7, b'abcd')
    '43263ec569cbfd89ea50f180ed82cd11-7-4'
    """
    return f'{key_of(path, offset, length)}{crc32(data):08x}-{int(index)}-{int(length)}'


def _mount_point(path: str) -> str:
    """``path``, or the nearest of its parents that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _held(directory: str) -> int:
    """Bytes of loadr's entries in ``directory`` and in its subdirectories (a ``cache_dir``
    holds one per dataset), counted from their names; only directories with the marker."""
    total = 0
    for folder in (directory, *_subdirectories(directory)):
        if not os.path.isfile(os.path.join(folder, MARKER_NAME)):
            continue                # listed only where it is ours: cache_dir may be anything
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        total += sum(int(m.group(4)) for m in map(parse_entry, names) if m)
    return total


def _subdirectories(directory: str) -> list[str]:
    try:
        with os.scandir(directory) as it:
            return [e.path for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def default_budget(directory) -> int:
    """The bytes a cache in ``directory`` may hold when no ``cache_bytes`` is given.

    :data:`DEFAULT_SHARE` (10%) of the space free on the filesystem that holds
    ``directory`` (or would hold it: the nearest parent that exists), counting
    the bytes of loadr's entries already in it as free (so that a resumed run
    gets the budget of the first), at most :data:`DEFAULT_CAP` (50 GiB); 0
    where the filesystem cannot be asked. One figure per run: computed where
    the reader is opened, and the workers get it from there.

    >>> 0 <= default_budget('/nonexistent/cache') <= DEFAULT_CAP
    True
    """
    directory = os.path.abspath(os.fspath(directory))
    try:
        st = os.statvfs(_mount_point(directory))
    except OSError:
        return 0
    free = st.f_bavail * st.f_frsize
    return int(min(DEFAULT_CAP, DEFAULT_SHARE * (free + _held(directory))))


# Directories warned about by this process (see warn_once), and the sockets
# that tell the other processes of the run that it was done.
_warned: dict[str, object] = {}


def warn_once(directory: str, message: str) -> None:
    """Log ``message`` once per run for ``directory``, whichever process meets it first.

    Each worker of a run meets a read-only or full disk for itself; one
    warning says it all. The processes of a run share the process group:
    the first to bind an abstract unix socket named after the directory and
    the group warns, and keeps the name for as long as it lives; a process
    forked from one that warned does not warn again. So a run warns once
    where its main process meets it, else once per pool of workers (a later
    Loader warns again only after the worker that warned has exited). Linux;
    elsewhere every process warns once.
    """
    if directory in _warned:
        return
    sock = None
    try:
        name = hashlib.sha1(f'{directory}\0{os.getpgid(0)}'.encode(
            'utf-8', 'surrogateescape')).hexdigest()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(f'\0loadr-cache-warned-{name}')
    except OSError as exc:
        if sock is not None:
            sock.close()
            sock = None
        if exc.errno == errno.EADDRINUSE:
            _warned[directory] = None           # another process of the run warned
            return
    _warned[directory] = sock
    log.warning('%s', message)


class View:
    """A process's picture of the entries: hash -> slot, and numpy arrays by slot."""

    def __init__(self):
        self.token = None           # the journal this view follows, and how far
        self.offset = 0
        self.slots: dict[str, int] = {}
        self.names: list = []
        self.index = np.zeros(0, dtype=np.int64)
        self.length = np.zeros(0, dtype=np.int64)
        self.live = np.zeros(0, dtype=bool)
        self.free: list[int] = []
        self.bytes = 0

    def add(self, name: str) -> None:
        m = parse_entry(name)
        if m is None:
            return
        key = m.group(1)
        if key in self.slots:
            self.remove(key)
        if self.free:
            slot = self.free.pop()
        else:
            slot = len(self.names)
            self.names.append(None)
            if slot >= len(self.index):
                size = max(64, 2 * len(self.index))
                for attr, fill in (('index', 0), ('length', 0), ('live', False)):
                    old = getattr(self, attr)
                    new = np.full(size, fill, dtype=old.dtype)
                    new[:len(old)] = old
                    setattr(self, attr, new)
        index, length = int(m.group(3)), int(m.group(4))
        self.slots[key] = slot
        self.names[slot] = name
        self.index[slot] = index
        self.length[slot] = length
        self.live[slot] = True
        self.bytes += length

    def remove(self, key: str) -> None:
        slot = self.slots.pop(key, None)
        if slot is None:
            return
        self.bytes -= int(self.length[slot])
        self.names[slot] = None
        self.live[slot] = False
        self.free.append(slot)

    def name(self, key: str) -> str | None:
        slot = self.slots.get(key)
        return None if slot is None else self.names[slot]

    def apply(self, data: bytes) -> None:
        """Apply journal lines (``+name`` / ``-name``); ``data`` ends with a newline."""
        for line in data.decode('ascii', 'replace').split('\n'):
            if line[:1] == '+':
                self.add(line[1:])
            elif line[:1] == '-':
                self.remove(line[1:1 + HASH_HEX])

    def journal(self) -> bytes:
        return ''.join(f'+{name}\n' for name in self.names if name is not None).encode()
