"""The fsspec filesystems of this process: made once per protocol and options, never dropped.

fsspec closes a dropped HTTP filesystem's session from the thread that drops
it, and when the IO loop is busy for 0.1 s it closes the connections there,
beside the loop, which loses a socket from the loop's epoll set (a read then
waits forever: seen as a timeout). Storages are pickled and copied freely;
their filesystems are not: :func:`filesystem` keeps one per protocol,
options and environment (a credentials chain reads it) for the process's life.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from ..errors import ConfigError
from . import forks
from .errors import one_line
from .settings import install_hint

__all__ = ['filesystem', 'filesystem_class']

_filesystems: dict[tuple, Any] = {}
_filesystems_lock = threading.Lock()
_kept: list = []
_ENVIRONMENT_PREFIXES = ('AWS_', 'GOOGLE_', 'GCS', 'FSSPEC', 'HTTP_PROXY', 'HTTPS_PROXY',
                         'NO_PROXY', 'http_proxy', 'https_proxy', 'no_proxy')


def _after_fork() -> None:
    # A forked child must not use the parent's filesystem objects (their sessions
    # belong to the parent's IO thread): forks.generation is part of their key.
    global _filesystems_lock
    _filesystems_lock = threading.Lock()    # another thread may have held it at fork


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork)


def _named(value: Any) -> str:
    """A function among a filesystem's options, by its name (json's ``default``)."""
    if callable(value) and hasattr(value, '__qualname__'):
        return f'{value.__module__}.{value.__qualname__}'
    raise TypeError(f'not JSON: {type(value).__name__}')


def filesystem_class(protocol: str, url: str) -> type:
    """fsspec's filesystem class of ``protocol``; a ConfigError naming what to install."""
    try:
        import fsspec
    except ImportError:
        raise ConfigError(f'reading {protocol}:// URLs needs fsspec, which is not '
                          f'installed: {install_hint(protocol)}', url) from None
    try:
        return fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        raise ConfigError(f'{protocol}:// needs a package that is not installed '
                          f'({one_line(exc)}): {install_hint(protocol)}', url) from None
    except ValueError:
        raise ConfigError(f'unknown protocol {protocol}:// (not an fsspec protocol): '
                          f'use a local path or a URL fsspec knows (s3://, gs://, '
                          f'https://, ...)', url) from None


def filesystem(protocol: str, url: str, options: dict) -> Any:
    """The filesystem of ``protocol`` made with ``options`` in this process (made now if
    not yet; asynchronous: a synchronous one is wrapped). ``url``: what a ConfigError
    names."""
    environment = tuple(sorted((k, v) for k, v in os.environ.items()
                               if k.startswith(_ENVIRONMENT_PREFIXES)))
    try:
        key: tuple | None = (forks.generation, protocol,
                             json.dumps(options, sort_keys=True, default=_named), environment)
    except (TypeError, ValueError):
        key = None
    with _filesystems_lock:         # the read-ahead thread may ask at once
        fs = _filesystems.get(key) if key is not None else None
        if fs is None:
            fs = _make(protocol, url, options)
            if key is not None:
                _filesystems[key] = fs
            else:
                _kept.append(fs)
    return fs


def _make(protocol: str, url: str, options: dict) -> Any:
    cls = filesystem_class(protocol, url)
    try:
        fs = cls(skip_instance_cache=True, **options)
    except Exception as exc:
        raise ConfigError(f'cannot make the {protocol}:// filesystem with these '
                          f'storage_options: {one_line(exc)}', url) from None
    if hasattr(fs, 'retries'):
        fs.retries = 1                 # s3fs: one try per call, we retry
    if not getattr(fs, 'async_impl', False):
        # A synchronous filesystem (sftp, memory, ...): its calls run in threads.
        try:
            from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
        except ImportError:
            raise ConfigError(f'{protocol}:// is a synchronous fsspec filesystem, '
                              f'which needs fsspec >= 2024.12: pip install -U fsspec',
                              url) from None
        fs = AsyncFileSystemWrapper(fs, asynchronous=False)
    return fs
