"""Every byte loadr's readers and writers touch goes through one small interface.

A *storage* answers for the paths of one kind: local files
(:mod:`~loadr.storage.local`), or URLs of an fsspec protocol
(:mod:`~loadr.storage.remote`, with HTTP and S3 as subclasses in
:mod:`~loadr.storage.http` and :mod:`~loadr.storage.s3`). What readers and
writers use, and nothing else (:class:`~loadr.storage.base.Storage`)::

    size(path, index=None) -> int
    read(path, offset, length, index=None) -> bytes      exactly ``length`` bytes
    read_many([(path, offset, length, index), ...]) -> [bytes, ...]
    read_all(path, index=None, max_bytes=None) -> bytes  a whole small file
    list(path) -> [name, ...]                            a directory's names, sorted
    exists(path), isdir(path), isfile(path) -> bool      never raise
    occupied(path) -> bool                               anything but an empty directory
    open_write(path) -> StagedFile                       renamed into place by commit()
    stage_dir(path, parents=False) -> StagedDir          a directory, the same way
    caching, cache_clock(root, order, start, count), cache_flush()   a local cache's clock
    close()

This module is the factory: :func:`storage_for` picks the storage of a path,
given the :class:`~loadr.storage.settings.StorageSettings` of the open (made
once by :func:`settings_for` from the user's ``storage_options`` and passed
down explicitly: the storages of one open are shared). The rest is one
concern per module: ``errors`` (every failure mapped to a loadr error),
``staging`` (writes renamed or uploaded into place), ``settings``,
``filesystems``, ``ranges``, and the parts the remote storage holds
(``versions``, ``caching``, ``readahead``), and the cache itself (``cache``,
``cachedir``, ``policy``).

Example::

    storage = storage_for('data/train')
    header = storage.read('data/train/refs.bag', 0, 8)
    with storage.open_write('out.bin') as f:     # .out.bin.loadr-tmp-… until commit
        f.write(b'abc')
        f.commit()
"""

from __future__ import annotations

import os

from ..errors import ConfigError
from .base import Storage
from .errors import TRANSIENT_ERRNOS, mapped, read_error, transient
from .local import RECHECK_INTERVAL_S, LocalStorage
from .settings import StorageSettings, split_url
from .staging import StagedDir, StagedFile, WriteFile

__all__ = ['Storage', 'LocalStorage', 'StagedFile', 'StagedDir', 'WriteFile', 'storage_for',
           'remote_storage', 'mapped', 'read_error', 'transient', 'is_url', 'CACHE_KEYS',
           'with_cache_settings', 'merged_options', 'TRANSIENT_ERRNOS',
           'RECHECK_INTERVAL_S', 'storage_class', 'StorageSettings', 'settings_for']



# Reader options that are settings of a URL's storage (its local cache, storage.caching):
# loadr.open and YAML reader sections take them beside the reader's own.
CACHE_KEYS = ('cache_dir', 'cache_bytes', 'cache_policy')


def with_cache_settings(storage_options: dict | None, cache: dict) -> dict:
    """``storage_options`` with the :data:`CACHE_KEYS` in ``cache`` put under ``'loadr'``.

    >>> with_cache_settings({'anon': True}, {'cache_bytes': 10})
    {'anon': True, 'loadr': {'cache_bytes': 10}}
    """
    options = dict(storage_options or {})
    options['loadr'] = {**(options.get('loadr') or {}), **cache}
    return options


def is_url(path) -> bool:
    """True for ``scheme://…`` (other than ``file://``): a path no local storage can open.

    >>> is_url('s3://bucket/x'), is_url('data/train'), is_url('C:/data')
    (True, False, False)
    """
    text = os.fspath(path) if not isinstance(path, str) else path
    scheme, sep, _ = text.partition('://')
    return bool(sep) and scheme.isidentifier() and scheme != 'file' and len(scheme) > 1


def merged_options(outer: dict | None, own: dict | None) -> dict | None:
    """``own`` storage options over ``outer`` ones, key by key; dict values (the
    ``'loadr'`` settings, ``client_kwargs``, ...) merged one level down.

    >>> merged_options({'endpoint_url': 'http://h', 'loadr': {'retries': 1}},
    ...                {'loadr': {'cache_bytes': 10}})
    {'endpoint_url': 'http://h', 'loadr': {'retries': 1, 'cache_bytes': 10}}
    """
    if not outer:
        return own
    if own is None:
        return outer
    out = dict(outer)
    for key, value in own.items():
        below = out.get(key)
        out[key] = {**below, **value} if isinstance(value, dict) and isinstance(below, dict) \
            else value
    return out


def settings_for(path, storage_options: StorageSettings | dict | None = None
                 ) -> StorageSettings | None:
    """The :class:`StorageSettings` of one open of ``path``: those given, or made once from
    a ``storage_options`` dict; None for a local path, which takes none.

    An opener (``loadr.open``, a YAML reader, ``loadr.check``, a command) calls it once
    and passes the settings to everything it opens: the storages they make are then
    shared (see :func:`remote_storage`). Options of a whole command (the CLI's
    ``--storage-option``) are merged under a reader's own by the caller
    (:func:`merged_options`) and passed in like any others.

    >>> settings_for('s3://b/x', {'loadr': {'retries': 1}}).retries
    1
    >>> settings_for('data/train') is None
    True
    """
    if isinstance(storage_options, StorageSettings):
        return storage_options
    first = path[0] if isinstance(path, (list, tuple)) and path else path
    if isinstance(first, (str, os.PathLike)) and is_url(first):
        return StorageSettings.of(storage_options, os.fspath(first))
    if storage_options:
        raise ConfigError(f'storage_options ({", ".join(map(str, storage_options))}) apply to '
                          f'URLs only; this is a local path', os.fspath(first))
    return None


def storage_for(path, storage_options: StorageSettings | dict | None = None) -> Storage:
    """The storage that reads and writes ``path``: local files, or an fsspec URL.

    URLs (``s3://``, ``https://``, …) go to :func:`remote_storage` (fsspec is
    imported then, not before), with ``storage_options``: the
    :class:`StorageSettings` of the open, or a dict of them (checked here).

    >>> type(storage_for('../shared/fixtures/bag')).__name__
    'LocalStorage'
    """
    if is_url(path):
        return remote_storage(os.fspath(path), storage_options)
    if storage_options:
        what = storage_options.as_options() if isinstance(storage_options, StorageSettings) \
            else storage_options
        raise ConfigError(f'storage_options ({", ".join(map(str, what))}) apply to '
                          f'URLs only; this is a local path', os.fspath(path))
    return LocalStorage()


def remote_storage(url: str, storage_options: StorageSettings | dict | None = None) -> Storage:
    """The storage of ``url``: the one made already with the same settings and protocol, or
    a new one.

    What a storage learns (listings, sizes, versions) is the snapshot a
    reader reads: shared by every open of one :class:`StorageSettings`
    (``loadr.open``, a YAML reader, a command make them once and pass them
    down), so that detection and the reader ask once, and never across
    settings, so that a dataset replaced at its URL is seen anew by the next
    open. A ``storage_options`` dict makes settings of its own: a new storage.
    HTTP(S) and S3 get their subclasses of
    :class:`~loadr.storage.remote.RemoteStorage`.
    """
    cls = storage_class(url)
    settings = settings_for(url, storage_options)
    assert settings is not None                 # a URL's
    shared = settings.shared()
    key = (cls.__name__, url.partition('://')[0].lower())
    storage = shared.get(key)
    if storage is None:
        storage = shared[key] = cls(url, settings)
    return storage


def storage_class(url: str) -> type:
    """The class of the storage of ``url``'s protocol.

    >>> storage_class('s3://b/x').__name__, storage_class('https://h/x').__name__
    ('S3Storage', 'HTTPStorage')
    """
    protocol, _ = split_url(url)          # fsspec's world: imported when a URL is opened
    if protocol in ('http', 'https'):
        from .http import HTTPStorage
        return HTTPStorage
    if protocol in ('s3', 's3a'):
        from .s3 import S3Storage
        return S3Storage
    from .remote import RemoteStorage
    return RemoteStorage
