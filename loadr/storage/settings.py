"""The settings of a remote storage: ``storage_options['loadr']``, checked once at open.

``storage_options`` go to the fsspec filesystem, except the key ``'loadr'``,
a dict of these settings (:data:`DEFAULTS`)::

    loadr.open('s3://bucket/train', storage_options={
        'endpoint_url': 'http://127.0.0.1:9000',
        'loadr': {'retries': 3, 'timeout_s': 10}})
"""

from __future__ import annotations

import math
import numbers
import os

from ..errors import ConfigError

__all__ = ['DEFAULTS', 'EXTRAS', 'split_url', 'install_hint', 'settings_of', 'NUMBERS']

DEFAULTS = {
    # More attempts after the first, for a transient failure.
    'retries': 5,
    # One read (all its attempts and pauses) gives up this long after it began.
    'timeout_s': 60.0,
    # Backoff before attempt k+1: uniform(0.5, 1) * min(backoff_max_s, backoff_s * 2**k).
    'backoff_s': 0.05,
    'backoff_max_s': 2.0,
    # Requests in flight at once, per process and storage.
    'max_concurrency': 64,
    # Ranges of one file this close are fetched as one request. Small, so that
    # the bytes fetched stay within a percent or two of the bytes needed.
    'merge_gap_bytes': 512,
    # A merged request grows to at most this many bytes.
    'max_request_bytes': 16 << 20,
    # Bytes read ahead and not yet consumed, per process and storage; the
    # oldest are dropped beyond it.
    'readahead_bytes': 64 << 20,
    # A file this small is read whole, once per process, the first time a range
    # of it is read ahead (a bag's refs and small value bags: one request per
    # file and process instead of one per file and batch); 0 turns it off. Not
    # under cache_dir (the cache's entries are read range by range).
    'small_file_bytes': 64 << 10,
    # The bytes of such whole files a process keeps, per storage; past it, ranges.
    'small_files_bytes': 32 << 20,
    # HTTP(S): the ranges of one file that a batch needs go in one request
    # (``Range: bytes=a-b,c-d,...``, answered multipart/byteranges), at most
    # this many per request; 0 turns it off. A server that answers a
    # multi-range request with the whole file is asked range by range.
    'max_ranges': 64,
    # A local disk cache of record ranges (loadr.storage.cache), used under a Loader:
    # a directory (one subdirectory per dataset is made in it), the bytes it
    # may hold per dataset (None: cachedir.default_budget, a share of the free
    # disk, fixed at open), and what it evicts when full: 'furthest' (the
    # range read again furthest in the future, known from the order) or 'lru'.
    'cache_dir': None,
    'cache_bytes': None,
    'cache_policy': 'furthest',
    # S3: a range is a GET of the object's presigned URL (signed once an hour), not a
    # botocore get_object (~1.2 ms of CPU each, against ~0.15); False: get_object.
    's3_presigned': True,
}
_CACHE_POLICIES = ('furthest', 'lru')



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
    extra = EXTRAS.get(protocol)
    if extra:
        return (f"pip install {_EXTRA_PACKAGES[extra]} (the '{extra}' extra: pip install -e "
                f"'.[{extra}]' in loadr's checkout)")
    return f'install fsspec and the fsspec package for {protocol}:// (see fsspec\'s list)'


# The numeric settings: (whole number?, least, most). Each is checked once, when the
# storage is made: an inf or a nan would otherwise surface much later as an
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


def _number(key: str, value, url: str) -> int | float:
    """``value`` of numeric setting ``key``, checked (finite, in range); a ConfigError if not."""
    whole, least, most = NUMBERS[key]
    what = 'a whole number' if whole else 'a number'
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)   # numpy's too
    if ok and not isinstance(value, numbers.Integral):
        ok = math.isfinite(value) and (not whole or float(value).is_integer())
    if not ok or not least <= value <= most:
        raise ConfigError(f"storage_options['loadr'][{key!r}] must be {what} from {least:g} "
                          f'to {most:g}, not {value!r}', url)
    return int(value) if whole else float(value)


def settings_of(options: dict, url: str) -> dict:
    """The settings in ``options["loadr"]`` (taken out of ``options``), checked; defaults for
    the rest. A ConfigError names what is wrong."""
    given = options.pop('loadr', None) or {}
    if not isinstance(given, dict):
        raise ConfigError(f"storage_options['loadr'] must be a dict of {sorted(DEFAULTS)}", url)
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown storage_options['loadr'] settings {unknown}; known: "
                          f'{sorted(DEFAULTS)}', url)
    settings = dict(DEFAULTS)
    for key, value in given.items():
        if key == 'cache_dir':
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f'cache_dir must be a local directory, not {value!r}', url)
            value = None if value is None else os.fspath(value)
        elif key == 'cache_policy':
            if value not in _CACHE_POLICIES:
                raise ConfigError(f'cache_policy must be one of {list(_CACHE_POLICIES)}, '
                                  f'not {value!r}', url)
        elif key == 'cache_bytes':
            # Named as the user gave it (loadr.open, YAML), not as storage_options['loadr'].
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, (int, float)) or not 0 <= value < float('inf')):
                raise ConfigError(f'cache_bytes must be a number of bytes > 0, not '
                                  f'{value!r}; leave it out for the default (a share of the '
                                  f'free disk)', url)
        elif key == 's3_presigned':
            if not isinstance(value, bool):
                raise ConfigError(f's3_presigned must be True or False, not {value!r}', url)
        elif key in NUMBERS:
            value = _number(key, value, url)
        settings[key] = value
    if settings['cache_dir']:
        if settings['cache_bytes'] is None:
            from .cachedir import default_budget    # numpy: not on import loadr
            settings['cache_bytes'] = default_budget(settings['cache_dir'])
        elif not settings['cache_bytes'] >= 1:
            raise ConfigError(f"cache_bytes must be a number of bytes > 0, not "
                              f"{settings['cache_bytes']!r}; leave it out for the default (a "
                              f"share of the free disk)", url)
    return settings


# ---------------------------------------------------------------------------
# Errors
