"""Digests of every record, kept beside a dataset, for formats that have no checksums.

Bag and gulp files carry no checksum: a flipped byte inside a JPEG still
decodes, to other pixels. ``loadr check --write-digests PATH`` (or
:func:`write`) records, for every file of the dataset, a digest of the whole
file and one of each record in it (a bag record, a gulp frame, an FFRecord
sample), in one *sidecar* file beside the dataset::

    data/train                  the dataset, untouched (its own readers ignore the sidecar)
    data/train.loadr-digests    msgpack: {'loadr': 'digests', 'version': 1, 'format',
                                          'algorithm': 'blake2b', 'files': {relative path:
                                          {'size', 'file': 16-byte digest,
                                           'records': 8-byte digest per record}}}

``loadr check`` then compares every file with it and names the file and the
datapoint whose bytes changed; readers opened with ``verify=True`` check each
record they read against it. Where a format's records lie is the format's to
say (the ``records`` entry of its row in :data:`loadr.readers.FORMATS`); a
format without one gets whole-file digests.

Example::

    write('data/train')                    # after a clean check
    loadr.check('data/train')              # now also compares the digests
    loadr.open('data/train', verify=True)  # ChecksumError on a changed record
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Literal, overload

import msgpack
import numpy as np

from .errors import ChecksumError, ConfigError, FormatError, LoadrError, Problem
from .storage import Storage, StorageSettings, storage_for

__all__ = ['SUFFIX', 'FileRecords', 'Digests', 'sidecar_path', 'write', 'load', 'verify',
           'record_digest', 'check_record']

SUFFIX = '.loadr-digests'
VERSION = 1
RECORD_DIGEST_BYTES = 8
FILE_DIGEST_BYTES = 16
BLOCK_BYTES = 8 << 20         # files and runs of records are read this much at a time
SIDECAR_MAX_BYTES = 1 << 34   # a sidecar larger than this is not one of ours


def record_digest(data) -> bytes:
    """The digest of one record: 8 bytes of BLAKE2b.

    >>> record_digest(b'abc').hex()
    'd8bb14d833d59559'
    """
    return hashlib.blake2b(data, digest_size=RECORD_DIGEST_BYTES).digest()


@dataclasses.dataclass
class FileRecords:
    """Where the records of one file lie, and the datapoint each belongs to (-1: none)."""

    starts: np.ndarray
    ends: np.ndarray
    owners: np.ndarray


def sidecar_path(path) -> str:
    """The sidecar of the dataset at ``path``: a sibling named ``<name>.loadr-digests``.

    >>> sidecar_path('data/train/')
    'data/train.loadr-digests'
    """
    return os.fspath(path).rstrip('/') + SUFFIX


def _root(storage: Storage, path: str) -> str:
    return path if storage.isdir(path) else os.path.dirname(path)


def _relative(root: str, file: str) -> str:
    return os.path.relpath(file, root).replace(os.sep, '/') if root else file


def _digest_file(storage: Storage, file: str, records: FileRecords | None
                 ) -> tuple[int, bytes, bytes]:
    """(size, whole-file digest, record digests) of one file, read a block at a time."""
    size = storage.size(file)
    whole = hashlib.blake2b(digest_size=FILE_DIGEST_BYTES)
    for at in range(0, size, BLOCK_BYTES):
        whole.update(storage.read(file, at, min(BLOCK_BYTES, size - at)))
    out = bytearray()
    if records is not None:
        starts, ends = records.starts.tolist(), records.ends.tolist()
        i, n = 0, len(starts)
        while i < n:
            lo = starts[i]
            if ends[i] - lo > BLOCK_BYTES:           # one large record: in pieces
                h = hashlib.blake2b(digest_size=RECORD_DIGEST_BYTES)
                for at in range(lo, ends[i], BLOCK_BYTES):
                    h.update(storage.read(file, at, min(BLOCK_BYTES, ends[i] - at)))
                out += h.digest()
                i += 1
                continue
            j, hi = i, ends[i]                       # records that fit one read from lo
            while j + 1 < n and starts[j + 1] >= lo and ends[j + 1] - lo <= BLOCK_BYTES:
                j += 1
                hi = max(hi, ends[j])
            view = memoryview(storage.read(file, lo, hi - lo))
            for k in range(i, j + 1):
                out += record_digest(view[starts[k] - lo:ends[k] - lo])
            i = j + 1
    return size, whole.digest(), bytes(out)


def write(path, layout_of, storage_options: StorageSettings | dict | None = None) -> str:
    """Record the digests of the dataset at ``path`` in its sidecar; returns the sidecar's path.

    ``layout_of(path)`` is the format's name and ``{file: FileRecords or None}``
    (:func:`loadr.check.layout`: it knows the formats, this module does not).
    Write them when the dataset is known to be good (``loadr check --write-digests``
    does so only after a clean check, :func:`loadr.check.write_digests`). An older
    sidecar is replaced.
    """
    path = os.fspath(path)
    storage = storage_for(path, storage_options)
    name, layout = layout_of(path)
    root = _root(storage, path)
    files = {}
    for file, records in layout.items():
        size, whole, digests = _digest_file(storage, file, records)
        files[_relative(root, file)] = {'size': size, 'file': whole, 'records': digests}
    blob = msgpack.packb({'loadr': 'digests', 'version': VERSION, 'format': name,
                          'algorithm': 'blake2b', 'files': files}, use_bin_type=True)
    target = sidecar_path(path)
    out = storage_for(target, storage_options).open_write(target)
    try:
        out.write(blob)
        out.commit(overwrite=True)
    except BaseException:
        out.abort()
        raise
    return target


class Digests:
    """A sidecar, loaded: the recorded ``files`` (relative path -> entry) of a dataset."""

    def __init__(self, path: str, sidecar: str, root: str, format: str, files: dict):  # noqa: A002
        self.path, self.sidecar, self.root, self.format, self.files = (
            path, sidecar, root, format, files)

    def records_of(self, file: str) -> bytes | None:
        """The record digests of ``file`` (an absolute path of the dataset), or None."""
        entry = self.files.get(_relative(self.root, file))
        return None if entry is None else entry['records']

    def for_file(self, file: str) -> tuple[bytes, str]:
        """What a reader keeps to verify the records of ``file``: ``(digests, sidecar)``.

        A file the sidecar does not list is a ConfigError: it was made after the digests.
        """
        digests = self.records_of(file)
        if digests is None:
            raise ConfigError(f'{self.sidecar} has no digests of this file (added since they '
                              f'were recorded?); record them again with loadr check '
                              f'--write-digests {self.path}', file)
        return digests, self.sidecar


def check_record(recorded: tuple[bytes, str], file: str, record: int, data,
                 index: int | None) -> None:
    """ChecksumError naming ``file`` and ``index`` unless ``data`` is record ``record`` as
    recorded; ``recorded`` is :meth:`Digests.for_file`'s answer."""
    digests, sidecar = recorded
    want = digests[RECORD_DIGEST_BYTES * record:RECORD_DIGEST_BYTES * (record + 1)]
    if record_digest(data) != want:
        raise ChecksumError(f'record {record} of this file differs from the digest recorded '
                            f'in {sidecar}: its bytes changed', file, index)


@overload
def load(path, storage_options: StorageSettings | dict | None = None, *,
         required: Literal[True]) -> Digests: ...


@overload
def load(path, storage_options: StorageSettings | dict | None = None,
         required: bool = False) -> Digests | None: ...


def load(path, storage_options: StorageSettings | dict | None = None,
         required: bool = False) -> Digests | None:
    """The sidecar of the dataset at ``path``, or None when it has none (ConfigError if
    ``required``). A sidecar that is not one of ours is a FormatError."""
    path = os.fspath(path)
    sidecar = sidecar_path(path)
    storage = storage_for(sidecar, storage_options)
    if not storage.exists(sidecar):
        if required:
            raise ConfigError(f'verify=True needs the digests of this dataset in {sidecar}; '
                              f'record them with: loadr check --write-digests {path}', path)
        return None
    raw = storage.read_all(sidecar, max_bytes=SIDECAR_MAX_BYTES)
    try:
        table = msgpack.unpackb(raw, raw=False)
        ok = (isinstance(table, dict) and table.get('loadr') == 'digests'
              and table.get('version') == VERSION and isinstance(table.get('files'), dict)
              and all(isinstance(e, dict) and isinstance(e.get('size'), int)
                      and isinstance(e.get('file'), bytes)
                      and isinstance(e.get('records'), bytes)
                      and len(e['records']) % RECORD_DIGEST_BYTES == 0
                      for e in table['files'].values()))
    except (ValueError, TypeError, msgpack.UnpackException):
        ok = False
    if not ok:
        raise FormatError('not a digests file written by loadr check --write-digests',
                          sidecar)
    return Digests(path, sidecar, _root(storage_for(path, storage_options), path),
                   table.get('format'), table['files'])


def verify(path, recorded: Digests, layout_of, storage_options: StorageSettings | dict | None = None
           ) -> list[Problem]:
    """Every file of the dataset compared with its recorded digests; a problem per change.

    ``layout_of`` as for :func:`write`.

    A changed record is named by its file and datapoint; bytes changed outside
    any record (a table, a header, a metadata file) by the file alone.
    """
    path = os.fspath(path)
    storage = storage_for(path, storage_options)
    try:
        _, layout = layout_of(path)
    except LoadrError:
        return []            # a dataset that does not open: its format's check said why
    current = {_relative(recorded.root, file): file for file in layout}
    problems = []
    for rel, entry in recorded.files.items():
        file = current.get(rel) or os.path.join(recorded.root, rel)
        if rel not in current:
            problems.append(Problem(file, None, f'recorded in {recorded.sidecar} but no longer '
                                                f'part of the dataset'))
            continue
        try:
            size, whole, digests = _digest_file(storage, file, layout[file])
        except LoadrError as exc:
            problems.append(Problem(exc.path or file, exc.index, exc.message))
            continue
        if size == entry['size'] and whole == entry['file']:
            continue
        found = []
        if size != entry['size']:
            found.append(Problem(file, None, f'file is {size} bytes; it was {entry["size"]} '
                                             f'when the digests were recorded'))
        records = layout[file]
        old = entry['records']
        changed = False
        for r in range(len(digests) // RECORD_DIGEST_BYTES):
            a, b = RECORD_DIGEST_BYTES * r, RECORD_DIGEST_BYTES * (r + 1)
            if digests[a:b] != old[a:b]:
                changed = True
                owner = int(records.owners[r])
                found.append(Problem(file, owner if owner >= 0 else None,
                                     f'record {r} (bytes {int(records.starts[r])}..'
                                     f'{int(records.ends[r])}) differs from its digest recorded '
                                     f'in {recorded.sidecar}: its bytes changed'))
        if not changed:
            found.append(Problem(file, None, f'bytes outside the records (a table, a header, '
                                             f'metadata) differ from the digest recorded in '
                                             f'{recorded.sidecar}'))
        problems += found
    for rel, file in current.items():
        if rel not in recorded.files:
            problems.append(Problem(file, None, f'not in {recorded.sidecar}: a file added '
                                                f'since the digests were recorded'))
    return problems
