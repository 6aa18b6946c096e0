"""Datasets behind URLs: the fsspec storage (``s3://``, ``gs://``, ``http(s)://``, any protocol).

:func:`loadr.storage.storage_for` hands every ``scheme://`` path to
:class:`RemoteStorage`, which implements the storage interface of
:mod:`loadr.storage` on an fsspec filesystem. fsspec and the protocol's
package (``s3fs``, ``gcsfs``, ``aiohttp``) come with the extras ``s3``,
``gcs``, ``http`` (``pip install -e '.[s3]'`` in a checkout); this module
imports them only when a URL is opened, never on ``import loadr``.

Reading. Every range is read with fsspec's async API on fsspec's IO thread,
so many ranges are in flight at once: :meth:`RemoteStorage.read_many` reads a
batch's records concurrently, merging ranges of a file that lie within
``merge_gap_bytes`` of each other into one range. Over HTTP the ranges of one
file go in one multi-range request (``max_ranges`` at most): a request costs
the client and the servers far more CPU than its bytes do, and a shuffled
batch otherwise makes one request per record. :meth:`RemoteStorage.prefetch`
starts the reads of records that will be needed soon (a worker's next
batches; the order is known) and returns at once; their bytes wait in a
small per-process buffer (``readahead_bytes``) that the next :meth:`read`
of a range inside them consumes. Sizes, listings and kinds (file or
directory) are asked once per process and travel with the storage when a
reader is pickled to a worker: a dataset is not expected to change while it
is read.

Versions. What a reader learns of each object when it opens it (its size,
and its version: the ETag, else its Last-Modified time) is its snapshot of
the dataset: every range request asks for that version (``If-Match``, or
``If-Unmodified-Since`` where only a time is known; S3's ``IfMatch``, and
the answer's ETag compared), the local cache keys its entries by it, and an
object replaced since the reader was made is a :class:`ReadError` naming the
URL ("changed since the reader was made"), never its new bytes mixed with
the old. Each open learns afresh: storages are shared only within one open
(see :func:`loadr.storage.using_storage_options`), and fsspec's listing cache
is dropped before each question.

Failures. A transient failure (HTTP 5xx, 429 or 408, a connection reset or
refused, a timeout, a body shorter than its Content-Length, an answer for
other bytes than were asked: its Content-Range, length or total size) is
tried again after an exponential backoff with jitter, at most ``retries``
more times and never past ``timeout_s`` after the read began; then a
:class:`ReadError` names the URL, the record and the attempts. A request
that carried several records (a merged range, a multi-range request, a
read-ahead span) and failed is asked again range by range first: only a
record whose own range fails is unreadable, and its error names it. A
server that ignores Range (a 200 with the whole file) is noticed at the
first answer: a file up to ``WHOLE_FILE_MAX_BYTES`` is read whole once and
its ranges cut from it; a larger one is a ReadError at once. The protocol libraries' own
retries are turned off where we can (s3fs, botocore), so ``retries`` is the
whole policy. Anything else (no such object or bucket, access denied, no
credentials, a missing package) is a one-line loadr error naming the URL and
the fix, raised without the library's traceback. Data that arrives whole but
wrong is not our business here: an FFRecord CRC mismatch is the reader's
ChecksumError, never retried into a silent success.

Writing. :meth:`RemoteStorage.open_write` and :meth:`RemoteStorage.stage_dir`
build the output in a local temporary file or directory, which the writers
use exactly as they use local staging; ``commit()`` uploads it. One object is
all-or-nothing (a PUT or a multipart upload only becomes visible when
complete); a directory uploads its data files first and the small files that
make it open as a dataset (``spec.json``, ``*.gmeta``, ``*.json``) last, and a
failed upload removes what it had put there (the target was empty: ours), so
nothing is left, or at worst data no reader opens. ``http(s)://`` is read-only.

Settings: ``storage_options`` go to the fsspec filesystem, except the key
``'loadr'``, a dict of this module's settings (:data:`DEFAULTS`)::

    loadr.open('s3://bucket/train', storage_options={
        'endpoint_url': 'http://127.0.0.1:9000',
        'loadr': {'retries': 3, 'timeout_s': 10}})
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import datetime
import functools
import hashlib
import json
import math
import numbers
import os
import random
import shutil
import tempfile
import threading
import time
from typing import Iterable, Sequence

from .errors import ConfigError, FormatError, LoadrError, ReadError, WriterError
from .storage import StagedDir, Storage

__all__ = ['RemoteStorage', 'remote_storage', 'DEFAULTS', 'EXTRAS', 'split_url']

DEFAULTS = {
    # More attempts after the first, for a transient failure.
    'retries': 5,
    # One read (all its attempts and pauses) gives up this long after it began.
    'timeout_s': 60.0,
    # Backoff before attempt k+1: uniform(0.5, 1) * min(backoff_max_s, backoff_s * 2**k).
    'backoff_s': 0.05,
    'backoff_max_s': 2.0,
    # Requests in flight at once, per process and storage.
    'max_concurrency': 64,
    # Ranges of one file this close are fetched as one request. Small, so that
    # the bytes fetched stay within a percent or two of the bytes needed.
    'merge_gap_bytes': 512,
    # A merged request grows to at most this many bytes.
    'max_request_bytes': 16 << 20,
    # Bytes read ahead and not yet consumed, per process and storage; the
    # oldest are dropped beyond it.
    'readahead_bytes': 64 << 20,
    # HTTP(S): the ranges of one file that a batch needs go in one request
    # (``Range: bytes=a-b,c-d,...``, answered multipart/byteranges), at most
    # this many per request; 0 turns it off. A server that answers a
    # multi-range request with the whole file is asked range by range.
    'max_ranges': 64,
    # A local disk cache of record ranges (loadr.cache), used under a Loader:
    # a directory (one subdirectory per dataset is made in it), the bytes it
    # may hold per dataset (None: loadr.cache.default_budget, a share of the free
    # disk, fixed at open), and what it evicts when full: 'furthest' (the
    # range read again furthest in the future, known from the order) or 'lru'.
    'cache_dir': None,
    'cache_bytes': None,
    'cache_policy': 'furthest',
}
_CACHE_POLICIES = ('furthest', 'lru')

# A server that ignores Range: files up to this size are read whole (and kept, at
# most this many bytes of them per process); a larger one is a ReadError.
WHOLE_FILE_MAX_BYTES = 64 << 20

# The extra that installs each protocol's package.
EXTRAS = {'s3': 's3', 's3a': 's3', 'gs': 'gcs', 'gcs': 'gcs', 'http': 'http', 'https': 'http'}

# Names of files that make a directory open as a dataset; uploaded last.
_MARKER_SUFFIXES = ('.json', '.gmeta')

_generation = 0
_timeout = getattr(asyncio, 'timeout', None)
# The fsspec filesystems of this process, never dropped (see _make_fs).
_filesystems: dict[tuple, object] = {}
_filesystems_lock = threading.Lock()
_kept: list = []
_ENVIRONMENT_PREFIXES = ('AWS_', 'GOOGLE_', 'GCS', 'FSSPEC', 'HTTP_PROXY', 'HTTPS_PROXY',
                         'NO_PROXY', 'http_proxy', 'https_proxy', 'no_proxy')


def _after_fork() -> None:
    # A forked child must not use the parent's filesystem objects (their
    # sessions belong to the parent's IO thread) nor its read-ahead futures.
    global _generation, _filesystems_lock
    _generation += 1
    _filesystems_lock = threading.Lock()    # another thread may have held it at fork


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork)


def split_url(url: str) -> tuple[str, str]:
    """``(protocol, rest)`` of a URL.

    >>> split_url('s3://bucket/train/refs.bag')
    ('s3', 'bucket/train/refs.bag')
    """
    scheme, sep, rest = url.partition('://')
    if not sep:
        raise ConfigError('not a URL (expected scheme://...)', url)
    return scheme.lower(), rest


# What each extra installs (pyproject.toml), for the hint: the packages by name, since
# "loadr" on the package index is another project and loadr may run from a checkout.
_EXTRA_PACKAGES = {'s3': 'fsspec s3fs', 'gcs': 'fsspec gcsfs', 'http': 'fsspec aiohttp'}


def _install_hint(protocol: str) -> str:
    extra = EXTRAS.get(protocol)
    if extra:
        return (f"pip install {_EXTRA_PACKAGES[extra]} (the '{extra}' extra: pip install -e "
                f"'.[{extra}]' in loadr's checkout)")
    return f'install fsspec and the fsspec package for {protocol}:// (see fsspec\'s list)'


# The numeric settings: (whole number?, least, most). Each is checked once, when the
# storage is made: an inf or a nan would otherwise surface much later as an
# OverflowError (int(inf)), no timeout at all (a comparison with nan is False),
# or another error far from its cause.
_NUMBERS = {
    'retries': (True, 0, 1000),
    'timeout_s': (False, 1e-3, 7 * 86400.0),
    'backoff_s': (False, 0, 3600.0),
    'backoff_max_s': (False, 0, 3600.0),
    'max_concurrency': (True, 1, 1 << 16),
    'merge_gap_bytes': (True, 0, 1 << 40),
    'max_request_bytes': (True, 1, 1 << 40),
    'readahead_bytes': (True, 0, 1 << 50),
    'max_ranges': (True, 0, 1 << 16),
}


def _number(key: str, value, url: str) -> int | float:
    """``value`` of numeric setting ``key``, checked (finite, in range); a ConfigError if not."""
    whole, least, most = _NUMBERS[key]
    what = 'a whole number' if whole else 'a number'
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)   # numpy's too
    if ok and not isinstance(value, numbers.Integral):
        ok = math.isfinite(value) and (not whole or float(value).is_integer())
    if not ok or not least <= value <= most:
        raise ConfigError(f"storage_options['loadr'][{key!r}] must be {what} from {least:g} "
                          f'to {most:g}, not {value!r}', url)
    return int(value) if whole else float(value)


def _settings(options: dict, url: str) -> dict:
    given = options.pop('loadr', None) or {}
    if not isinstance(given, dict):
        raise ConfigError(f"storage_options['loadr'] must be a dict of {sorted(DEFAULTS)}", url)
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown storage_options['loadr'] settings {unknown}; known: "
                          f'{sorted(DEFAULTS)}', url)
    settings = dict(DEFAULTS)
    for key, value in given.items():
        if key == 'cache_dir':
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f'cache_dir must be a local directory, not {value!r}', url)
            value = None if value is None else os.fspath(value)
        elif key == 'cache_policy':
            if value not in _CACHE_POLICIES:
                raise ConfigError(f'cache_policy must be one of {list(_CACHE_POLICIES)}, '
                                  f'not {value!r}', url)
        elif key == 'cache_bytes':
            # Named as the user gave it (loadr.open, YAML), not as storage_options['loadr'].
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, (int, float)) or not 0 <= value < float('inf')):
                raise ConfigError(f'cache_bytes must be a number of bytes > 0, not '
                                  f'{value!r}; leave it out for the default (a share of the '
                                  f'free disk)', url)
        elif key in _NUMBERS:
            value = _number(key, value, url)
        settings[key] = value
    if settings['cache_dir']:
        if settings['cache_bytes'] is None:
            from .cache import default_budget       # numpy: not on import loadr.remote
            settings['cache_bytes'] = default_budget(settings['cache_dir'])
        elif not settings['cache_bytes'] >= 1:
            raise ConfigError(f"cache_bytes must be a number of bytes > 0, not "
                              f"{settings['cache_bytes']!r}; leave it out for the default (a "
                              f"share of the free disk)", url)
    return settings


# ---------------------------------------------------------------------------
# Errors


class _ShortBody(Exception):
    """Fewer bytes came than were asked for (a connection cut mid-body)."""


class _WrongRange(Exception):
    """A 206 answer for other bytes than were asked (its range, length or total size).

    Transient: a cache or a proxy between us and the server may have mixed up
    two answers; asked again, the server gives the right bytes or the retries
    end in a ReadError naming the URL and the record.
    """


class _Changed(Exception):
    """The answer came from another version of the object than the reader opened."""


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind an exception of aiohttp, botocore or s3fs, if any."""
    for e in (exc, exc.__cause__, exc.__context__):
        if e is None:
            continue
        status = getattr(e, 'status', None)
        if isinstance(status, int):
            return status
        response = getattr(e, 'response', None)
        if isinstance(response, dict):
            code = response.get('ResponseMetadata', {}).get('HTTPStatusCode')
            if isinstance(code, int):
                return code
    return None


def _names(exc: BaseException) -> set[str]:
    """Class names of the exception, its bases and its causes (no import of the libraries)."""
    names = set()
    seen = 0
    while exc is not None and seen < 4:
        names.update(cls.__name__ for cls in type(exc).__mro__)
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return names


_TRANSIENT_NAMES = {
    '_ShortBody', '_WrongRange', 'TimeoutError', 'ClientPayloadError', 'ServerDisconnectedError',
    'ClientConnectionError', 'ClientOSError', 'ServerTimeoutError', 'ConnectionError',
    'EndpointConnectionError', 'ConnectionClosedError', 'ReadTimeoutError',
    'ConnectTimeoutError', 'IncompleteReadError', 'ResponseStreamingError', 'IncompleteRead',
    'ContentLengthError', 'FSTimeoutError', 'ResponseParserError',
}
_CREDENTIAL_NAMES = {'NoCredentialsError', 'PartialCredentialsError', 'CredentialRetrievalError',
                     'InvalidAccessKeyId', 'SignatureDoesNotMatch', 'ExpiredToken',
                     'DefaultCredentialsError', 'RefreshError'}


def _kind(exc: BaseException) -> str:
    """'transient', 'missing', 'denied', 'credentials', 'changed' or 'other'."""
    names = _names(exc)
    if names & _CREDENTIAL_NAMES:
        return 'credentials'
    status = _status(exc)
    if status == 412 or '_Changed' in names:     # If-Match / If-Unmodified-Since refused
        return 'changed'
    if status is not None:
        if status == 404:
            return 'missing'
        if status in (401, 403):
            return 'denied'
        if status in (408, 429) or status >= 500:
            return 'transient'
        if status >= 400:
            return 'other'
    if isinstance(exc, FileNotFoundError):
        # fsspec's HTTP stat turns any failure, a refused connection too, into this.
        cause = exc.__cause__
        return 'transient' if cause is not None and _kind(cause) == 'transient' else 'missing'
    if isinstance(exc, PermissionError):
        return 'denied'
    if names & _TRANSIENT_NAMES:
        return 'transient'
    return 'other'


_KIND_TEXT = {
    'missing': 'no such object, bucket or directory',
    'denied': 'access denied: check the credentials and their permissions '
              '(AWS_* variables, storage_options)',
    'credentials': 'no valid credentials: set them in the environment (e.g. AWS_ACCESS_KEY_ID '
                   'and AWS_SECRET_ACCESS_KEY), in storage_options, or use '
                   "storage_options={'anon': True} for public data",
    'changed': 'the object changed since the reader was made (the server holds another '
               'version than the one opened); open the dataset again to read the new version',
}


def _one_line(exc: BaseException) -> str:
    text = ' '.join(str(exc).split()) or type(exc).__name__
    return f'{type(exc).__name__}: {text[:200]}'


def _error(exc: BaseException, url: str, index: int | None, attempts: int,
           what: str = 'read') -> LoadrError:
    """The loadr error for a failed operation on ``url`` (its library's exception as text)."""
    if isinstance(exc, LoadrError):
        return exc
    kind = _kind(exc)
    if kind in _KIND_TEXT:
        err = ReadError(f'cannot {what}: {_KIND_TEXT[kind]} ({_one_line(exc)})', url, index)
    else:
        tries = f' after {attempts} attempts' if attempts > 1 else ''
        err = ReadError(f'cannot {what}{tries}: {_one_line(exc)}', url, index)
    err.attempts = attempts
    # Our own retries are spent: the loader's retry policy must not start them again.
    err.transient = False
    err.kind = kind
    return err


# ---------------------------------------------------------------------------
# The read-ahead buffer


# Overlapping spans looked at, latest start first, to find one holding a range.
_LOOK_BACK = 16


class _Span:
    """Bytes ``[start, end)`` of one file, being fetched or fetched; ``uses`` reads expected."""

    __slots__ = ('path', 'start', 'end', 'future', 'uses')

    def __init__(self, path: str, start: int, end: int, future, uses: int):
        self.path, self.start, self.end, self.future, self.uses = path, start, end, future, uses


class _ReadAhead:
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
        self.by_path: dict[str, tuple[list[int], list[_Span]]] = {}    # starts, spans
        self.age: collections.OrderedDict[int, _Span] = collections.OrderedDict()
        self.claims: dict[tuple, list] = {}         # (path, offset, length) -> [span, count]
        self.bytes = 0
        self.lock = threading.Lock()

    def find(self, path: str, offset: int, length: int) -> _Span | None:
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

    def live(self, span: _Span) -> bool:
        # By identity: a dropped span's id() may be a newer span's.
        return self.age.get(id(span)) is span

    def claim(self, path: str, offset: int, length: int, span: _Span | None = None) -> bool:
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

    def take(self, path: str, offset: int, length: int) -> _Span | None:
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
        if span.uses <= 0:
            self.drop(span)
        return span

    def add(self, span: _Span) -> None:
        starts, spans = self.by_path.setdefault(span.path, ([], []))
        k = bisect.bisect_right(starts, span.start)
        starts.insert(k, span.start)
        spans.insert(k, span)
        self.age[id(span)] = span
        self.bytes += span.end - span.start
        while self.bytes > self.max_bytes and len(self.age) > 1:
            self.drop(next(iter(self.age.values())))
        if len(self.claims) > 4 * len(self.age) + 1024:     # claims of dropped spans
            self.claims = {k: v for k, v in self.claims.items() if self.live(v[0])}

    def drop(self, span: _Span) -> None:
        if self.age.pop(id(span), None) is None:
            return
        starts, spans = self.by_path[span.path]
        k = spans.index(span)
        del starts[k], spans[k]
        self.bytes -= span.end - span.start

    def clear(self) -> None:
        for span in self.age.values():
            span.future.cancel()
        self.by_path, self.age, self.bytes = {}, collections.OrderedDict(), 0
        self.claims = {}


def _merge(ranges: list[tuple[str, int, int]], gap: int, max_bytes: int
           ) -> list[tuple[str, int, int, list[int]]]:
    """Ranges grouped into requests: ``(path, start, end, [positions in ranges])``.

    >>> _merge([('a', 0, 10), ('a', 12, 5), ('b', 0, 4), ('a', 100, 1)], 4, 1 << 20)
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


def _boundary(content_type: str) -> bytes:
    """The boundary of a ``multipart/byteranges`` Content-Type."""
    for param in content_type.split(';')[1:]:
        key, _, value = param.strip().partition('=')
        if key.strip().lower() == 'boundary':
            return value.strip().strip('"').encode('latin-1')
    raise _ShortBody(f'multipart answer without a boundary ({content_type!r})')


def _content_range(value: str) -> tuple[int, int, int | None]:
    """``(start, end, size)`` of a ``Content-Range: bytes a-b/size`` header: bytes
    ``[start, end)`` of a file of ``size`` bytes (None for ``*``).

    >>> _content_range('bytes 0-9/100'), _content_range('bytes 5-5/*')
    ((0, 10, 100), (5, 6, None))
    """
    unit, _, rest = value.strip().partition(' ')
    span, _, total = rest.partition('/')
    first, _, last = span.partition('-')
    total = total.strip()
    if (unit.lower() != 'bytes' or not first.strip().isdigit() or not last.strip().isdigit()
            or not (total.isdigit() or total == '*') or int(last) < int(first)):
        raise _WrongRange(f'unreadable Content-Range {value!r}')
    return int(first), int(last) + 1, int(total) if total != '*' else None


def _check_part(asked: tuple[int, int] | None, got: tuple[int, int, int | None], length: int,
                size: int | None) -> None:
    """Raise _WrongRange (or _ShortBody) unless an answer of ``length`` bytes with
    Content-Range ``got`` is bytes ``asked`` (None: any) of a file of ``size`` bytes.

    >>> _check_part((0, 10), (0, 10, 100), 10, 100)
    >>> _check_part((0, 10), (10, 20, 100), 10, 100)
    Traceback (most recent call last):
    loadr.remote._WrongRange: asked for bytes 0-9, the answer holds bytes 10-19
    """
    first, last, total = got
    if asked is not None and (first, last) != tuple(asked):
        raise _WrongRange(f'asked for bytes {asked[0]}-{asked[1] - 1}, the answer holds bytes '
                          f'{first}-{last - 1}')
    if total is not None and size is not None and total != size:
        raise _WrongRange(f'the answer gives the file {total} bytes, not the {size} it had '
                          f'when it was opened')
    if length < last - first:
        raise _ShortBody(f'got {length} of {last - first} bytes at offset {first}')
    if length > last - first:
        raise _WrongRange(f'got {length} bytes for the {last - first} of bytes '
                          f'{first}-{last - 1}')


def _byteranges(body: bytes, boundary: bytes, size: int | None = None
                ) -> list[tuple[int, int, bytes]]:
    r"""The parts of a ``multipart/byteranges`` body: ``(start, end, bytes)``.

    Each part's length comes from its Content-Range, so the boundary is never
    searched for inside the data (where it may well occur). A part of a file
    of another ``size`` (when given) is a _WrongRange.

    >>> body = (b'\r\n--B\r\nContent-Range: bytes 0-2/9\r\n\r\nabc'
    ...         b'\r\n--B\r\nContent-Range: bytes 6-8/9\r\n\r\n--B\r\n--B--\r\n')
    >>> _byteranges(body, b'B')
    [(0, 3, b'abc'), (6, 9, b'--B')]
    >>> _byteranges(body, b'B', size=10)        # doctest: +ELLIPSIS
    Traceback (most recent call last):
    loadr.remote._WrongRange: the answer gives the file 9 bytes, not the 10 it had ...
    """
    delimiter = b'--' + boundary
    parts = []
    at = body.find(delimiter)
    while at >= 0:
        at += len(delimiter)
        if body[at:at + 2] == b'--':
            return parts                        # the closing delimiter
        head_end = body.find(b'\r\n\r\n', at)
        if head_end < 0:
            break
        span = None
        for line in body[at:head_end].decode('latin-1').split('\r\n'):
            name, _, value = line.partition(':')
            if name.strip().lower() == 'content-range':
                span = _content_range(value)
                _check_part(None, span, span[1] - span[0], size)
        if span is None:
            raise _ShortBody('a part of a multipart answer has no Content-Range')
        start = head_end + 4
        stop = start + span[1] - span[0]
        if stop > len(body):
            break
        parts.append((span[0], span[1], body[start:stop]))
        at = body.find(delimiter, stop)
    raise _ShortBody(f'the multipart answer was cut short after {len(parts)} parts')


def _cut(parts: list[tuple[int, int, bytes]], start: int, end: int) -> bytes | None:
    """Bytes ``[start, end)`` out of the part that holds them, if one does."""
    for first, last, data in parts:
        if first <= start and end <= last:
            return data[start - first:end - first]
    return None


class _Part:
    """The ``k``-th result of a future that fetched several spans in one request:
    the future's surface that :class:`_ReadAhead` and ``_take`` use."""

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


# ---------------------------------------------------------------------------
# The storage


class RemoteStorage(Storage):
    """The storage of URLs of one fsspec protocol; see the module docstring.

    Picklable: a copy keeps the protocol, the options and what was learnt
    about the files (sizes, listings), and opens its own filesystem on first
    use in its process.

    Example::

        s = RemoteStorage('s3://bucket/x', {'endpoint_url': 'http://127.0.0.1:9000'})
        head = s.read('s3://bucket/x/refs.bag', 0, 8)
    """

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url
        self.protocol, _ = split_url(url)
        options = dict(storage_options or {})
        self.settings = _settings(options, url)
        self.options = options
        self._sizes: dict[str, int] = {}
        self._kinds: dict[str, str | None] = {}          # 'file' | 'directory' | None (absent)
        self._listings: dict[str, list[str]] = {}
        # path -> (ETag, Last-Modified) as first learnt: the version every read asks for.
        self._versions: dict[str, tuple] = {}
        self._init_process()
        self._filesystem_class()          # a missing package is told now, at open

    def __getstate__(self):
        return {'url': self.url, 'protocol': self.protocol, 'options': self.options,
                'settings': self.settings, 'sizes': dict(self._sizes),
                'kinds': dict(self._kinds), 'listings': dict(self._listings),
                'versions': dict(self._versions)}

    def __setstate__(self, state):
        self.url, self.protocol = state['url'], state['protocol']
        self.options, self.settings = state['options'], state['settings']
        self._sizes, self._kinds = state['sizes'], state['kinds']
        self._listings = state['listings']
        self._versions = state.get('versions', {})
        self._init_process()

    def _init_process(self) -> None:
        self._fs = None
        self._generation = _generation
        self._buffer = _ReadAhead(int(self.settings['readahead_bytes']))
        self._semaphore = None
        self._why: dict[str, str] = {}       # path -> why it is missing, for the message
        self._random = random.Random()
        self.requests = 0            # requests sent by this process (for tests and benchmarks)
        self.bytes_fetched = 0
        self._one_range_hosts: set[str] = set()   # they answer a multi-range request whole
        self._no_range_hosts: set[str] = set()    # they answer any range request whole
        self._wholes: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._whole_bytes = 0
        self._whole_pending: dict[str, asyncio.Future] = {}
        # The local cache (cache_dir): one per dataset, and what the loader said of
        # the reads under way (see cache_clock); ranges fetched since, to offer it.
        self._caches: dict[str, object] = {}
        self._clock = None                  # (cache, NextUse, position after the batch)
        self._fetched: list[tuple] = []

    def __repr__(self) -> str:
        return f'RemoteStorage({self.protocol}://)'

    # -- the filesystem -----------------------------------------------------------------

    def _filesystem_class(self):
        try:
            import fsspec
        except ImportError:
            raise ConfigError(f'reading {self.protocol}:// URLs needs fsspec, which is not '
                              f'installed: {_install_hint(self.protocol)}', self.url) from None
        try:
            return fsspec.get_filesystem_class(self.protocol)
        except ImportError as exc:
            raise ConfigError(f'{self.protocol}:// needs a package that is not installed '
                              f'({_one_line(exc)}): {_install_hint(self.protocol)}',
                              self.url) from None
        except ValueError:
            raise ConfigError(f'unknown protocol {self.protocol}:// (not an fsspec protocol): '
                              f'use a local path or a URL fsspec knows (s3://, gs://, '
                              f'https://, ...)', self.url) from None

    @property
    def fs(self):
        """The fsspec filesystem of this process (made on first use, again after a fork)."""
        if self._generation != _generation:
            self._init_process()
        if self._fs is None:
            with _filesystems_lock:         # the read-ahead thread may ask at once
                if self._fs is None:
                    self._fs = self._make_fs()
        return self._fs

    def _make_fs(self):
        import fsspec.asyn

        cls = self._filesystem_class()
        options = dict(self.options)
        if self.protocol in ('s3', 's3a'):
            # We retry; botocore's own retries would multiply ours (and hide the count).
            config = dict(options.get('config_kwargs') or {})
            config.setdefault('retries', {'max_attempts': 1, 'mode': 'standard'})
            options['config_kwargs'] = config
        elif self.protocol in ('http', 'https'):
            # A body read in one piece, not 64 KiB at a time: 40% less CPU per record
            # (measured: 390 -> 235 us per 60 KB range). Byte ranges of the stored bytes,
            # never of a compressed rendering of them.
            client = dict(options.get('client_kwargs') or {})
            client.setdefault('read_bufsize', 1 << 20)
            options['client_kwargs'] = client
            options.setdefault('headers', {'Accept-Encoding': 'identity'})
        # One filesystem per protocol and options in a process, kept for the
        # process's life: fsspec closes a dropped HTTP filesystem's session from
        # the thread that drops it, and when the IO loop is busy for 0.1 s it
        # closes the connections there, beside the loop, which loses a socket
        # from the loop's epoll set (a read then waits forever: seen as a
        # timeout). Storages are pickled and copied freely; their filesystems are not.
        # The environment is part of what made it (a credentials chain reads it).
        environment = tuple(sorted((k, v) for k, v in os.environ.items()
                                   if k.startswith(_ENVIRONMENT_PREFIXES)))
        try:
            key = (_generation, self.protocol, json.dumps(options, sort_keys=True), environment)
        except (TypeError, ValueError):
            key = None
        fs = _filesystems.get(key) if key is not None else None
        if fs is not None:
            self._loop = fsspec.asyn.get_loop()
            return fs
        try:
            fs = cls(skip_instance_cache=True, **options)
        except Exception as exc:
            raise ConfigError(f'cannot make the {self.protocol}:// filesystem with these '
                              f'storage_options: {_one_line(exc)}', self.url) from None
        if hasattr(fs, 'retries'):
            fs.retries = 1                 # s3fs: one try per call, we retry
        if not getattr(fs, 'async_impl', False):
            # A synchronous filesystem (sftp, memory, ...): its calls run in threads.
            try:
                from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
            except ImportError:
                raise ConfigError(f'{self.protocol}:// is a synchronous fsspec filesystem, '
                                  f'which needs fsspec >= 2024.12: pip install -U fsspec',
                                  self.url) from None
            fs = AsyncFileSystemWrapper(fs, asynchronous=False)
        self._loop = fsspec.asyn.get_loop()
        if key is not None:
            _filesystems[key] = fs
        else:
            _kept.append(fs)
        return fs

    def _run(self, coro, timeout_s: float | None = None):
        """Run ``coro`` on fsspec's IO thread and wait for it."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop_of())
        return future.result(timeout_s)

    def _loop_of(self):
        self.fs                            # noqa: B018 - makes the filesystem (and loop)
        return self._loop

    # -- one request, retried -----------------------------------------------------------

    async def _retried(self, make, url: str, index: int | None, what: str = 'read'):
        """``await make()`` with the retry policy; the result, or a loadr error."""
        s = self.settings
        deadline = time.monotonic() + s['timeout_s']
        attempts = 0
        while True:
            attempts += 1
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError(f'no answer within timeout_s={s["timeout_s"]:g}')
                if _timeout is None:                        # Python 3.10
                    return await asyncio.wait_for(make(), left)
                async with _timeout(left):                  # no task of its own: cheaper
                    return await make()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, asyncio.TimeoutError) and not str(exc):
                    exc = TimeoutError(f'no answer within timeout_s={s["timeout_s"]:g}')
                pause = self._random.uniform(0.5, 1.0) * min(
                    s['backoff_max_s'], s['backoff_s'] * 2 ** (attempts - 1))
                transient = _kind(exc) == 'transient'
                if not transient or attempts > s['retries'] or time.monotonic() + pause >= deadline:
                    err = _error(exc, url, index, attempts, what)
                    # Ended by the deadline, not by the retries: a request that carried
                    # several records is then not asked again range by range (that
                    # would run past timeout_s, once per range, on a server that stalls).
                    err.deadline_spent = transient and time.monotonic() + pause >= deadline
                    raise err from None
                await asyncio.sleep(pause)

    async def _limited(self, coro_fn):
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(int(self.settings['max_concurrency']) or 1)
        async with self._semaphore:
            return await coro_fn()

    async def _fetch(self, path: str, start: int, end: int, index: int | None) -> bytes:
        """Bytes ``[start, end)`` of ``path``, exactly, retried."""
        if self.protocol in ('http', 'https'):
            def once():
                return self._http_range(path, start, end, index)
        elif self.protocol in ('s3', 's3a'):
            def once():
                return self._s3_range(path, start, end)
        else:
            fs = self.fs

            async def once():
                self.requests += 1
                data = await fs._cat_file(path, start=start, end=end)
                self.bytes_fetched += len(data)
                _check_part(None, (start, end, None), len(data), None)
                return data
        return await self._limited(lambda: self._retried(once, path, index))

    def _http_kw(self, path: str, spans: Sequence[tuple[int, int]]) -> dict:
        """The keywords of a GET of byte ranges ``spans`` (``[start, end)`` each) of the
        version of ``path`` the reader opened (:meth:`_conditions`); counted."""
        kw = dict(self.fs.kwargs)
        headers = dict(kw.pop('headers', None) or {})
        headers['Range'] = 'bytes=' + ','.join(f'{a}-{b - 1}' for a, b in spans)
        headers.update(self._conditions(path))
        kw['headers'] = headers
        self.requests += 1
        return kw

    async def _http_range(self, path: str, start: int, end: int, index: int | None) -> bytes:
        """One attempt at bytes ``[start, end)`` over HTTP, the answer checked: a 206 for
        exactly those bytes of a file of the size we know (else a _WrongRange, retried)."""
        whole = await self._whole_kept(path, index)
        if whole is not None:
            return whole[start:end]
        fs = self.fs
        session = await fs.set_session()
        async with session.get(fs.encode_url(path), **self._http_kw(path, [(start, end)])) as r:
            if r.status == 200:
                return (await self._whole_answer(r, path, index))[start:end]
            if r.status >= 400:
                fs._raise_not_found_for_status(r, path)
            if r.status != 206:
                raise _WrongRange(f'HTTP {r.status} {r.reason} to a range request')
            got = _content_range(r.headers.get('Content-Range', ''))
            body = await r.read()
        self.bytes_fetched += len(body)
        _check_part((start, end), got, len(body), self._sizes.get(path))
        return body

    async def _s3_range(self, path: str, start: int, end: int) -> bytes:
        """One attempt at bytes ``[start, end)`` of an S3 object, its ContentRange checked."""
        fs = self.fs
        bucket, key, version = fs.split_path(path)
        self.requests += 1
        answer = await fs._call_s3('get_object', Bucket=bucket, Key=key,
                                   Range=f'bytes={start}-{end - 1}',
                                   **({'VersionId': version} if version else {}),
                                   **self._s3_conditions(path))
        try:
            self._check_version(path, answer.get('ETag'))
            body = await answer['Body'].read()
        finally:
            answer['Body'].close()
        self.bytes_fetched += len(body)
        content_range = answer.get('ContentRange')
        got = _content_range(content_range) if content_range else (start, start + len(body),
                                                                    None)
        _check_part((start, end), got, len(body), self._sizes.get(path))
        return body

    # A server that ignores Range (python's http.server, some CDNs) answers 200 with
    # the whole file. Files up to WHOLE_FILE_MAX_BYTES are then read whole once and
    # kept (at most that many bytes in all, per process): their ranges are cut from
    # them. A larger file is a ReadError at once, not a whole download per retry.

    async def _whole_kept(self, path: str, index: int | None) -> bytes | None:
        """The file kept whole (or being read whole) from a server that ignores Range."""
        if _host(path) not in self._no_range_hosts:
            return None
        whole = self._wholes.get(path)
        if whole is None and path in self._whole_pending:
            whole = await asyncio.shield(self._whole_pending[path])
        if whole is not None:
            self._wholes.move_to_end(path, last=True)
            return whole
        size = self._sizes.get(path)
        if size is not None and size > WHOLE_FILE_MAX_BYTES:
            raise self._no_ranges(path, index, size)
        return None

    async def _whole_answer(self, r, path: str, index: int | None) -> bytes:
        """The whole file of a 200 answer to a range request, kept; a ReadError if too big."""
        self._no_range_hosts.add(_host(path))
        self._one_range_hosts.add(_host(path))
        size = r.content_length if r.content_length is not None else self._sizes.get(path)
        if size is None or size > WHOLE_FILE_MAX_BYTES:
            r.close()                       # not read: the error is what it would end in
            raise self._no_ranges(path, index, size)
        kept = self._wholes.get(path)
        if kept is not None:                # another read has read it whole meanwhile
            r.close()
            return kept
        pending = self._whole_pending.get(path)
        if pending is not None:             # another read is reading it whole: wait for it
            r.close()
            return await asyncio.shield(pending)
        pending = self._whole_pending[path] = asyncio.get_running_loop().create_future()
        try:
            body = await r.read()
            self.bytes_fetched += len(body)
            known = self._sizes.get(path)
            if len(body) != size:
                raise _ShortBody(f'got {len(body)} of the {size} bytes of the whole file')
            if known is not None and size != known:
                raise _WrongRange(f'the answer gives the file {size} bytes, not the {known} '
                                  f'it had when it was opened')
        except BaseException as exc:
            # The waiters try again (a transient error), also when this read was
            # cancelled (its deadline): they must not be cancelled with it.
            pending.set_exception(exc if isinstance(exc, Exception) else
                                  _ShortBody('the read of the whole file was cut short'))
            pending.exception()             # retrieved: nobody may be waiting
            raise
        finally:
            del self._whole_pending[path]
        pending.set_result(body)
        self._wholes[path] = body
        self._whole_bytes += len(body)
        while self._whole_bytes > WHOLE_FILE_MAX_BYTES and len(self._wholes) > 1:
            self._whole_bytes -= len(self._wholes.popitem(last=False)[1])
        return body

    def _no_ranges(self, path: str, index: int | None, size: int | None) -> ReadError:
        what = f'a file of {size} bytes' if size is not None else 'a file of unknown size'
        err = ReadError(f'the server ignored the Range request; loadr needs byte ranges (it '
                        f'answered with the whole file, and {what} is more than loadr reads '
                        f'whole: {WHOLE_FILE_MAX_BYTES >> 20} MiB)', path, index)
        err.transient, err.attempts, err.kind = False, 1, 'other'
        return err

    def _groups(self, requests: list) -> list[list[int]]:
        """Requests (``(path, start, end, members)``, sorted by path) that go out
        together: over HTTP up to ``max_ranges`` of one file, else one each."""
        most = int(self.settings['max_ranges'])
        if self.protocol not in ('http', 'https') or most < 2:
            return [[k] for k in range(len(requests))]
        limit = int(self.settings['max_request_bytes'])
        groups: list[list[int]] = []
        size = 0
        for k, (path, start, end, _) in enumerate(requests):
            last = groups[-1] if groups else None
            if (last is not None and requests[last[0]][0] == path and len(last) < most
                    and size + end - start <= limit
                    and _host(path) not in self._one_range_hosts):
                last.append(k)
                size += end - start
            else:
                groups.append([k])
                size = end - start
        return groups

    async def _fetch_group(self, requests: list, ks: list[int], index_of) -> list:
        """The bytes of requests ``ks`` (all of one file), or for each that failed its
        LoadrError; ``index_of(k)``: the record named in request ``k``'s error.

        Over HTTP one multi-range request. What it left out, or all of it when
        it failed after its retries, is asked request by request: one bad
        range fails only its own request, never the others that shared its
        multi-range request.
        """
        path = requests[ks[0]][0]
        spans = [(requests[k][1], requests[k][2]) for k in ks]
        got: list = [None] * len(spans)
        if len(ks) > 1:
            try:
                got = await self._limited(lambda: self._retried(
                    lambda: self._http_ranges(path, spans), path, index_of(ks[0])))
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

    async def _http_ranges(self, path: str, spans: list[tuple[int, int]]) -> list | None:
        """One attempt at byte ranges ``spans`` of ``path`` in one multi-range request:
        each one's bytes, or None where the answer left it out; None for a server
        that answers it with the whole file (remembered: asked range by range)."""
        fs = self.fs
        session = await fs.set_session()
        async with session.get(fs.encode_url(path), **self._http_kw(path, spans)) as r:
            if r.status == 200:
                r.close()               # the whole file is coming: not read
                self._one_range_hosts.add(_host(path))
                return None
            if r.status >= 400:
                fs._raise_not_found_for_status(r, path)
            if r.status != 206:
                raise _WrongRange(f'HTTP {r.status} {r.reason} to a range request')
            content_type = r.headers.get('Content-Type', '')
            content_range = r.headers.get('Content-Range', '')
            body = await r.read()
        self.bytes_fetched += len(body)
        size = self._sizes.get(path)
        if content_type.lower().startswith('multipart/byteranges'):
            parts = _byteranges(body, _boundary(content_type), size)
        else:                           # the server made one range of them
            got = _content_range(content_range)
            _check_part(None, got, len(body), size)
            parts = [(got[0], got[1], body)]
        return [_cut(parts, a, b) for a, b in spans]

    async def _fetch_all(self, requests: list, index_of) -> list:
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

    # -- versions -----------------------------------------------------------------------

    def _learn(self, path: str, size=None, etag=None, modified=None) -> None:
        """Remember what the server said of object ``path`` (the first answer wins: the
        reader's snapshot)."""
        if size is not None:
            self._sizes.setdefault(path, int(size))
        etag = str(etag) if etag else None
        if hasattr(modified, 'astimezone'):             # s3fs: a datetime, in local time
            modified = modified.astimezone(datetime.timezone.utc).strftime(
                '%a, %d %b %Y %H:%M:%S GMT')
        modified = str(modified) if modified else None
        if etag or modified:
            self._versions.setdefault(path, (etag, modified))

    def _conditions(self, path: str) -> dict:
        """The HTTP headers that ask for the version of ``path`` the reader opened.

        A strong ETag goes in ``If-Match``; without one (nginx's JSON listing
        gives a time, not an ETag; a weak ETag never matches) the time goes in
        ``If-Unmodified-Since``. The server answers 412 for another version.
        """
        etag, modified = self._versions.get(path) or (None, None)
        if etag and not etag.startswith('W/'):
            return {'If-Match': etag}
        if modified:
            return {'If-Unmodified-Since': modified}
        return {}

    def _s3_conditions(self, path: str) -> dict:
        """The ``get_object`` keywords that ask for the version of ``path`` the reader
        opened (S3 answers 412 PreconditionFailed for another)."""
        etag = (self._versions.get(path) or (None,))[0]
        return {'IfMatch': etag} if etag and not etag.startswith('W/') else {}

    def _check_version(self, path: str, etag: str | None) -> None:
        """An answer's ETag against the one opened (for a store that ignores IfMatch)."""
        opened = (self._versions.get(path) or (None,))[0]
        if etag and opened and etag != opened:
            raise _Changed(f'ETag {etag}, opened as {opened}')

    def _cache_path(self, path: str) -> str:
        """The name the local cache knows ``path`` by: with its size and version, so that
        an object replaced at the same URL never meets the old one's entries."""
        etag, modified = self._versions.get(path) or (None, None)
        return f'{path}\n{self._sizes.get(path)}\n{etag}\n{modified}'

    # -- the local cache ----------------------------------------------------------------

    @property
    def caching(self) -> bool:
        """True when a ``cache_dir`` is set: the loader then calls :meth:`cache_clock`."""
        return bool(self.settings['cache_dir'])

    def cache_clock(self, root: str, order, start: int, count: int) -> None:
        """Say that the reads that follow are those of positions ``start ..
        start + count - 1`` of ``order`` over the dataset at ``root``.

        Ranges fetched since the last call are offered to the cache first, as
        of that call's batch (their next use is after it). Called by the loader
        once per batch, where the reads happen (workers, or inline).
        """
        if self._generation != _generation:
            self._init_process()
        if not self.settings['cache_dir']:
            return
        self._offer()
        from .cache import NextUse                  # numpy: not on import loadr.remote
        cache = self._cache_of(root)
        old = self._clock
        next_use = old[1] if old is not None and old[1].order is order else NextUse(order)
        self._clock = (cache, next_use, start + count)

    def cache_flush(self) -> None:
        """Offer the cache the ranges fetched for the last batch (a worker that stops)."""
        if self._generation == _generation and self._clock is not None:
            self._offer()

    def _cache_of(self, root: str):
        """The cache of the dataset at ``root``: a subdirectory of ``cache_dir``."""
        cache = self._caches.get(root)
        if cache is None:
            from .cache import RangeCache
            name = hashlib.sha1(root.encode()).hexdigest()[:16]
            cache = self._caches[root] = RangeCache(
                os.path.join(self.settings['cache_dir'], name),
                int(self.settings['cache_bytes'] or 0), self.settings['cache_policy'])
        return cache

    def _offer(self) -> None:
        clock, fetched = self._clock, self._fetched
        if clock is None or not fetched:
            return
        self._fetched = []
        cache, next_use, now = clock
        cache.offer(fetched, functools.partial(next_use, now=now))

    def _cached(self, path: str, offset: int, length: int) -> bytes | None:
        clock = self._clock
        if clock is None or length == 0 or path not in self._sizes:
            return None                 # a file not yet opened: its version is not known
        return clock[0].get(self._cache_path(path), offset, length)

    def _fetched_now(self, path: str, offset: int, length: int, index: int | None,
                     data: bytes) -> None:
        """Remember a range fetched from the server, for the cache's next offer."""
        if self._clock is not None and index is not None and length and path in self._sizes:
            self._fetched.append((self._cache_path(path), offset, length, index, data))

    def cache_stats(self) -> dict:
        """This process's cache counts (hits, misses, bytes_hit, admitted, evicted, ...)."""
        out: dict = {}
        for cache in self._caches.values():
            for key, value in cache.stats().items():
                out[key] = out.get(key, 0) + value
        return out

    # -- reading ------------------------------------------------------------------------

    def size(self, path: str, index: int | None = None) -> int:
        """Bytes in object ``path`` (asked once per process, then remembered)."""
        size = self._sizes.get(path)
        if size is None:
            kind = self._stat(path, index)
            if kind is None:
                why = self._why.get(path.rstrip('/'))
                raise ReadError(f'cannot open: {_KIND_TEXT["missing"]}'
                                + (f' ({why})' if why else ''), path, index)
            if kind == 'directory':
                raise ReadError('cannot open: is a directory, not a file', path, index)
            size = self._sizes.get(path)
            if size is None:
                info = self._run(self._retried(lambda: self.fs._info(path), path, index, 'open'))
                if info.get('size') is None:
                    raise ReadError('the server does not say the size of this file', path, index)
                self._learn(path, info['size'], *_info_version(info))
                size = self._sizes[path]
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
        if self._generation != _generation:
            self._init_process()
        data = self._take(path, offset, length, index)
        if data is None:
            data = self._cached(path, offset, length)
            if data is not None:
                return data
            self._check_bounds(path, offset, length, index)
            if length == 0:
                return b''
            data = self._run(self._fetch(path, offset, offset + length, index))
        self._fetched_now(path, offset, length, index, data)
        return data

    def _take(self, path: str, offset: int, length: int, index: int | None) -> bytes | None:
        """The range from the read-ahead buffer; None when it is not there, or when the
        request that carried it failed along with other ranges (asked alone then)."""
        buffer = self._buffer
        with buffer.lock:
            span = buffer.take(path, offset, length)
            if span is None:
                return None
        try:
            data = span.future.result(self.settings['timeout_s'] + 5)
        except concurrent.futures.CancelledError:
            return None
        except concurrent.futures.TimeoutError:
            # Its own deadline should have ended it: the IO thread is stuck.
            raise ReadError(f'cannot read: the read ahead did not finish within timeout_s='
                            f'{self.settings["timeout_s"]:g}', path, index) from None
        except LoadrError as exc:
            if (span.start, span.end) != (offset, offset + length) and not getattr(
                    exc, 'deadline_spent', False):
                # A merged span: the failure may be a neighbour's. This range is
                # asked alone before the record is declared unreadable.
                return None
            # Its own request, tried alone after its retries: the error, for this record.
            raise _for_record(exc, path, index) from None
        return data[offset - span.start:offset - span.start + length]

    def read_many(self, ranges: Iterable[Sequence]) -> list[bytes]:
        """The bytes of each ``(path, offset, length[, index])``, fetched concurrently.

        A merged request that fails is asked again range by range: the error
        raised is that of the first range (in the order given) that fails on
        its own, naming its record.
        """
        if self._generation != _generation:
            self._init_process()
        ranges = [tuple(r) for r in ranges]
        out: list = [None] * len(ranges)
        todo = []
        for k, r in enumerate(ranges):
            index = r[3] if len(r) > 3 else None
            out[k] = self._take(r[0], r[1], r[2], index)
            if out[k] is not None:
                self._fetched_now(r[0], r[1], r[2], index, out[k])
                continue
            out[k] = self._cached(r[0], r[1], r[2])
            if out[k] is None:
                self._check_bounds(r[0], r[1], r[2], index)
                todo.append(k)
        if todo:
            requests = _merge([ranges[k] for k in todo], int(self.settings['merge_gap_bytes']),
                              int(self.settings['max_request_bytes']))
            datas = self._run(self._fetch_all(
                requests, lambda k: _index_of(ranges[todo[requests[k][3][0]]])))
            alone: dict[tuple, list[int]] = {}      # (path, offset, length) -> positions
            for (path, start, end, members), data in zip(requests, datas):
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
                    self._fetched_now(r[0], r[1], r[2], _index_of(r), out[k])
            if alone:
                # Merged requests that failed: each of their ranges alone, so that only
                # a range that fails by itself fails its record.
                firsts = [ks[0] for ks in alone.values()]
                got = self._run(self._fetch_each([ranges[k] for k in firsts]))
                for ks, data in zip(alone.values(), got):
                    for k in ks:
                        out[k] = data
                        if not isinstance(data, LoadrError):
                            self._fetched_now(*ranges[k][:3], _index_of(ranges[k]), data)
            for k, data in enumerate(out):
                if isinstance(data, LoadrError):
                    raise _for_record(data, ranges[k][0], _index_of(ranges[k])) from None
        return out

    async def _fetch_each(self, ranges: list[Sequence]) -> list:
        """The bytes of each ``(path, offset, length[, index])`` alone (or its LoadrError)."""
        results = await asyncio.gather(*(self._fetch(r[0], r[1], r[1] + r[2], _index_of(r))
                                         for r in ranges), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, LoadrError):
                raise result
        return results

    def prefetch(self, ranges: Iterable[Sequence], cache_root: str | None = None) -> None:
        """Start reading ``(path, offset, length[, index])`` ranges now; returns at once.

        The next :meth:`read` (or :meth:`read_many`) of a range inside one of
        them takes its bytes from here. Ranges already buffered, or in the
        local cache of the dataset at ``cache_root``, are not fetched again;
        ranges past the end of their file are left for the read to report.
        """
        if self._generation != _generation:
            self._init_process()
        buffer = self._buffer
        fresh = []
        cache = None
        if cache_root is not None and self.settings['cache_dir']:
            cache = self._cache_of(cache_root)
        elif self._clock is not None:
            cache = self._clock[0]
        with buffer.lock:
            for r in ranges:
                if not buffer.claim(r[0], r[1], r[2]) and (
                        cache is None or r[0] not in self._sizes
                        or not cache.has(self._cache_path(r[0]), r[1], r[2])):
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
        loop = self._loop_of()
        requests = _merge(fresh, int(self.settings['merge_gap_bytes']),
                          int(self.settings['max_request_bytes']))
        with buffer.lock:
            for ks in self._groups(requests):
                future = asyncio.run_coroutine_threadsafe(self._fetch_group(
                    requests, ks, lambda k: _index_of(fresh[requests[k][3][0]])), loop)
                for j, k in enumerate(ks):
                    path, start, end, members = requests[k]
                    span = _Span(path, start, end, _Part(future, j), 0)
                    buffer.add(span)
                    for m in members:
                        buffer.claim(*fresh[m][:3], span=span)

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
        if path in self._kinds:
            return self._kinds[path]
        parent, _, name = path.rpartition('/')
        if name not in self._listings.get(parent, (name,)):
            return None                     # its directory was listed, without it
        stat = self._http_stat if self.protocol in ('http', 'https') else self._fs_stat
        kind = self._run(self._retried(lambda: stat(path), path, index, 'open'))
        self._kinds[path] = kind
        return kind

    async def _fs_stat(self, path: str) -> str | None:
        _invalidate(self.fs, path, self.protocol)   # asked afresh: this open's snapshot
        try:
            info = await self.fs._info(path)
        except FileNotFoundError as exc:
            if exc.__cause__ is not None and _kind(exc.__cause__) == 'transient':
                raise
            self._why[path] = _one_line(exc)
            return None
        if info.get('type') == 'directory':
            return 'directory'
        self._learn(path, info.get('size'), *_info_version(info))
        return 'file'

    async def _http_stat(self, url: str) -> str | None:
        """A HEAD that does not follow redirects: nginx answers a directory with a 301 to url/."""
        session = await self.fs.set_session()
        async with session.head(url, allow_redirects=False) as r:
            if r.status in (405, 501):              # a server without HEAD
                return await self._fs_stat(url)
            if r.status == 404:
                self._why[url] = f'HTTP {r.status} {r.reason}'
                return None
            location = r.headers.get('Location', '')
            if r.status in (301, 302, 307, 308) and location.rstrip('/').endswith(
                    url.rpartition('/')[2]) and location.endswith('/'):
                return 'directory'
            if r.status >= 400:
                r.raise_for_status()
            if r.status == 200:
                self._learn(url, r.headers.get('Content-Length'), r.headers.get('ETag'),
                            r.headers.get('Last-Modified'))
            return 'file'

    def list(self, path: str) -> list:
        """The names in directory ``path``, sorted (asked once per process)."""
        path = path.rstrip('/') or path
        names = self._listings.get(path)
        if names is None:
            if self.protocol in ('http', 'https'):
                entries = self._run(self._retried(lambda: self._http_list(path), path, None,
                                                  'list'))
            else:
                entries = self._run(self._retried(lambda: self._fs_list(path), path, None,
                                                  'list'))
            names = sorted(name for name, *_ in entries)
            for name, kind, size, version in entries:
                self._kinds[f'{path}/{name}'] = kind
                if kind == 'file':
                    self._learn(f'{path}/{name}', size, *version)
            self._listings[path] = names
            self._kinds[path] = 'directory'
        return list(names)

    async def _fs_list(self, path: str) -> list[tuple[str, str, int | None, tuple]]:
        _invalidate(self.fs, path, self.protocol)   # asked afresh: this open's snapshot
        entries = await self.fs._ls(path, detail=True)
        out = []
        for e in entries:
            name = e['name'].rstrip('/').rpartition('/')[2]
            if e['name'].rstrip('/') == _strip_protocol(path).rstrip('/'):
                raise NotADirectoryError(f'not a directory: {path}')
            out.append((name, 'directory' if e.get('type') == 'directory' else 'file',
                        e.get('size') if e.get('type') != 'directory' else None,
                        _info_version(e)))
        return out

    async def _http_list(self, url: str) -> list[tuple[str, str, int | None, tuple]]:
        """A directory page: nginx's JSON autoindex, else the links of an HTML index."""
        fs = self.fs
        body = await fs._cat_file(url + '/')
        try:
            entries = json.loads(body)
        except ValueError:
            entries = None
        if isinstance(entries, list) and all(isinstance(e, dict) and 'name' in e
                                             for e in entries):
            return [(e['name'], 'directory' if e.get('type') == 'directory' else 'file',
                     e.get('size'), (None, e.get('mtime'))) for e in entries]
        out = []
        for link in await fs._ls(url + '/', detail=False):
            rest = link[len(url) + 1:] if link.startswith(url + '/') else None
            if rest and rest.rstrip('/') and '/' not in rest.rstrip('/'):
                out.append((rest.rstrip('/'), 'directory' if rest.endswith('/') else 'file',
                            None, (None, None)))
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
        self._forget(path)
        kind = self._stat(path)
        if kind == 'directory':
            try:
                return bool(self.list(path))
            except LoadrError:
                return True
        return kind is not None

    def _forget(self, path: str) -> None:
        """Drop what we remembered about ``path`` and what lies under it (we are writing it)."""
        path = path.rstrip('/')
        for table in (self._sizes, self._kinds, self._listings, self._versions):
            for key in [k for k in table if k == path or k.startswith(path + '/')]:
                del table[key]
        parent = path.rpartition('/')[0]
        self._listings.pop(parent, None)
        if self._fs is not None and hasattr(self._fs, 'invalidate_cache'):
            self._fs.invalidate_cache(path)

    def close(self) -> None:
        with self._buffer.lock:
            self._buffer.clear()

    # -- writing ------------------------------------------------------------------------

    def _check_writable(self, path: str) -> None:
        if self.protocol in ('http', 'https'):
            raise ConfigError(f'{self.protocol}:// is read-only for loadr: write to a local '
                              f'path or an object store (s3://, gs://)', path)

    def open_write(self, path: str) -> 'RemoteStagedFile':
        """A new object written locally first; ``commit()`` uploads it in one piece."""
        self._check_writable(path)
        return RemoteStagedFile(self, path)

    def stage_dir(self, path: str, parents: bool = False) -> 'RemoteStagedDir':
        """A new directory built locally; ``commit()`` uploads it, data first, markers last."""
        self._check_writable(path)
        return RemoteStagedDir(self, path)

    def upload(self, pairs: Sequence[tuple[str, str]], done: list | None = None) -> None:
        """Upload ``(local file, url)`` pairs concurrently, each retried.

        The URLs uploaded are appended to ``done``, also when another failed
        (whose error is raised once all have ended).
        """
        fs = self.fs

        async def all_of():
            return await asyncio.gather(*(self._limited(lambda lp=lp, u=u: self._retried(
                lambda: fs._put_file(lp, u), u, None, 'write')) for lp, u in pairs),
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

        async def all_of():
            await asyncio.gather(*(self._limited(lambda u=u: self._retried(
                lambda: fs._rm_file(u), u, None, 'remove')) for u in urls),
                return_exceptions=True)
        try:
            self._run(all_of())
        finally:
            for u in urls:
                self._forget(u)


def remote_storage(url: str, storage_options: dict | None = None) -> RemoteStorage:
    """The storage of ``url``: a new one, or within one open the same for a protocol and options.

    What a storage learns (listings, sizes, versions) is the snapshot a
    reader reads: shared within one open (``loadr.open``, a YAML reader, a
    command: :func:`loadr.storage.using_storage_options`), so that detection
    and the reader ask once, and never across opens, so that a dataset
    replaced at its URL is seen anew by the next open. Options that are not
    plain data (an object in ``client_kwargs``) get a storage of their own.
    """
    from . import storage as storage_module
    shared = storage_module._SCOPE.get()
    if shared is None or shared[0] != storage_module._generation:   # none, or a forked parent's
        return RemoteStorage(url, storage_options)
    protocol, _ = split_url(url)
    try:
        key = (protocol, json.dumps(storage_options or {}, sort_keys=True))
    except (TypeError, ValueError):
        return RemoteStorage(url, storage_options)
    storage = shared[1].get(key)
    if storage is None:
        storage = shared[1][key] = RemoteStorage(url, storage_options)
    return storage


def _host(url: str) -> str:
    return url.partition('://')[2].partition('/')[0]


def _index_of(r: Sequence) -> int | None:
    return r[3] if len(r) > 3 else None


def _for_record(exc: LoadrError, path: str, index: int | None) -> LoadrError:
    """``exc`` (an error of a read that served several records) for the record at ``index``."""
    if exc.path == path and exc.index == index:
        return exc
    err = type(exc)(exc.message, path, index)
    err.__dict__.update({k: v for k, v in exc.__dict__.items()
                         if k not in ('message', 'path', 'index')})
    return err


def _invalidate(fs, path: str, protocol: str) -> None:
    """Drop fsspec's cached listings of ``path`` and its parents (s3fs answers from them)."""
    invalidate = getattr(fs, 'invalidate_cache', None)
    if invalidate is not None:
        try:
            invalidate(path if protocol in ('http', 'https') else _strip_protocol(path))
        except Exception:                # a cache that cannot be dropped is asked as it is
            pass


def _info_version(info: dict) -> tuple:
    """``(ETag, Last-Modified)`` of an fsspec info or listing entry (s3fs, http)."""
    return (info.get('ETag') or info.get('etag'),
            info.get('LastModified') or info.get('Last-Modified') or info.get('mtime'))


def _strip_protocol(url: str) -> str:
    return url.partition('://')[2] if '://' in url else url


# ---------------------------------------------------------------------------
# Staged writes: built locally, uploaded on commit


def _spool_dir() -> str:
    return tempfile.mkdtemp(prefix='loadr-upload-')


class RemoteStagedFile:
    """One object, written to a local temporary file and uploaded by ``commit()``.

    The same surface as :class:`loadr.storage.StagedFile` (``write``,
    ``pwrite``, ``sync``, ``commit``, ``abort``); ``path`` is the local file.
    """

    def __init__(self, storage: RemoteStorage, url: str):
        from .storage import WriteFile
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
            storage._forget(self.target)
            storage.upload([(self.path, self.target)])
            storage._forget(self.target)
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

    A :class:`loadr.storage.StagedDir` (``path``, ``join``, ``open_write``,
    ``write_file``, ``mkdir``) whose ``commit`` uploads and whose ``abort``
    removes the local spool: the writers write local files, as they do for a
    local target.
    """

    def __init__(self, storage: RemoteStorage, url: str, parents: bool = False):
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
            storage._forget(self.target)
        except BaseException:
            self.abort()
            raise
        self.abort()
        self.done = True

    def abort(self) -> None:
        """Remove the local directory (ours: we made it)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.done = True
