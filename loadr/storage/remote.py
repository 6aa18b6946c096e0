"""Datasets behind URLs: the fsspec storage (``s3://``, ``gs://``, any protocol).

:func:`loadr.storage.storage_for` hands every ``scheme://`` path to
:func:`loadr.storage.remote_storage`, which makes the class of its protocol
(:func:`storage_class`): :class:`RemoteStorage` here, on any fsspec
filesystem, with :class:`~loadr.storage.http.HTTPStorage` and
:class:`~loadr.storage.s3.S3Storage` overriding what their protocols do
differently. fsspec and the protocol's package (``s3fs``, ``gcsfs``,
``aiohttp``) come with the extras ``s3``, ``gcs``, ``http`` (``pip install
-e '.[s3]'`` in a checkout); they are imported only when a URL is opened,
never on ``import loadr``.

Reading. Every range is read with fsspec's async API on fsspec's IO thread,
so many ranges are in flight at once: :meth:`RemoteStorage.read_many` reads a
batch's records concurrently, merging ranges of a file that lie within
``merge_gap_bytes`` of each other into one range
(:func:`loadr.storage.readahead.merge`). Records that will be needed soon are
read ahead (:mod:`loadr.storage.readahead`). Sizes, listings and kinds (file
or directory) are asked once per process and travel with the storage when a
reader is pickled to a worker: a dataset is not expected to change while it
is read; what was opened is pinned by its version (:mod:`loadr.storage.versions`).

Failures. A transient failure (HTTP 5xx, 429 or 408, a connection reset or
refused, a timeout, a body shorter than its Content-Length, an answer for
other bytes than were asked: its Content-Range, length or total size) is
tried again after an exponential backoff with jitter, at most ``retries``
more times and never past ``timeout_s`` after the read began; then a
:class:`ReadError` names the URL, the record and the attempts. A request
that carried several records (a merged range, a multi-range request, a
read-ahead span) and failed is asked again range by range first: only a
record whose own range fails is unreadable, and its error names it. The
protocol libraries' own retries are turned off where we can (s3fs,
botocore), so ``retries`` is the whole policy. Anything else (no such
object or bucket, access denied, no credentials, a missing package) is a
one-line loadr error naming the URL and the fix, raised without the
library's traceback (:mod:`loadr.storage.errors`). Data that arrives whole
but wrong is not our business here: an FFRecord CRC mismatch is the
reader's ChecksumError, never retried into a silent success.

Writing. :meth:`RemoteStorage.open_write` and :meth:`RemoteStorage.stage_dir`
build the output in a local temporary file or directory, which the writers
use exactly as they use local staging; ``commit()`` uploads it
(:mod:`loadr.storage.staging`). ``http(s)://`` is read-only.

Settings: :mod:`loadr.storage.settings`.
"""

from __future__ import annotations

import asyncio
import builtins
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

from ..errors import FormatError, LoadrError, ReadError
from . import forks, netstats
from .base import Storage
from .caching import CacheHookup
from .errors import KIND_TEXT, for_record, kind, one_line, remote_error, with_details
from .filesystems import filesystem, filesystem_class
from .ranges import check_part
from .readahead import ReadingAhead, index_of, merge
from .settings import StorageSettings, split_url
from .staging import RemoteStagedDir, RemoteStagedFile
from .versions import Versions, info_version

__all__ = ['RemoteStorage']

_timeout = getattr(asyncio, 'timeout', None)


class RemoteStorage(Storage):
    """The storage of URLs of one fsspec protocol; see the module docstring.
    Made by :func:`loadr.storage.remote_storage`, which picks the subclass of
    the protocol (HTTP, S3) where it has one.

    It holds its parts, each with its own typed fields: ``versions`` (what
    was learnt of each file: size and version, :mod:`loadr.storage.versions`),
    ``cache`` (the local cache, :mod:`loadr.storage.caching`) and ``ahead``
    (the read-ahead, :mod:`loadr.storage.readahead`); the storage itself is
    the transport (one request, retried) and the reads that join them. A
    subclass (HTTP, S3) overrides the transport only.

    Picklable: a copy keeps the protocol, the settings and what was learnt
    about the files (sizes, versions, listings), and opens its own filesystem
    on first use in its process.

    Example::

        s = remote_storage('s3://bucket/x', {'endpoint_url': 'http://127.0.0.1:9000'})
        head = s.read('s3://bucket/x/refs.bag', 0, 8)
    """

    remote = True

    def __init__(self, url: str, settings: StorageSettings | dict | None = None):
        self.url = url
        self.protocol, _ = split_url(url)
        self.settings = StorageSettings.of(settings, url)
        self.versions = Versions()
        self.kinds: dict[str, str | None] = {}   # 'file' | 'directory' | None (absent)
        self.listings: dict[str, list[str]] = {}
        self._init_process()
        filesystem_class(self.protocol, url)     # a missing package is told now, at open

    def __getstate__(self) -> dict:
        return {'url': self.url, 'protocol': self.protocol, 'settings': self.settings,
                'kinds': dict(self.kinds), 'listings': dict(self.listings),
                **self.versions.state()}

    def __setstate__(self, state: dict) -> None:
        self.url, self.protocol = state['url'], state['protocol']
        self.settings = state['settings']
        self.kinds, self.listings = state['kinds'], state['listings']
        self.versions = Versions.from_state(state)
        self._init_process()

    def _init_process(self) -> None:
        """The parts of this process: the filesystem, the local cache and the read-ahead
        (a forked child keeps what its parent had read ahead and finished)."""
        self._fs: Any = None
        self._loop: Any = None
        self._generation = forks.generation
        self._semaphore: asyncio.Semaphore | None = None
        self._why: dict[str, str] = {}       # path -> why it is missing, for the message
        self._random = random.Random()
        self.requests = 0            # requests sent by this process (for tests and benchmarks)
        self.bytes_fetched = 0
        self.cache = CacheHookup(self.settings, self.versions, self._ask_version)
        self.ahead = ReadingAhead(
            self.settings, fetch=self._fetch, groups=self._groups,
            fetch_group=self._fetch_group, size=self.size, loop=self._loop_of,
            cache=self.cache, parent=getattr(self, 'ahead', None))

    def _this_process(self) -> None:
        """Start afresh in a forked child (the parent's filesystem, read-ahead and cache
        clock are not ours)."""
        if self._generation != forks.generation:
            self._init_process()

    @property
    def options(self) -> dict:
        """The fsspec filesystem's options (``storage_options`` without ``'loadr'``)."""
        return dict(self.settings.options)

    @property
    def concurrency(self) -> int:
        """Requests in flight at once (``max_concurrency``)."""
        return self.settings.max_concurrency

    # -- the parts, as the Storage interface offers them ---------------------------------

    @property
    def caching(self) -> bool:
        """True when a ``cache_dir`` is set: the loader then calls :meth:`cache_clock`."""
        return self.cache.on

    def cache_clock(self, root: str, order: Any, start: int, count: int) -> None:
        """The reads that follow serve positions ``start .. start + count - 1`` of ``order``
        over the dataset at ``root`` (see :meth:`loadr.storage.caching.CacheHookup.clock`).
        Called by the loader once per batch, where the reads happen (workers, or inline)."""
        self._this_process()
        self.cache.clock(root, order, start, count)

    def cache_flush(self) -> None:
        """Offer the cache the ranges fetched for the last batch (a worker that stops)."""
        if self._generation == forks.generation:
            self.cache.offer()

    def cache_stats(self) -> dict[str, int]:
        """This process's cache counts (hits, misses, bytes_hit, admitted, evicted, ...)."""
        return self.cache.stats()

    def _ask_version(self, path: str) -> None:
        """Ask the server what it says of ``path`` now (its version, for the cache)."""
        self._run(self._retried(lambda: self._stat_once(path), path, None, 'open'))

    def modified(self, path: str) -> float | None:
        """The Last-Modified time of the version of ``path`` the reader opened (seconds since
        the epoch), or None where the server gave none."""
        return self.versions.modified(path)

    def prefetch(self, ranges: Iterable[Sequence], cache_root: str | None = None) -> None:
        """Start reading ``(path, offset, length[, index])`` ranges now; returns at once
        (see :meth:`loadr.storage.readahead.ReadingAhead.prefetch`)."""
        self._this_process()
        self.ahead.prefetch(ranges, cache_root)

    def hold(self) -> None:
        """Keep what is read ahead after it is read, for children about to be forked."""
        self._this_process()
        self.ahead.hold()

    def release(self) -> None:
        """Drop what :meth:`hold` kept, once the children are forked."""
        self._this_process()
        self.ahead.release()

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait for the reads ahead under way (before a fork); whether they all ended."""
        self._this_process()
        return self.ahead.settle(timeout_s)

    def __repr__(self) -> str:
        return f'RemoteStorage({self.protocol}://)'

    # -- the filesystem -----------------------------------------------------------------

    @property
    def fs(self) -> Any:
        """The fsspec filesystem of this process (made on first use, again after a fork)."""
        self._this_process()
        if self._fs is None:
            import fsspec.asyn
            fs = filesystem(self.protocol, self.url, self._fs_options(dict(self.options)))
            self._loop = fsspec.asyn.get_loop()
            self._fs = fs
        return self._fs

    def _fs_options(self, options: dict) -> dict:
        """The options the filesystem is made with (a subclass adds its protocol's)."""
        return options

    def _run(self, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None) -> Any:
        """Run ``coro`` on fsspec's IO thread and wait for it."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop_of())
        return future.result(timeout_s)

    def _loop_of(self) -> asyncio.AbstractEventLoop:
        self.fs                            # noqa: B018 - makes the filesystem (and loop)
        return self._loop

    # -- one request, retried -----------------------------------------------------------

    async def _retried(self, make: Callable[[], Awaitable], url: str, index: int | None,
                       what: str = 'read') -> Any:
        """``await make()`` with the retry policy; the result, or a loadr error."""
        s = self.settings
        deadline = time.monotonic() + s.timeout_s
        attempts = 0
        while True:
            attempts += 1
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError(f'no answer within timeout_s={s.timeout_s:g}')
                if _timeout is None:                        # Python 3.10
                    return await asyncio.wait_for(make(), left)
                async with _timeout(left):                  # no task of its own: cheaper
                    return await make()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, asyncio.TimeoutError) and not str(exc):
                    exc = TimeoutError(f'no answer within timeout_s={s.timeout_s:g}')
                pause = self._random.uniform(0.5, 1.0) * min(
                    s.backoff_max_s, s.backoff_s * 2 ** (attempts - 1))
                transient = kind(exc) == 'transient'
                if not transient or attempts > s.retries or time.monotonic() + pause >= deadline:
                    err = remote_error(exc, url, index, attempts, what)
                    # Ended by the deadline, not by the retries: a request that carried
                    # several records is then not asked again range by range (that
                    # would run past timeout_s, once per range, on a server that stalls).
                    raise with_details(err, deadline_spent=transient and time.monotonic()
                                       + pause >= deadline) from None
                await asyncio.sleep(pause)

    async def _limited(self, coro_fn: Callable[[], Awaitable]) -> Any:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.settings.max_concurrency or 1)
        async with self._semaphore:
            t0 = netstats.started()
            nbytes = 0
            try:
                got = await coro_fn()
                nbytes = len(got) if isinstance(got, (bytes, bytearray, memoryview)) else \
                    sum(len(g) for g in got if isinstance(g, (bytes, bytearray))) \
                    if isinstance(got, list) else 0
                return got
            finally:
                netstats.ended(t0, nbytes)

    async def _fetch(self, path: str, start: int, end: int, index: int | None) -> bytes:
        """Bytes ``[start, end)`` of ``path``, exactly, retried."""
        return await self._limited(lambda: self._retried(
            lambda: self._range_once(path, start, end, index), path, index))

    async def _range_once(self, path: str, start: int, end: int, index: int | None) -> bytes:
        """One attempt at bytes ``[start, end)`` of ``path``, its length checked."""
        self.requests += 1
        data = await self.fs._cat_file(path, start=start, end=end)
        self.bytes_fetched += len(data)
        check_part(None, (start, end, None), len(data), None)
        return data

    async def _ranges_once(self, path: str, spans: list[tuple[int, int]]) -> list | None:
        """One attempt at several ranges of ``path`` in one request (HTTP's multi-range);
        None: ask them one by one (the base class's :meth:`_groups` never asks)."""
        return None

    def _groups(self, requests: list) -> list[list[int]]:
        """Requests (``(path, start, end, members)``, sorted by path) that go out
        together: one each here; HTTP sends up to ``max_ranges`` of a file in one."""
        return [[k] for k in range(len(requests))]

    async def _fetch_group(self, requests: list, ks: list[int],
                           index_of: Callable[[int], int | None]) -> list:
        """The bytes of requests ``ks`` (all of one file), or for each that failed its
        LoadrError; ``index_of(k)``: the record named in request ``k``'s error.

        Over HTTP one multi-range request. What it left out, or all of it when
        it failed after its retries, is asked request by request: one bad
        range fails only its own request, never the others that shared its
        multi-range request.
        """
        path = requests[ks[0]][0]
        spans = [(requests[k][1], requests[k][2]) for k in ks]
        got: list | None = [None] * len(spans)
        if len(ks) > 1:
            try:
                got = await self._limited(lambda: self._retried(
                    lambda: self._ranges_once(path, spans), path, index_of(ks[0])))
            except LoadrError as exc:
                if getattr(exc, 'deadline_spent', False):
                    return [exc] * len(spans)
                got = None
        if got is None:
            got = [None] * len(spans)
        missing = [j for j, data in enumerate(got) if data is None]
        if missing:
            results = await asyncio.gather(*(self._fetch(path, *spans[j], index_of(ks[j]))
                                             for j in missing), return_exceptions=True)
            for j, result in zip(missing, results):
                if isinstance(result, BaseException) and not isinstance(result, LoadrError):
                    raise result
                got[j] = result
        return got

    async def _fetch_all(self, requests: list, index_of: Callable[[int], int | None]) -> list:
        """The bytes of every request (or its LoadrError), the groups of
        :meth:`_groups` concurrently; ``index_of(k)`` as for :meth:`_fetch_group`."""
        groups = self._groups(requests)
        datas = await asyncio.gather(*(self._fetch_group(requests, ks, index_of)
                                       for ks in groups))
        out: list = [None] * len(requests)
        for ks, got in zip(groups, datas):
            for k, data in zip(ks, got):
                out[k] = data
        return out

    # -- reading ------------------------------------------------------------------------

    def size(self, path: str, index: int | None = None) -> int:
        """Bytes in object ``path`` (asked once per process, then remembered)."""
        size = self.versions.size_of(path)
        if size is None:
            kind = self._stat(path, index)
            if kind is None:
                why = self._why.get(path.rstrip('/'))
                raise ReadError(f'cannot open: {KIND_TEXT["missing"]}'
                                + (f' ({why})' if why else ''), path, index)
            if kind == 'directory':
                raise ReadError('cannot open: is a directory, not a file', path, index)
            size = self.versions.size_of(path)
            if size is None:
                info = self._run(self._retried(lambda: self.fs._info(path), path, index, 'open'))
                if info.get('size') is None:
                    raise ReadError('the server does not say the size of this file', path, index)
                self.versions.learn(path, info['size'], *info_version(info))
                size = self.versions.sizes[path]
        return size

    def _check_bounds(self, path: str, offset: int, length: int, index: int | None) -> None:
        if offset < 0 or length < 0:
            raise FormatError(f'negative offset {offset} or length {length}', path, index)
        size = self.size(path, index)
        if offset + length > size:
            raise FormatError(f'file is truncated: wanted {length} bytes at offset {offset}, '
                              f'got {max(0, min(length, size - offset))}', path, index)

    def read(self, path: str, offset: int, length: int, index: int | None = None) -> bytes:
        """Exactly ``length`` bytes at ``offset``: from the read-ahead buffer, or fetched now."""
        self._this_process()
        data = self.ahead.take(path, offset, length, index)
        if data is None:
            data = self.cache.cached(path, offset, length)
            if data is not None:
                return data
            self._check_bounds(path, offset, length, index)
            if length == 0:
                return b''
            t0 = time.perf_counter()
            data = self._run(self._fetch(path, offset, offset + length, index))
            netstats.waited(time.perf_counter() - t0, uncovered=True)
            self.ahead.keep_whole(path, offset, data, self.versions.size_of(path))
        self.cache.fetched_now(path, offset, length, index, data)
        return data

    def read_many(self, ranges: Iterable[Sequence]) -> list[bytes]:
        """The bytes of each ``(path, offset, length[, index])``, fetched concurrently.

        Ranges read ahead are claimed first and the others asked for before any
        wait, so that a range still on its way costs the rest no round trip. A
        merged request that fails is asked again range by range: the error
        raised is that of the first range (in the order given) that fails on
        its own, naming its record.
        """
        self._this_process()
        ranges = [tuple(r) for r in ranges]
        out: list = [None] * len(ranges)
        claims, todo = {}, []
        for k, r in enumerate(ranges):
            claim = self.ahead.claim(r[0], r[1], r[2])
            if claim is not None:
                claims[k] = claim
            elif self._missing(ranges, k, out):
                todo.append(k)
        fetching = self._start_fetch(ranges, todo)
        late = []
        for k, claim in claims.items():
            r = ranges[k]
            out[k] = self.ahead.taken(claim, r[0], r[1], r[2], index_of(r))
            if out[k] is not None:
                self.cache.fetched_now(r[0], r[1], r[2], index_of(r), out[k])
            elif self._missing(ranges, k, out):
                late.append(k)      # its read ahead failed with others': asked alone below
        self._end_fetch(ranges, todo, fetching, out)
        if late:
            self._end_fetch(ranges, late, self._start_fetch(ranges, late), out)
        for k, data in enumerate(out):
            if isinstance(data, LoadrError):
                raise for_record(data, ranges[k][0], index_of(ranges[k])) from None
        return out

    def _missing(self, ranges: list, k: int, out: list) -> bool:
        """Whether range ``k`` must be fetched (not in the local cache; ``out[k]`` set
        when it is); raises when it lies outside its file."""
        r = ranges[k]
        out[k] = self.cache.cached(r[0], r[1], r[2])
        if out[k] is not None:
            return False
        self._check_bounds(r[0], r[1], r[2], index_of(r))
        return True

    def _start_fetch(self, ranges: list, todo: list) -> tuple | None:
        """Start fetching ``ranges[k]`` for each ``k`` of ``todo`` (merged into requests);
        (requests, future), or None for nothing to fetch."""
        if not todo:
            return None
        requests = merge([ranges[k] for k in todo], self.settings.merge_gap_bytes,
                         self.settings.max_request_bytes)
        future = asyncio.run_coroutine_threadsafe(self._fetch_all(
            requests, lambda k: index_of(ranges[todo[requests[k][3][0]]])), self._loop_of())
        return requests, future

    def _end_fetch(self, ranges: list, todo: list, fetching: tuple | None, out: list) -> None:
        """Wait for :meth:`_start_fetch`'s requests and put each range's bytes (or its
        LoadrError) in ``out``; ranges of a failed merged request are asked alone."""
        if fetching is None:
            return
        requests, future = fetching
        t0 = time.perf_counter()
        datas = future.result()
        netstats.waited(time.perf_counter() - t0, uncovered=True)
        alone: dict[tuple, list[int]] = {}      # (path, offset, length) -> positions
        for (_path, start, end, members), data in zip(requests, datas):
            for m in members:
                k = todo[m]
                r = ranges[k]
                if isinstance(data, LoadrError):
                    if (r[1], r[1] + r[2]) == (start, end) or getattr(
                            data, 'deadline_spent', False):
                        out[k] = data               # its own request failed, or timed out
                    else:
                        alone.setdefault(tuple(r[:3]), []).append(k)
                    continue
                out[k] = data[r[1] - start:r[1] - start + r[2]]
                self.ahead.keep_whole(r[0], r[1], out[k], self.versions.size_of(r[0]))
                self.cache.fetched_now(r[0], r[1], r[2], index_of(r), out[k])
        if alone:
            # Merged requests that failed: each of their ranges alone, so that only
            # a range that fails by itself fails its record.
            firsts = [ks[0] for ks in alone.values()]
            got = self._run(self._fetch_each([ranges[k] for k in firsts]))
            for ks, data in zip(alone.values(), got):
                for k in ks:
                    out[k] = data
                    if not isinstance(data, LoadrError):
                        r = ranges[k]
                        self.cache.fetched_now(r[0], r[1], r[2], index_of(r), data)

    async def _fetch_each(self, ranges: list[Sequence]) -> list:
        """The bytes of each ``(path, offset, length[, index])`` alone (or its LoadrError)."""
        results = await asyncio.gather(*(self._fetch(r[0], r[1], r[1] + r[2], index_of(r))
                                         for r in ranges), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, LoadrError):
                raise result
        return results

    def read_all(self, path: str, index: int | None = None,
                 max_bytes: int | None = None) -> bytes:
        """The whole of a small file (at most ``max_bytes + 1`` bytes of it)."""
        size = self.size(path, index)
        want = size if max_bytes is None else min(size, max_bytes + 1)
        return self.read(path, 0, want, index)

    # -- names --------------------------------------------------------------------------

    def _stat(self, path: str, index: int | None = None) -> str | None:
        """'file', 'directory' or None (nothing there); asked once per process."""
        path = path.rstrip('/') or path
        if path in self.kinds:
            return self.kinds[path]
        parent, _, name = path.rpartition('/')
        if name not in self.listings.get(parent, (name,)):
            return None                     # its directory was listed, without it
        kind = self._run(self._retried(lambda: self._stat_once(path), path, index, 'open'))
        self.kinds[path] = kind
        return kind

    async def _stat_once(self, path: str) -> str | None:
        """'file', 'directory' or None, asked of the server once (fsspec's info)."""
        self._invalidate(path)                      # asked afresh: this open's snapshot
        try:
            info = await self.fs._info(path)
        except FileNotFoundError as exc:
            if exc.__cause__ is not None and kind(exc.__cause__) == 'transient':
                raise
            self._why[path] = one_line(exc)
            return None
        if info.get('type') == 'directory':
            return 'directory'
        self.versions.learn(path, info.get('size'), *info_version(info))
        return 'file'

    def list(self, path: str) -> list:
        """The names in directory ``path``, sorted (asked once per process)."""
        path = path.rstrip('/') or path
        names = self.listings.get(path)
        if names is None:
            entries = self._run(self._retried(lambda: self._list_once(path), path, None,
                                              'list'))
            names = sorted(name for name, *_ in entries)
            for name, kind, size, version in entries:
                self.kinds[f'{path}/{name}'] = kind
                if kind == 'file':
                    self.versions.learn(f'{path}/{name}', size, *version)
            self.listings[path] = names
            self.kinds[path] = 'directory'
        return list(names)

    async def _list_once(self, path: str
                         ) -> builtins.list[tuple[str, str, int | None, tuple]]:
        """``(name, kind, size, version)`` of each entry of directory ``path``, asked once."""
        self._invalidate(path)                      # asked afresh: this open's snapshot
        entries = await self.fs._ls(path, detail=True)
        out = []
        for e in entries:
            name = e['name'].rstrip('/').rpartition('/')[2]
            if e['name'].rstrip('/') == _strip_protocol(path).rstrip('/'):
                raise NotADirectoryError(f'not a directory: {path}')
            out.append((name, 'directory' if e.get('type') == 'directory' else 'file',
                        e.get('size') if e.get('type') != 'directory' else None,
                        info_version(e)))
        return out

    def kind(self, path: str) -> str | None:
        """'file', 'directory' or None (nothing there); a :class:`ReadError` with the cause
        when the server cannot say (unreachable, access denied), which :meth:`exists` and
        its kin read as False."""
        try:
            return self._stat(path)
        except ReadError as exc:
            if getattr(exc, 'kind', None) != 'transient':
                raise
            err = ReadError(f'the server cannot be reached ({exc.message})', exc.path, exc.index)
            err.__dict__.update({k: v for k, v in exc.__dict__.items()
                                 if k not in ('message', 'path', 'index')})
            raise err from None

    def exists(self, path: str) -> bool:
        try:
            return self._stat(path) is not None
        except LoadrError:
            return False

    def isdir(self, path: str) -> bool:
        try:
            return self._stat(path) == 'directory'
        except LoadrError:
            return False

    def isfile(self, path: str) -> bool:
        try:
            return self._stat(path) == 'file'
        except LoadrError:
            return False

    def occupied(self, path: str) -> bool:
        """True if anything is at ``path`` or under ``path/`` (asked afresh, never cached)."""
        self.forget(path)
        kind = self._stat(path)
        if kind == 'directory':
            try:
                return bool(self.list(path))
            except LoadrError:
                return True
        return kind is not None

    def forget(self, path: str) -> None:
        """Drop what we remembered about ``path`` and what lies under it (we are writing it)."""
        path = path.rstrip('/')
        self.versions.forget(path)
        for table in (self.kinds, self.listings):
            for key in [k for k in table if k == path or k.startswith(path + '/')]:
                del table[key]
        parent = path.rpartition('/')[0]
        self.listings.pop(parent, None)
        if self._fs is not None and hasattr(self._fs, 'invalidate_cache'):
            self._fs.invalidate_cache(path)

    def _invalidate(self, path: str) -> None:
        """Drop fsspec's cached listings of ``path`` and its parents (s3fs answers from them)."""
        invalidate = getattr(self.fs, 'invalidate_cache', None)   # not every fsspec has one
        if invalidate is not None:
            try:
                invalidate(self._fs_path(path))
            except Exception:           # a cache that cannot be dropped is asked as it is
                pass

    def _fs_path(self, url: str) -> str:
        """``url`` as the filesystem's listing cache names it (without the protocol)."""
        return _strip_protocol(url)

    def close(self) -> None:
        self.ahead.clear()

    # -- writing ------------------------------------------------------------------------

    def _check_writable(self, path: str) -> None:
        """Raise a ConfigError where the protocol cannot be written (HTTP)."""

    def open_write(self, path: str) -> RemoteStagedFile:
        """A new object written locally first; ``commit()`` uploads it in one piece."""
        self._check_writable(path)
        return RemoteStagedFile(self, path)

    def stage_dir(self, path: str, parents: bool = False) -> RemoteStagedDir:
        """A new directory built locally; ``commit()`` uploads it, data first, markers last."""
        self._check_writable(path)
        return RemoteStagedDir(self, path)

    def upload(self, pairs: Sequence[tuple[str, str]],
               done: builtins.list[str] | None = None) -> None:
        """Upload ``(local file, url)`` pairs concurrently, each retried.

        The URLs uploaded are appended to ``done``, also when another failed
        (whose error is raised once all have ended).
        """
        fs = self.fs

        def put(lp: str, u: str) -> Callable[[], Awaitable]:
            return lambda: self._retried(lambda: fs._put_file(lp, u), u, None, 'write')

        async def all_of():
            return await asyncio.gather(*(self._limited(put(lp, u)) for lp, u in pairs),
                                        return_exceptions=True)
        results = self._run(all_of())
        if done is not None:
            done.extend(u for (_, u), r in zip(pairs, results) if not isinstance(r, BaseException))
        for r in results:
            if isinstance(r, BaseException):
                raise r

    def remove(self, urls: Sequence[str]) -> None:
        """Delete objects we uploaded (best effort: a failure here is not raised)."""
        fs = self.fs

        def rm(u: str) -> Callable[[], Awaitable]:
            return lambda: self._retried(lambda: fs._rm_file(u), u, None, 'remove')

        async def all_of():
            await asyncio.gather(*(self._limited(rm(u)) for u in urls), return_exceptions=True)
        try:
            self._run(all_of())
        finally:
            for u in urls:
                self.forget(u)


def _strip_protocol(url: str) -> str:
    return url.partition('://')[2] if '://' in url else url

