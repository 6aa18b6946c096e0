"""Readers for the on-disk formats, and ``open(path)`` that picks one.

A fourth format is one new module here that defines ``FORMAT`` (a
:class:`~loadr.readers.base.Format`) and one line in ``FORMAT_MODULES``.

Example::

    r = loadr.readers.open('../shared/fixtures/bag')    # a BagReader
    r = loadr.readers.FFRecordReader('train.ffr', check_data=True)
"""

from __future__ import annotations

import importlib
import os

from ..errors import FormatError
from .base import Files, Format, Problem, Reader, check_index

# The detection table: tried in this order, first match wins.
FORMAT_MODULES = ('gulp', 'ffrecord', 'bag')

_CLASSES = {
    'GulpReader': 'gulp', 'FFRecordReader': 'ffrecord', 'BagReader': 'bag',
}

__all__ = ['open', 'formats', 'detect', 'Reader', 'Files', 'Format', 'Problem',
           'check_index', *_CLASSES]


def formats() -> list[Format]:
    """Every known format, in detection order."""
    return [importlib.import_module(f'{__name__}.{m}').FORMAT for m in FORMAT_MODULES]


def detect(path: str | os.PathLike) -> Format:
    """The :class:`Format` of ``path``, or a FormatError naming what was looked for.

    >>> detect('../shared/fixtures/gulp').name
    'gulp'
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FormatError('no such file or directory', path)
    for fmt in formats():
        if fmt.detect(path):
            return fmt
    names = ', '.join(f.name for f in formats())
    raise FormatError(f'not a dataset loadr knows (looked for: {names})', path)


def open(path: str | os.PathLike, **options) -> Reader:  # noqa: A001 - mirrors builtins.open on purpose
    """Open a dataset of any known format; ``options`` go to its reader.

    >>> r = open('../shared/fixtures/ffrecord/single.ffr')
    >>> len(r)
    20
    """
    return detect(path).reader(os.fspath(path), **options)


def __getattr__(name):
    # Reader classes load on first use so one broken or slow format never
    # slows down `import loadr` in every worker.
    if name in _CLASSES:
        return getattr(importlib.import_module(f'{__name__}.{_CLASSES[name]}'), name)
    raise AttributeError(name)
