"""A small HTTP/1.1 proxy of ours that injects latency and faults in front of a real server.

Per request it can wait a fixed delay (as a round trip to a far server
would; concurrent requests wait concurrently), answer ``503``, send the
headers and only part of the body then close (a short body), reset the
connection (an RST, no answer), answer for other bytes than were asked (a
``wrong`` range: the Range is shifted by one byte on its way to the server,
which answers it honestly) or give the file another total size in the
Content-Range (``total``). Which requests fail is deterministic: a
request is named by (method, path, Range header) and its k-th attempt fails
when ``hash(seed, name, k)`` falls under the fault fractions, so the same
reads meet the same faults in every run whatever the timing; after
``max_faults`` failed attempts a request always goes through, so a client that
retries enough always succeeds. ``hang=True`` accepts requests and never
answers (a server that stalls); :meth:`Proxy.stop` makes the server go away.

It counts requests, faults, the body bytes it passed to clients and the
most requests it held in their delay at once (``proxy.stats``; ``proxy.log``
lists each request's method, target and Range); over HTTP,
``GET /__proxy__/stats`` returns the counts as JSON and
``GET /__proxy__/reset`` zeroes them, for a proxy in another process
(``python -m tests.remote.proxy --upstream http://127.0.0.1:8080 --delay-ms 20``).

Example::

    with Proxy('http://127.0.0.1:8080', delay_s=0.02, error=0.1, seed=1) as proxy:
        url = proxy.url + '/ffrecord/single.ffr'
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import socket
import struct
import threading
import time
import urllib.parse

__all__ = ['Proxy']

READ_LIMIT_BYTES = 1 << 20
HEAD_END = b'\r\n\r\n'


class Proxy:
    """The fault-injecting proxy, served by an asyncio loop in a thread of this process.

    ``error``, ``short``, ``reset``, ``wrong``, ``total``: fractions of attempts
    answered 503, cut short, reset, for a shifted range, or with a wrong total
    size (their sum at most 1). ``delay_s``: added before every request is
    forwarded. ``refuse``: a substring of the targets always answered 503;
    with ``refuse_bytes=(a, b)`` only those of its requests whose Range
    covers a byte of ``[a, b)`` (a bad record: every request that carries it
    fails, whatever else it carries); ``refuse_status``: the status they get
    instead (403: an expired presigned URL; 301: a bucket of another region),
    with the S3 error code ``refuse_code``. ``expire_after_s``: a presigned URL
    (its ``X-Amz-Date``) older than this is refused as S3 refuses an expired one
    (403 AccessDenied, "Request has expired"); :meth:`signatures` lists the
    signatures seen.
    ``whole_for_many_ranges``: a multi-range request is passed on without its
    Range (the whole file comes back, as from a server that does not do
    multi-range). ``slow``: the
    fraction of requests (chosen by their method, target and Range, the same
    in every run) held ``slow_s`` more than the others, as a server that
    answers some ranges late. Settings may be changed while it runs.
    """

    def __init__(self, upstream: str, delay_s: float = 0.0, error: float = 0.0,
                 short: float = 0.0, reset: float = 0.0, seed: int = 0, max_faults: int = 2,
                 hang: bool = False, port: int = 0, refuse: str | None = None,
                 whole_for_many_ranges: bool = False, wrong: float = 0.0, total: float = 0.0,
                 refuse_bytes: tuple[int, int] | None = None, slow: float = 0.0,
                 slow_s: float = 0.0, refuse_status: int = 503, refuse_code: str = 'Refused',
                 expire_after_s: float | None = None):
        parts = urllib.parse.urlsplit(upstream if '//' in upstream else f'http://{upstream}')
        self.upstream = (parts.hostname or '127.0.0.1', parts.port or 80)
        self.delay_s, self.error, self.short, self.reset = delay_s, error, short, reset
        self.seed, self.max_faults, self.hang = seed, max_faults, hang
        self.refuse = refuse          # requests whose target holds this are always 503
        self.refuse_bytes = refuse_bytes    # ... and whose Range covers one of these bytes
        self.refuse_status = refuse_status  # ... answered with this status
        self.refuse_code = refuse_code      # ... and this S3 error code (not for a 503)
        self.wrong, self.total = wrong, total
        self.slow, self.slow_s = slow, slow_s
        # As a server without multi-range support: such a request gets the whole file (200).
        self.whole_for_many_ranges = whole_for_many_ranges
        self.expire_after_s = expire_after_s
        self._port = port
        self._attempts: dict[tuple, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self.port: int | None = None
        self.reset_stats()

    @property
    def url(self) -> str:
        return f'http://127.0.0.1:{self.port}'

    def reset_stats(self) -> None:
        """Zero the counters (and forget past attempts, so faults repeat from the start)."""
        self.stats = {'requests': 0, 'body_bytes': 0, 'error': 0, 'short': 0, 'reset': 0,
                      'wrong': 0, 'total': 0, 'hung': 0, 'max_in_flight': 0, 'slow': 0,
                      'expired': 0}
        self._in_flight = 0
        self.log: list[tuple[str, str, str]] = []      # (method, target, Range) of each request
        self._attempts = {}

    def signatures(self) -> set[str]:
        """The presigned URLs' signatures (``X-Amz-Signature``) of the requests seen."""
        return {_signature(target) for _, target, _ in list(self.log)} - {None}

    # ----------------------------------------------------------------- life cycle
    def start(self) -> Proxy:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name='fault-proxy',
                                        daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, '127.0.0.1', self._port, limit=READ_LIMIT_BYTES),
            self._loop)
        self._server = future.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Close the listening socket and every open connection: the server is gone."""
        if self._loop is None:
            return
        loop, self._loop = self._loop, None

        async def shut():
            # shutdown(), not only close(): a process forked from this one (a Loader's
            # worker) holds copies of our sockets, which would keep them listening and
            # connected; shutdown acts on the socket itself, as a dead server's would.
            for sock in self._server.sockets:
                _shutdown(sock)
            self._server.close()
            # Connections accepted just now reach their handler some turns of the loop
            # later (accept task, transport, protocol, handler task): wait until every
            # task is a handler we know, so that every socket we accepted is closed too.
            me = asyncio.current_task()
            for _ in range(200):
                await asyncio.sleep(0)
                if all(t is me or t in self._tasks for t in asyncio.all_tasks()):
                    break
            await asyncio.sleep(0.01)
            for w in list(self._writers):
                _shutdown(w.get_extra_info('socket'))
                w.transport.abort()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(10)
            loop.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ----------------------------------------------------------------- faults
    def _fault(self, method: str, target: str, range_: str) -> str | None:
        """None, 'error', 'short', 'reset', 'wrong' or 'total' for this attempt."""
        key = (method, target, range_)
        attempt = self._attempts.get(key, 0)
        self._attempts[key] = attempt + 1
        if attempt >= self.max_faults:
            return None
        digest = hashlib.blake2b(repr((self.seed, key, attempt)).encode(), digest_size=8).digest()
        u = int.from_bytes(digest, 'little') / 2 ** 64
        for kind, p in (('error', self.error), ('short', self.short), ('reset', self.reset),
                        ('wrong', self.wrong), ('total', self.total)):
            if u < p:
                return kind
            u -= p
        return None

    def _slow(self, method: str, target: str, range_: str) -> bool:
        """Whether this request is one of the ``slow`` fraction (the same in every run)."""
        digest = hashlib.blake2b(repr(('slow', self.seed, method, target, range_)).encode(),
                                 digest_size=8).digest()
        return int.from_bytes(digest, 'little') / 2 ** 64 < self.slow

    # ----------------------------------------------------------------- serving
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._writers.add(writer)
        self._tasks.add(asyncio.current_task())
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass            # stop() cancels us; asyncio would log a cancelled handler as an error
        finally:
            self._writers.discard(writer)
            self._tasks.discard(asyncio.current_task())
            writer.transport.abort()

    async def _one(self, reader, writer) -> bool:
        """Serve one request; False when the client connection should end."""
        try:
            head = await reader.readuntil(HEAD_END)
        except asyncio.IncompleteReadError:
            return False
        lines = head[:-4].decode('latin-1').split('\r\n')
        method, target, _ = (lines[0].split(' ', 2) + ['', ''])[:3]
        headers = [tuple(s.strip() for s in line.split(':', 1))
                   for line in lines[1:] if ':' in line]
        h = {k.lower(): v for k, v in headers}
        if h.get('expect', '').lower() == '100-continue':
            # botocore's PUTs wait for this before they send the body (we forward it whole).
            writer.write(b'HTTP/1.1 100 Continue\r\n\r\n')
            headers = [(k, v) for k, v in headers if k.lower() != 'expect']
        body = await _read_body(reader, h)
        if target.startswith('/__proxy__/'):
            return await self._control(target, writer)
        self.stats['requests'] += 1
        self.log.append((method, target, h.get('range', '')))
        if self.hang:
            self.stats['hung'] += 1
            await asyncio.Event().wait()          # until the proxy stops and cancels us
        delay = self.delay_s
        if self.slow and self._slow(method, target, h.get('range', '')):
            self.stats['slow'] += 1
            delay += self.slow_s
        if delay:
            # Requests waiting here at once: how many a client keeps in flight.
            self._in_flight += 1
            self.stats['max_in_flight'] = max(self.stats['max_in_flight'], self._in_flight)
            try:
                await asyncio.sleep(delay)
            finally:
                self._in_flight -= 1
        if self.expire_after_s is not None and _expired(target, self.expire_after_s):
            self.stats['expired'] += 1
            body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                    b'<Message>Request has expired</Message><X-Amz-Expires>3600'
                    b'</X-Amz-Expires></Error>')
            writer.write(b'HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n'
                         b'Content-Length: %d\r\n\r\n%s' % (len(body), body))
            await writer.drain()
            return True
        fault = self._fault(method, target, h.get('range', ''))
        if self.refuse is not None and self.refuse in target and (
                self.refuse_bytes is None or _covers(h.get('range', ''), self.refuse_bytes)):
            fault = 'error'
            if self.refuse_status != 503:
                self.stats['refused'] = self.stats.get('refused', 0) + 1
                body = (f'<Error><Code>{self.refuse_code}</Code><Message>by the test proxy'
                        f'</Message></Error>').encode()
                writer.write(b'HTTP/1.1 %d Refused\r\nContent-Length: %d\r\n'
                             b'Location: http://127.0.0.1:9/\r\n\r\n%s'
                             % (self.refuse_status, len(body), body))
                await writer.drain()
                return True
        if fault == 'reset':
            self.stats['reset'] += 1
            sock = writer.get_extra_info('socket')
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
            _shutdown(sock)         # cut even where a forked process holds a copy of it
            writer.transport.abort()
            return False
        if fault == 'error':
            self.stats['error'] += 1
            writer.write(b'HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n'
                         b'Retry-After: 0\r\n\r\n')
            await writer.drain()
            return True
        if self.whole_for_many_ranges and ',' in h.get('range', ''):
            headers = [(k, v) for k, v in headers if k.lower() != 'range']
        if fault == 'wrong' and h.get('range'):
            self.stats['wrong'] += 1
            headers = [(k, _shifted(v) if k.lower() == 'range' else v) for k, v in headers]
        status_head, resp_body, keep = await self._forward(method, target, headers, body)
        if fault == 'total' and b'\r\ncontent-range: bytes ' in status_head.lower():
            self.stats['total'] += 1
            status_head = _other_total(status_head)
        if fault == 'short' and len(resp_body) >= 2:
            self.stats['short'] += 1
            self.stats['body_bytes'] += len(resp_body) // 2     # counted before the client sees it
            writer.write(status_head + resp_body[:len(resp_body) // 2])
            await writer.drain()
            _shutdown(writer.get_extra_info('socket'))
            writer.transport.abort()
            return False
        self.stats['body_bytes'] += len(resp_body)
        writer.write(status_head + resp_body)
        await writer.drain()
        return keep and h.get('connection', '').lower() != 'close'

    async def _forward(self, method, target, headers, body):
        """One request to the upstream on a fresh connection; (head, body, keep-alive ok)."""
        up_r, up_w = await asyncio.open_connection(*self.upstream, limit=READ_LIMIT_BYTES)
        try:
            keep = {'connection', 'keep-alive', 'proxy-connection', 'transfer-encoding',
                    'content-length'}
            out = [f'{method} {target} HTTP/1.1']
            out += [f'{k}: {v}' for k, v in headers if k.lower() not in keep]
            out += [f'Content-Length: {len(body)}'] if body or method in ('PUT', 'POST') else []
            out += ['Connection: close', '', '']
            up_w.write('\r\n'.join(out).encode('latin-1') + body)
            await up_w.drain()
            head = await up_r.readuntil(HEAD_END)
            lines = head[:-4].decode('latin-1').split('\r\n')
            rh = {}
            kept = [lines[0]]
            for line in lines[1:]:
                k, _, v = line.partition(':')
                rh[k.strip().lower()] = v.strip()
                if k.strip().lower() not in ('connection', 'keep-alive', 'transfer-encoding'):
                    kept.append(line)
            status = int(lines[0].split(' ', 2)[1])
            if method == 'HEAD' or status in (204, 304) or 100 <= status < 200:
                data = b''
                if 'content-length' not in rh:
                    kept.append('Content-Length: 0')
            elif 'chunked' in rh.get('transfer-encoding', '').lower():
                data = await _read_chunked(up_r)
                kept.append(f'Content-Length: {len(data)}')
            elif 'content-length' in rh:
                data = await up_r.readexactly(int(rh['content-length']))
            else:
                data = await up_r.read()
                kept.append(f'Content-Length: {len(data)}')
            kept += ['Connection: keep-alive', '', '']
            return '\r\n'.join(kept).encode('latin-1'), data, True
        finally:
            up_w.transport.abort()

    async def _control(self, target: str, writer) -> bool:
        if target.startswith('/__proxy__/reset'):
            self.reset_stats()
        data = json.dumps(self.stats).encode()
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                     b'Content-Length: %d\r\n\r\n' % len(data) + data)
        await writer.drain()
        return True


def _expired(target: str, after_s: float) -> bool:
    """Whether the presigned URL ``target`` was signed (its ``X-Amz-Date``) over
    ``after_s`` ago."""
    signed = urllib.parse.parse_qs(target.partition('?')[2]).get('X-Amz-Date')
    if not signed:
        return False
    at = datetime.datetime.strptime(signed[0], '%Y%m%dT%H%M%SZ').replace(
        tzinfo=datetime.UTC).timestamp()
    return time.time() - at > after_s


def _signature(target: str) -> str | None:
    """The ``X-Amz-Signature`` of a request target (a presigned URL's), or None."""
    query = urllib.parse.parse_qs(target.partition('?')[2])
    return query.get('X-Amz-Signature', [None])[0]


def _ranges(header: str) -> list[tuple[int, int]]:
    """``[start, end)`` of each range of a ``Range: bytes=a-b,c-`` header (``c-``: to 2**62)."""
    out = []
    for part in header.partition('=')[2].split(','):
        first, _, last = part.strip().partition('-')
        if first.isdigit():
            out.append((int(first), int(last) + 1 if last.isdigit() else 1 << 62))
    return out


def _covers(header: str, span: tuple[int, int]) -> bool:
    """True when a range of the Range header holds a byte of ``[start, end)``."""
    return any(a < span[1] and span[0] < b for a, b in _ranges(header))


def _shifted(header: str) -> str:
    """The ranges of a Range header one byte later (one earlier where they start past 0)."""
    step = -1 if all(a > 0 for a, _ in _ranges(header)) else 1
    return 'bytes=' + ','.join(f'{a + step}-{b - 1 + step}' for a, b in _ranges(header))


def _other_total(head: bytes) -> bytes:
    """The response head with the total size of its Content-Range one more."""
    lines = head.split(b'\r\n')
    for k, line in enumerate(lines):
        if line.lower().startswith(b'content-range:') and b'/' in line:
            span, _, size = line.rpartition(b'/')
            lines[k] = span + b'/' + str(int(size) + 1).encode()
    return b'\r\n'.join(lines)


def _shutdown(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


async def _read_body(reader: asyncio.StreamReader, h: dict) -> bytes:
    if 'chunked' in h.get('transfer-encoding', '').lower():
        return await _read_chunked(reader)
    n = int(h.get('content-length', 0) or 0)
    return await reader.readexactly(n) if n else b''


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """The decoded body of a chunked message (trailers dropped)."""
    parts = []
    while True:
        size = int((await reader.readuntil(b'\r\n')).split(b';')[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b'\r\n')) != b'\r\n':
                pass
            return b''.join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def main(argv=None) -> None:
    """Run a proxy in the foreground until interrupted (for a benchmark in another process)."""
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--upstream', required=True)
    p.add_argument('--port', type=int, default=0)
    p.add_argument('--delay-ms', type=float, default=0.0)
    p.add_argument('--error', type=float, default=0.0)
    p.add_argument('--short', type=float, default=0.0)
    p.add_argument('--reset', type=float, default=0.0)
    p.add_argument('--wrong', type=float, default=0.0)
    p.add_argument('--total', type=float, default=0.0)
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args(argv)
    proxy = Proxy(args.upstream, delay_s=args.delay_ms / 1000, error=args.error,
                  short=args.short, reset=args.reset, wrong=args.wrong, total=args.total,
                  seed=args.seed, port=args.port).start()
    print(proxy.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()


if __name__ == '__main__':
    main()
