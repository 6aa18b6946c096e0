"""S3 ranges as plain GETs of presigned URLs: a signature per object and hour, not per range.

A ``get_object`` through aiobotocore costs ~1.2 ms of CPU (measured: a
96 KB range against a local S3 server, 1,193 µs a request), most of it in
botocore's request pipeline (parameters checked and serialized, events,
a signature, the answer parsed), and a shuffled batch makes one per record.
Here each object's URL is presigned once (``generate_presigned_url``,
~0.1 ms, valid :data:`URL_SECONDS`) and every range is an aiohttp GET of it
with ``Range`` and ``If-Match`` headers, which S3 does not ask to be signed:
the cost of an HTTP range request (~0.15 ms).

A URL refused with 403 after :data:`FRESH_SECONDS` of use (expired
credentials or URL) is signed again once, in the same attempt. Options this
path does not carry (requester pays, server-side encryption with the
customer's keys, a botocore proxy configuration) keep ``get_object``
(:func:`presignable`); so does ``storage_options['loadr']['s3_presigned'] =
False``.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import ssl
import time
from typing import TYPE_CHECKING

__all__ = ['PresignedGets', 'S3Answer', 'Redirected', 'presignable', 'URL_SECONDS']

if TYPE_CHECKING:       # aiohttp is imported when a session is made
    import aiohttp

# How long a presigned URL is asked to be valid, and how long before its end it is
# signed again.
URL_SECONDS = 3600
_RENEW_BEFORE_S = 300
# A 403 to a URL signed longer ago than this is taken for an expired one (signed again).
FRESH_SECONDS = 1.0

# S3's answers to a URL signed for another region than the bucket's.
_OTHER_REGION = frozenset({'AuthorizationQueryParametersError', 'AuthorizationHeaderMalformed',
                           'PermanentRedirect', 'TemporaryRedirect'})
# s3fs options that change the request in ways a presigned GET does not carry.
_NOT_PRESIGNABLE = ('requester_pays', 's3_additional_kwargs', 'session')
# The sessions made, (pid, loop, session), never dropped before the exit (a session
# closed from another thread than its loop's can lose a socket from the loop's epoll set:
# see loadr.storage.filesystems); a forked child never uses its parent's.
_kept: list = []


def _close_sessions() -> None:
    """At the exit: this process's sessions closed on their loop, the others' (a parent's,
    inherited at a fork) connectors at once, as fsspec's HTTP does: aiohttp logs a session
    that is collected unclosed."""
    for pid, loop, session in _kept:
        try:
            if pid == os.getpid() and loop.is_running():
                asyncio.run_coroutine_threadsafe(session.close(), loop).result(0.5)
                continue
        except Exception:
            pass
        connector = getattr(session, '_connector', None)
        if connector is not None:
            connector._close()


atexit.register(_close_sessions)


class S3Answer(Exception):
    """An S3 error answer (``status``, S3's ``Code`` and message) to a presigned GET; sorted
    by its status like botocore's (404 missing, 403 denied, 412 changed, 5xx transient)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f'HTTP {status} {code}: {message}'.strip())
        self.status = status
        self.code = code


class Redirected(Exception):
    """S3 answered a presigned GET with a redirect, or said the URL was signed for another
    region (a bucket of another region): botocore's ``get_object``, which finds the
    bucket's region, reads that bucket."""


def presignable(options: dict) -> bool:
    """Whether ranges of a filesystem made with these s3fs ``options`` may be presigned GETs.

    >>> presignable({"endpoint_url": "http://127.0.0.1:9000"}), presignable({"requester_pays": 1})
    (True, False)
    """
    if any(options.get(k) for k in _NOT_PRESIGNABLE):
        return False
    config = options.get('config_kwargs') or {}
    return not config.get('proxies')


def _ssl_of(options: dict):
    """The TLS verification botocore would do: ``client_kwargs['verify']`` (False, or a CA
    bundle), else ``AWS_CA_BUNDLE``, else the system's."""
    verify = (options.get('client_kwargs') or {}).get('verify', None)
    if verify is False:
        return False
    bundle = verify if isinstance(verify, str) else os.environ.get('AWS_CA_BUNDLE')
    return ssl.create_default_context(cafile=bundle) if bundle else None


class PresignedGets:
    """Presigned URLs of one s3fs filesystem's objects, and the aiohttp session that GETs them.

    One per filesystem (so per process); its coroutines run on fsspec's loop.
    """

    def __init__(self, fs, options: dict, connections: int):
        self.fs = fs
        self.urls: dict[tuple, tuple] = {}      # (bucket, key, version) -> (yarl URL, signed at)
        self.ssl = _ssl_of(options)
        self.connections = connections
        self.session: aiohttp.ClientSession | None = None
        self.proxies: dict[tuple, str | None] = {}

    async def _session(self):
        if self.session is None:
            import aiohttp
            # Not trust_env: aiohttp would then look up ~/.netrc and the proxy variables
            # on a thread for every request (0.3 ms each); the proxy is found once per
            # host (_proxy_of) instead.
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections, ssl=self.ssl),
                auto_decompress=False, read_bufsize=1 << 20)
            _kept.append((os.getpid(), asyncio.get_running_loop(), self.session))
        return self.session

    def _proxy_of(self, url) -> str | None:
        """The proxy of the environment (``HTTPS_PROXY``, ``NO_PROXY``, as botocore reads
        them) for the host of ``url`` (a yarl URL), found once per scheme and host."""
        key = (url.scheme, url.host, url.port)
        if key not in self.proxies:
            import urllib.request
            proxy = urllib.request.getproxies().get(url.scheme)
            if proxy and urllib.request.proxy_bypass(url.host or ''):
                proxy = None
            self.proxies[key] = proxy or None
        return self.proxies[key]

    async def _url(self, bucket: str, key: str, version: str | None, again: bool) -> tuple:
        """``(url, signed at)`` of the object: kept, or signed now."""
        name = (bucket, key, version)
        now = time.monotonic()
        kept = self.urls.get(name)
        if kept is not None and not again and now - kept[1] < URL_SECONDS - _RENEW_BEFORE_S:
            return kept
        client = await self.fs.set_session()
        params = {'Bucket': bucket, 'Key': key}
        if version:
            params['VersionId'] = version
        url = await client.generate_presigned_url('get_object', Params=params,
                                                  ExpiresIn=URL_SECONDS)
        # Sent as signed, byte for byte: aiohttp would otherwise requote the key's
        # escapes (%3D as =, %2C as ,), and the server's signature check could fail.
        import yarl
        url = yarl.URL(url, encoded=True)
        self.urls[name] = (url, now)
        if len(self.urls) > 1 << 16:            # a dataset of very many objects: the oldest go
            for old in list(self.urls)[:1 << 14]:
                del self.urls[old]
        return url, now

    async def get(self, bucket: str, key: str, version: str | None, headers: dict):
        """``(headers, body)`` of a 2xx answer to a GET of the object with ``headers``;
        an :class:`S3Answer` for an error answer."""
        session = await self._session()
        again = False
        while True:
            url, signed = await self._url(bucket, key, version, again)
            async with session.get(url, headers=headers, allow_redirects=False,
                                   proxy=self._proxy_of(url)) as r:
                if r.status < 300:
                    return r.headers, await r.read()
                if r.status < 400:
                    raise Redirected(f'HTTP {r.status} to a presigned GET of s3://{bucket}')
                text = (await r.read())[:4096].decode('utf-8', 'replace')
            code = _tag(text, 'Code') or r.reason or ''
            if code in _OTHER_REGION:
                # A URL signed for the client's region, the bucket in another: S3 says so
                # with a 400 (SigV4), where get_object's redirect handling finds the region.
                raise Redirected(f'HTTP {r.status} {code} to a presigned GET of s3://{bucket}')
            if r.status == 403 and not again and time.monotonic() - signed > FRESH_SECONDS:
                again = True                # expired credentials or URL: signed again, once
                continue
            raise S3Answer(r.status, code, _tag(text, 'Message'))


def _tag(xml: str, name: str) -> str:
    found = re.search(f'<{name}>(.*?)</{name}>', xml, re.S)
    return found.group(1).strip()[:200] if found else ''
