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
  crosses a process boundary. Every byte is read through the storage of
  :mod:`loadr.storage` (locally ``os.pread``, so threads and forked children
  never share a file position), which also notices a file replaced after
  the reader was made, in every process.
- ``r.identity()`` is a small JSON-able dict naming what is read (format,
  files relative to the dataset root, sizes, datapoints), cheap to compute.
- Every failure on bad data raises a :mod:`loadr.errors` error that names the
  file and the index.

What else a reader may implement (a batch read of its own, read-ahead, a
cache that learns the order, ``warm()``, its own order, ...) is written down
as protocols in :mod:`loadr.sources`: a reader names those it implements
among its bases (:class:`Reader` itself implements ``BatchSource``,
``Prefetching``, ``Caching`` and ``Identified``), the loader looks them up once
(:func:`loadr.sources.hooks_of`), and ``tests/readers/common.py`` checks each
declaration.

Example::

    r = loadr.open('data/train')
    print(len(r), r.spec)
    first = r[0]
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import Problem, WriterError
from ..sources import BatchSource, Caching, Identified, Locating, Prefetching, one_by_one
from ..storage import LocalStorage as Files
from ..storage import StagedDir, Storage, WriteFile, read_error, storage_for
from ..storage.staging import RemoteStagedFile
from .records import Plan, Source, infer_types

__all__ = ['Reader', 'Writer', 'Files', 'Format', 'Problem', 'check_index', 'read_error',
           'open_each', 'remote', 'select_keys', 'with_settings']

# Above this many files, identity() lists them by a hash of their names and sizes.
IDENTITY_MAX_FILES = 16


def remote(storage) -> bool:
    """True for a storage whose every question is a round trip (a URL's, loadr.storage.remote)."""
    return storage.remote


def open_each(storage, fn: Callable, items: Sequence) -> list:
    """``[fn(item) for item in items]``; concurrently where ``storage`` is remote.

    Opening a dataset of many files asks the server a few things per file:
    one after the other, 1,000 shards behind a 20 ms round trip took minutes.
    In threads, up to the storage's ``max_concurrency`` of them wait at
    once. The failure of the first item in order is raised, as a loop would
    (the items not started yet are dropped).

    >>> open_each(Files(), len, ['ab', 'c'])
    [2, 1]
    """
    if not remote(storage) or len(items) < 2:
        return [fn(item) for item in items]
    import concurrent.futures
    threads = int(getattr(storage, 'concurrency', 1))
    pool = concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(items))),
                                                 thread_name_prefix='loadr-open')
    try:
        futures = [pool.submit(fn, item) for item in items]
        out = [f.result() for f in futures]
    except BaseException:
        # Not waiting for the opens under way (each may wait up to timeout_s): a failure
        # or a Ctrl-C is the caller's at once; those threads end with their request.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return out


def select_keys(dp: dict, mask: dict, whole: str, missing) -> dict:
    """The keys of ``dp`` that ``mask`` asks for, in a format whose values are read whole
    (no parts of a sequence to select): ``True`` keeps a key, ``False`` leaves it out.

    ``whole`` ends the TypeError of any other mask value; ``missing(key)`` makes the error
    (naming the file and index) for a key ``dp`` does not have.

    >>> select_keys({'a': 1, 'b': 2}, {'a': True, 'b': False}, 'read whole', KeyError)
    {'a': 1}
    """
    out = {}
    for key, want in mask.items():
        if want is False:
            continue
        if want is not True:
            raise TypeError(f'mask value for {key!r} must be True or False; {whole}')
        if key not in dp:
            raise missing(key)
        out[key] = dp[key]
    return out


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


class Reader(BatchSource, Prefetching, Caching, Identified, Locating):
    """Base class for loadr's readers; see the module docstring for the contract.

    Subclasses implement ``__len__``, ``_get(i, mask)``, ``available(i)`` and
    ``spec``; this class handles index checking and masks. It implements the
    optional protocols :class:`~loadr.sources.BatchSource` (a loop, marked
    :func:`~loadr.sources.one_by_one`: a subclass with a faster batch read
    overrides it and names the protocol again), :class:`~loadr.sources.Prefetching`,
    :class:`~loadr.sources.Caching` (both active on remote files only),
    :class:`~loadr.sources.Identified` and :class:`~loadr.sources.Locating` (the
    dataset's path; a reader of many files names the one that holds the index).
    """

    #: The dataset's path (or URL, or pattern) and the storage its files are read through,
    #: set by each format's ``__init__``; a reader without files (a test's) has neither.
    path: str
    _files: Storage
    #: What :func:`loadr.open` passes unless told otherwise: a format whose files can say
    #: how they are read (FFRecord: ``decode='auto'``) lets ``loadr.open`` find out.
    open_defaults: dict = {}

    if TYPE_CHECKING:
        # Each format's __init__ takes the path (or URL, pattern, list of files) and options
        # of its own; Reader has none at run time (a reader of no files may take nothing).
        def __init__(self, *args: Any, **options: Any) -> None: ...

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _get(self, index: int, mask: dict | None) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def available(self, index: int) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def spec(self) -> dict:  # pragma: no cover - abstract
        """``{key: type}`` of the datapoints, as the format says (bag types)."""
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

    def where(self, index: int) -> str | None:
        """The file (or URL) that holds datapoint ``index``: here the dataset's path; a
        reader of many files overrides it to name the one (never reads anything)."""
        path = getattr(self, 'path', None)
        return path if isinstance(path, str) else None

    @one_by_one
    def read_batch(self, indices: Iterable[int]) -> list[dict]:
        """Datapoints for ``indices``, in order. Example: ``r.read_batch([4, 0, 9])``."""
        return [self[i] for i in indices]

    @property
    def prefetches(self) -> bool:
        """True when :meth:`prefetch` does something: the reader's files are remote."""
        files = getattr(self, '_files', None)          # a reader without files reads nothing ahead
        return files is not None and files.remote

    def prefetch(self, indices: Iterable[int]) -> None:
        """Start reading the records of ``indices`` now, for reads soon (storage.readahead).

        A hint: it returns at once, and does nothing on local files (or for a
        reader without ``_ranges``). Whatever is wrong with a record is left
        for its read to report. Example: ``r.prefetch([4, 0, 9])``.
        """
        storage = getattr(self, '_files', None)
        if storage is None or not storage.remote:
            return
        try:
            ranges = self._ranges([check_index(i, len(self)) for i in indices])
        except Exception:
            return
        storage.prefetch(ranges, cache_root=self.path)     # the cache's, if it has one

    @property
    def caches(self) -> bool:
        """True when the reader's files are remote with a local cache (``cache_dir``)."""
        files = getattr(self, '_files', None)          # a reader without files has no cache
        return files is not None and files.caching

    def cache_clock(self, order, start: int, count: int) -> None:
        """Tell the cache which positions of ``order`` the reads that follow serve.

        The loader calls it once per batch where a reader :attr:`caches`; the
        cache needs the position to know when each range is read next.
        """
        files = getattr(self, '_files', None)
        if files is not None:
            files.cache_clock(self.path, order, start, count)

    def cache_flush(self) -> None:
        """Offer the cache what was fetched since the last :meth:`cache_clock` (at the end)."""
        files = getattr(self, '_files', None)
        if files is not None:
            files.cache_flush()

    def _ranges(self, indices: list[int]) -> list[tuple]:
        """``(path, offset, length, index)`` of the bytes the datapoints need (for prefetch)."""
        return []

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    # The format's name in the table of loadr.readers; each reader sets it.
    format_name: str = ''

    # -- what generic code (inspect, convert) asks of a format, without naming it ----

    @classmethod
    def probe(cls, path: str, **options) -> Reader:
        """The reader that shows ``path`` best (``loadr inspect``); unknown options are ignored.

        ``options`` are the command line's (``allow_pickle``, ``decode``, …):
        each format takes the ones it knows.
        """
        return cls(path, **known_options(cls, options))

    def details(self) -> dict:
        """What ``loadr inspect`` shows besides datapoints and spec (chunks, shards, …)."""
        return {}

    @classmethod
    def source(cls, path: str, **options) -> Source:
        """``path`` opened for copying into another format: encoded images stay bytes.

        The default reads datapoints as they are, typed by :func:`infer_types`
        over all of them; formats with a spec or undecoded images override it.
        """
        reader = cls(path, **known_options(cls, options))
        return Source(path, reader.format_name, reader, infer_types(reader))

    def _identity_files(self) -> dict[str, int]:  # pragma: no cover - abstract
        """``{path: size in bytes}`` of every file the reader reads, as it saw them when made."""
        raise NotImplementedError

    def _identity_root(self) -> str:
        """The directory :meth:`identity` names files relative to: the dataset's directory,
        or the directory of a single file (a reader of files named by a pattern: theirs)."""
        return self.path if self._files.isdir(self.path) else os.path.dirname(self.path)

    def identity(self) -> dict:
        """What this reader reads, small and JSON-able: format, datapoints, files and sizes.

        Paths are relative to the dataset (a directory, or the directory of a
        single file), so a dataset that moves keeps its identity. Nothing is
        hashed but the list of names (when there are more than
        :data:`IDENTITY_MAX_FILES` files): computing it costs no read.

        >>> import loadr
        >>> loadr.open(FIXTURES / 'ffrecord/single.ffr').identity()
        {'format': 'ffrecord', 'datapoints': 20, 'files': {'single.ffr': 144202}}
        """
        root = self._identity_root()
        files = {os.path.relpath(p, root).replace(os.sep, '/'): int(size)
                 for p, size in sorted(self._identity_files().items())}
        out = {'format': self.format_name, 'datapoints': len(self)}
        if len(files) <= IDENTITY_MAX_FILES:
            out['files'] = files
        else:
            listing = json.dumps(sorted(files.items()), separators=(',', ':')).encode()
            out.update(file_count=len(files), bytes=sum(files.values()),
                       files_sha256=hashlib.sha256(listing).hexdigest())
        return out

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


def known_options(cls, options: dict) -> dict:
    """The entries of ``options`` that ``cls(path, ...)`` accepts by name."""
    import inspect
    names = inspect.signature(cls).parameters
    return {k: v for k, v in options.items() if k in names}


class Writer:
    """The one staged-write lifecycle every writer shares.

    Output goes to a hidden sibling of ``path`` (a directory, or one file:
    ``directory``) that becomes ``path`` only on a clean :meth:`close`; an
    exception inside ``with``, :meth:`abort`, or a failed close removes it,
    and a target that exists (a file, or a non-empty directory) is refused
    before anything is written, unless ``overwrite`` (a single file replaced
    whole on success, as ffrecord's own writer does). Subclasses validate their arguments, call
    :meth:`_stage`, and implement ``append(datapoint) -> int`` (one datapoint,
    a dict, the same shape for every format), :meth:`_finish` (what is
    written last) and, if they hold parts open, :meth:`_release`.

    Example::

        with loadr.writers.BagWriter('out', {'label': 'int'}) as w:
            w.append({'label': 3})
    """

    format_name: str = ''
    directory: bool = True
    overwrite: bool = False
    path: str
    closed: bool
    #: The staged output, opened by :meth:`_stage`: ``_dir`` where the format is a
    #: directory, ``_file`` where it is one file; ``_out`` is the one there is.
    _out: StagedDir | WriteFile | RemoteStagedFile
    _dir: StagedDir
    _file: WriteFile | RemoteStagedFile      # a StagedFile is a WriteFile

    def _stage(self, storage_options: dict | None = None) -> None:
        """Refuse an occupied target, then open the staged output as ``self._out``."""
        storage = storage_for(self.path, storage_options)
        if storage.occupied(self.path) and not (self.overwrite and storage.isfile(self.path)):
            what = ('an existing non-empty directory' if storage.isdir(self.path)
                    else 'an existing file')
            raise WriterError(f'refusing to overwrite {what}', self.path)
        if self.directory:
            self._out = self._dir = storage.stage_dir(self.path, parents=True)
        else:
            self._out = self._file = storage.open_write(self.path)
        self.closed = False

    def append(self, datapoint) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- conversion into this format (loadr convert), asked through the format table -

    @classmethod
    def plan(cls, plan: Plan, dst: str, types: dict, **options) -> None:
        """Fill ``plan.settings`` for ``types`` (``{key: bag type}``) or raise ConfigError.

        The ConfigError says why the data does not fit and what would.
        """
        raise NotImplementedError  # pragma: no cover - abstract

    @classmethod
    def describe_plan(cls, plan: Plan) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def from_plan(cls, plan: Plan, dst: str, **options) -> Writer:  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def datapoint_for(cls, plan: Plan, index: int, dp):
        """The source's datapoint as this writer appends it (the default: as it is)."""
        return dp

    def _finish(self) -> None:  # pragma: no cover - abstract
        """Write what comes last (tables, headers, specs) into the staged output."""
        raise NotImplementedError

    def _release(self) -> None:
        """Close the parts still open, without raising (the output is being dropped)."""

    def close(self) -> None:
        """Finish and put the output in place; on any failure nothing is left. Idempotent."""
        if getattr(self, 'closed', True):
            return
        try:
            self._finish()
            if self.directory:
                self._dir.commit(sync=True)
            else:
                self._file.commit(overwrite=self.overwrite)
        except WriterError:
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise WriterError(f'cannot finish writing: {exc.strerror or exc}; nothing was '
                              f'kept', self.path) from exc
        except BaseException:
            self.abort()
            raise
        self.closed = True

    def abort(self) -> None:
        """Stop and remove everything written; ``path`` is left as it was."""
        if getattr(self, '_out', None) is None:
            return
        try:
            self._release()
        finally:
            self._out.abort()
            self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False

    def __del__(self):
        try:
            if not getattr(self, 'closed', True):
                self.abort()
        except Exception:
            pass


@dataclasses.dataclass(frozen=True)
class Format:
    """One row of the detection table in ``loadr.readers``.

    ``detect(path) -> bool`` must be cheap and must not raise; ``check(path)``
    returns every :class:`Problem` it finds. ``checksums`` says what the
    format itself guards its bytes with (None: nothing, so ``loadr check``
    promises none); ``records(path)`` says where the records of each file lie,
    ``{file: FileRecords or None}``, for the digests of :mod:`loadr.digests`
    (without it, files get whole-file digests only).

    A format that reads URLs takes the settings of the open as a second
    argument of each (``detect(path, storage_options)``, ``check(...)``,
    ``records(...)``); one of one's own may take the path alone: call them
    through :meth:`detects`, :meth:`checks` and :meth:`records_of`, which pass
    the settings only to a function that takes them.
    """

    name: str
    #: Offered any path, pattern or list of files: it says False to what it does not read.
    #: It may take the storage settings as a second argument (``storage_options``).
    detect: Callable[..., bool]
    reader: type[Reader]
    writer: type[Writer]
    check: Callable[..., Sequence[Problem]]
    checksums: str | None = None
    records: Callable[..., dict] | None = None

    def detects(self, path: Any, storage_options: Any = None) -> bool:
        """``detect(path)``, given the storage settings of the open where the format's
        ``detect`` takes them (a format of one's own may take the path alone)."""
        return with_settings(self.detect, path, storage_options)

    def checks(self, path: Any, storage_options: Any = None) -> Sequence[Problem]:
        """``check(path)``, given the storage settings of the open as :meth:`detects` is."""
        return with_settings(self.check, path, storage_options)

    def records_of(self, path: Any, storage_options: Any = None) -> dict | None:
        """``records(path)`` (None for a format without it), given the storage settings of
        the open as :meth:`detects` is."""
        if self.records is None:
            return None
        return with_settings(self.records, path, storage_options)


def with_settings(fn: Callable, path: Any, storage_options: Any) -> Any:
    """``fn(path, storage_options)``, or ``fn(path)`` where ``fn`` takes the path alone (a
    format of one's own written for local files).

    >>> with_settings(len, 'abc', {'anon': True})
    3
    """
    try:
        takes = len(inspect.signature(fn).parameters) > 1
    except (TypeError, ValueError):
        takes = False
    return fn(path, storage_options) if takes else fn(path)
