"""The local cache of a remote storage, driven by the loader's clock (the order).

A remote storage with ``cache_dir`` set keeps one
:class:`~loadr.storage.cache.RangeCache` per dataset (a subdirectory of
``cache_dir``). The loader tells it, once per batch, which positions of the
order the reads that follow serve (:meth:`CacheHookup.clock`, reached
through the reader's declared :class:`loadr.sources.Caching` hooks); the
ranges fetched for a batch are offered to the cache at the next call, with
their next use known from the order (:class:`~loadr.storage.policy.NextUse`).
Reads ask the cache before the server (:meth:`CacheHookup.cached`).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from typing import Any

from ..errors import LoadrError
from .settings import StorageSettings
from .versions import Versions

__all__ = ['CacheHookup']


class CacheHookup:
    """The local cache part of a :class:`~loadr.storage.remote.RemoteStorage`, one per
    process: the caches of its datasets, the loader's clock, and the ranges fetched
    since the clock last moved.

    It needs the storage's settings, what the storage learnt of its files
    (``versions``: the cache keys its entries by their version) and
    ``ask_version(path)``, which asks the server for the version of a file the
    open learnt no version of (a HEAD; its answer lands in ``versions``).
    """

    def __init__(self, settings: StorageSettings, versions: Versions,
                 ask_version: Callable[[str], None]):
        self.settings = settings
        self.versions = versions
        self.ask_version = ask_version
        self.caches: dict[str, Any] = {}        # root -> RangeCache
        self.now: tuple | None = None           # (cache, NextUse, position after the batch)
        self.fetched: list[tuple] = []          # (key, offset, length, index, data)

    @property
    def on(self) -> bool:
        """True when a ``cache_dir`` is set: the loader then calls :meth:`clock`."""
        return bool(self.settings.cache_dir)

    def clock(self, root: str, order: Any, start: int, count: int) -> None:
        """Say that the reads that follow are those of positions ``start ..
        start + count - 1`` of ``order`` over the dataset at ``root``.

        Ranges fetched since the last call are offered to the cache first, as
        of that call's batch (their next use is after it).
        """
        if not self.settings.cache_dir:
            return
        self.offer()
        from .policy import NextUse  # numpy: not on import loadr
        cache = self.cache_of(root)
        old = self.now
        next_use = old[1] if old is not None and old[1].order is order else NextUse(order)
        self.now = (cache, next_use, start + count)

    def current(self) -> Any:
        """The cache of the batch under way (the clock's), or None."""
        return None if self.now is None else self.now[0]

    def cache_of(self, root: str) -> Any:
        """The cache of the dataset at ``root``: a subdirectory of ``cache_dir``."""
        cache = self.caches.get(root)
        if cache is None:
            from .cache import RangeCache
            assert self.settings.cache_dir is not None      # only asked with one
            name = hashlib.sha1(root.encode()).hexdigest()[:16]
            cache = self.caches[root] = RangeCache(
                os.path.join(self.settings.cache_dir, name), int(self.settings.cache_bytes or 0),
                self.settings.cache_policy)
        return cache

    def offer(self) -> None:
        """Offer the cache the ranges fetched since the clock last moved."""
        now, fetched = self.now, self.fetched
        if now is None or not fetched:
            return
        self.fetched = []
        cache, next_use, position = now
        cache.offer(fetched, functools.partial(next_use, now=position))

    def cached(self, path: str, offset: int, length: int) -> bytes | None:
        """The range from the cache of the batch under way, or None."""
        now = self.now
        if now is None or length == 0:
            return None
        key = self.key(path)
        return None if key is None else now[0].get(key, offset, length)

    def fetched_now(self, path: str, offset: int, length: int, index: int | None,
                    data: bytes) -> None:
        """Remember a range fetched from the server, for the cache's next offer."""
        if self.now is not None and index is not None and length:
            key = self.key(path)
            if key is not None:
                self.fetched.append((key, offset, length, index, data))

    def key(self, path: str) -> str | None:
        """The name the cache knows ``path`` by, or None where it must not be cached.

        A file not yet opened has no name yet. A file whose version is not known
        (a listing that gave its size alone) is asked for it first (a HEAD,
        once per process): an entry is used only under the version the
        server says now. A server that gives none (no ETag, no Last-Modified)
        leaves no way to tell a file replaced at the URL from the one cached:
        such a file is not cached, and one warning says so.
        """
        versions = self.versions
        if versions.size_of(path) is None:
            return None
        if not versions.known(path):
            self.learn_version(path)
        if path not in versions.versions:
            return None
        return versions.cache_name(path)

    def learn_version(self, path: str) -> None:
        """Ask the server for the version of ``path`` (see :meth:`key`)."""
        from .cachedir import warn_once  # numpy: not on import loadr
        try:
            self.ask_version(path)
        except LoadrError:
            pass                # the read itself says what is wrong; uncached meanwhile
        if path in self.versions.versions:
            return
        self.versions.unversioned.add(path)
        host = path.partition('://')[2].partition('/')[0]
        cache_dir = self.settings.cache_dir
        warn_once(f'{cache_dir}\0unversioned\0{host}',
                  f'{path}: the server gives no version of this file (no ETag, no '
                  f'Last-Modified), so a file replaced at its URL could not be told from '
                  f'the one cached: its reads are not cached in '
                  f'{cache_dir} (nor those of any such file of {host})')

    def stats(self) -> dict[str, int]:
        """This process's cache counts (hits, misses, bytes_hit, admitted, evicted, ...)."""
        out: dict[str, int] = {}
        for cache in self.caches.values():
            for key, value in cache.stats().items():
                out[key] = out.get(key, 0) + value
        return out
