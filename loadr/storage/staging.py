"""Where a writer keeps its output until it is complete, and what is left when it is killed.

Every writer writes under a hidden sibling of its target and renames it into
place on success, so an interrupted write never leaves anything that opens
as a dataset. The sibling's name says whose it is::

    .<target name>.loadr-tmp-<host>-<pid>-<random>

A writer killed outright (SIGKILL, out of memory) cannot remove its sibling;
the next writer of the same target does (:func:`reclaim`), once the pid no
longer runs on this host. Siblings of other hosts (a shared filesystem) are
left alone: a pid means nothing across machines.

The storages hand these out: :class:`StagedFile` and :class:`StagedDir` for
local targets (``LocalStorage.open_write`` / ``stage_dir``),
:class:`RemoteStagedFile` and :class:`RemoteStagedDir` for a URL (built in a
local temporary file or directory; ``commit()`` uploads it). One object is
all-or-nothing (a PUT or a multipart upload only becomes visible when
complete); a directory uploads its data files first and the small files that
make it open as a dataset (``spec.json``, ``*.gmeta``, ``*.json``) last, and
a failed upload removes what it had put there (the target was empty: ours),
so nothing is left, or at worst data no reader opens.

Example::

    with storage_for('out.bin').open_write('out.bin') as f:   # .out.bin.loadr-tmp-… until commit
        f.write(b'abc')
        f.commit()
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import tempfile

from ..errors import WriterError
from ..pids import running

__all__ = ['MARK', 'make', 'reclaim', 'WriteFile', 'StagedFile', 'StagedDir',
           'RemoteStagedFile', 'RemoteStagedDir']

MARK = '.loadr-tmp-'
_O_CLOEXEC = getattr(os, 'O_CLOEXEC', 0)
# Names of files that make a directory open as a dataset; uploaded last.
_MARKER_SUFFIXES = ('.json', '.gmeta')


def _host() -> str:
    # Kept to the characters of a file name we can parse back.
    return re.sub(r'[^A-Za-z0-9_.]', '_', socket.gethostname())[:64] or 'host'


def _prefix(path: str) -> tuple[str, str]:
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    return parent, f'.{name}{MARK}'


def make(path, directory: bool = False) -> str:
    """Create a fresh hidden sibling of ``path`` (a file, or a directory) and return its path.

    >>> os.path.basename(make('/tmp/out.ffr')).startswith('.out.ffr.loadr-tmp-')  # doctest: +SKIP
    True
    """
    parent, prefix = _prefix(path)
    while True:
        tmp = os.path.join(parent, f'{prefix}{_host()}-{os.getpid()}-{secrets.token_hex(4)}')
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def reclaim(path) -> list[str]:
    """Remove the hidden siblings of ``path`` left by writers of this host that no longer run.

    Returns what was removed. Anything it cannot parse or remove is left as it is.
    """
    parent, prefix = _prefix(path)
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    here = f'{_host()}-'
    for name in names:
        if not name.startswith(prefix + here):
            continue
        pid = name[len(prefix + here):].split('-', 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or running(int(pid)):
            continue
        full = os.path.join(parent, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
        except OSError:
            continue
        removed.append(full)
    return removed


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

    What killed writers left is removed first (:func:`reclaim`).
    ``abort()`` (also on an exception inside ``with``) removes the temporary file.
    """

    def __init__(self, path: str):
        reclaim(path)
        try:
            tmp = make(path)
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
        self.target = path
        if parents:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        reclaim(path)
        try:
            self.path = make(path, directory=True)
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


# ---------------------------------------------------------------------------
# Staged writes of a URL: built locally, uploaded on commit


def _spool_dir() -> str:
    return tempfile.mkdtemp(prefix='loadr-upload-')


class RemoteStagedFile:
    """One object, written to a local temporary file and uploaded by ``commit()``.

    The same surface as :class:`StagedFile` (``write``,
    ``pwrite``, ``sync``, ``commit``, ``abort``); ``path`` is the local file.
    """

    def __init__(self, storage, url: str):
        self.storage, self.target = storage, url
        self._dir = _spool_dir()
        self.path = os.path.join(self._dir, url.rstrip('/').rpartition('/')[2] or 'object')
        self._file = WriteFile(self.path, exclusive=True)
        self.committed = False
        self.closed = False

    def write(self, data) -> None:
        self._file.write(data)

    def pwrite(self, data, offset: int) -> None:
        self._file.pwrite(data, offset)

    def sync(self) -> None:
        self._file._file.flush()            # local spool: durability is the upload's business

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._file.close()

    def commit(self, overwrite: bool = True) -> None:
        """Upload the object; with ``overwrite=False`` an existing object is kept."""
        try:
            self.close()
            storage = self.storage
            if not overwrite and storage.occupied(self.target):
                raise WriterError('the object appeared while it was being written', self.target)
            storage.forget(self.target)
            storage.upload([(self.path, self.target)])
            storage.forget(self.target)
        except BaseException:
            self.abort()
            raise
        self.committed = True
        shutil.rmtree(self._dir, ignore_errors=True)

    def abort(self) -> None:
        """Drop the local file; nothing was uploaded."""
        try:
            self.close()
        except OSError:
            pass
        shutil.rmtree(self._dir, ignore_errors=True)

    def discard(self) -> None:
        self.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None or not self.committed:
            self.abort()


class RemoteStagedDir(StagedDir):
    """A directory built in a local temporary directory and uploaded by ``commit()``.

    A :class:`StagedDir` (``path``, ``join``, ``open_write``,
    ``write_file``, ``mkdir``) whose ``commit`` uploads and whose ``abort``
    removes the local spool: the writers write local files, as they do for a
    local target.
    """

    def __init__(self, storage, url: str, parents: bool = False):
        self.storage, self.target = storage, url.rstrip('/')
        self.path = _spool_dir()
        self.done = False

    def commit(self, sync: bool = False) -> None:
        """Upload every file (data first, the files that mark a dataset last)."""
        try:
            storage = self.storage
            if storage.occupied(self.target):
                raise WriterError('the target appeared, non-empty, while writing', self.target)
            files = []
            for folder, _, names in os.walk(self.path):
                for name in names:
                    local = os.path.join(folder, name)
                    rel = os.path.relpath(local, self.path).replace(os.sep, '/')
                    files.append((local, f'{self.target}/{rel}'))
            data = [f for f in files if not f[0].endswith(_MARKER_SUFFIXES)]
            markers = sorted(f for f in files if f[0].endswith(_MARKER_SUFFIXES))
            uploaded: list[str] = []
            try:
                storage.upload(data, uploaded)
                storage.upload(markers, uploaded)
            except BaseException:
                # Ours (the target was empty): take them away again, so that nothing is
                # left. Where that fails too, the markers that make a dataset are missing.
                storage.remove(uploaded)
                raise
            storage.forget(self.target)
        except BaseException:
            self.abort()
            raise
        self.abort()
        self.done = True

    def abort(self) -> None:
        """Remove the local directory (ours: we made it)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.done = True
