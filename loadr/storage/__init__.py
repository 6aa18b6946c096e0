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
:func:`using_storage_options` scopes the options of URLs and the storages of
one open. The rest is one concern per module: ``errors`` (every failure
mapped to a loadr error), ``staging`` (writes renamed or uploaded into
place), ``settings``, ``ranges``, ``readahead``, ``versions`` and
``caching`` of the remote storage, and the cache itself (``cache``,
``cachedir``, ``policy``).

Example::

    storage = storage_for('data/train')
    header = storage.read('data/train/refs.bag', 0, 8)
    with storage.open_write('out.bin') as f:     # .out.bin.loadr-tmp-… until commit
        f.write(b'abc')
        f.commit()
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os

from ..errors import ConfigError
from . import forks
from .base import Storage
from .errors import TRANSIENT_ERRNOS, mapped, read_error, transient
from .local import RECHECK_INTERVAL_S, LocalStorage
from .settings import split_url
from .staging import StagedDir, StagedFile, WriteFile

__all__ = ['Storage', 'LocalStorage', 'StagedFile', 'StagedDir', 'WriteFile', 'storage_for',
           'remote_storage', 'mapped', 'read_error', 'transient', 'is_url', 'CACHE_KEYS',
           'with_cache_settings', 'using_storage_options', 'merged_options', 'TRANSIENT_ERRNOS',
           'RECHECK_INTERVAL_S', 'storage_class']



# Reader options that are settings of a URL's storage (its local cache, storage.caching):
# loadr.open and YAML reader sections take them beside the reader's own.
CACHE_KEYS = ('cache_dir', 'cache_bytes', 'cache_policy')


def with_cache_settings(storage_options: dict | None, cache: dict) -> dict:
    """``storage_options`` with the :data:`CACHE_KEYS` in ``cache`` put under ``'loadr'``.

    ``None`` stands for the options in force (the command line's
    ``--storage-option``, see :func:`using_storage_options`): the cache
    settings are added to them, never put in their place.

    >>> with_cache_settings({'anon': True}, {'cache_bytes': 10})
    {'anon': True, 'loadr': {'cache_bytes': 10}}
    >>> with using_storage_options({'anon': True, 'loadr': {'retries': 1}}):
    ...     with_cache_settings(None, {'cache_bytes': 10})
    {'anon': True, 'loadr': {'retries': 1, 'cache_bytes': 10}}
    """
    if storage_options is None:
        storage_options = _OPTIONS.get()
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


# The storage_options of URLs opened without their own (detection, check, the CLI's
# --storage-option): set by ``with using_storage_options(...)``.
_OPTIONS = contextvars.ContextVar('loadr_storage_options', default=None)
# (fork generation, {key: storage}): the URL storages of one open (remote_storage).
_SCOPE = contextvars.ContextVar('loadr_storage_scope', default=None)


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


@contextlib.contextmanager
def using_storage_options(storage_options: dict | None):
    """Within the block, URLs get these storage options, under their own.

    A URL opened with ``storage_options`` of its own (a YAML reader's, a
    ``loadr.open`` argument) gets both, its own winning key by key
    (:func:`merged_options`): the command line's ``--storage-option`` is
    never dropped. ``None`` keeps those of an enclosing block. The
    block is also one open: the storages of its URLs are shared inside it
    (detection and the reader ask the server once) and learn afresh outside
    it (a dataset replaced at its URL is seen anew by the next open).

    >>> with using_storage_options({'anon': True}):
    ...     with using_storage_options(None):
    ...         _OPTIONS.get()
    {'anon': True}
    """
    token = _OPTIONS.set(merged_options(_OPTIONS.get(), storage_options))
    scope = _SCOPE.set(_SCOPE.get() or (forks.generation, {}))
    try:
        yield
    finally:
        _SCOPE.reset(scope)
        _OPTIONS.reset(token)


def storage_for(path, storage_options: dict | None = None) -> Storage:
    """The storage that reads and writes ``path``: local files, or an fsspec URL.

    URLs (``s3://``, ``https://``, …) go to :func:`remote_storage` (fsspec is
    imported then, not before).

    >>> type(storage_for('../shared/fixtures/bag')).__name__
    'LocalStorage'
    """
    if is_url(path):
        return remote_storage(os.fspath(path), merged_options(_OPTIONS.get(), storage_options))
    if storage_options:
        raise ConfigError(f'storage_options ({", ".join(map(str, storage_options))}) apply to '
                          f'URLs only; this is a local path', os.fspath(path))
    return LocalStorage()



def remote_storage(url: str, storage_options: dict | None = None):
    """The storage of ``url``: a new one, or within one open the same for a protocol and options.

    What a storage learns (listings, sizes, versions) is the snapshot a
    reader reads: shared within one open (``loadr.open``, a YAML reader, a
    command: :func:`using_storage_options`), so that detection and the
    reader ask once, and never across opens, so that a dataset replaced at
    its URL is seen anew by the next open. Options that are not plain data
    (an object in ``client_kwargs``) get a storage of their own. HTTP(S) and
    S3 get their subclasses of :class:`~loadr.storage.remote.RemoteStorage`.
    """
    cls = storage_class(url)
    shared = _SCOPE.get()
    if shared is None or shared[0] != forks.generation:   # none, or a forked parent's
        return cls(url, storage_options)
    try:
        key = (cls.__name__, url.partition('://')[0].lower(),
               json.dumps(storage_options or {}, sort_keys=True))
    except (TypeError, ValueError):
        return cls(url, storage_options)
    storage = shared[1].get(key)
    if storage is None:
        storage = shared[1][key] = cls(url, storage_options)
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
