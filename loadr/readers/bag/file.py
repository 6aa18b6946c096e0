"""One bag file: its records and offset table, read (:class:`Bag`) and written
(:class:`BagFileWriter`); byte layout: docs/FORMATS.md §3.
"""

from __future__ import annotations

import array
import os
import re
import struct
import sys

import numpy as np

from ... import codecs
from ...digests import check_record
from ...errors import FormatError, LoadrError, ReadError, WriterError
from ...storage import Storage, WriteFile, storage_for
from ..base import Writer, check_index

ENTRY_BYTES = 8                 # one uint64 table entry
SPEC_NAME = 'spec.json'
REFS_KEY = 'refs'
SPEC_MAX_BYTES = 1 << 20        # a spec.json larger than this is not a spec
VALIDATE_CHUNK_ENTRIES = 1 << 20  # check() reads a table 8 MiB at a time
# A bag's header is read from its last bytes: this many in one read, which holds the
# whole table of a bag of up to ~2,000 records (one round trip instead of two remotely).
TAIL_BYTES = 16 << 10
# What a lazily opened bag reads on first use (Bag(lazy=True)).
_HEADER = frozenset({'version', 'index_offset', '_ends_at', '_len'})
SHARD_NAME = re.compile(r'[0-9]{6,}\Z')
IMAGE_TYPES = ('jpg', 'png')
# Keys become file names: nothing that leaves the directory or hides the file.
_KEY_FORBIDDEN = re.compile(r'[/\\\x00]')
# granular's DatasetWriter asks that keys and types start with [a-z_].
GRANULAR_NAME = re.compile(r'[a-z_]')
CONVERTIBLE_KEY = re.compile(r'[a-z_][^/\\\x00]*\Z')

_u64 = struct.Struct('<Q')


def parse_type(type_name: str) -> tuple[str, bool]:
    """Split a spec type into (base type, is a sequence).

    >>> parse_type('jpg[]')
    ('jpg', True)
    """
    if type_name.endswith('[]'):
        return type_name[:-2], True
    return type_name, False


def spec_problem(spec) -> str | None:
    """Why ``spec`` is not a valid spec (a dict of key -> known type), or None."""
    if not isinstance(spec, dict):
        return f'the spec must be a JSON object of key -> type, not {type(spec).__name__}'
    for key, type_name in spec.items():
        if (not isinstance(key, str) or not key or key.startswith('.')
                or _KEY_FORBIDDEN.search(key)):
            return f'bad key {key!r}: keys name files, so no "/", "\\\\", NUL or leading "."'
        if key == REFS_KEY:
            return f'key {REFS_KEY!r} is reserved: it would share refs.bag'
        if not isinstance(type_name, str):
            return f'type of key {key!r} must be a string, not {type(type_name).__name__}'
        base, _ = parse_type(type_name)
        if base not in codecs.TYPES and base not in codecs.UNSUPPORTED_TYPES:
            known = ', '.join(codecs.TYPES + codecs.UNSUPPORTED_TYPES)
            return f'key {key!r} has unknown type {type_name!r} (known: {known}, each with [])'
    return None


class Bag:
    """One bag file (version 1 or 2), read through a :mod:`loadr.storage` storage.

    ``len(bag)`` records; ``bag[i]`` is record i's bytes; ``read_range(a, b)``
    reads records ``a .. b-1`` with one read. ``version``, ``index_offset``
    (where the table starts, as the last 8 bytes say) and ``size`` (file
    bytes) describe the file; ``limits`` is the table as stored.
    ``cache_index`` keeps the table in memory and ``cache_data`` the whole
    file, each loaded on first use, once per process, never pickled.
    ``lazy`` leaves the header (version, table, length) until first asked
    for (a round trip saved at open behind a URL; :func:`read_headers`
    reads many at once).

    Example::

        bag = Bag('data/train/label.bag')
        first, rest = bag[0], bag.read_range(1, len(bag))
    """

    def __init__(self, path: str | os.PathLike, files: Storage | None = None,
                 cache_index: bool = False, cache_data: bool = False, lazy: bool = False):
        self.path = os.fspath(path)
        self._files = files if files is not None else storage_for(self.path)
        self.cache_index = cache_index
        self.cache_data = cache_data
        self._table: np.ndarray | None = None     # per-process caches, filled lazily
        self._data: bytes | None = None
        self.digests = None      # (record digests, sidecar) when verified (loadr.digests)
        if lazy:
            self.size = self._files.size(self.path)
        else:
            self._read_header()

    def __getattr__(self, name: str):
        # Called only for a missing attribute: the header of a lazily opened bag.
        if name in _HEADER and '_files' in self.__dict__:
            self._read_header(keep_table=True)
            return self.__dict__[name]
        raise AttributeError(f'{type(self).__name__!r} object has no attribute {name!r}')

    def _tail_range(self) -> tuple[int, int]:
        """``(offset, length)`` of the last bytes the header is read from."""
        size = self.size
        return size - min(size, TAIL_BYTES), min(size, TAIL_BYTES)

    def _read_header(self, tail: bytes | None = None, keep_table: bool = False) -> None:
        """Version, table start and length from the file's last bytes (``tail``: read already).

        ``keep_table``: a table that came whole with them is kept (``cache_index``), as
        its first use would load it: for a header read on first use, by the process
        that reads the bag (at open, the tables stay unread as before).
        """
        size = self._files.size(self.path)
        self.size = size
        if size == 0:            # an empty bag, as granular writes it
            self.version, self.index_offset, self._ends_at, self._len = 2, 0, 0, 0
            return
        if size < ENTRY_BYTES:
            raise FormatError(f'a bag file holds 0 or at least {ENTRY_BYTES} bytes, '
                              f'this one {size}', self.path)
        tail_at, length = self._tail_range()
        if tail is None:
            try:
                tail = self._files.read(self.path, tail_at, length)
            except ReadError:
                if length <= 2 * ENTRY_BYTES:
                    raise
                # A small bag's tail is all of it: a record that cannot be read must
                # fail alone, not the header. The last 8 bytes (and the table's first
                # entry, below) on their own, as the table needs.
                tail_at = size - ENTRY_BYTES
                tail = self._files.read(self.path, tail_at, ENTRY_BYTES)
        start = _u64.unpack(tail[-ENTRY_BYTES:])[0]
        if start > size - ENTRY_BYTES:
            raise FormatError(f'index table start {start} (the last 8 bytes) is past the '
                              f'end of the {size}-byte file', self.path)
        if (size - start) % ENTRY_BYTES:
            raise FormatError(f'index table of {size - start} bytes (from offset {start}) is '
                              f'not a whole number of {ENTRY_BYTES}-byte entries', self.path)
        first = (_u64.unpack(tail[start - tail_at:start - tail_at + ENTRY_BYTES])[0]
                 if start >= tail_at else
                 _u64.unpack(self._files.read(self.path, start, ENTRY_BYTES))[0])
        entries = (size - start) // ENTRY_BYTES
        # Set together, the length last: another thread may be reading the same header.
        if first == 0:           # version 1: a leading 0, then starts and the last end
            self.version, self._ends_at = 1, start + ENTRY_BYTES
            self.index_offset, self._len = start, entries - 1
        else:
            self.version, self._ends_at, self.index_offset, self._len = 2, start, start, entries
        if keep_table and (self.cache_index or self.cache_data) and self._table is None \
                and self._ends_at >= tail_at:
            at = self._ends_at - tail_at
            try:
                self._load_table(None, tail[at:at + ENTRY_BYTES * self._len])
            except LoadrError:
                pass                # its first use loads it again and says so, naming the record

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_table'] = state['_data'] = None   # caches stay in their process
        return state

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i) -> bytes:
        i = check_index(i, self._len)
        return self.read_range(i, i + 1)[0]

    def __repr__(self) -> str:
        return f'Bag({self.path!r}, version {self.version}, {self._len} records)'

    # -- reading ------------------------------------------------------------

    def _pread(self, offset: int, length: int, index: int | None) -> bytes:
        if self.cache_data:
            data = self._data
            if data is None:
                self._data = data = self._files.read(self.path, 0, self.size, index)
            return data[offset:offset + length]
        return self._files.read(self.path, offset, length, index)

    def _load_table(self, index: int | None, raw: bytes | None = None) -> np.ndarray:
        """All record ends as uint64, checked; cached when ``cache_index``.

        ``raw``: the table's bytes, read already (with the header).
        """
        if self._table is not None:
            return self._table
        if raw is None:
            raw = self._pread(self._ends_at, ENTRY_BYTES * self._len, index)
        ends = np.frombuffer(raw, '<u8')
        bad = np.flatnonzero(ends[1:] < ends[:-1])
        if bad.size:
            j = int(bad[0]) + 1
            raise FormatError(f'index table: record {j} ends at {int(ends[j])}, before it '
                              f'starts at {int(ends[j - 1])}', self.path,
                              j if index is None else index)
        if self._len and int(ends[-1]) > self.index_offset:
            raise FormatError(f'index table: last record ends at {int(ends[-1])}, past the '
                              f'data end {self.index_offset}', self.path, index)
        if self.cache_index or self.cache_data:
            self._table = ends
        return ends

    def _bounds(self, start: int, stop: int, index: int | None) -> list[int]:
        """Offsets ``[begin of start, end of start, …, end of stop-1]``, checked."""
        lo = start - 1 if start else 0
        if self.cache_index or self.cache_data:
            bounds = self._load_table(index)[lo:stop].tolist()
        else:
            raw = self._pread(self._ends_at + ENTRY_BYTES * lo, ENTRY_BYTES * (stop - lo), index)
            bounds = list(struct.unpack(f'<{stop - lo}Q', raw))
        if not start:
            bounds.insert(0, 0)
        previous = 0
        for j, end in enumerate(bounds):
            if end < previous:
                raise FormatError(f'index table: record {start + j - 1} ends at {end}, before '
                                  f'it starts at {previous}', self.path,
                                  start + j - 1 if index is None else index)
            previous = end
        if bounds[-1] > self.index_offset:
            raise FormatError(f'index table: record {stop - 1} ends at {bounds[-1]}, past the '
                              f'data end {self.index_offset}', self.path,
                              stop - 1 if index is None else index)
        return bounds

    def read_range(self, start: int, stop: int, index: int | None = None) -> list[bytes]:
        """Records ``start .. stop-1`` with one data read; ``index`` goes into errors.

        >>> Bag(FIXTURES / 'bag_raw/v1.bag').read_range(0, 2)[0]
        b'\\xa2'
        """
        if not 0 <= start <= stop <= self._len:
            raise IndexError(f'records {start}..{stop} out of range for {self._len} records')
        if start == stop:
            return []
        bounds = self._bounds(start, stop, index)
        first = bounds[0]
        data = self._pread(first, bounds[-1] - first, start if index is None else index)
        records = [data[a - first:b - first] for a, b in zip(bounds[:-1], bounds[1:])]
        if self.digests is not None:
            for k, record in enumerate(records):
                check_record(self.digests, self.path, start + k, record,
                             start + k if index is None else index)
        return records

    @property
    def limits(self) -> list[int]:
        """The index table as stored (version 1 with its leading 0)."""
        ends = self._load_table(None).tolist()
        return [0, *ends] if self.version == 1 else ends

    def validate(self) -> None:
        """Check the whole table, a chunk at a time; FormatError names the first bad record."""
        previous = 0
        for lo in range(0, self._len, VALIDATE_CHUNK_ENTRIES):
            n = min(VALIDATE_CHUNK_ENTRIES, self._len - lo)
            ends = np.frombuffer(self._pread(self._ends_at + ENTRY_BYTES * lo,
                                             ENTRY_BYTES * n, lo), '<u8')
            starts = np.concatenate([np.array([previous], '<u8'), ends[:-1]])
            bad = np.flatnonzero(ends < starts)
            if bad.size:
                j = lo + int(bad[0])
                raise FormatError(f'index table: record {j} ends at {int(ends[j - lo])}, '
                                  f'before it starts at {int(starts[j - lo])}', self.path, j)
            previous = int(ends[-1])
        # The last end is the table start itself (the last 8 bytes), so a table that never
        # decreases also never runs past the data.


class BagFileWriter(Writer):
    """Write one bag file, version 2 (granular's default) or 1.

    Records go to a temporary sibling that is renamed into place on a clean
    ``close()``; an existing file is refused (the lifecycle of
    :class:`~loadr.readers.base.Writer`). With ``out`` (a file inside a
    directory that is itself staged) or ``atomic=False`` the file is written
    in place. Zero-byte records are refused, as granular refuses them: in
    version 2 a leading empty record would read back as a version-1 file.

    Example::

        with BagFileWriter('labels.bag') as w:
            w.append(b'\\x01')
    """

    directory = False

    def __init__(self, path: str | os.PathLike, version: int = 2, atomic: bool = True,
                 out: WriteFile | None = None):
        if version not in (1, 2):
            raise WriterError(f'bag version must be 1 or 2, not {version!r}', path)
        self.path = os.fspath(path)
        self.version = version
        self._ends = array.array('Q')
        self._offset = 0
        if out is None and atomic:
            self._stage()
        else:
            if out is None:
                if storage_for(self.path).exists(self.path):
                    raise WriterError('refusing to overwrite an existing file', self.path)
                out = WriteFile(self.path, exclusive=True)
            self._out = self._file = out
            self.closed = False
        self._tmp = self._file.path

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def size(self) -> int:
        """Bytes the file will have once closed."""
        return self._offset + ENTRY_BYTES * (len(self._ends) + (self.version == 1))

    def append(self, record: bytes) -> int:
        """Append one non-empty record; returns its index."""
        if self.closed:
            raise WriterError('append to a closed bag writer', self.path)
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise WriterError(f'a record must be bytes, not {type(record).__name__}',
                              self.path, len(self._ends))
        if not len(record):
            raise WriterError('zero-byte records cannot be stored in a bag', self.path,
                              len(self._ends))
        self._file.write(record)
        self._offset += len(record)
        self._ends.append(self._offset)
        return len(self._ends) - 1

    def _finish(self) -> None:
        """Write the table."""
        table = array.array('Q', [0]) + self._ends if self.version == 1 else self._ends
        if sys.byteorder == 'big':
            table.byteswap()
        self._file.write(table.tobytes())
