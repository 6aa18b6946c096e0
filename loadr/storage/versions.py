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
:meth:`loadr.storage.caching.CacheHookup.key`). Each open learns afresh:
storages are shared only within one open (see
:func:`loadr.storage.remote_storage`).
"""

from __future__ import annotations

import datetime
import email.utils
from typing import Any

from .errors import VersionChanged

__all__ = ['Versions', 'info_version']


def info_version(info: dict) -> tuple[Any, Any]:
    """``(ETag, Last-Modified)`` of an fsspec info or listing entry (s3fs, http)."""
    return (info.get('ETag') or info.get('etag'),
            info.get('LastModified') or info.get('Last-Modified') or info.get('mtime'))


class Versions:
    """What a remote storage learnt of its objects: each one's size and version
    (``(ETag, Last-Modified)``) as first learnt, and the objects whose server gives no
    version. Travels with the storage when a reader is pickled to a worker.

    >>> v = Versions()
    >>> v.learn('s3://b/x', 10, '"abc"')
    >>> v.conditions('s3://b/x'), v.size_of('s3://b/x')
    ({'If-Match': '"abc"'}, 10)
    """

    def __init__(self, sizes: dict[str, int] | None = None,
                 versions: dict[str, tuple[str | None, str | None]] | None = None,
                 unversioned: set[str] | None = None):
        self.sizes: dict[str, int] = dict(sizes or {})
        # path -> (ETag, Last-Modified) as first learnt: the version every read asks for.
        self.versions: dict[str, tuple[str | None, str | None]] = dict(versions or {})
        self.unversioned: set[str] = set(unversioned or ())   # asked: the server gives none

    def state(self) -> dict:
        """What a pickled storage carries (:meth:`from_state` makes it again)."""
        return {'sizes': dict(self.sizes), 'versions': dict(self.versions),
                'unversioned': set(self.unversioned)}

    @classmethod
    def from_state(cls, state: dict) -> Versions:
        return cls(state.get('sizes'), state.get('versions'), state.get('unversioned'))

    def size_of(self, path: str) -> int | None:
        """The size of ``path`` as the open learnt it, or None where not known yet."""
        return self.sizes.get(path)

    def learn(self, path: str, size: Any = None, etag: Any = None, modified: Any = None) -> None:
        """Remember what the server said of object ``path`` (the first answer wins: the
        reader's snapshot)."""
        if size is not None:
            if self.sizes.setdefault(path, int(size)) != int(size):
                return      # another object than the one opened: its version is not ours
        etag = str(etag) if etag else None
        if hasattr(modified, 'astimezone'):             # s3fs: a datetime, in local time
            modified = modified.astimezone(datetime.UTC).strftime(
                '%a, %d %b %Y %H:%M:%S GMT')
        modified = str(modified) if modified else None
        if etag or modified:
            self.versions.setdefault(path, (etag, modified))

    def known(self, path: str) -> bool:
        """Whether the version of ``path`` is known, or known to be given by no one."""
        return path in self.versions or path in self.unversioned

    def etag(self, path: str) -> str | None:
        """The ETag of the version of ``path`` opened, or None."""
        return (self.versions.get(path) or (None, None))[0]

    def conditions(self, path: str) -> dict[str, str]:
        """The HTTP headers that ask for the version of ``path`` the reader opened.

        A strong ETag goes in ``If-Match``; without one (nginx's JSON listing
        gives a time, not an ETag; a weak ETag never matches) the time goes in
        ``If-Unmodified-Since``. The server answers 412 for another version.
        """
        etag, modified = self.versions.get(path) or (None, None)
        if etag and not etag.startswith('W/'):
            return {'If-Match': etag}
        if modified:
            return {'If-Unmodified-Since': modified}
        return {}

    def check(self, path: str, etag: str | None) -> None:
        """An answer's ETag against the one opened (for a store that ignores IfMatch)."""
        opened = self.etag(path)
        if etag and opened and etag != opened:
            raise VersionChanged(f'ETag {etag}, opened as {opened}')

    def modified(self, path: str) -> float | None:
        """The Last-Modified time of the version of ``path`` the reader opened (seconds since
        the epoch), or None where the server gave none."""
        modified = (self.versions.get(path) or (None, None))[1]
        try:
            return email.utils.parsedate_to_datetime(modified).timestamp() if modified else None
        except (TypeError, ValueError):
            return None

    def cache_name(self, path: str) -> str:
        """The name the local cache knows ``path`` by: with its size and version, so that
        an object replaced at the same URL never meets the old one's entries."""
        etag, modified = self.versions.get(path) or (None, None)
        return f'{path}\n{self.sizes.get(path)}\n{etag}\n{modified}'

    def forget(self, path: str) -> None:
        """Drop what was learnt of ``path`` and of what lies under it (it is being written)."""
        path = path.rstrip('/')

        def under(key: str) -> bool:
            return key == path or key.startswith(path + '/')
        self.unversioned = {k for k in self.unversioned if not under(k)}
        for table in (self.sizes, self.versions):
            for key in [k for k in table if under(k)]:
                del table[key]
