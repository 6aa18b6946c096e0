"""The Reader protocol and the small parts every format shares.

The contract every reader keeps (and ``tests/readers/common.py`` checks):

- ``len(r)`` datapoints, addressed ``0 .. len(r) - 1``; ``r[i]`` returns a
  dict. Any other index (negative, too large, not an int) raises IndexError
  or TypeError.
- ``r[i, mask]`` reads only the keys in ``mask``; for a sequence key the mask
  value may be ``True`` (all of it), a ``range`` or a list of positions, and
  only those elements are read from disk. ``r.available(i)`` returns
  ``{key: True | range(n)}`` without reading values.
- ``r.read_batch(indices)`` returns ``[r[i] for i in indices]``, possibly
  faster.
- Deterministic: the same index gives the same bytes, from any process.
- Picklable: files are opened lazily, once per process; no file handle
  crosses a process boundary. Every byte is read through the storage of
  :mod:`loadr.storage` (locally ``os.pread``, so threads and forked children
  never share a file position), which also notices a file replaced after
  the reader was made, in every process.
- ``r.identity()`` is a small JSON-able dict naming what is read (format,
  files relative to the dataset root, sizes, datapoints), cheap to compute.
- Every failure on bad data raises a :mod:`loadr.errors` error that names the
  file and the index.

Example::

    r = loadr.open('data/train')
    print(len(r), r.spec)
    first = r[0]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Iterable, Sequence

from ..storage import LocalStorage as Files
from ..storage import read_error

__all__ = ['Reader', 'Files', 'Format', 'Problem', 'check_index', 'read_error']

# Above this many files, identity() lists them by a hash of their names and sizes.
IDENTITY_MAX_FILES = 16


def check_index(i: Any, n: int) -> int:
    """Return ``i`` as an int in ``[0, n)`` or raise IndexError/TypeError.

    >>> check_index(3, 10)
    3
    """
    if isinstance(i, bool) or not hasattr(i, '__index__'):
        raise TypeError(f'datapoint index must be an integer, not {type(i).__name__}')
    i = i.__index__()
    if not 0 <= i < n:
        raise IndexError(f'index {i} out of range for {n} datapoints')
    return i


class Reader:
    """Base class for loadr's readers; see the module docstring for the contract.

    Subclasses implement ``__len__``, ``_get(i, mask)``, ``available(i)`` and
    ``spec``; this class handles index checking and masks.
    """

    spec: dict

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _get(self, index: int, mask: dict | None) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def available(self, index: int) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getitem__(self, key) -> dict:
        if isinstance(key, tuple):
            if len(key) != 2:
                raise TypeError('use reader[index] or reader[index, mask]')
            index, mask = key
            if not isinstance(mask, dict):
                raise TypeError(f'mask must be a dict, not {type(mask).__name__}')
        else:
            index, mask = key, None
        return self._get(check_index(index, len(self)), mask)

    def read_batch(self, indices: Iterable[int]) -> list[dict]:
        """Datapoints for ``indices``, in order. Example: ``r.read_batch([4, 0, 9])``."""
        return [self[i] for i in indices]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    # The format's name in the table of loadr.readers; each reader sets it.
    format_name: str = ''

    def _identity_files(self) -> dict[str, int]:  # pragma: no cover - abstract
        """``{path: size in bytes}`` of every file the reader reads, as it saw them when made."""
        raise NotImplementedError

    def identity(self) -> dict:
        """What this reader reads, small and JSON-able: format, datapoints, files and sizes.

        Paths are relative to the dataset (a directory, or the directory of a
        single file), so a dataset that moves keeps its identity. Nothing is
        hashed but the list of names (when there are more than
        :data:`IDENTITY_MAX_FILES` files): computing it costs no read.

        >>> import loadr
        >>> loadr.open('../shared/fixtures/ffrecord/single.ffr').identity()
        {'format': 'ffrecord', 'datapoints': 20, 'files': {'single.ffr': 144202}}
        """
        root = self.path if self._files.isdir(self.path) else os.path.dirname(self.path)
        files = {os.path.relpath(p, root).replace(os.sep, '/'): int(size)
                 for p, size in sorted(self._identity_files().items())}
        out = {'format': self.format_name, 'datapoints': len(self)}
        if len(files) <= IDENTITY_MAX_FILES:
            out['files'] = files
        else:
            listing = json.dumps(sorted(files.items()), separators=(',', ':')).encode()
            out.update(file_count=len(files), bytes=sum(files.values()),
                       files_sha256=hashlib.sha256(listing).hexdigest())
        return out

    def close(self) -> None:
        files = getattr(self, '_files', None)
        if files is not None:
            files.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        path = getattr(self, 'path', '?')
        return f'{type(self).__name__}({str(path)!r}, {len(self)} datapoints)'


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem ``loadr.check`` found: the file, the index (or None), what is wrong."""

    path: str
    index: int | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.index is None else f'{self.path} [index {self.index}]'
        return f'{where}: {self.message}'


@dataclasses.dataclass(frozen=True)
class Format:
    """One row of the detection table in ``loadr.readers``.

    ``detect(path) -> bool`` must be cheap and must not raise; ``check(path)``
    returns every :class:`Problem` it finds.
    """

    name: str
    detect: Callable[[str], bool]
    reader: type
    writer: type
    check: Callable[[str], Sequence[Problem]]
