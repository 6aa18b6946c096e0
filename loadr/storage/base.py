"""The interface every storage implements (see :mod:`loadr.storage`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .staging import RemoteStagedFile, StagedDir, StagedFile

__all__ = ['Storage']


class Storage:
    """What every storage backend implements; see the module docstring."""

    def size(self, path: str, index: int | None = None) -> int:  # pragma: no cover
        raise NotImplementedError

    def read(self, path: str, offset: int, length: int,
             index: int | None = None) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def read_many(self, ranges: Iterable[tuple]) -> list[bytes]:
        """``[read(*r) for r in ranges]`` of ``(path, offset, length, index)``.

        A remote storage runs them concurrently.
        """
        return [self.read(*r) for r in ranges]

    def read_all(self, path: str, index: int | None = None,
                 max_bytes: int | None = None) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def modified(self, path: str) -> float | None:
        """When ``path`` was last written, in seconds since the epoch, as this storage knows
        it (a URL's: the Last-Modified of the version it opened), or None where unknown."""
        return None

    def list(self, path: str) -> list:  # pragma: no cover
        raise NotImplementedError

    def exists(self, path: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    def isdir(self, path: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    def isfile(self, path: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    def occupied(self, path: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    def open_write(self, path: str) -> StagedFile | RemoteStagedFile:  # pragma: no cover
        raise NotImplementedError

    def stage_dir(self, path: str, parents: bool = False) -> StagedDir:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass

    # -- what only a remote storage does: read ahead (loadr.storage.readahead) --------

    @property
    def concurrency(self) -> int:
        """How many reads are worth running at once (a remote storage's ``max_concurrency``)."""
        return 1

    #: True where every question is a round trip (a URL's): reads are worth starting
    #: ahead (:meth:`prefetch`) and running concurrently.
    remote = False

    def prefetch(self, ranges: Iterable[tuple], cache_root: str | None = None) -> None:
        """Start reading ``(path, offset, length[, index])`` ranges now (a hint; nothing
        for local files)."""

    def hold(self) -> None:
        """Keep what is read ahead after it is read, for children about to be forked."""

    def release(self) -> None:
        """Drop what :meth:`hold` kept, once the children are forked."""

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait for the reads ahead under way (before a fork); whether they all ended."""
        return True

    # -- the local cache of a remote storage (loadr.storage.caching) ------------------
    # A storage without one says so here: a reader asks these, never probes for them.

    @property
    def caching(self) -> bool:
        """True when the storage keeps a local cache that learns the order (``cache_dir``)."""
        return False

    def cache_clock(self, root: str, order, start: int, count: int) -> None:
        """The reads that follow serve positions ``start .. start + count - 1`` of ``order``
        over the dataset at ``root`` (the cache's clock); nothing without a cache."""

    def cache_flush(self) -> None:
        """Offer the cache what was fetched since the last :meth:`cache_clock`."""

