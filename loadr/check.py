"""``loadr.check(path)``: a full integrity check of any dataset.

Example::

    report = loadr.check('data/train')
    if not report.ok:
        for problem in report.problems:
            print(problem)          # names the file and the index
"""

from __future__ import annotations

import dataclasses
import functools
import os

from . import digests
from .errors import LoadrError
from .readers import detect
from .readers.base import Problem
from .storage import StorageSettings, settings_for

__all__ = ['check', 'Report', 'DIGESTS', 'layout', 'write_digests']

DIGESTS = 'digests recorded by loadr check --write-digests'


@dataclasses.dataclass
class Report:
    """What ``check`` found: the format (None if unknown), every problem, and what the bytes
    were checked against (``checksums``: the format's own, digests recorded beside the
    dataset, or None when neither exists and only structure and decoding were checked)."""

    path: str
    format: str | None
    problems: list[Problem]
    checksums: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return f'{self.path}: {self.format}, no problems'
        lines = [f'{self.path}: {self.format or "unknown format"}, '
                 f'{len(self.problems)} problem(s)']
        lines += [f'  {p}' for p in self.problems]
        return '\n'.join(lines)


def check(path: str | os.PathLike, storage_options: StorageSettings | dict | None = None
          ) -> Report:
    """Check every file of the dataset at ``path``; never raises for bad data.

    The format's own check (structure, every image and frame decoded, its
    checksums if it has any), then, if the dataset has digests beside it
    (``loadr check --write-digests``, :mod:`loadr.digests`), every file
    compared with them. ``storage_options`` are those of a URL (``s3://``,
    ``https://``; see loadr.storage.remote): its settings are made once and
    passed to the format's check and the digests' reads.

    >>> check(FIXTURES / 'bag').ok
    True
    """
    path = os.fspath(path)
    try:
        settings = settings_for(path, storage_options)
        fmt = detect(path, settings)
    except LoadrError as exc:
        return Report(path, None, [Problem(exc.path or path, exc.index, exc.message)])
    problems = list(fmt.checks(path, settings))
    against = [fmt.checksums] if fmt.checksums else []
    try:
        recorded = digests.load(path, settings)
    except LoadrError as exc:
        problems.append(Problem(exc.path or path, exc.index, exc.message))
        recorded = None
    if recorded is not None:
        layout_of = functools.partial(layout, storage_options=settings)
        problems += digests.verify(path, recorded, layout_of, settings)
        against.append(DIGESTS)
    return Report(path, fmt.name, problems, '; '.join(against) or None)


def layout(path: str, storage_options: StorageSettings | dict | None = None
           ) -> tuple[str, dict]:
    """The format's name and ``{file: its records (a digests.FileRecords) or None}`` for
    every file of the dataset at ``path``: what :mod:`loadr.digests` digests.
    ``storage_options``: a URL's (the settings of the open, or a dict of them).

    The format is detected here, not in :mod:`loadr.digests`, which the readers use.
    """
    settings = settings_for(path, storage_options)
    fmt = detect(path, settings)
    records = fmt.records_of(path, settings)        # None: a format without record offsets
    if records is not None:
        return fmt.name, records
    options = {} if settings is None else {'storage_options': settings}
    with fmt.reader(path, **options) as reader:
        return fmt.name, dict.fromkeys(reader._identity_files())


def write_digests(path, storage_options: StorageSettings | dict | None = None) -> str:
    """Record the digests of the dataset at ``path`` beside it (``loadr check
    --write-digests``); returns the sidecar's path. See :func:`loadr.digests.write`.
    ``storage_options``: a URL's (the settings of the open, or a dict of them)."""
    path = os.fspath(path)
    settings = settings_for(path, storage_options)
    return digests.write(path, functools.partial(layout, storage_options=settings), settings)
