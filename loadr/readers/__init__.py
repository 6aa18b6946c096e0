"""Readers for the on-disk formats, and ``open(path)`` that picks one.

A fourth format is one new module or package here (as ``bag/``: layout, reader,
writer, checks) that defines ``FORMAT`` (a :class:`~loadr.readers.base.Format`)
and one entry in ``FORMATS``.

Example::

    r = loadr.readers.open('../shared/fixtures/bag')    # a BagReader
    r = loadr.readers.FFRecordReader('train.ffr', check_data=True)
"""

from __future__ import annotations

import os

from ..errors import ConfigError, FormatError
from ..storage import CACHE_KEYS, is_url, settings_for, storage_for, with_cache_settings
from . import bag, ffrecord, folder, gulp, parquet, webdataset
from .bag import BagReader
from .base import Files, Format, Problem, Reader, check_index
from .ffrecord import FFRecordReader
from .folder import ImageFolderReader
from .gulp import GulpReader
from .parquet import ParquetReader
from .patterns import is_pattern, names_nothing
from .webdataset import WebDatasetReader

# The detection table: tried in this order, first match wins.
# A list of files, or a pattern (``{000..009}``, ``*``) naming them, is offered to every
# format too: those that read many files say whether they take it.
# Image folders come last: any directory with class folders of images would do.
FORMATS: tuple[Format, ...] = (gulp.FORMAT, ffrecord.FORMAT, bag.FORMAT, webdataset.FORMAT,
                               parquet.FORMAT, folder.FORMAT)

__all__ = ['open', 'formats', 'detect', 'Reader', 'Files', 'Format', 'Problem',
           'check_index', 'GulpReader', 'FFRecordReader', 'BagReader', 'WebDatasetReader',
           'ImageFolderReader', 'ParquetReader', 'FORMATS']


def formats() -> list[Format]:
    """Every known format, in detection order."""
    return list(FORMATS)


def detect(path: str | os.PathLike, storage_options=None) -> Format:
    """The :class:`Format` of ``path``, or a FormatError naming what was looked for;
    ``storage_options``: a URL's (the settings of the open, or a dict of them).

    >>> detect(FIXTURES / 'gulp').name
    'gulp'
    """
    if isinstance(path, (list, tuple)) or is_pattern(os.fspath(path)):
        # Files named by a list or a pattern: the formats that read many files say.
        path = path if isinstance(path, (list, tuple)) else os.fspath(path)
        if not isinstance(path, str) or not storage_for(path, storage_options).exists(path):
            for fmt in formats():
                if fmt.detects(path, storage_options):
                    return fmt
            raise FormatError(names_nothing(path) or (
                f"the files named are no dataset loadr knows (looked for: "
                f"{', '.join(f.name for f in formats())})"), str(path))
    path = os.fspath(path)
    storage = storage_for(path, storage_options)
    # A URL's storage tells a server it cannot reach (a ReadError with the cause) from
    # nothing being there; exists() alone would call both "no such file".
    kind = getattr(storage, 'kind', None)
    if not (kind(path) is not None if kind is not None else storage.exists(path)):
        raise FormatError('no such file or directory', path)
    for fmt in formats():
        if fmt.detects(path, storage_options):
            return fmt
    names = ', '.join(f.name for f in formats())
    raise FormatError(f'not a dataset loadr knows (looked for: {names})', path)


def open(path: str | os.PathLike, **options) -> Reader:  # noqa: A001 - mirrors builtins.open on purpose
    """Open a dataset of any known format; ``options`` go to its reader.

    A dataset behind a URL takes ``cache_dir=``, ``cache_bytes=`` (and
    ``cache_policy=``): a local cache of its records (see :mod:`loadr.storage.cache`).
    Without ``cache_bytes`` the cache may hold 10% of the disk space free
    under ``cache_dir`` at open, at most 50 GiB (:func:`loadr.storage.cachedir.default_budget`).

    >>> r = open(FIXTURES / 'ffrecord/single.ffr')
    >>> len(r)
    20
    """
    cache = {k: options.pop(k) for k in CACHE_KEYS if k in options}
    if cache:
        first = path[0] if isinstance(path, (list, tuple)) and path else path
        if not is_url(os.fspath(first)):
            raise ConfigError(f'{sorted(cache)} apply to datasets behind URLs; a local '
                              f'dataset is read in place', os.fspath(path))
        options['storage_options'] = with_cache_settings(options.get('storage_options'), cache)
    # A URL's settings, made once: the detection and the reader share its storage.
    settings = settings_for(path, options.get('storage_options'))
    if settings is not None:
        options['storage_options'] = settings
    reader = detect(path, settings).reader
    if not isinstance(path, (list, tuple)):
        path = os.fspath(path)
    return reader(path, **{**reader.open_defaults, **options})
