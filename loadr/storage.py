"""Every byte loadr's readers and writers touch goes through one small interface.

A *storage* answers for the paths of one kind (local files today; URLs of
an fsspec protocol later). What readers and writers use, and nothing else::

    size(path, index=None) -> int
    read(path, offset, length, index=None) -> bytes      exactly ``length`` bytes
    read_many([(path, offset, length, index), ...]) -> [bytes, ...]
    read_all(path, index=None, max_bytes=None) -> bytes  a whole small file
    list(path) -> [name, ...]                            a directory's names, sorted
    exists(path), isdir(path), isfile(path) -> bool      never raise
    occupied(path) -> bool                               anything but an empty directory
    open_write(path) -> StagedFile                       renamed into place by commit()
    stage_dir(path, parents=False) -> StagedDir          a directory, the same way
    close()

:func:`storage_for` picks the storage of a path. A second backend (fsspec
for ``s3://``, ``https://``, …) is one class implementing the methods above
plus one branch in :func:`storage_for`: it would run ``read_many`` concurrently
and map its library's errors to :class:`~loadr.errors.ReadError` with
``transient`` set, as :func:`read_error` does for ``OSError``.

Errors: :class:`mapped` turns an ``OSError`` into a ``ReadError`` naming the
path and the index; :func:`transient` says whether a failed read is worth
retrying (the loader's retry policy asks it).

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

Example::

    storage = storage_for('data/train')
    header = storage.read('data/train/refs.bag', 0, 8)
    with storage.open_write('out.bin') as f:     # .out.bin.loadr-tmp-… until commit
        f.write(b'abc')
        f.commit()
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import itertools
import os
import shutil
import time
from typing import Iterable

from .errors import ConfigError, FormatError, LoadrError, ReadError, WriterError

__all__ = ['Storage', 'LocalStorage', 'StagedFile', 'StagedDir', 'WriteFile', 'storage_for',
           'mapped', 'read_error', 'transient', 'is_url', 'CACHE_KEYS', 'with_cache_settings',
           'TRANSIENT_ERRNOS', 'RECHECK_INTERVAL_S']

# Errors of the OS that may pass when the read is tried again (a network
# filesystem's hiccup, an interrupted call); anything else is final.
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT,
                              errno.ESTALE})
# How often a process that holds a file open looks whether it was replaced.
# A stat of every open file costs about a microsecond each; once a second is
# nothing next to the reads, and bounds how long old data can be served.
RECHECK_INTERVAL_S = 1.0
# Files looked at per recheck, in turn, so a dataset of many files costs no more.
RECHECK_MAX_FILES = 64

_O_CLOEXEC = getattr(os, 'O_CLOEXEC', 0)

# Bumped in the child of every fork: a storage made before it holds the
# parent's descriptors, which it must not share (file positions aside, a
# close in one process would not close the other's). Cheaper than a getpid()
# per read.
_generation = 0


def _after_fork() -> None:
    global _generation
    _generation += 1


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork)


# ---------------------------------------------------------------------------
# Errors


def read_error(exc: OSError, path: str, index: int | None) -> ReadError:
    """A ReadError for an OSError, naming the file, the index and the errno.

    ``transient`` is True for the errors a retry may cure (EIO, EAGAIN, …).

    >>> err = read_error(OSError(errno.EIO, 'Input/output error'), 'x.bag', 3)
    >>> str(err), err.transient
    ('x.bag [index 3]: cannot read (EIO): Input/output error', True)
    """
    name = errno.errorcode.get(exc.errno or 0, 'error')
    err = ReadError(f'cannot read ({name}): {exc.strerror or exc}', path, index)
    err.errno = exc.errno
    err.transient = exc.errno in TRANSIENT_ERRNOS
    return err


class mapped:
    """Context manager: an ``OSError`` inside becomes a ReadError naming ``path`` and ``index``.

    loadr's own errors pass through unchanged. A class, not a generator, so
    entering it costs next to nothing.

    >>> with mapped('missing.bag', 7):                     # doctest: +SKIP
    ...     open('missing.bag', 'rb')
    Traceback (most recent call last):
    loadr.errors.ReadError: missing.bag [index 7]: cannot read (ENOENT): No such file or directory
    """

    __slots__ = ('path', 'index')

    def __init__(self, path: str, index: int | None = None):
        self.path, self.index = path, index

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and isinstance(exc, OSError) and not isinstance(exc, LoadrError):
            raise read_error(exc, self.path, self.index) from exc
        return False


def transient(exc: BaseException) -> bool:
    """True when a failed read may succeed if tried again (the retry policy asks this).

    A ReadError says so itself (its storage set ``transient``); a bare
    ``OSError`` (or one in ``__cause__``) is judged by its errno.

    >>> transient(read_error(OSError(errno.EIO, 'I/O'), 'x', 0)), transient(ValueError())
    (True, False)
    """
    for e in (exc, exc.__cause__):
        if e is None:
            continue
        flag = getattr(e, 'transient', None)
        if flag is not None:
            return bool(flag)
        if isinstance(e, OSError) and e.errno in TRANSIENT_ERRNOS:
            return True
    return False


# ---------------------------------------------------------------------------
# Choosing a storage


# Reader options that are settings of a URL's storage (loadr.remote's local cache):
# loadr.open and YAML reader sections take them beside the reader's own.
CACHE_KEYS = ('cache_dir', 'cache_bytes', 'cache_policy')


def with_cache_settings(storage_options: dict | None, cache: dict) -> dict:
    """``storage_options`` with the :data:`CACHE_KEYS` in ``cache`` put under ``'loadr'``.

    ``None`` stands for the options in force (the command line's
    ``--storage-option``, see :func:`using_storage_options`): the cache
    settings are added to them, never put in their place.

    >>> with_cache_settings({'anon': True}, {'cache_bytes': 10})
    {'anon': True, 'loadr': {'cache_bytes': 10}}
    >>> with using_storage_options({'anon': True, 'loadr': {'retries': 1}}):
    ...     with_cache_settings(None, {'cache_bytes': 10})
    {'anon': True, 'loadr': {'retries': 1, 'cache_bytes': 10}}
    """
    if storage_options is None:
        storage_options = _OPTIONS.get()
    options = dict(storage_options or {})
    options['loadr'] = {**(options.get('loadr') or {}), **cache}
    return options


def is_url(path) -> bool:
    """True for ``scheme://…`` (other than ``file://``): a path no local storage can open.

    >>> is_url('s3://bucket/x'), is_url('data/train'), is_url('C:/data')
    (True, False, False)
    """
    text = os.fspath(path) if not isinstance(path, str) else path
    scheme, sep, _ = text.partition('://')
    return bool(sep) and scheme.isidentifier() and scheme != 'file' and len(scheme) > 1


# The storage_options of URLs opened without their own (detection, check, the CLI's
# --storage-option): set by ``with using_storage_options(...)``.
_OPTIONS = contextvars.ContextVar('loadr_storage_options', default=None)
# (fork generation, {key: storage}): the URL storages of one open (loadr.remote).
_SCOPE = contextvars.ContextVar('loadr_storage_scope', default=None)


def merged_options(outer: dict | None, own: dict | None) -> dict | None:
    """``own`` storage options over ``outer`` ones, key by key; dict values (the
    ``'loadr'`` settings, ``client_kwargs``, ...) merged one level down.

    >>> merged_options({'endpoint_url': 'http://h', 'loadr': {'retries': 1}},
    ...                {'loadr': {'cache_bytes': 10}})
    {'endpoint_url': 'http://h', 'loadr': {'retries': 1, 'cache_bytes': 10}}
    """
    if not outer:
        return own
    if own is None:
        return outer
    out = dict(outer)
    for key, value in own.items():
        below = out.get(key)
        out[key] = {**below, **value} if isinstance(value, dict) and isinstance(below, dict) \
            else value
    return out


@contextlib.contextmanager
def using_storage_options(storage_options: dict | None):
    """Within the block, URLs get these storage options, under their own.

    A URL opened with ``storage_options`` of its own (a YAML reader's, a
    ``loadr.open`` argument) gets both, its own winning key by key
    (:func:`merged_options`): the command line's ``--storage-option`` is
    never dropped. ``None`` keeps those of an enclosing block. The
    block is also one open: the storages of its URLs are shared inside it
    (detection and the reader ask the server once) and learn afresh outside
    it (a dataset replaced at its URL is seen anew by the next open).

    >>> with using_storage_options({'anon': True}):
    ...     with using_storage_options(None):
    ...         _OPTIONS.get()
    {'anon': True}
    """
    token = _OPTIONS.set(merged_options(_OPTIONS.get(), storage_options))
    scope = _SCOPE.set(_SCOPE.get() or (_generation, {}))
    try:
        yield
    finally:
        _SCOPE.reset(scope)
        _OPTIONS.reset(token)


def storage_for(path, storage_options: dict | None = None) -> Storage:
    """The storage that reads and writes ``path``: local files, or an fsspec URL.

    URLs (``s3://``, ``https://``, …) go to :class:`loadr.remote.RemoteStorage`
    (fsspec is imported then, not before).

    >>> type(storage_for('../shared/fixtures/bag')).__name__
    'LocalStorage'
    """
    if is_url(path):
        from .remote import remote_storage
        return remote_storage(os.fspath(path), merged_options(_OPTIONS.get(), storage_options))
    if storage_options:
        raise ConfigError(f'storage_options ({", ".join(map(str, storage_options))}) apply to '
                          f'URLs only; this is a local path', os.fspath(path))
    return LocalStorage()


# ---------------------------------------------------------------------------
# The interface


class Storage:
    """What every storage backend implements; see the module docstring."""

    def size(self, path: str, index: int | None = None) -> int:  # pragma: no cover
        raise NotImplementedError

    def read(self, path: str, offset: int, length: int,
             index: int | None = None) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def read_many(self, ranges: Iterable[tuple]) -> list[bytes]:
        """``[read(*r) for r in ranges]`` of ``(path, offset, length, index)``.

        A remote storage runs them concurrently.
        """
        return [self.read(*r) for r in ranges]

    def read_all(self, path: str, index: int | None = None,
                 max_bytes: int | None = None) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def list(self, path: str) -> list:  # pragma: no cover
        raise NotImplementedError

    def exists(self, path: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    def isdir(self, path: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    def isfile(self, path: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    def occupied(self, path: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    def open_write(self, path: str) -> StagedFile:  # pragma: no cover
        raise NotImplementedError

    def stage_dir(self, path: str, parents: bool = False) -> StagedDir:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------
# Local files


def _identity(st: os.stat_result) -> tuple[int, int]:
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
        self._generation = _generation
        # path -> (device, inode) as first seen by whoever made us; pickled
        self._seen: dict[str, tuple[int, int, int]] = {}
        self._opened: list[str] = []          # paths with a descriptor here, in open order
        self._recheck_at = time.monotonic() + RECHECK_INTERVAL_S
        self._cursor = 0

    def __getstate__(self):
        return {'seen': dict(self._seen)}

    def __setstate__(self, state):
        self.__init__()
        self._seen = dict(state.get('seen', {}))

    # -- descriptors ------------------------------------------------------------------

    def fd(self, path: str, index: int | None = None) -> int:
        """The cached descriptor of ``path``; ReadError (naming ``index``) if it cannot open."""
        if self._generation != _generation:
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
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}
        self._opened = []
        self._generation = _generation

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
                # Python loop, which cost as much as a 4 KiB pread (issue 15).
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
        if self._generation == _generation:
            for fd in self._fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
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


class WriteFile:
    """A local file being written: ``write`` appends (buffered), ``pwrite`` writes at an offset.

    Example::

        f = WriteFile('part.bin', exclusive=True)
        f.write(b'abc')
        f.close()
    """

    def __init__(self, path: str, exclusive: bool = False, fd: int | None = None):
        self.path = path
        flags = os.O_WRONLY | _O_CLOEXEC | (os.O_CREAT | os.O_EXCL if exclusive else 0)
        try:
            fd = os.open(path, flags, 0o666) if fd is None else fd
        except OSError as exc:
            raise WriterError(f'cannot create: {exc.strerror or exc}', path) from exc
        self._file = open(fd, 'wb', closefd=True)
        self.closed = False

    def write(self, data) -> None:
        self._file.write(data)

    def pwrite(self, data, offset: int) -> None:
        """Write ``data`` at ``offset`` (the buffer is flushed first)."""
        self._file.flush()
        view = memoryview(data).cast('B')
        fd, written = self._file.fileno(), 0
        while written < len(view):
            written += os.pwrite(fd, view[written:], offset + written)

    def sync(self) -> None:
        """Flush and fsync: the bytes are on disk."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._file.close()

    def commit(self, overwrite: bool = False) -> None:
        """The bytes are final: close (a file written in place has nothing to rename)."""
        self.close()

    def abort(self) -> None:
        self.discard()

    def discard(self) -> None:
        """Close and remove the file (we created it)."""
        try:
            self.close()
        except OSError:
            pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StagedFile(WriteFile):
    """A file written under ``.<name>.loadr-tmp-…`` beside ``path``, renamed there on commit.

    What killed writers left is removed first (:mod:`loadr.readers.staging`).
    ``abort()`` (also on an exception inside ``with``) removes the temporary file.
    """

    def __init__(self, path: str):
        from .readers import staging      # here: loadr.readers imports this module
        staging.reclaim(path)
        try:
            tmp = staging.make(path)
        except OSError as exc:
            raise WriterError(f'cannot create a temporary file beside it: '
                              f'{exc.strerror or exc}', path) from exc
        self.target = path
        super().__init__(tmp)
        self.committed = False

    def commit(self, overwrite: bool = True) -> None:
        """fsync, close and rename into place; with ``overwrite=False`` an existing file is kept."""
        try:
            self.sync()
            self.close()
            if not overwrite and os.path.lexists(self.target):
                raise WriterError('the file appeared while it was being written', self.target)
            os.replace(self.path, self.target)
        except BaseException:
            self.abort()
            raise
        self.committed = True

    def abort(self) -> None:
        """Stop and remove the temporary file; the target is left untouched."""
        if not self.committed:
            self.discard()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None or not self.committed:
            self.abort()


class StagedDir:
    """A directory built under ``.<name>.loadr-tmp-…`` beside ``path``, renamed there on commit.

    ``commit()`` refuses a target that appeared, non-empty, meanwhile;
    ``abort()`` removes the temporary directory (ours: we made it).

    Example::

        d = StagedDir('out')
        with d.open_write('a.bin') as f:
            f.write(b'x')
        d.commit()
    """

    def __init__(self, path: str, parents: bool = False):
        from .readers import staging      # here: loadr.readers imports this module
        self.target = path
        if parents:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        staging.reclaim(path)
        try:
            self.path = staging.make(path, directory=True)
        except OSError as exc:
            raise WriterError(f'cannot create a temporary directory beside it: '
                              f'{exc.strerror or exc}', path) from exc
        self.done = False

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def open_write(self, name: str) -> WriteFile:
        """A new file ``name`` (relative) inside the staged directory."""
        return WriteFile(self.join(name), exclusive=True)

    def write_file(self, name: str, data: bytes, sync: bool = False) -> None:
        """The whole of a small file ``name`` inside the staged directory."""
        with self.open_write(name) as f:
            f.write(data)
            if sync:
                f.sync()

    def mkdir(self, name: str) -> str:
        path = self.join(name)
        os.mkdir(path)
        return path

    def commit(self, sync: bool = False) -> None:
        """Rename into place (an empty directory at the target is replaced)."""
        try:
            target = self.target
            if os.path.lexists(target):
                if not os.path.isdir(target) or os.path.islink(target) or os.listdir(target):
                    raise WriterError('the target appeared, non-empty, while writing', target)
                os.rmdir(target)
            os.rename(self.path, target)
        except BaseException:
            self.abort()
            raise
        self.done = True
        if sync:
            _fsync_dir(os.path.dirname(os.path.abspath(self.target)))

    def abort(self) -> None:
        if not self.done:
            shutil.rmtree(self.path, ignore_errors=True)
            self.done = True


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
