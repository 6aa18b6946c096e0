"""The local cache of a remote storage, driven by the loader's clock (the order).

A remote storage with ``cache_dir`` set keeps one
:class:`~loadr.storage.cache.RangeCache` per dataset (a subdirectory of
``cache_dir``). The loader tells it, once per batch, which positions of the
order the reads that follow serve (:meth:`CacheHookup.cache_clock`, reached
through the reader's declared :class:`loadr.sources.Caching` hooks); the
ranges fetched for a batch are offered to the cache at the next call, with
their next use known from the order (:class:`~loadr.storage.policy.NextUse`).
Reads ask the cache before the server (:meth:`CacheHookup._cached`).
"""

from __future__ import annotations

import functools
import hashlib
import os

from ..errors import LoadrError

__all__ = ['CacheHookup']


class CacheHookup:
    """The cache half of :class:`~loadr.storage.remote.RemoteStorage`."""

    @property
    def caching(self) -> bool:
        """True when a ``cache_dir`` is set: the loader then calls :meth:`cache_clock`."""
        return bool(self.settings.cache_dir)

    def cache_clock(self, root: str, order, start: int, count: int) -> None:
        """Say that the reads that follow are those of positions ``start ..
        start + count - 1`` of ``order`` over the dataset at ``root``.

        Ranges fetched since the last call are offered to the cache first, as
        of that call's batch (their next use is after it). Called by the loader
        once per batch, where the reads happen (workers, or inline).
        """
        self._this_process()
        if not self.settings.cache_dir:
            return
        self._offer()
        from .policy import NextUse                 # numpy: not on import loadr
        cache = self._cache_of(root)
        old = self._clock
        next_use = old[1] if old is not None and old[1].order is order else NextUse(order)
        self._clock = (cache, next_use, start + count)

    def cache_flush(self) -> None:
        """Offer the cache the ranges fetched for the last batch (a worker that stops)."""
        if self._same_process() and self._clock is not None:
            self._offer()

    def _cache_of(self, root: str):
        """The cache of the dataset at ``root``: a subdirectory of ``cache_dir``."""
        cache = self._caches.get(root)
        if cache is None:
            from .cache import RangeCache
            name = hashlib.sha1(root.encode()).hexdigest()[:16]
            cache = self._caches[root] = RangeCache(
                os.path.join(self.settings.cache_dir, name),
                int(self.settings.cache_bytes or 0), self.settings.cache_policy)
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
        if clock is None or length == 0:
            return None
        key = self._cache_key(path)
        return None if key is None else clock[0].get(key, offset, length)

    def _fetched_now(self, path: str, offset: int, length: int, index: int | None,
                     data: bytes) -> None:
        """Remember a range fetched from the server, for the cache's next offer."""
        if self._clock is not None and index is not None and length:
            key = self._cache_key(path)
            if key is not None:
                self._fetched.append((key, offset, length, index, data))

    def _cache_key(self, path: str) -> str | None:
        """The name the cache knows ``path`` by, or None where it must not be cached.

        A file not yet opened has no name yet. A file whose version is not known
        (a listing that gave its size alone) is asked for it first (a HEAD,
        once per process): an entry is used only under the version the
        server says now. A server that gives none (no ETag, no Last-Modified)
        leaves no way to tell a file replaced at the URL from the one cached:
        such a file is not cached, and one warning says so.
        """
        if path not in self._sizes:
            return None
        if path not in self._versions and path not in self._unversioned:
            self._ask_version(path)
        if path not in self._versions:
            return None
        return self._cache_path(path)

    def _ask_version(self, path: str) -> None:
        """Ask the server for the version of ``path`` (see :meth:`_cache_key`)."""
        from .cachedir import warn_once             # numpy: not on import loadr
        try:
            self._run(self._retried(lambda: self._stat_once(path), path, None, 'open'))
        except LoadrError:
            pass                # the read itself says what is wrong; uncached meanwhile
        if path in self._versions:
            return
        self._unversioned.add(path)
        host = path.partition('://')[2].partition('/')[0]
        warn_once(f'{self.settings.cache_dir}\0unversioned\0{host}',
                  f'{path}: the server gives no version of this file (no ETag, no '
                  f'Last-Modified), so a file replaced at its URL could not be told from '
                  f'the one cached: its reads are not cached in '
                  f'{self.settings.cache_dir} (nor those of any such file of {host})')

    def cache_stats(self) -> dict:
        """This process's cache counts (hits, misses, bytes_hit, admitted, evicted, ...)."""
        out: dict = {}
        for cache in self._caches.values():
            for key, value in cache.stats().items():
                out[key] = out.get(key, 0) + value
        return out
