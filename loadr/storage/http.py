"""HTTP(S): the remote storage over plain web servers, with what HTTP does differently.

A GET with ``Range`` per request (``If-Match`` / ``If-Unmodified-Since`` pin
the version opened), up to ``max_ranges`` ranges of one file in one
multi-range request answered ``multipart/byteranges``
(:mod:`loadr.storage.ranges`): a request costs the client and the servers
far more CPU than its bytes do, and a shuffled batch otherwise makes one
request per record. A server that answers a multi-range request with the
whole file is asked range by range. A server that ignores Range altogether
(a 200 with the whole file) is noticed at the first answer: a file up to
:data:`WHOLE_FILE_MAX_BYTES` is read whole once and its ranges cut from it;
a larger one is a ReadError at once. A HEAD that does not follow redirects
tells a file from a directory (nginx answers a directory with a 301), and a
directory is listed from nginx's JSON autoindex, else the links of an HTML
index. ``http(s)://`` is read-only.
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Sequence

from ..errors import ConfigError, ReadError
from .errors import _ShortBody, _WrongRange
from .ranges import boundary, byteranges, check_part, content_range, cut
from .remote import RemoteStorage

__all__ = ['HTTPStorage', 'WHOLE_FILE_MAX_BYTES']

# A server that ignores Range: files up to this size are read whole (and kept, at
# most this many bytes of them per process); a larger one is a ReadError.
WHOLE_FILE_MAX_BYTES = 64 << 20



async def _client(connector_limit: int = 100, **kwargs):
    """fsspec's ``get_client``: an aiohttp session of ``connector_limit`` connections."""
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connector_limit), **kwargs)

class HTTPStorage(RemoteStorage):
    """The storage of ``http://`` and ``https://`` URLs (read-only); see the module docstring."""

    def _init_process(self) -> None:
        super()._init_process()
        self._one_range_hosts: set[str] = set()   # they answer a multi-range request whole
        self._no_range_hosts: set[str] = set()    # they answer any range request whole
        self._wholes: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._whole_bytes = 0
        self._whole_pending: dict[str, asyncio.Future] = {}

    def _fs_options(self, options: dict) -> dict:
        # A body read in one piece, not 64 KiB at a time: 40% less CPU per record
        # (measured: 390 -> 235 us per 60 KB range). Byte ranges of the stored bytes,
        # never of a compressed rendering of them.
        client = dict(options.get('client_kwargs') or {})
        client.setdefault('read_bufsize', 1 << 20)
        if 'get_client' not in options and 'connector' not in client:
            # aiohttp's connector holds 100 connections unless told: as many as
            # max_concurrency lets be in flight.
            client['connector_limit'] = int(self.settings['max_concurrency'])
            options['get_client'] = _client
        options['client_kwargs'] = client
        options.setdefault('headers', {'Accept-Encoding': 'identity'})
        return options

    def _fs_path(self, url: str) -> str:
        return url                      # fsspec's HTTP caches listings by the whole URL

    def _check_writable(self, path: str) -> None:
        raise ConfigError(f'{self.protocol}:// is read-only for loadr: write to a local '
                          f'path or an object store (s3://, gs://)', path)

    # -- ranges -------------------------------------------------------------------------

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

    async def _range_once(self, path: str, start: int, end: int, index: int | None) -> bytes:
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
            got = content_range(r.headers.get('Content-Range', ''))
            body = await r.read()
        self.bytes_fetched += len(body)
        check_part((start, end), got, len(body), self._sizes.get(path))
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
        if most < 2:
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

    async def _ranges_once(self, path: str, spans: list[tuple[int, int]]) -> list | None:
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
            parts = byteranges(body, boundary(content_type), size)
        else:                           # the server made one range of them
            got = content_range(content_range)
            check_part(None, got, len(body), size)
            parts = [(got[0], got[1], body)]
        return [cut(parts, a, b) for a, b in spans]

    # -- names --------------------------------------------------------------------------

    async def _stat_once(self, url: str) -> str | None:
        """A HEAD that does not follow redirects: nginx answers a directory with a 301 to url/."""
        session = await self.fs.set_session()
        async with session.head(url, allow_redirects=False) as r:
            if r.status in (405, 501):              # a server without HEAD
                return await super()._stat_once(url)
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

    async def _list_once(self, url: str) -> list[tuple[str, str, int | None, tuple]]:
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


def _host(url: str) -> str:
    return url.partition('://')[2].partition('/')[0]
