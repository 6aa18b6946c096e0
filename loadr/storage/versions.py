"""The version of each remote object that a reader opened: its snapshot of the dataset.

What a reader learns of each object when it opens it (its size, and its
version: the ETag, else its Last-Modified time) is its snapshot of the
dataset: every range request asks for that version (``If-Match``, or
``If-Unmodified-Since`` where only a time is known; S3's ``IfMatch``, and
the answer's ETag compared), the local cache keys its entries by it, and an
object replaced since the reader was made is a :class:`~loadr.errors.ReadError`
naming the URL ("changed since the reader was made"), never its new bytes
mixed with the old. An object whose version the open did not learn (a
listing that gave its size alone) is asked for it (a HEAD) before the cache
serves any of it; one whose server gives none is not cached (see
:meth:`loadr.storage.caching.CacheHookup._cache_key`). Each open learns
afresh: storages are shared only within one open (see
:func:`loadr.storage.using_storage_options`).
"""

from __future__ import annotations

import datetime
import email.utils

from .errors import _Changed

__all__ = ['Versions', 'info_version']


def info_version(info: dict) -> tuple:
    """``(ETag, Last-Modified)`` of an fsspec info or listing entry (s3fs, http)."""
    return (info.get('ETag') or info.get('etag'),
            info.get('LastModified') or info.get('Last-Modified') or info.get('mtime'))


class Versions:
    """The versions half of :class:`~loadr.storage.remote.RemoteStorage`: ``_sizes`` and
    ``_versions`` (path -> (ETag, Last-Modified)) as first learnt, and what they ask."""

    def _learn(self, path: str, size=None, etag=None, modified=None) -> None:
        """Remember what the server said of object ``path`` (the first answer wins: the
        reader's snapshot)."""
        if size is not None:
            if self._sizes.setdefault(path, int(size)) != int(size):
                return      # another object than the one opened: its version is not ours
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

    def _check_version(self, path: str, etag: str | None) -> None:
        """An answer's ETag against the one opened (for a store that ignores IfMatch)."""
        opened = (self._versions.get(path) or (None,))[0]
        if etag and opened and etag != opened:
            raise _Changed(f'ETag {etag}, opened as {opened}')

    def modified(self, path: str) -> float | None:
        """The Last-Modified time of the version of ``path`` the reader opened (seconds since
        the epoch), or None where the server gave none."""
        modified = (self._versions.get(path) or (None, None))[1]
        try:
            return email.utils.parsedate_to_datetime(modified).timestamp() if modified else None
        except (TypeError, ValueError):
            return None

    def _cache_path(self, path: str) -> str:
        """The name the local cache knows ``path`` by: with its size and version, so that
        an object replaced at the same URL never meets the old one's entries."""
        etag, modified = self._versions.get(path) or (None, None)
        return f'{path}\n{self._sizes.get(path)}\n{etag}\n{modified}'
