"""HTTP(S): the remote storage over plain web servers, with what HTTP does differently.

A GET with ``Range`` per request (``If-Match`` / ``If-Unmodified-Since`` pin
the version opened), up to ``max_ranges`` ranges of one file in one
multi-range request answered ``multipart/byteranges``
(:mod:`loadr.storage.ranges`): a request costs the client and the servers
far more CPU than its bytes do, and a shuffled batch otherwise makes one
request per record. A server that answers a multi-range request with the
whole file is asked range by range. A server that ignores Range altogether
(a 200 with the whole file) is found by one request per host and process
(the others wait for its answer; a HEAD's ``Accept-Ranges: bytes`` spares
it): a file up to :data:`WHOLE_FILE_MAX_BYTES` is then read whole at most
once per process, kept in a temporary file, and its ranges cut from it (a
forked worker keeps its parent's); one warning says so; a larger file is a
ReadError at once. A HEAD that does not follow redirects
tells a file from a directory (nginx answers a directory with a 301), and a
directory is listed from nginx's JSON autoindex, else the links of an HTML
index. ``http(s)://`` is read-only.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Sequence

from ..errors import ConfigError, ReadError
from . import netstats
from .cachedir import warn_once
from .errors import ShortBody, WrongRange, with_details
from .ranges import boundary, byteranges, check_part, content_range, cut
from .remote import RemoteStorage

__all__ = ['HTTPStorage', 'WHOLE_FILE_MAX_BYTES']

# A server that ignores Range: files up to this size are read whole (once per process,
# kept in a temporary file); a larger one is a ReadError.
WHOLE_FILE_MAX_BYTES = 64 << 20


class _Whole:
    """A file read whole from a server that ignores Range, kept in an unnamed temporary
    file (gone with the last process that holds it; a forked child shares it)."""

    def __init__(self, data: bytes):
        self.file = tempfile.TemporaryFile(prefix='loadr-whole-')
        self.file.write(data)
        self.file.flush()
        self.size = len(data)

    def __getitem__(self, span: slice) -> bytes:
        start, end, _ = span.indices(self.size)
        return os.pread(self.file.fileno(), max(0, end - start), start)



async def _client(connector_limit: int = 100, **kwargs):
    """fsspec's ``get_client``: an aiohttp session of ``connector_limit`` connections."""
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connector_limit), **kwargs)

class HTTPStorage(RemoteStorage):
    """The storage of ``http://`` and ``https://`` URLs (read-only); see the module docstring."""

    def _init_process(self) -> None:
        super()._init_process()
        # What a forked child keeps of its parent's: what the hosts do with Range, and
        # the files read whole (no request in flight: their futures are the parent's).
        self._one_range_hosts: set[str] = set(getattr(self, '_one_range_hosts', ()))
        self._range_hosts: set[str] = set(getattr(self, '_range_hosts', ()))
        self._no_range_hosts: set[str] = set(getattr(self, '_no_range_hosts', ()))
        self._wholes: dict[str, _Whole] = dict(getattr(self, '_wholes', None) or {})
        self._whole_pending: dict[str, asyncio.Future] = {}
        self._probes: dict[str, asyncio.Future] = {}      # host -> its first range request

    def _fs_options(self, options: dict) -> dict:
        # A body read in one piece, not 64 KiB at a time: 40% less CPU per record
        # (measured: 390 -> 235 us per 60 KB range). Byte ranges of the stored bytes,
        # never of a compressed rendering of them.
        client = dict(options.get('client_kwargs') or {})
        client.setdefault('read_bufsize', 1 << 20)
        if 'get_client' not in options and 'connector' not in client:
            # aiohttp's connector holds 100 connections unless told: as many as
            # max_concurrency lets be in flight.
            client['connector_limit'] = int(self.settings.max_concurrency)
            options['get_client'] = _client
        options['client_kwargs'] = client
        options.setdefault('headers', {'Accept-Encoding': 'identity'})
        return options

    def _fs_path(self, url: str) -> str:
        return url                      # fsspec's HTTP caches listings by the whole URL

    def close(self) -> None:
        super().close()
        self._wholes = {}               # their temporary files go with the last reference

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
        headers.update(self.versions.conditions(path))
        kw['headers'] = headers
        self.requests += 1
        return kw

    async def _range_once(self, path: str, start: int, end: int, index: int | None) -> bytes:
        """One attempt at bytes ``[start, end)`` over HTTP, the answer checked: a 206 for
        exactly those bytes of a file of the size we know (else a WrongRange, retried)."""
        whole = await self._whole_kept(path, index)
        if whole is not None:
            netstats.read_whole()
            return whole[start:end]
        host = _host(path)
        probing = host not in self._range_hosts and await self._probing(host)
        if host in self._no_range_hosts:            # found out while this one waited
            netstats.read_whole()
            return (await self._whole(path, index))[start:end]
        try:
            fs = self.fs
            session = await fs.set_session()
            async with session.get(fs.encode_url(path),
                                   **self._http_kw(path, [(start, end)])) as r:
                if r.status == 200:
                    netstats.read_whole()
                    return (await self._whole_answer(r, path, index))[start:end]
                if r.status >= 400:
                    fs._raise_not_found_for_status(r, path)
                if r.status != 206:
                    raise WrongRange(f'HTTP {r.status} {r.reason} to a range request')
                self._range_hosts.add(host)
                got = content_range(r.headers.get('Content-Range', ''))
                body = await r.read()
        finally:
            if probing:
                self._probes.pop(host).set_result(None)
        self.bytes_fetched += len(body)
        check_part((start, end), got, len(body), self.versions.size_of(path))
        return body

    async def _probing(self, host: str) -> bool:
        """Whether this request is the one that finds out if ``host`` answers Range (its
        first, alone); else wait for the one under way. Requests sent at once to a
        server that ignores Range would each bring a whole file."""
        while host not in self._range_hosts and host not in self._no_range_hosts:
            probe = self._probes.get(host)
            if probe is None:
                self._probes[host] = asyncio.get_running_loop().create_future()
                return True
            await asyncio.shield(probe)     # and again if it failed: one of us asks next
        return False

    # A server that ignores Range (python's http.server, some CDNs) answers 200 with
    # the whole file. Files up to WHOLE_FILE_MAX_BYTES are then read whole at most
    # once per process and kept (a temporary file): their ranges are cut from them. A
    # larger file is a ReadError at once, not a whole download per retry.

    async def _whole_kept(self, path: str, index: int | None):
        """The file kept whole from a server that ignores Range (read whole now if not
        yet); None for a server not known to ignore it."""
        whole = self._wholes.get(path)
        if whole is not None:
            return whole
        if _host(path) not in self._no_range_hosts:
            return None
        return await self._whole(path, index)

    async def _whole(self, path: str, index: int | None) -> _Whole:
        """The whole of ``path`` from a server that ignores Range: kept, being read by
        another request (waited for), or read now with a plain GET."""
        whole = self._wholes.get(path)
        if whole is not None:
            return whole
        pending = self._whole_pending.get(path)
        if pending is not None:
            return await asyncio.shield(pending)
        size = self.versions.size_of(path)
        if size is not None and size > WHOLE_FILE_MAX_BYTES:
            raise self._no_ranges(path, index, size)
        fs = self.fs
        session = await fs.set_session()
        kw = self._http_kw(path, [])
        del kw['headers']['Range']
        async with session.get(fs.encode_url(path), **kw) as r:
            if r.status >= 400:
                fs._raise_not_found_for_status(r, path)
            if r.status != 200:
                raise WrongRange(f'HTTP {r.status} {r.reason} to a GET of the whole file')
            return await self._whole_answer(r, path, index)

    async def _whole_answer(self, r, path: str, index: int | None) -> _Whole:
        """The whole file of a 200 answer, kept; a ReadError if too big."""
        self._ignores_range(path, r.content_length)
        size = r.content_length if r.content_length is not None else self.versions.size_of(path)
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
            known = self.versions.size_of(path)
            if len(body) != size:
                raise ShortBody(f'got {len(body)} of the {size} bytes of the whole file')
            if known is not None and size != known:
                raise WrongRange(f'the answer gives the file {size} bytes, not the {known} '
                                  f'it had when it was opened')
            whole = _Whole(body)
        except BaseException as exc:
            # The waiters try again (a transient error), also when this read was
            # cancelled (its deadline): they must not be cancelled with it.
            pending.set_exception(exc if isinstance(exc, Exception) else
                                  ShortBody('the read of the whole file was cut short'))
            pending.exception()             # retrieved: nobody may be waiting
            raise
        finally:
            del self._whole_pending[path]
        pending.set_result(whole)
        self._wholes[path] = whole
        return whole

    def _ignores_range(self, path: str, size: int | None) -> None:
        """The server of ``path`` answered a range request with the whole file: its files
        are read whole from now on, and one warning says what that costs."""
        host = _host(path)
        self._one_range_hosts.add(host)
        if host in self._no_range_hosts:
            return
        self._no_range_hosts.add(host)
        scheme = path.partition('://')[0]
        what = f'{size:,} bytes' if size is not None else 'all of it'
        warn_once(f'no-range\0{scheme}://{host}',
                  f'{path}: the server at {scheme}://{host} ignores Range requests (it '
                  f'answers each with the whole file): every file of it is downloaded whole '
                  f'({what} for this one), at most once per process (the main one and each '
                  f'worker), and kept in a temporary file while the process lives; more '
                  f'workers would download more. A server that answers Range (nginx, S3, '
                  f'most CDNs) reads only the bytes of the records')

    def _no_ranges(self, path: str, index: int | None, size: int | None) -> ReadError:
        what = f'a file of {size} bytes' if size is not None else 'a file of unknown size'
        err = ReadError(f'the server ignored the Range request; loadr needs byte ranges (it '
                        f'answered with the whole file, and {what} is more than loadr reads '
                        f'whole: {WHOLE_FILE_MAX_BYTES >> 20} MiB)', path, index)
        return with_details(err, transient=False, attempts=1, kind='other')

    def _groups(self, requests: list) -> list[list[int]]:
        """Requests (``(path, start, end, members)``, sorted by path) that go out
        together: over HTTP up to ``max_ranges`` of one file, else one each."""
        most = int(self.settings.max_ranges)
        if most < 2:
            return [[k] for k in range(len(requests))]
        limit = int(self.settings.max_request_bytes)
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
        that answers it with the whole file (remembered: asked range by range), and
        for one not yet known to answer a single range (asked range by range: the
        first of them finds out)."""
        if _host(path) not in self._range_hosts:
            return None
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
                raise WrongRange(f'HTTP {r.status} {r.reason} to a range request')
            content_type = r.headers.get('Content-Type', '')
            content_range = r.headers.get('Content-Range', '')
            body = await r.read()
        self.bytes_fetched += len(body)
        size = self.versions.size_of(path)
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
                self.versions.learn(url, r.headers.get('Content-Length'), r.headers.get('ETag'),
                            r.headers.get('Last-Modified'))
                if r.headers.get('Accept-Ranges', '').strip().lower() == 'bytes':
                    self._range_hosts.add(_host(url))    # no first request alone
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
        out: list[tuple[str, str, int | None, tuple]] = []
        for link in await fs._ls(url + '/', detail=False):
            rest = link[len(url) + 1:] if link.startswith(url + '/') else None
            if rest and rest.rstrip('/') and '/' not in rest.rstrip('/'):
                out.append((rest.rstrip('/'), 'directory' if rest.endswith('/') else 'file',
                            None, (None, None)))
        return out


def _host(url: str) -> str:
    return url.partition('://')[2].partition('/')[0]
