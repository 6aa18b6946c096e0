"""``loadr.check(path)``: a full integrity check of any dataset.

Example::

    report = loadr.check('data/train')
    if not report.ok:
        for problem in report.problems:
            print(problem)          # names the file and the index
"""

from __future__ import annotations

import dataclasses
import os

from .errors import LoadrError
from .readers import detect
from .storage import using_storage_options
from .readers.base import Problem

__all__ = ['check', 'Report']


@dataclasses.dataclass
class Report:
    """What ``check`` found: the format (None if unknown) and every problem."""

    path: str
    format: str | None
    problems: list[Problem]

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


def check(path: str | os.PathLike, storage_options: dict | None = None) -> Report:
    """Check every file of the dataset at ``path``; never raises for bad data.

    ``storage_options`` are those of a URL (``s3://``, ``https://``; see loadr.remote).

    >>> check('../shared/fixtures/bag').ok
    True
    """
    path = os.fspath(path)
    with using_storage_options(storage_options):
        try:
            fmt = detect(path)
        except LoadrError as exc:
            return Report(path, None, [Problem(exc.path or path, exc.index, exc.message)])
        return Report(path, fmt.name, list(fmt.check(path)))
