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

__all__ = ['CacheHookup']


class CacheHookup:
    """The cache half of :class:`~loadr.storage.remote.RemoteStorage`."""

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
        self._this_process()
        if not self.settings['cache_dir']:
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
