"""A local disk cache of record byte ranges, evicting the range whose next use lies furthest ahead.

Remote storage (:mod:`loadr.storage.remote`) reads byte ranges ``(path, offset, length,
index)`` of records. A :class:`RangeCache` keeps some of them in a local directory
(``cache_dir``), at most ``max_bytes`` of them, for the next time the same record is read: a
later epoch, or a run resumed from a state. When full it drops the range whose next use lies
furthest ahead, or with ``policy='lru'`` the least recently used
(:mod:`loadr.storage.policy`); an offered range whose next use is further than everything
kept is not written. The directory's layout: :mod:`loadr.storage.cachedir`.

What one can expect from it: with a fresh random permutation per epoch every hit is a range
kept across the boundary between two epochs, so no policy saves more of an epoch's bytes
than ``max_bytes``; furthest-next-use reaches that bound, LRU about ``c**2 / 2`` of it for a
cache of fraction ``c`` (BENCHMARKS.md, "Local cache of remote ranges").

Checksums: :meth:`RangeCache.get` serves an entry only if its length and CRC-32 are those in
its name (ISA-L's CRC-32 where isal is installed, zlib's elsewhere: the same values); a
damaged one (a flipped bit on disk, a cut or grown file) is a miss and is deleted, so the
range is fetched and cached again (the check's cost: BENCHMARKS.md). A version-1 directory
(entries without checksums) is upgraded when first adopted: its entries and journal are
deleted, under the lock.

A full or read-only disk: a cache that cannot write only means "not cached". Where the
directory cannot be created, or the lock file, the journal or an entry cannot be written,
the process logs one warning naming the directory (once per run, whichever process meets it
first) and stops offering; entries already there are still served where their checksums
verify. The batches are the same either way.

Concurrency: several processes (the loader's workers) share a directory.
:meth:`RangeCache.offer` decides and changes the content under an exclusive ``flock``; an
entry is written to a temporary file and renamed into place, so :meth:`RangeCache.get`
(which takes no lock) reads a whole entry or none: a ``get`` racing the eviction of its
entry still reads the whole file it opened, or finds it gone (a miss).

Cost: listing a directory of 64k entries and parsing the names takes ~0.1 s of Python, too
much for every batch. Each process keeps a view of the entries (name, index, length in numpy
arrays), built once, and follows the others' changes through the journal, an append-only
file of ``+name`` / ``-name`` lines written under the lock (rewritten from the view when it
grows past a few times the entries). An offer costs O(entries) numpy work and O(changes)
Python and file work (10 ms for one that evicts and writes 64 of 64k entries; a get 0.02
ms). ``max_bytes`` counts the ranges' bytes; the filesystem adds its blocks and the journal
a few MB at most. Changes are ordered so that the journal never misses a file that is on
disk: an eviction is unlinked before its ``-`` line, an admission gets its ``+`` line before
it is renamed into place; a process killed in between leaves the journal listing a file that
is gone (counted, never read), never an uncounted file, so the directory never holds more
than ``max_bytes`` of entries.

loadr deletes only what it provably created: entries (of this version or version 1),
temporary files and its three own files, all recognised by their names, inside a directory
that carries the marker. Anything else in the directory is left alone.

Example (``n=4`` records read in order, two of them just fetched at positions 0 and 1; the
cache has room for 10 bytes)::

    >>> import functools, os, tempfile
    >>> from loadr.order import Order
    >>> from loadr.storage.policy import NextUse
    >>> tmp = tempfile.TemporaryDirectory()
    >>> cache = RangeCache(os.path.join(tmp.name, 'cache'), max_bytes=10)
    >>> next_use = functools.partial(NextUse(Order(4, seed=0, shuffle=False)).__call__, now=2)
    >>> next_use(np.array([0, 1, 2]))          # index 0 is read next at position 4, ...
    array([4, 5, 2])
    >>> cache.offer([('s3://b/x.bag', 0, 4, 0, b'abcd'),
    ...              ('s3://b/x.bag', 4, 8, 1, b'efghijkl')], next_use)
    >>> cache.get('s3://b/x.bag', 0, 4)
    b'abcd'
    >>> cache.get('s3://b/x.bag', 4, 8) is None  # 4 + 8 > 10, and index 1 comes later
    True
    >>> cache.stats()['hits'], cache.stats()['admitted']
    (1, 1)
    >>> cache.clear(); tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import threading
import time

import numpy as np

from ..errors import ConfigError, ResourceError
from ..pids import running
from .cachedir import (
    CACHE_VERSION,
    CRC_HEX,
    HASH_HEX,
    JOURNAL_HEAD,
    JOURNAL_NAME,
    LOCK_NAME,
    MARKER_NAME,
    O_CLOEXEC,
    TMP_PREFIX,
    View,
    crc32,
    default_budget,
    host,
    key_of,
    old_entry,
    parse_entry,
    warn_once,
)
from .policy import POLICIES, furthest, lru

__all__ = ['RangeCache']

# The journal is rewritten from the view once it is this many times the size
# a fresh one would have (and at least JOURNAL_MIN_BYTES): the rewrite makes
# every other process read it whole once, so not too often.
JOURNAL_GROWTH = 4
JOURNAL_MIN_BYTES = 1 << 20


class _Unwritable(Exception):
    """Raised inside the cache where the directory turned out not to be writable."""


class RangeCache:
    """Record byte ranges kept in a local directory, at most ``max_bytes`` of them.

    ``policy='furthest'`` (the default) keeps, among the entries and the
    ranges offered, those whose next use is nearest, up to ``max_bytes``:
    it evicts the furthest first and does not admit an offered range that
    would be evicted at once. ``policy='lru'`` admits every offered range
    and evicts the least recently used (file mtime; :meth:`get` touches).
    ``max_bytes=None``: :func:`default_budget` of the directory.

    Every entry carries the CRC-32 of its bytes (in its name): :meth:`get`
    serves only bytes of the right length and checksum; a damaged entry is a
    miss, and is deleted (it is provably ours) so that the range is fetched
    and cached again.

    A cache that cannot write only means "not cached": where the directory
    cannot be created, the lock file, the journal or an entry cannot be
    written (a read-only or full disk, no permission), the process logs one
    warning naming the directory (once per run: see :func:`warn_once`) and
    offers no more; it still serves the entries it can verify. Refused with
    :class:`~loadr.errors.ConfigError`: a ``directory`` that is a file, or
    holds files not loadr's, or belongs to another version of loadr.

    Picklable: only ``directory``, ``max_bytes`` and ``policy`` travel; the
    copy's counters start at zero. See the module's docstring for the
    layout, the locking and the costs.

    >>> RangeCache('/nonexistent/x', 0, policy='fifo')
    Traceback (most recent call last):
    ...
    loadr.errors.ConfigError: /nonexistent/x: unknown cache policy 'fifo'; known: furthest, lru
    """

    def __init__(self, directory: str, max_bytes: int | None, policy: str = 'furthest'):
        directory = os.path.abspath(os.fspath(directory))
        if policy not in POLICIES:
            raise ConfigError(f'unknown cache policy {policy!r}; known: {", ".join(POLICIES)}',
                              directory)
        if max_bytes is None:
            max_bytes = default_budget(directory)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ConfigError(f'max_bytes must be an integer >= 0, not {max_bytes!r}', directory)
        self.directory, self.max_bytes, self.policy = directory, max_bytes, policy
        self._reset()
        self._prepare()

    def _reset(self) -> None:
        self._pid = os.getpid()
        # Threads of one process share the view; the flock orders processes.
        self._mutex = threading.RLock()
        self._prepared = False
        self._created = False
        self._reclaimed = False
        self._listed = False
        # False once this process met a directory it cannot write (or read): see _off.
        self._writable = True
        self._readable = True
        self._bad: set[str] = set()     # damaged entries it could not delete: never read again
        self._last_stamp = 0
        self._view = View()
        self._stats = dict.fromkeys(('hits', 'misses', 'bytes_hit', 'admitted', 'evicted',
                                     'bytes_admitted', 'write_errors', 'damaged'), 0)

    def __getstate__(self):
        return {'directory': self.directory, 'max_bytes': self.max_bytes, 'policy': self.policy}

    def __setstate__(self, state):
        self.directory, self.max_bytes, self.policy = (
            state['directory'], state['max_bytes'], state['policy'])
        self._reset()               # the directory is checked on first use, in that process

    def __repr__(self) -> str:
        return (f'RangeCache({self.directory!r}, max_bytes={self.max_bytes}, '
                f'policy={self.policy!r})')

    @property
    def writable(self) -> bool:
        """False once this process found that it cannot write the directory (it offers no more)."""
        self._check_process()
        self._prepare()
        return self._writable

    # -- the directory ------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            # A forked copy: its own counters, and a view it rebuilds itself.
            self._reset()

    def _off(self, exc: OSError, readable: bool = True) -> None:
        """Stop writing (and reading, unless ``readable``) in this process, and say so once."""
        self._writable = False
        self._readable = self._readable and readable
        why = exc.strerror or str(exc)
        if self._readable:
            what = ('cannot be written', 'the entries there are still read where their '
                    'checksums verify')
        else:
            what = 'cannot be used', 'nothing is read from it'
        warn_once(self.directory, f'loadr: the cache directory {self.directory} {what[0]} '
                                   f'({why}); the run goes on uncached ({what[1]})')

    def _prepare(self) -> None:
        """Create or adopt the directory: it must be new, empty, or carry our marker.

        A disk that refuses (read-only, full, no permission) turns the cache
        off in this process (:meth:`_off`) rather than failing the run.
        """
        if self._prepared:
            return
        try:
            self._adopt()
        except OSError as exc:
            self._off(exc, readable=False)
        except _Unwritable as exc:
            # Adopted, but not writable: a version-1 directory whose entries (no
            # checksum: nothing to verify them by) cannot be deleted is not read.
            self._off(exc.args[0], readable=False)
        else:
            # Said at the start, not at the first change (which may never come: a
            # worker whose ranges were all cached).
            try:
                os.close(os.open(self._path(LOCK_NAME), os.O_RDWR | os.O_CREAT | O_CLOEXEC,
                                 0o644))
            except OSError as exc:
                self._off(exc)
        self._prepared = True

    def _adopt(self) -> None:
        try:
            os.makedirs(self.directory)
            self._created = True
        except FileExistsError:
            pass
        except NotADirectoryError as exc:
            raise ConfigError(f'cannot create the cache directory: {exc.strerror} (a parent '
                              f'is a file)', self.directory) from exc
        if not os.path.isdir(self.directory):
            raise ConfigError('the cache directory is not a directory', self.directory)
        marker = self._path(MARKER_NAME)
        meta = self._read_marker()
        if meta is None:
            names = os.listdir(self.directory)
            # Our own files count for nothing: another process may be making the
            # marker this moment (its temporary file is here before the marker).
            foreign = [n for n in names if not n.startswith(MARKER_NAME)]
            if foreign and MARKER_NAME not in names:
                raise ConfigError(
                    f'not a loadr cache directory (no {MARKER_NAME} in it) and not empty; '
                    f'loadr deletes only files it created, so give it an empty or new '
                    f'directory as cache_dir', self.directory)
            self._write_marker(marker, {'version': CACHE_VERSION,
                                        'created_dir': self._created})
            meta = self._read_marker() or {}
        if meta.get('version') == 1:
            meta = self._upgrade()
        if meta.get('version') != CACHE_VERSION:
            raise ConfigError(f'{MARKER_NAME} says {meta!r}; this loadr writes cache version '
                              f'{CACHE_VERSION}: use another cache_dir', self.directory)
        self._created = bool(meta.get('created_dir'))

    def _read_marker(self) -> dict | None:
        """The marker's content; None where there is none (OSError where it cannot be read)."""
        try:
            with open(self._path(MARKER_NAME), 'rb') as f:
                data = f.read()
        except FileNotFoundError:
            return None
        try:
            meta = json.loads(data)
        except ValueError as exc:
            raise ConfigError(f'unreadable {MARKER_NAME}: {exc}', self.directory) from exc
        if not isinstance(meta, dict):
            raise ConfigError(f'{MARKER_NAME} says {meta!r}; this loadr writes cache version '
                              f'{CACHE_VERSION}: use another cache_dir', self.directory)
        return meta

    def _write_marker(self, marker: str, meta: dict, replace: bool = False) -> None:
        # Written whole under a temporary name, then linked: link fails if a
        # racing process made the marker first, and nobody sees half of one.
        tmp = self._path(f'{TMP_PREFIX}{host()}-{os.getpid()}-{secrets.token_hex(4)}')
        try:
            with open(tmp, 'xb') as f:
                f.write(json.dumps(meta).encode() + b'\n')
            if replace:
                os.replace(tmp, marker)
            else:
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, marker)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _upgrade(self) -> dict:
        """A version-1 directory: delete its entries (they have no checksum) and its
        journal, then mark it version 2; under the lock, once for all processes."""
        try:
            with self._lock_file():
                meta = self._read_marker() or {}
                if meta.get('version') != 1:
                    return meta                 # another process did it meanwhile
                for name in os.listdir(self.directory):
                    if old_entry(name) or name == JOURNAL_NAME:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self._path(name))
                meta = {**meta, 'version': CACHE_VERSION}
                self._write_marker(self._path(MARKER_NAME), meta, replace=True)
                return meta
        except OSError as exc:
            raise _Unwritable(exc) from exc

    @contextlib.contextmanager
    def _lock_file(self):
        """Hold the directory's flock (OSError where the lock file cannot be opened)."""
        fd = os.open(self._path(LOCK_NAME), os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)            # releases the flock

    @contextlib.contextmanager
    def _locked(self, compact: bool = True):
        """Hold the directory's lock, with the view brought up to date."""
        self._check_process()
        self._prepare()
        with self._mutex, self._lock_file():
            if not self._follow():
                self._rebuild()
            elif not self._reclaimed:
                self._reclaim()
            yield
            if compact:
                self._maybe_compact()

    def _follow(self) -> bool:
        """Apply the journal's new lines to the view; False if there is no usable journal."""
        try:
            with open(self._path(JOURNAL_NAME), 'rb') as f:
                head = f.readline()
                if not head.startswith(JOURNAL_HEAD) or not head.endswith(b'\n'):
                    return False
                token = head[len(JOURNAL_HEAD):-1]
                view = self._view
                if token != view.token:
                    view = self._view = View()
                    view.token, view.offset = token, len(head)
                f.seek(view.offset)
                data = f.read()
        except OSError:
            return False
        # Without the lock a writer may be half way through an append: only
        # whole lines count.
        end = data.rfind(b'\n') + 1
        if end:
            view.apply(data[:end])
            view.offset += end
        return True

    def _reclaim(self, names: list | None = None) -> None:
        """Remove the temporary files of processes of this host that no longer run
        (killed while writing an entry); once per process, at its first change."""
        here = f'{TMP_PREFIX}{host()}-'
        for name in os.listdir(self.directory) if names is None else names:
            if name.startswith(here):
                pid = name[len(here):].split('-', 1)[0]
                if pid.isdigit() and int(pid) != os.getpid() and not running(int(pid)):
                    with contextlib.suppress(OSError):
                        os.unlink(self._path(name))
        self._reclaimed = True

    def _listing(self) -> tuple[View, list]:
        view = View()
        names = os.listdir(self.directory)
        for name in names:
            if parse_entry(name):
                view.add(name)
        return view, names

    def _rebuild(self) -> None:
        """Under the lock: the view from the directory's names, and a fresh journal."""
        self._view, names = self._listing()
        self._reclaim(names)
        self._write_journal()

    def _write_journal(self) -> None:
        view = self._view
        token = secrets.token_hex(8).encode()
        head = JOURNAL_HEAD + token + b'\n'
        tmp = self._path(f'{TMP_PREFIX}{host()}-{os.getpid()}-{secrets.token_hex(4)}')
        try:
            with open(tmp, 'xb') as f:
                f.write(head + view.journal())
            os.replace(tmp, self._path(JOURNAL_NAME))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        view.token, view.offset = token, os.path.getsize(self._path(JOURNAL_NAME))

    def _append(self, lines: list[str]) -> None:
        if not lines:
            return
        data = ''.join(lines).encode()
        fd = os.open(self._path(JOURNAL_NAME), os.O_WRONLY | os.O_APPEND | O_CLOEXEC)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                done = 0
                while done < len(data):
                    done += os.write(fd, data[done:])
            except OSError:
                # A full disk can take half a line: cut the journal back to its last
                # whole line, or, failing that, delete it (every process then
                # rebuilds its view from the directory).
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.unlink(self._path(JOURNAL_NAME))
                raise
        finally:
            os.close(fd)
        self._view.apply(data)
        self._view.offset += len(data)

    def _maybe_compact(self) -> None:
        view = self._view
        fresh = len(view.slots) * (HASH_HEX + CRC_HEX + 24)     # about a line per entry
        if view.offset > max(JOURNAL_MIN_BYTES, JOURNAL_GROWTH * fresh):
            self._write_journal()

    # -- reading ------------------------------------------------------------

    def _lookup(self, path: str, offset: int, length: int) -> str | None:
        self._check_process()
        self._prepare()
        if not self._readable:
            return None
        key = key_of(path, offset, length)
        with self._mutex:
            name = self._view.name(key)
            if name is None:
                # Another process may have added it since: read the journal's tail.
                if not self._follow() and not self._listed:
                    # No journal (a directory made read-only, or a full disk):
                    # what is there, once; every entry is verified when read.
                    self._listed = True
                    with contextlib.suppress(OSError):
                        self._view = self._listing()[0]
                name = self._view.name(key)
        return None if name in self._bad else name

    def get(self, path: str, offset: int, length: int) -> bytes | None:
        """The cached bytes of the range, or None (not cached, evicted, or damaged).

        An entry whose length or CRC-32 is not that of the bytes it was made
        from is damaged: it is deleted (or, where the directory cannot be
        written, never read again by this process), and the range is fetched
        and cached again.
        """
        name = self._lookup(path, offset, length)
        data = None
        if name is not None:
            try:
                with open(self._path(name), 'rb') as f:
                    data = f.read(length + 1)
                    if len(data) != length or crc32(data) != int(
                            name[HASH_HEX:HASH_HEX + CRC_HEX], 16):
                        data = None
                        self._damaged(name, os.fstat(f.fileno()))
                    elif self.policy == 'lru':
                        with contextlib.suppress(OSError):
                            os.utime(f.fileno(), ns=(self._stamp(),) * 2)
            except OSError:
                data = None
        if data is None:
            self._stats['misses'] += 1
        else:
            self._stats['hits'] += 1
            self._stats['bytes_hit'] += length
        return data

    def _damaged(self, name: str, st: os.stat_result) -> None:
        """Delete the damaged entry ``name`` (the file ``st`` read) unless another took its
        place meanwhile; where that cannot be done, this process does not read it again."""
        self._stats['damaged'] += 1
        if self._writable:
            try:
                with self._locked():
                    path = self._path(name)
                    try:
                        now = os.stat(path)
                    except FileNotFoundError:
                        return
                    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                        return                  # written again since: not the one read
                    os.unlink(path)
                    if self._view.name(name[:HASH_HEX]) == name:
                        self._append([f'-{name}\n'])
                    return
            except OSError as exc:
                self._off(exc)
        self._bad.add(name)

    def has(self, path: str, offset: int, length: int) -> bool:
        """Whether the range is cached now (it may be evicted right after; its bytes are
        verified when read)."""
        name = self._lookup(path, offset, length)
        if name is None:
            return False
        try:
            st = os.stat(self._path(name))
        except OSError:
            return False
        if st.st_size != length:
            # Damaged: deleted now, else the range fetched (read ahead) instead would
            # not be offered in its place (its key is taken).
            self._damaged(name, st)
            return False
        return True

    # -- deciding what stays -------------------------------------------------

    def offer(self, items, next_use=None) -> None:
        """Consider ranges just fetched: ``(path, offset, length, index, data)`` each.

        ``next_use(indices) -> positions`` (e.g. ``functools.partial(
        NextUse(order).__call__, now=position after the batch)``) is needed by
        ``'furthest'``: without it nothing is admitted nor evicted. Ranges
        without an index, already cached, larger than ``max_bytes`` or whose
        data is not ``length`` bytes are not admitted; nothing is, once this
        process found the directory not writable.
        """
        if self.policy == 'furthest' and next_use is None:
            return
        self._check_process()
        self._prepare()
        if not self._writable:
            return
        new: list[tuple[str, int, int, memoryview]] = []
        seen: set[str] = set()
        for path, offset, length, index, data in items:
            if index is None or length > self.max_bytes or int(index) < 0:
                continue
            view = memoryview(data).cast('B')
            if view.nbytes != length:
                continue
            key = key_of(path, offset, length)
            if key in seen:
                continue
            seen.add(key)
            new.append((key, int(index), int(length), view))
        if not new:
            return
        try:
            with self._locked():
                table = self._view
                new = [item for item in new if item[0] not in table.slots]
                if not new:
                    return
                slots = np.flatnonzero(table.live)
                new_length = np.array([item[2] for item in new], dtype=np.int64)
                total = table.bytes + int(new_length.sum())
                if total <= self.max_bytes:
                    evict_slots, admit = slots[:0], np.ones(len(new), dtype=bool)
                elif self.policy == 'furthest':
                    evict_slots, admit = furthest(self._view, slots, new, new_length,
                                                  total - self.max_bytes, next_use)
                else:
                    evict_slots, admit = lru(self._view, slots, new_length, self.max_bytes,
                                             self._path)
                self._change(evict_slots, [item for item, a in zip(new, admit) if a])
        except OSError as exc:
            # A read-only or full disk, no permission: not cached (see the class).
            self._off(exc)

    def _change(self, evict_slots: np.ndarray, admitted: list) -> None:
        """Evict, then admit; the journal never misses a file on disk (see the docstring).

        An OSError (a full or read-only disk) leaves at worst lines for files
        that are gone, never a file the journal does not list, and goes up.
        """
        view = self._view
        lines = []
        try:
            for slot in evict_slots.tolist():
                name = view.names[slot]
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(name))
                lines.append(f'-{name}\n')
        except OSError:
            self._stats['evicted'] += len(lines)
            self._append(lines)
            raise
        self._stats['evicted'] += len(lines)
        names = [f'{key}{crc32(data):08x}-{index}-{length}'
                 for key, index, length, data in admitted]
        self._append(lines + [f'+{name}\n' for name in names])
        for k, (name, (_, _, length, data)) in enumerate(zip(names, admitted)):
            try:
                self._write(name, data)
            except OSError:
                self._stats['write_errors'] += len(names) - k
                self._append([f'-{name}\n' for name in names[k:]])
                raise
            self._stats['admitted'] += 1
            self._stats['bytes_admitted'] += length

    def _stamp(self) -> int:
        # LRU's recency, in ns: the fine clock (a file's own mtime comes from a
        # coarse one, equal for files written a few ms apart), strictly increasing.
        self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
        return self._last_stamp

    def _write(self, name: str, data: memoryview) -> None:
        tmp = self._path(f'{TMP_PREFIX}{host()}-{os.getpid()}-{secrets.token_hex(4)}')
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC, 0o644)
            try:
                done = 0
                while done < len(data):
                    done += os.write(fd, data[done:])
                if self.policy == 'lru':
                    os.utime(fd, ns=(self._stamp(),) * 2)
            finally:
                os.close(fd)
            os.replace(tmp, self._path(name))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # -- the rest -----------------------------------------------------------

    def stats(self) -> dict:
        """This process's counts: hits, misses, bytes_hit, admitted, evicted,
        bytes_admitted, write_errors (ranges not cached: the disk refused them),
        damaged (entries read whose length or checksum was wrong)."""
        self._check_process()
        return dict(self._stats)

    def bytes_used(self) -> int:
        """The bytes of the entries, as this process last saw them."""
        return self._view.bytes

    def clear(self) -> None:
        """Remove every entry, the temporary files, the marker, the lock and the
        journal, and the directory if loadr created it and it is then empty;
        anything else in it stays. Not while other processes use the directory.
        ResourceError where the disk refuses (read-only, no permission)."""
        self._check_process()
        self._prepare()
        try:
            with self._mutex, self._lock_file():
                if self._read_marker() is None:         # never adopted: not provably ours
                    return
                for name in os.listdir(self.directory):
                    if (parse_entry(name) or old_entry(name)
                            or name.startswith(TMP_PREFIX) or name == JOURNAL_NAME):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self._path(name))
                for name in (MARKER_NAME, LOCK_NAME):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._path(name))
        except OSError as exc:
            raise ResourceError(f'cannot clear the cache: {exc.strerror or exc}',
                                self.directory) from exc
        if self._created:
            with contextlib.suppress(OSError):
                os.rmdir(self.directory)
        self._prepared = False
        self._view = View()
