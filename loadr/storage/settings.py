"""The settings of a remote storage: one typed :class:`StorageSettings`, checked once.

``storage_options`` go to the fsspec filesystem, except the key ``'loadr'``,
a dict of loadr's own settings (the fields of :class:`StorageSettings`)::

    loadr.open('s3://bucket/train', storage_options={
        'endpoint_url': 'http://127.0.0.1:9000',
        'loadr': {'retries': 3, 'timeout_s': 10}})

:meth:`StorageSettings.of` builds the settings from that dict once, when a
URL is opened, and refuses an unknown key or a wrong value with a
:class:`~loadr.errors.ConfigError` naming it; from there the settings object
itself is passed (``loadr.open`` → the reader → :func:`loadr.storage.storage_for`
→ the storage → each request), never the dict again.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from . import forks

__all__ = ['StorageSettings', 'DEFAULTS', 'EXTRAS', 'NUMBERS', 'CACHE_POLICIES', 'split_url',
           'install_hint']

CACHE_POLICIES = ('furthest', 'lru')


@dataclasses.dataclass(frozen=True, eq=False)
class StorageSettings:
    """loadr's settings of the storage of URLs (``storage_options['loadr']``), and the
    fsspec ``options`` (the rest of ``storage_options``).

    Made by :meth:`of`, which checks every value; frozen. Settings are those
    of one open: the URL storages made with one settings object are shared
    (detection and the reader ask the server once, see
    :func:`loadr.storage.remote_storage`), those of another object never, so
    that a dataset replaced at its URL is seen anew by the next open. Equality
    is identity for that reason.

    >>> s = StorageSettings.of({'anon': True, 'loadr': {'retries': 1}})
    >>> s.retries, s.timeout_s, dict(s.options)
    (1, 60.0, {'anon': True})
    """

    #: More attempts after the first, for a transient failure.
    retries: int = 5
    #: One read (all its attempts and pauses) gives up this long after it began.
    timeout_s: float = 60.0
    #: Backoff before attempt k+1: uniform(0.5, 1) * min(backoff_max_s, backoff_s * 2**k).
    backoff_s: float = 0.05
    backoff_max_s: float = 2.0
    #: Requests in flight at once, per process and storage.
    max_concurrency: int = 64
    #: Ranges of one file this close are fetched as one request. Small, so that
    #: the bytes fetched stay within a percent or two of the bytes needed.
    merge_gap_bytes: int = 512
    #: A merged request grows to at most this many bytes.
    max_request_bytes: int = 16 << 20
    #: Bytes read ahead and not yet consumed, per process and storage; the
    #: oldest are dropped beyond it.
    readahead_bytes: int = 64 << 20
    #: A file this small is read whole, once per process, the first time a range
    #: of it is read ahead (a bag's refs and small value bags: one request per
    #: file and process instead of one per file and batch); 0 turns it off. Not
    #: under cache_dir (the cache's entries are read range by range).
    small_file_bytes: int = 64 << 10
    #: The bytes of such whole files a process keeps, per storage; past it, ranges.
    small_files_bytes: int = 32 << 20
    #: HTTP(S): the ranges of one file that a batch needs go in one request
    #: (``Range: bytes=a-b,c-d,...``, answered multipart/byteranges), at most
    #: this many per request; 0 turns it off. A server that answers a
    #: multi-range request with the whole file is asked range by range.
    max_ranges: int = 64
    #: A local disk cache of record ranges (loadr.storage.cache), used under a Loader:
    #: a directory (one subdirectory per dataset is made in it), the bytes it
    #: may hold per dataset (None: cachedir.default_budget, a share of the free
    #: disk, fixed at open), and what it evicts when full: 'furthest' (the
    #: range read again furthest in the future, known from the order) or 'lru'.
    cache_dir: str | None = None
    cache_bytes: int | None = None
    cache_policy: str = 'furthest'
    #: S3: a range is a GET of the object's presigned URL (signed once an hour), not a
    #: botocore get_object (~1.2 ms of CPU each, against ~0.15); False: get_object.
    s3_presigned: bool = True
    #: The fsspec filesystem's options: ``storage_options`` without ``'loadr'``.
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, '_storages', None)

    def __getstate__(self) -> dict:
        # The storages shared by one open stay in their process (a copy is another open).
        state = dict(self.__dict__)
        state.pop('_storages', None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, '_storages', None)

    @classmethod
    def of(cls, storage_options: Mapping | StorageSettings | None,
           where: str | None = None) -> StorageSettings:
        """The settings of ``storage_options`` (a dict as the user gives it, or settings made
        already, returned as they are), checked; ``where``: the URL a ConfigError names."""
        if isinstance(storage_options, StorageSettings):
            return storage_options
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ConfigError(f'storage_options must be a dict, not '
                              f'{type(storage_options).__name__}', where)
        options = dict(storage_options or {})
        given = options.pop('loadr', None) or {}
        if not isinstance(given, Mapping):
            raise ConfigError(f"storage_options['loadr'] must be a dict of {sorted(DEFAULTS)}",
                              where)
        unknown = sorted(set(given) - set(DEFAULTS))
        if unknown:
            raise ConfigError(f"unknown storage_options['loadr'] settings {unknown}; known: "
                              f'{sorted(DEFAULTS)}', where)
        values = {key: checked(key, value, where) for key, value in given.items()}
        if values.get('cache_dir'):
            if values.get('cache_bytes') is None:
                from .cachedir import default_budget  # numpy: not on import loadr
                values['cache_bytes'] = int(default_budget(values['cache_dir']))
            elif not values['cache_bytes'] >= 1:
                raise ConfigError(f"cache_bytes must be a number of bytes > 0, not "
                                  f"{values['cache_bytes']!r}; leave it out for the default (a "
                                  f"share of the free disk)", where)
            values['cache_bytes'] = int(values['cache_bytes'])
        return cls(options=options, **values)

    def as_options(self) -> dict:
        """These settings as ``storage_options`` again (the ``'loadr'`` settings that differ
        from the defaults).

        >>> StorageSettings.of({'anon': True, 'loadr': {'retries': 1}}).as_options()
        {'anon': True, 'loadr': {'retries': 1}}
        """
        own = {key: getattr(self, key) for key, default in DEFAULTS.items()
               if getattr(self, key) != default}
        return {**self.options, **({'loadr': own} if own else {})}

    def shared(self) -> dict:
        """The storages made with these settings in this process (one open's), by what
        tells them apart (see :func:`loadr.storage.remote_storage`); empty in a forked
        child, whose storages are its own."""
        storages = self.__dict__.get('_storages')
        if storages is None or storages[0] != forks.generation:
            storages = (forks.generation, {})
            object.__setattr__(self, '_storages', storages)
        return storages[1]


DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(StorageSettings)
                            if f.name != 'options'}


# The numeric settings: (whole number?, least, most). Each is checked once, when the
# settings are made: an inf or a nan would otherwise surface much later as an
# OverflowError (int(inf)), no timeout at all (a comparison with nan is False),
# or another error far from its cause.
NUMBERS = {
    'retries': (True, 0, 1000),
    'timeout_s': (False, 1e-3, 7 * 86400.0),
    'backoff_s': (False, 0, 3600.0),
    'backoff_max_s': (False, 0, 3600.0),
    'max_concurrency': (True, 1, 1 << 16),
    'merge_gap_bytes': (True, 0, 1 << 40),
    'max_request_bytes': (True, 1, 1 << 40),
    'readahead_bytes': (True, 0, 1 << 50),
    'small_file_bytes': (True, 0, 1 << 40),
    'small_files_bytes': (True, 0, 1 << 50),
    'max_ranges': (True, 0, 1 << 16),
}


def checked(key: str, value: Any, where: str | None) -> Any:
    """``value`` of setting ``key``, checked and converted; a ConfigError naming both if not."""
    if key == 'cache_dir':
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f'cache_dir must be a local directory, not {value!r}', where)
        return None if value is None else os.fspath(value)
    if key == 'cache_policy':
        if value not in CACHE_POLICIES:
            raise ConfigError(f'cache_policy must be one of {list(CACHE_POLICIES)}, '
                              f'not {value!r}', where)
        return value
    if key == 'cache_bytes':
        # Named as the user gave it (loadr.open, YAML), not as storage_options['loadr'].
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, (int, float)) or not 0 <= value < float('inf')):
            raise ConfigError(f'cache_bytes must be a number of bytes > 0, not '
                              f'{value!r}; leave it out for the default (a share of the '
                              f'free disk)', where)
        return value
    if key == 's3_presigned':
        if not isinstance(value, bool):
            raise ConfigError(f's3_presigned must be True or False, not {value!r}', where)
        return value
    return number(key, value, where)


def number(key: str, value: Any, where: str | None) -> int | float:
    """``value`` of numeric setting ``key``, checked (finite, in range); a ConfigError if not."""
    whole, least, most = NUMBERS[key]
    what = 'a whole number' if whole else 'a number'
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)   # numpy's too
    if ok and not isinstance(value, numbers.Integral):
        ok = math.isfinite(value) and (not whole or float(value).is_integer())
    if not ok or not least <= value <= most:
        raise ConfigError(f"storage_options['loadr'][{key!r}] must be {what} from {least:g} "
                          f'to {most:g}, not {value!r}', where)
    return int(value) if whole else float(value)


# The extra that installs each protocol's package.
EXTRAS = {'s3': 's3', 's3a': 's3', 'gs': 'gcs', 'gcs': 'gcs', 'http': 'http', 'https': 'http'}


def split_url(url: str) -> tuple[str, str]:
    """``(protocol, rest)`` of a URL.

    >>> split_url('s3://bucket/train/refs.bag')
    ('s3', 'bucket/train/refs.bag')
    """
    scheme, sep, rest = url.partition('://')
    if not sep:
        raise ConfigError('not a URL (expected scheme://...)', url)
    return scheme.lower(), rest


# What each extra installs (pyproject.toml), for the hint: the packages by name, since
# "loadr" on the package index is another project and loadr may run from a checkout.
_EXTRA_PACKAGES = {'s3': 'fsspec s3fs', 'gcs': 'fsspec gcsfs', 'http': 'fsspec aiohttp'}


def install_hint(protocol: str) -> str:
    """What to install for URLs of ``protocol``.

    >>> install_hint('gs')[:24]
    'pip install fsspec gcsfs'
    """
    extra = EXTRAS.get(protocol)
    if extra:
        return (f"pip install {_EXTRA_PACKAGES[extra]} (the '{extra}' extra: pip install -e "
                f"'.[{extra}]' in loadr's checkout)")
    return f'install fsspec and the fsspec package for {protocol}:// (see fsspec\'s list)'
