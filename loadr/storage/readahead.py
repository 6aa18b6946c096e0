"""Read-ahead of a remote storage: the plan (ranges merged into requests) and the buffer.

:meth:`ReadingAhead.prefetch` starts the reads of records that will be
needed soon (a worker's next batches; the order is known) and returns at
once; their bytes wait in a small per-process buffer (``readahead_bytes``)
that the next read of a range inside them consumes (:meth:`ReadingAhead.take`).
:func:`merge` is the one plan of requests, used by reads and read-ahead alike:
ranges of a file within ``merge_gap_bytes`` of each other go in one request.

A file of at most ``small_file_bytes`` (a bag's refs, a small value bag) is
read whole the first time a range of it is read ahead, and kept for the
process (``small_files_bytes`` in all): its later ranges cost no request. A
bag of many shards read shuffled otherwise asks every shard's small files
again for every batch, a round trip each that the read-ahead rarely hides.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from ..errors import LoadrError, ReadError
from . import netstats
from .caching import CacheHookup
from .errors import for_record
from .settings import StorageSettings

__all__ = ['Span', 'Buffer', 'Part', 'merge', 'index_of', 'finished', 'kept_spans',
           'kept_small', 'resolved', 'ReadingAhead']

# Overlapping spans looked at, latest start first, to find one holding a range.
_LOOK_BACK = 16
# The uses of a span a child kept from its parent: never worn out by reads.
_KEPT_USES = 1 << 40


class Span:
    """Bytes ``[start, end)`` of one file, being fetched or fetched; ``uses`` reads expected."""

    __slots__ = ('path', 'start', 'end', 'future', 'uses')

    def __init__(self, path: str, start: int, end: int, future, uses: int):
        self.path, self.start, self.end, self.future, self.uses = path, start, end, future, uses


class Buffer:
    """Spans read ahead, by file, found by the range a read asks for.

    Each range asked ahead *claims* the span that will serve it (by its exact
    ``(path, offset, length)``), and its read gives the claim back to that
    same span: spans overlap (a batch's merged span can cover records of
    another batch), so finding "a" span at read time would wear out the
    wrong one. A span goes when its last claim is given back, or, oldest
    first, when the buffer holds more than ``max_bytes``.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.by_path: dict[str, tuple[list[int], list[Span]]] = {}    # starts, spans
        self.age: collections.OrderedDict[int, Span] = collections.OrderedDict()
        self.claims: dict[tuple, list] = {}         # (path, offset, length) -> [span, count]
        self.bytes = 0
        # While set, a span whose reads are done stays (until the buffer is full): a
        # process that reads for the children it is about to fork (ReadingAhead.hold).
        self.keep = False
        self.held: list[Span] = []      # the spans added while keeping (ReadingAhead.release)
        self.lock = threading.Lock()
        netstats.set_ahead_budget(max_bytes)      # bounds the tasks a worker holds

    def find(self, path: str, offset: int, length: int) -> Span | None:
        found = self.by_path.get(path)
        if not found:
            return None
        starts, spans = found
        # The span that starts last before ``offset`` may end before the range
        # does while an earlier, longer one holds it: look back a few.
        k = bisect.bisect_right(starts, offset) - 1
        end = offset + length
        for j in range(k, max(-1, k - _LOOK_BACK), -1):
            if spans[j].end >= end:
                return spans[j]
        return None

    def live(self, span: Span) -> bool:
        # By identity: a dropped span's id() may be a newer span's.
        return self.age.get(id(span)) is span

    def claim(self, path: str, offset: int, length: int, span: Span | None = None) -> bool:
        """Claim the span that holds the range (``span``, or one found); False if none."""
        key = (path, offset, length)
        held = self.claims.get(key)
        if held is not None and self.live(held[0]):
            held[1] += 1
            held[0].uses += 1
            return True
        span = span or self.find(path, offset, length)
        if span is None:
            return False
        self.claims[key] = [span, 1]
        span.uses += 1
        return True

    def take(self, path: str, offset: int, length: int) -> Span | None:
        """The span to read the range from, its claim given back (any holder, unclaimed)."""
        key = (path, offset, length)
        held = self.claims.get(key)
        if held is None or not self.live(held[0]):
            self.claims.pop(key, None)
            return self.find(path, offset, length)
        span = held[0]
        held[1] -= 1
        if held[1] <= 0:
            del self.claims[key]
        span.uses -= 1
        if span.uses <= 0 and not self.keep:
            self.drop(span)
        return span

    def add(self, span: Span) -> None:
        starts, spans = self.by_path.setdefault(span.path, ([], []))
        k = bisect.bisect_right(starts, span.start)
        starts.insert(k, span.start)
        spans.insert(k, span)
        self.age[id(span)] = span
        if self.keep:
            self.held.append(span)
        self.bytes += span.end - span.start
        while self.bytes > self.max_bytes and len(self.age) > 1:
            self.drop(next(iter(self.age.values())))
        netstats.ahead(self.bytes)
        if len(self.claims) > 4 * len(self.age) + 1024:     # claims of dropped spans
            self.claims = {k: v for k, v in self.claims.items() if self.live(v[0])}

    def drop(self, span: Span) -> None:
        if self.age.pop(id(span), None) is None:
            return
        starts, spans = self.by_path[span.path]
        k = spans.index(span)
        del starts[k], spans[k]
        self.bytes -= span.end - span.start
        netstats.ahead(self.bytes)

    def clear(self) -> None:
        for span in self.age.values():
            span.future.cancel()
        self.by_path, self.age, self.bytes = {}, collections.OrderedDict(), 0
        self.claims = {}
        netstats.ahead(0)


def merge(ranges: list[tuple[str, int, int]], gap: int, max_bytes: int
           ) -> list[tuple[str, int, int, list[int]]]:
    """Ranges grouped into requests: ``(path, start, end, [positions in ranges])``.

    >>> merge([('a', 0, 10), ('a', 12, 5), ('b', 0, 4), ('a', 100, 1)], 4, 1 << 20)
    [('a', 0, 17, [0, 1]), ('a', 100, 101, [3]), ('b', 0, 4, [2])]
    """
    order = sorted(range(len(ranges)), key=lambda k: (ranges[k][0], ranges[k][1]))
    out: list[list] = []
    for k in order:
        path, offset, length = ranges[k][0], ranges[k][1], ranges[k][2]
        end = offset + length
        if out:
            last = out[-1]
            if last[0] == path and offset <= last[2] + gap and max(last[2], end) - last[1] \
                    <= max_bytes:
                last[2] = max(last[2], end)
                last[3].append(k)
                continue
        out.append([path, offset, end, [k]])
    return [tuple(r) for r in out]


class Part:
    """The ``k``-th result of a future that fetched several spans in one request:
    the future's surface that :class:`Buffer` and :meth:`ReadingAhead.take` use."""

    __slots__ = ('future', 'k')

    def __init__(self, future, k: int):
        self.future, self.k = future, k

    def result(self, timeout: float | None = None) -> bytes:
        data = self.future.result(timeout)[self.k]
        if isinstance(data, BaseException):     # this span failed (alone), not the others
            raise data
        return data

    def cancel(self) -> bool:
        return self.future.cancel()


def finished(future) -> bytes | None:
    """The bytes a read (a future, or a :class:`Part` of one) fetched, or None while it is
    under way, or where it failed; read without the future's lock, which a thread of a
    parent process may have held when this child forked (waiting on it hangs forever)."""
    k = None
    if isinstance(future, Part):
        future, k = future.future, future.k
    if getattr(future, '_state', None) != 'FINISHED' or \
            getattr(future, '_exception', True) is not None:
        return None
    data = getattr(future, '_result', None)
    if k is not None:
        data = data[k] if isinstance(data, list) and k < len(data) else None
    return bytes(data) if isinstance(data, (bytearray, memoryview)) else \
        data if isinstance(data, bytes) else None


def kept_spans(buffer: Buffer | None) -> list[Span]:
    """The spans of ``buffer`` (a parent's, at a fork) that were fetched, as spans of
    this process, oldest first; those under way or failed are left out.

    The loader reads a worker's first records before it forks (see
    :meth:`ReadingAhead.settle`): the child's first batch then waits on no round trip.
    """
    if buffer is None:
        return []
    out = []
    # Not under the buffer's lock: as for the future's, a parent's thread may have held it.
    for span in list(buffer.age.values()):
        data = finished(span.future)
        if data is None or len(data) != span.end - span.start:
            continue
        # Its reads in this child are not known (the parent's claims are the parent's): a
        # first read must not drop a span that holds other records a later task reads.
        # It stays until the buffer needs the room (oldest first).
        out.append(Span(span.path, span.start, span.end, resolved(data), _KEPT_USES))
    return out


def kept_small(small: dict | None) -> dict:
    """The whole small files of ``small`` (path -> future; a parent's, at a fork) that
    were read, as futures of this process; reads under way or failed are left out."""
    kept = {}
    for path, future in (small or {}).items():
        data = finished(future) if future is not None else None
        if data is not None:
            kept[path] = resolved(data)
    return kept


def resolved(data) -> concurrent.futures.Future:
    """A future that holds ``data`` already: what a finished read gives, made in this
    process (a parent's futures are not waited on; see :func:`finished`)."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(data)
    return future


def index_of(r: Sequence) -> int | None:
    """The index of a ``(path, offset, length[, index])`` range, or None."""
    return r[3] if len(r) > 3 else None


# What the read-ahead asks of its storage's transport (see :class:`ReadingAhead`).
Fetch = Callable[[str, int, int, 'int | None'], Coroutine[Any, Any, bytes]]
FetchGroup = Callable[[list, list, Callable[[int], 'int | None']], Coroutine[Any, Any, list]]


class ReadingAhead:
    """The read-ahead part of a :class:`~loadr.storage.remote.RemoteStorage`, one per
    process: what it starts (:meth:`prefetch`) and what a read takes from it
    (:meth:`take`), a buffer of spans and the small files read whole.

    What it needs of the storage is passed in, each a callable:
    ``fetch(path, start, end, index)`` (a coroutine: one range, retried),
    ``groups(requests)`` and ``fetch_group(requests, ks, index_of)`` (the
    requests that go out together, and a coroutine that fetches one such
    group), ``size(path)`` and ``loop()`` (the IO thread's event loop); and
    the storage's ``cache`` (ranges there are not fetched). ``parent``: the
    read-ahead of the process this one was forked from, whose finished
    spans and small files it keeps.
    """

    def __init__(self, settings: StorageSettings, *, fetch: Fetch,
                 groups: Callable[[list], list[list[int]]], fetch_group: FetchGroup,
                 size: Callable[[str], int], loop: Callable[[], asyncio.AbstractEventLoop],
                 cache: CacheHookup, parent: ReadingAhead | None = None):
        self.settings = settings
        self.fetch, self.groups, self.fetch_group = fetch, groups, fetch_group
        self.size, self.loop, self.cache = size, loop, cache
        # A forked child keeps the spans its parent had fetched ahead (the loader reads
        # the first batches' records before it forks) and its small files.
        self.buffer = Buffer(settings.readahead_bytes)
        for span in kept_spans(parent.buffer if parent is not None else None):
            self.buffer.add(span)
        # path -> future of the whole (small) file; None: its whole read failed (ranges).
        # A forked child keeps the ones its parent had read (bytes, no request in flight:
        # the loader warms before it forks, so that its workers need not each warm).
        self.small: dict[str, Any] = kept_small(parent.small if parent is not None else None)
        self.small_bytes = sum(len(f.result()) for f in self.small.values())

    def take(self, path: str, offset: int, length: int, index: int | None) -> bytes | None:
        """The range from the read-ahead buffer; None when it is not there, or when the
        request that carried it failed along with other ranges (asked alone then)."""
        claim = self.claim(path, offset, length)
        return None if claim is None else self.taken(claim, path, offset, length, index)

    def claim(self, path: str, offset: int, length: int) -> tuple[bool, Any] | None:
        """What read ahead will serve the range (a whole small file's read, or a span,
        claimed), without waiting for it; None when nothing read ahead holds it.

        A reader of several ranges claims them all first and asks for the others
        before it waits (:meth:`~loadr.storage.remote.RemoteStorage.read_many`): a
        range read ahead then costs no round trip of its own before the rest go out.
        """
        buffer = self.buffer
        with buffer.lock:
            whole = self.small.get(path) if self.small else None
            if whole is not None:
                return True, whole
            span = buffer.take(path, offset, length)
        return None if span is None else (False, span)

    def taken(self, claim: tuple[bool, Any], path: str, offset: int, length: int,
              index: int | None) -> bytes | None:
        """The bytes of a range :meth:`claim` claimed, waited for (see :meth:`take`)."""
        small, span = claim
        if small:
            return self.take_small(path, span, offset, length)
        timeout_s = self.settings.timeout_s
        try:
            if span.future.future.done() if isinstance(span.future, Part) else \
                    span.future.done():
                data = span.future.result(0)
            else:
                t0 = time.perf_counter()
                data = span.future.result(timeout_s + 5)
                netstats.waited(time.perf_counter() - t0)
        except concurrent.futures.CancelledError:
            return None
        except concurrent.futures.TimeoutError:
            # Its own deadline should have ended it: the IO thread is stuck.
            raise ReadError(f'cannot read: the read ahead did not finish within timeout_s='
                            f'{timeout_s:g}', path, index) from None
        except LoadrError as exc:
            if (span.start, span.end) != (offset, offset + length) and not getattr(
                    exc, 'deadline_spent', False):
                # A merged span: the failure may be a neighbour's. This range is
                # asked alone before the record is declared unreadable.
                return None
            # Its own request, tried alone after its retries: the error, for this record.
            raise for_record(exc, path, index) from None
        return data[offset - span.start:offset - span.start + length]

    def take_small(self, path: str, whole: Any, offset: int, length: int) -> bytes | None:
        """The range from the whole small file ``whole`` (a future) read ahead; None
        when that read failed (the range is then asked alone, and reports the error)."""
        t0 = None if whole.done() else time.perf_counter()
        try:
            data = whole.result(self.settings.timeout_s + 5)
        except Exception:
            with self.buffer.lock:
                if self.small.get(path) is whole:
                    # Read as ranges from now on: one bad record of it then fails alone,
                    # and only once, as in a file read range by range.
                    self.small[path] = None
            return None
        if t0 is not None:
            netstats.waited(time.perf_counter() - t0)
        if offset + length > len(data):
            return None
        return data[offset:offset + length]

    def keep_whole(self, path: str, offset: int, data: bytes, size: int | None) -> None:
        """Keep a small file that a read fetched whole (``size``: the file's) as a small
        file read ahead is kept (``small_file_bytes``): the open reads a small bag's
        header so (its last bytes are all of it), and the warm-up and the workers then
        ask for it again."""
        small = self.settings.small_file_bytes
        if offset or not small or len(data) > small or self.settings.cache_dir \
                or size != len(data):
            return
        with self.buffer.lock:
            if path in self.small or self.small_bytes + len(data) > \
                    self.settings.small_files_bytes:
                return
            self.small[path] = resolved(data)
            self.small_bytes += len(data)

    def read_small(self, fresh: list, sizes: dict, loop: asyncio.AbstractEventLoop) -> list:
        """Start the whole-file reads of the small files among ``fresh``'s (once per
        process); the ranges left to read as ranges."""
        small = self.settings.small_file_bytes
        if not small or self.settings.cache_dir:
            # Under a local cache, reads look there range by range (and verify what
            # they find): a whole file in memory would hide its entries.
            return fresh
        budget = self.settings.small_files_bytes
        out = []
        with self.buffer.lock:
            for r in fresh:
                path = r[0]
                if path in self.small:
                    if self.small[path] is None:        # its whole read failed: ranges
                        out.append(r)
                    continue
                size = sizes[path]
                if 0 < size <= small and self.small_bytes + size <= budget:
                    self.small[path] = asyncio.run_coroutine_threadsafe(
                        self.fetch(path, 0, size, index_of(r)), loop)
                    self.small_bytes += size
                    continue
                out.append(r)
        return out

    def hold(self) -> None:
        """Until :meth:`release`, keep what is read ahead once it has been read too (up
        to ``readahead_bytes``): for the children this process is about to fork, which
        keep it (:func:`kept_spans`; a child's buffer is its own, not holding). The
        loader's warm-up before the fork reads the first batches' records so, while its
        own spec probe reads one of them."""
        self.buffer.keep = True

    def release(self) -> None:
        """Drop what :meth:`hold` kept, once the children it was kept for are forked (they
        have their own copy): this process does not read it."""
        buffer = self.buffer
        with buffer.lock:
            buffer.keep = False
            for span in buffer.held:
                buffer.drop(span)
            buffer.held = []

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait until the reads ahead under way (spans and small files) have ended, at most
        ``timeout_s`` (default the ``timeout_s`` setting); whether they all did.

        A process about to fork calls it: a forked child keeps what its parent
        fetched ahead (:func:`kept_spans`), never what was still on its way.
        """
        with self.buffer.lock:
            futures = [s.future.future if isinstance(s.future, Part) else s.future
                       for s in self.buffer.age.values()]
            futures += [f for f in (self.small or {}).values() if f is not None]
        if not futures:
            return True
        timeout = self.settings.timeout_s + 5 if timeout_s is None else timeout_s
        _, left = concurrent.futures.wait(futures, timeout)
        return not left

    def clear(self) -> None:
        """Drop everything read ahead (the storage is closed)."""
        with self.buffer.lock:
            self.buffer.clear()
            self.small, self.small_bytes = {}, 0

    def prefetch(self, ranges: Iterable[Sequence], cache_root: str | None = None) -> None:
        """Start reading ``(path, offset, length[, index])`` ranges now; returns at once.

        The next read of a range inside one of them takes its bytes from here.
        Ranges already buffered, or in the local cache of the dataset at
        ``cache_root``, are not fetched again; ranges past the end of their
        file are left for the read to report.
        """
        buffer = self.buffer
        fresh = []
        cache = None
        if cache_root is not None and self.settings.cache_dir:
            cache = self.cache.cache_of(cache_root)
        else:
            cache = self.cache.current()
        ranges = list(ranges)
        # Each file's name in the cache, its version asked first where not known.
        keys = {path: self.cache.key(path) for path in {r[0] for r in ranges}} \
            if cache is not None else {}
        with buffer.lock:
            small = self.small
            for r in ranges:
                if small.get(r[0]) is not None:
                    continue
                key = keys.get(r[0])
                if not buffer.claim(r[0], r[1], r[2]) and (
                        key is None or not cache.has(key, r[1], r[2])):
                    fresh.append(tuple(r))
        sizes = {}
        for path in {r[0] for r in fresh}:
            try:
                sizes[path] = self.size(path)       # known already, but for a first read
            except LoadrError:
                sizes[path] = -1                    # left for the read to report
        fresh = [r for r in fresh if r[2] > 0 and r[1] >= 0 and r[1] + r[2] <= sizes[r[0]]]
        if not fresh:
            return
        loop = self.loop()
        fresh = self.read_small(fresh, sizes, loop)
        if not fresh:
            return
        requests = merge(fresh, self.settings.merge_gap_bytes, self.settings.max_request_bytes)
        with buffer.lock:
            for ks in self.groups(requests):
                future: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(
                    self.fetch_group(requests, ks, lambda k: index_of(fresh[requests[k][3][0]])),
                    loop)
                for j, k in enumerate(ks):
                    path, start, end, members = requests[k]
                    span = Span(path, start, end, Part(future, j), 0)
                    buffer.add(span)
                    for m in members:
                        buffer.claim(fresh[m][0], fresh[m][1], fresh[m][2], span=span)
