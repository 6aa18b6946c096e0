"""Bag datasets (granular 0.20.x): bag files, datasets, sharded datasets.

Three small layers, as granular has them (byte layout: docs/FORMATS.md §3):

- :class:`Bag` is one bag file: non-empty records, then a table of uint64
  little-endian offsets; the last 8 bytes say where the table starts.
  Version 2 stores the end of each record; version 1 stores the start of
  each record and then the end of the last, so its first entry is 0. A
  zero-byte file is an empty bag. A contiguous range of records is one read.
- A dataset is a directory: ``spec.json`` (``{"key": "type"}``, sorted),
  ``refs.bag`` (one msgpack record per datapoint, a list aligned with the
  spec keys: an int for a plain key, ``[start, length]`` or ``[]`` for a
  sequence key ``"type[]"``), and ``<key>.bag`` per key.
- A sharded dataset is a directory of datasets ``000000/``, ``000001/``, …;
  datapoint indices run through the shards in order.

:class:`BagReader` reads a dataset or a sharded dataset, :class:`BagWriter`
writes one (byte-identical to granular's ``DatasetWriter`` and
``ShardedDatasetWriter`` for the same datapoints), :func:`check` finds every
problem, :func:`detect` recognises the layout. Values are decoded with
:mod:`loadr.codecs`.

Everything read from disk is checked before it is used: a table must start
inside the file, be a whole number of entries, and its offsets must not
decrease or run past the data; refs must have the spec's shape and point
inside their bags. A bad file raises FormatError (a bad value DecodeError)
naming the file and the datapoint index; sizes always come from the file
size, so a lying table never makes us allocate for it.

Example::

    with BagWriter('data/train', {'image': 'jpg', 'label': 'int'}) as w:
        w.append({'image': pixels, 'label': 3})
    r = BagReader('data/train')
    r[0]['label']                                   # 3
    r[0, {'label': True}]                           # reads only label.bag
"""

from __future__ import annotations

import array
import bisect
import errno
import json
import os
import re
import struct
import sys
from collections.abc import Mapping
from typing import Sequence

import msgpack
import numpy as np

from .. import codecs
from ..errors import ConfigError, DecodeError, FormatError, LoadrError, ReadError, WriterError
from ..digests import check_record
from ..sources import Warming
from ..storage import Storage, WriteFile, storage_for
from .base import (Format, Plan, Problem, Reader, Source, Writer, _known, check_index,
                   open_each, remote)

__all__ = ['Bag', 'BagFileWriter', 'BagReader', 'BagWriter', 'FORMAT', 'check', 'detect',
           'parse_type']

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
_GRANULAR_NAME = re.compile(r'[a-z_]')
_CONVERTIBLE_KEY = re.compile(r'[a-z_][^/\\\x00]*\Z')

_u64 = struct.Struct('<Q')


def parse_type(type_name: str) -> tuple[str, bool]:
    """Split a spec type into (base type, is a sequence).

    >>> parse_type('jpg[]')
    ('jpg', True)
    """
    if type_name.endswith('[]'):
        return type_name[:-2], True
    return type_name, False


def _spec_problem(spec) -> str | None:
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


# ---------------------------------------------------------------------------
# One bag file


class Bag:
    """One bag file (version 1 or 2), read through a :mod:`loadr.storage` storage.

    ``len(bag)`` records; ``bag[i]`` is record i's bytes; ``read_range(a, b)``
    reads records ``a .. b-1`` with one read. ``version``, ``index_offset``
    (where the table starts, as the last 8 bytes say) and ``size`` (file
    bytes) describe the file; ``limits`` is the table as stored.
    ``cache_index`` keeps the table in memory and ``cache_data`` the whole
    file, each loaded on first use, once per process, never pickled.
    ``lazy`` leaves the header (version, table, length) until first asked
    for (a round trip saved at open behind a URL; :func:`_read_headers`
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
        self._table = None       # per-process caches, filled lazily
        self._data = None
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
            if self._data is None:
                self._data = self._files.read(self.path, 0, self.size, index)
            return self._data[offset:offset + length]
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
            self._out, self.closed = out, False
        self._file = self._out
        self._tmp = self._out.path

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


# ---------------------------------------------------------------------------
# Datasets and shards on disk


def _read_spec(storage: Storage, directory: str) -> tuple[list[tuple[str, str]], int]:
    """The (key, type) pairs of ``directory/spec.json`` in file order, validated; its size."""
    path = os.path.join(directory, SPEC_NAME)
    try:
        raw = storage.read_all(path, max_bytes=SPEC_MAX_BYTES)
    except ReadError as exc:    # permission, EIO: the system failed, not the format
        if getattr(exc, 'errno', None) == errno.ENOENT:
            raise FormatError('missing spec.json: not a bag dataset', path) from None
        raise
    if len(raw) > SPEC_MAX_BYTES:
        raise FormatError(f'spec.json is larger than {SPEC_MAX_BYTES} bytes', path)

    def pairs(items):
        seen = set()
        for key, _ in items:
            if key in seen:
                raise FormatError(f'spec.json names key {key!r} twice', path)
            seen.add(key)
        return dict(items)
    try:
        spec = json.loads(raw.decode('utf-8'), object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f'spec.json is not valid JSON: {exc}', path) from exc
    problem = _spec_problem(spec)
    if problem:
        raise FormatError(f'spec.json: {problem}', path)
    return list(spec.items()), len(raw)


def _list_shards(storage: Storage, path: str
                 ) -> tuple[list[str], list[Problem], list[Problem]]:
    """The dataset directories under ``path`` in order, what makes the layout unreadable,
    and what else is odd about it (entries that are not shards)."""
    if not storage.isdir(path):
        return [], [Problem(path, None, 'not a directory')], []
    if storage.isfile(os.path.join(path, SPEC_NAME)):
        return [path], [], []
    shards, fatal, odd = {}, [], []
    try:
        names = storage.list(path)
    except LoadrError as exc:
        return [], [Problem(path, None, exc.message)], []
    for name in names:
        full = os.path.join(path, name)
        if SHARD_NAME.match(name) and name == f'{int(name):06}' and storage.isdir(full):
            shards[int(name)] = full
        elif not name.startswith('.'):
            # granular's ShardedDatasetReader takes every entry for a shard number.
            odd.append(Problem(full, None, 'not a shard directory (000000, 000001, …); '
                                           "granular's reader would fail on it"))
    if not shards:
        if any(name.endswith('.bag') for name in names):
            fatal.append(Problem(os.path.join(path, SPEC_NAME), None,
                                 'missing spec.json: bag files without their spec (an '
                                 'interrupted write?)'))
        else:
            fatal.append(Problem(path, None, 'not a bag dataset: no spec.json and no shard '
                                             'directories 000000/, 000001/, …'))
    else:
        expected = 0        # one problem per gap, named by its first missing shard
        for number in sorted(shards):
            if number != expected:
                gap = (f'shard {expected:06} is missing' if number == expected + 1 else
                       f'shards {expected:06} to {number - 1:06} are missing')
                fatal.append(Problem(os.path.join(path, f'{expected:06}'), None,
                                     f'{gap}: shards must be numbered without gaps'))
            expected = number + 1
    return [shards[k] for k in sorted(shards)], fatal, odd if shards else []


def _read_headers(files: Storage, bags: Sequence[Bag]) -> None:
    """Read the headers of the lazily opened ``bags`` with one concurrent ``read_many``.

    A bag whose header cannot be read here stays lazy: its first use reads it
    again and raises what is wrong, naming the record.
    """
    bags = [b for b in bags if b is not None and '_len' not in b.__dict__]
    if not bags:
        return
    ranges = [(b.path, *b._tail_range()) for b in bags]
    try:
        tails = files.read_many([r for r in ranges if r[2]])
    except LoadrError:
        return
    tails.reverse()
    for bag, (_, _, length) in zip(bags, ranges):
        tail = tails.pop() if length else b''
        try:
            bag._read_header(tail, keep_table=True)
        except LoadrError:
            pass


def _read_tables(files: Storage, bags: Sequence[Bag]) -> None:
    """Load the index tables the ``bags`` keep (``cache_index``) with one ``read_many``.

    A table that cannot be read or is wrong here is left for its first use,
    which raises what is wrong, naming the record.
    """
    bags = [b for b in bags if b is not None and (b.cache_index or b.cache_data)
            and b._table is None and b._len]
    if not bags:
        return
    try:
        raws = files.read_many([(b.path, b._ends_at, ENTRY_BYTES * b._len) for b in bags])
    except LoadrError:
        return
    for bag, raw in zip(bags, raws):
        try:
            bag._load_table(None, raw)
        except LoadrError:
            pass


class _Dataset:
    """One dataset directory: its spec, its bags, and how to read a datapoint."""

    def __init__(self, path: str, spec: list[tuple[str, str]], bags: dict, start: int,
                 spec_size: int = 0):
        self.path = path
        self.spec_size = spec_size        # bytes of spec.json
        self.spec = spec                  # (key, type) in spec.json order = refs order
        self.bags = bags                  # 'refs' and every key -> Bag (None: unusable)
        self.start = start                # global index of datapoint 0
        self._types = {k: parse_type(t) for k, t in spec}
        self._last_refs = None            # (local index, refs), per process
        self._refs_ahead: dict[int, list] = {}    # local index -> refs read ahead, per process

    @classmethod
    def open(cls, path: str, files: Storage, cache_index: bool, cache_keys: Sequence[str],
             start: int) -> _Dataset:
        if remote(files):
            try:
                files.list(path)        # every file's size and version in one round trip
            except LoadrError:
                pass                    # no listing: each file is asked on its own
        spec, spec_size = _read_spec(files, path)
        bags = {}
        for key in (REFS_KEY, *(k for k, _ in spec)):
            bag_path = os.path.join(path, f'{key}.bag')
            if not files.isfile(bag_path):
                raise FormatError(f'missing bag file for key {key!r}', bag_path)
            # Behind a URL only refs.bag's header is read at open (it gives the length):
            # the value bags' are read on first use, many at once (_read_headers).
            bags[key] = Bag(bag_path, files, cache_index, key in cache_keys,
                            lazy=key != REFS_KEY and remote(files))
        problem = _empty_refs_problem(bags)
        if problem:
            raise FormatError(problem, bags[REFS_KEY].path)
        return cls(path, spec, bags, start, spec_size)

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_last_refs'] = None
        state['_refs_ahead'] = {}
        return state

    def __len__(self) -> int:
        return len(self.bags[REFS_KEY])

    @property
    def spec_dict(self) -> dict:
        return dict(sorted(self.spec))

    def refs(self, local: int) -> list:
        """The refs entry of datapoint ``local``, checked against the spec and the bags."""
        last = self._last_refs          # once: a read-ahead thread may set it meanwhile
        if last is not None and last[0] == local:
            return last[1]
        refs = self._refs_ahead.pop(local, None)
        if refs is None:
            refs = self._read_refs(local)
        self._last_refs = (local, refs)
        return refs

    def refs_ahead(self, local: int) -> list:
        """Read datapoint ``local``'s refs now and keep them for its read (read-ahead)."""
        refs = self._read_refs(local)
        if len(self._refs_ahead) > 65536:       # kept for reads that never came (cancelled)
            self._refs_ahead.clear()
        self._refs_ahead[local] = refs
        return refs

    def _read_refs(self, local: int) -> list:
        index = self.start + local
        refs_bag = self.bags[REFS_KEY]
        raw = refs_bag.read_range(local, local + 1, index)[0]
        try:
            refs = msgpack.unpackb(raw)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise FormatError(f'refs record is not msgpack: {exc}', refs_bag.path, index) from exc
        if not isinstance(refs, list) or len(refs) != len(self.spec):
            raise FormatError(f'refs record must be a list of {len(self.spec)} entries (one '
                              f'per spec key), not {refs!r:.80}', refs_bag.path, index)
        for (key, type_name), ref in zip(self.spec, refs):
            bag = self.bags.get(key)
            problem = _ref_problem(ref, self._types[key][1], None if bag is None else len(bag))
            if problem:
                raise FormatError(f'refs entry for {key!r} ({type_name}): {problem}',
                                  refs_bag.path, index)
        return refs

    def available(self, local: int) -> dict:
        refs = self.refs(local)
        return {key: range(ref[1] if ref else 0) if self._types[key][1] else True
                for (key, _), ref in zip(self.spec, refs)}

    def read(self, local: int, mask: dict | None, decode_images: bool) -> dict:
        """Datapoint ``local``: the keys the mask asks for, sequences as lists."""
        index = self.start + local
        if mask is not None:
            unknown = [k for k in mask if k not in self._types]
            if unknown:
                raise ConfigError(f'mask names key {unknown[0]!r}, which is not in the spec '
                                  f'{sorted(self._types)}')
        refs = self.refs(local)
        out = {}
        for (key, type_name), ref in zip(self.spec, refs):
            want = True if mask is None else mask.get(key, False)
            base, is_seq = self._types[key]
            bag = self.bags[key]
            if not is_seq:
                if not isinstance(want, (bool, np.bool_)):
                    raise TypeError(f'mask value for plain key {key!r} must be True or False, '
                                    f'not {want!r}')
                if want:
                    raw = bag.read_range(ref, ref + 1, index)[0]
                    out[key] = _decode(base, raw, decode_images, bag.path, index, key, ref)
                continue
            start, length = ref if ref else (0, 0)
            positions = _positions(key, want, length)
            if positions is None:
                continue
            if not positions:
                out[key] = []
                continue
            lo, hi = min(positions), max(positions) + 1
            records = bag.read_range(start + lo, start + hi, index)  # one read, then pick
            out[key] = [_decode(base, records[p - lo], decode_images, bag.path, index,
                                f'{key}[{p}]', start + p) for p in positions]
        return out


def _empty_refs_problem(bags: dict) -> str | None:
    """Why an empty refs.bag beside non-empty value bags is a cut file, or None.

    granular writes every bag empty for a dataset without datapoints, so
    records in a value bag with no refs to them mean refs.bag lost its
    content; reading it as an empty dataset would drop every datapoint.
    """
    if len(bags[REFS_KEY]):
        return None
    full = [(key, len(bag)) for key, bag in bags.items()
            if key != REFS_KEY and bag is not None and len(bag)]
    if not full:
        return None
    key, count = full[0]
    return (f'refs.bag is empty but {key}.bag holds {count} records: refs.bag was cut or '
            f'emptied, so its datapoints cannot be found')


def _ref_problem(ref, is_seq: bool, bag_len: int | None) -> str | None:
    def is_int(x):
        return type(x) is int
    if not is_seq:
        if not is_int(ref):
            return f'must be an int, not {ref!r:.40}'
        if bag_len is not None and not 0 <= ref < bag_len:
            return f'record {ref} is out of range for a bag of {bag_len} records'
        return None
    if not isinstance(ref, list) or len(ref) not in (0, 2) or not all(map(is_int, ref)):
        return f'must be [] or [start, length], not {ref!r:.40}'
    if ref:
        start, length = ref
        if start < 0 or length < 0:
            return f'negative start or length {ref}'
        if bag_len is not None and start + length > bag_len:
            return f'records {start}..{start + length} run past a bag of {bag_len} records'
    return None


def _positions(key: str, want, length: int) -> list[int] | None:
    """Element positions a sequence mask value asks for (None: the key is not wanted)."""
    if want is True or (isinstance(want, np.bool_) and want):
        return list(range(length))
    if want is False or isinstance(want, np.bool_):
        return None
    if isinstance(want, (range, slice)):
        if any(x is not None and x < 0 for x in (want.start, want.stop)):
            raise IndexError(f'mask range {want} for {key!r} must not be negative')
        return list(range(length)[slice(want.start, want.stop, want.step)])
    if isinstance(want, np.ndarray):
        want = want.tolist()
    if isinstance(want, (list, tuple)):
        positions = []
        for p in want:
            if isinstance(p, bool) or not hasattr(p, '__index__'):
                raise TypeError(f'mask positions for {key!r} must be ints, not {p!r}')
            p = p.__index__()
            if not 0 <= p < length:
                raise IndexError(f'position {p} out of range for {key!r} with {length} '
                                 f'elements')
            positions.append(p)
        return positions
    raise TypeError(f'mask value for sequence key {key!r} must be True, False, a range or '
                    f'a list of positions, not {type(want).__name__}')


def _decode(base: str, raw: bytes, decode_images: bool, path: str, index: int, where: str,
            record: int):
    if base in IMAGE_TYPES and not decode_images:
        return raw
    try:
        return codecs.decode(base, raw)
    except DecodeError as exc:
        raise DecodeError(f'value of {where!r} (record {record}, {base}): {exc.message}',
                          path, index) from exc


_ahead_executor = None
_ahead_pid = None


def _read_ahead_thread():
    """This process's thread for the second step of reading ahead (one, made on first use)."""
    global _ahead_executor, _ahead_pid
    if _ahead_executor is None or _ahead_pid != os.getpid():
        import concurrent.futures
        _ahead_executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix='loadr-bag-ahead')
        _ahead_pid = os.getpid()
    return _ahead_executor


# ---------------------------------------------------------------------------
# The reader


class BagReader(Reader, Warming):     # warm(): the index tables, ahead of the reads
    """A granular dataset directory, or a sharded directory of them, as a Reader.

    ``verify`` checks every record read against the digests that ``loadr
    check --write-digests`` recorded (:mod:`loadr.digests`).
    ``cache_index`` keeps every bag's index table in memory (8 bytes per
    record), ``cache_keys`` keeps the named bags (``'refs'`` included)
    whole in memory; both fill lazily, once per process, and are never
    pickled. ``decode_images=False`` leaves ``jpg``/``png`` values (and
    their sequence elements) as their encoded bytes. ``size`` is the bytes
    of every bag and spec.json. Subclasses may set ``files_class`` to a
    storage class (for example a :class:`~loadr.storage.LocalStorage`
    subclass that counts reads); by default the path's storage is used.

    Example::

        r = BagReader('../shared/fixtures/bag', cache_keys=('refs', 'idx'))
        r.available(1)                               # {'feat': True, 'frames': range(4), …}
        r[1, {'frames': [0, 3], 'idx': True}]        # frames 0..3 in one read, picks 0 and 3
    """

    files_class: type | None = None
    format_name = 'bag'

    def __init__(self, path: str | os.PathLike, cache_index: bool = True,
                 cache_keys: Sequence[str] = (), decode_images: bool = True,
                 storage_options: dict | None = None, verify: bool = False):
        self.path = os.fspath(path)
        if isinstance(cache_keys, str) or not all(isinstance(k, str) for k in cache_keys):
            raise ConfigError(f'cache_keys must be a list of key names, not {cache_keys!r}')
        self.cache_index = bool(cache_index)
        self.cache_keys = tuple(cache_keys)
        self.decode_images = bool(decode_images)
        self._files = (storage_for(self.path, storage_options) if self.files_class is None
                       else self.files_class())
        dirs, fatal, _ = _list_shards(self._files, self.path)
        if fatal:
            raise FormatError(fatal[0].message, fatal[0].path)
        self._shards: list[_Dataset] = []
        start = 0
        # Behind a URL the shards open concurrently (their round trips wait together).
        opened = open_each(self._files, lambda d: _Dataset.open(
            d, self._files, self.cache_index, self.cache_keys, 0), dirs)
        for directory, shard in zip(dirs, opened):
            shard.start = start
            if self._shards and shard.spec_dict != self._shards[0].spec_dict:
                raise FormatError(f'spec differs from the first shard\'s '
                                  f'{self._shards[0].spec_dict}', os.path.join(directory,
                                                                               SPEC_NAME))
            self._shards.append(shard)
            start += len(shard)
        self._length = start
        self._stops = [s.start + len(s) for s in self._shards]
        unknown = [k for k in self.cache_keys if k != REFS_KEY and k not in self.spec]
        if unknown:
            raise ConfigError(f'cache_keys names {unknown[0]!r}, which is not in the spec '
                              f'{sorted(self.spec)} (or "refs")')
        self.size = sum(self._identity_files().values())
        self.verify = bool(verify)
        if self.verify:
            # The digests of each bag travel with it to workers (8 bytes a record).
            from ..digests import load
            recorded = load(self.path, storage_options, required=True)
            for shard in self._shards:
                for bag in shard.bags.values():
                    bag.digests = recorded.for_file(bag.path)

    def _identity_files(self) -> dict[str, int]:
        out = {}
        for s in self._shards:
            out[os.path.join(s.path, SPEC_NAME)] = s.spec_size
            out.update((b.path, b.size) for b in s.bags.values())
        return out

    @property
    def spec(self) -> dict:
        """``{key: type}`` with sorted keys, as spec.json."""
        return self._shards[0].spec_dict

    def details(self) -> dict:
        return {'shards': self.shards}

    @classmethod
    def source(cls, path: str, **options) -> Source:
        """The dataset with images as their encoded bytes, typed by its spec."""
        reader = cls(path, **dict(_known(cls, options), decode_images=False))
        return Source(path, cls.format_name, reader, dict(reader.spec))

    @property
    def shards(self) -> int:
        """How many dataset directories this reader spans (1 when not sharded)."""
        return len(self._shards)

    def __len__(self) -> int:
        return self._length

    def _locate(self, index: int) -> tuple[_Dataset, int]:
        shard = self._shards[bisect.bisect_right(self._stops, index)]
        return shard, index - shard.start

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop('_ahead', None)       # read-ahead jobs of this process
        return state

    def _get(self, index: int, mask: dict | None) -> dict:
        ahead = self.__dict__.get('_ahead')
        if ahead:
            job = ahead.pop(index, None)
            if job is not None:
                # Its value ranges are being asked for: wait until they are (the
                # refs came first anyway), or this read would fetch them again.
                try:
                    job.result(getattr(self._files, 'settings', {}).get('timeout_s', 60) + 5)
                except Exception:
                    pass            # a hint: the read below reports what is wrong
        shard, local = self._locate(index)
        return shard.read(local, mask, self.decode_images)

    def prefetch(self, indices) -> None:
        """Start reading the records of ``indices``; returns at once (see Reader.prefetch).

        Two steps: the refs records, then the value records they name. The
        second waits a round trip for the first, so it runs on a thread of
        its own (one per process); a read of a datapoint whose second step is
        under way waits for it, so no range is fetched twice.
        """
        storage = self._files
        if not storage.remote:
            return
        try:
            located = self._refs_ahead([check_index(i, len(self)) for i in indices])
        except Exception:
            return
        job = _read_ahead_thread().submit(self._values_ahead, located)
        ahead = self.__dict__.setdefault('_ahead', {})
        if len(ahead) > 4 * len(located) + 4096:      # left by tasks never read (cancelled)
            for key in [k for k, j in ahead.items() if j.done()]:
                del ahead[key]
        for _, _, index in located:
            ahead[index] = job

    def warm(self) -> None:
        """Read the index tables a process keeps, all at once: for a dataset behind
        a URL one round trip instead of one per bag, before the first batch."""
        storage = self._files
        if not storage.remote:
            return
        # The value bags' headers first (opened lazily), their tables with them.
        _read_headers(storage, [b for shard in self._shards for b in shard.bags.values()])
        bags = [b for shard in self._shards for b in shard.bags.values()
                if b is not None and b.cache_index and not b.cache_data
                and b._table is None and b._len]
        storage.prefetch([(b.path, b._ends_at, ENTRY_BYTES * b._len) for b in bags])
        for bag in bags:
            bag._load_table(None)

    def _values_ahead(self, located: list) -> None:
        shards = {id(shard): shard for shard, _, _ in located}.values()
        _read_headers(self._files, [b for shard in shards for b in shard.bags.values()])
        self._files.prefetch(self._value_ranges(located), cache_root=self.path)

    def _refs_ahead(self, indices: list[int]) -> list[tuple]:
        """Ask for the refs records of ``indices``; ``(shard, local, index)`` each."""
        located = [(*self._locate(index), index) for index in indices]
        # The refs tables of shards not read yet in this process, all at once.
        shards = {id(shard): shard for shard, _, _ in located}.values()
        _read_tables(self._files, [shard.bags[REFS_KEY] for shard in shards])
        refs = []
        for shard, local, index in located:
            bag = shard.bags[REFS_KEY]
            a, b = bag._bounds(local, local + 1, index)
            refs.append((bag.path, a, b - a, index))
        self._files.prefetch(refs)
        return located

    def _ranges(self, indices: list[int]) -> list[tuple]:
        return self._value_ranges(self._refs_ahead(indices))

    def _value_ranges(self, located: list) -> list[tuple]:
        """``(path, offset, length, index)`` of the value records the refs name."""
        out = []
        for shard, local, index in located:
            # Read here, kept for the datapoint's read: each range asked ahead is
            # read once (loadr.storage.remote counts on it to free what it holds).
            for (key, _), ref in zip(shard.spec, shard.refs_ahead(local)):
                bag = shard.bags[key]
                lo, hi = (ref, ref + 1) if not shard._types[key][1] else \
                    (ref[0], ref[0] + ref[1]) if ref else (0, 0)
                if bag.cache_data or hi <= lo:
                    continue
                bounds = bag._bounds(lo, hi, index)
                out.append((bag.path, bounds[0], bounds[-1] - bounds[0], index))
        return out

    def available(self, index: int) -> dict:
        """``{key: True | range(n)}`` for datapoint ``index``, from refs.bag alone."""
        shard, local = self._locate(check_index(index, self._length))
        return shard.available(local)


# ---------------------------------------------------------------------------
# The writer


class BagWriter(Writer):
    """Write a dataset (or, with ``shardlen``, a sharded one) that granular reads.

    Bags are version 2, ``spec.json`` and refs are written exactly as
    granular 0.20.3 writes them, so the same datapoints give the same bytes.
    Output goes to a temporary sibling directory that is renamed into place
    on a clean close; an existing non-empty ``directory`` is refused, an
    exception inside ``with`` removes the temporary output, and spec.json is
    written last, so an interrupted write never opens as a dataset.

    Values are checked as they come: a missing or extra key, or a value its
    type cannot encode, raises WriterError naming the datapoint number and
    key, and nothing of that datapoint is written. Empty ``bytes``/``utf8``
    values are refused: bag records must be non-empty (granular refuses
    them too, and an empty first record would make a bag unreadable).
    Without any datapoint, a sharded writer still writes one empty shard.

    Example::

        with BagWriter('out', {'frames': 'jpg[]', 'label': 'int'}, shardlen=1000) as w:
            w.append({'frames': [img0, img1], 'label': 7})
    """

    format_name = 'bag'

    def __init__(self, directory: str | os.PathLike, spec: Mapping[str, str],
                 shardlen: int | None = None, storage_options: dict | None = None):
        self.path = os.fspath(directory)
        problem = _spec_problem(dict(spec) if isinstance(spec, Mapping) else spec)
        if problem is None:
            for key, type_name in spec.items():
                base, _ = parse_type(type_name)
                if not _GRANULAR_NAME.match(key):
                    problem = f'key {key!r} must start with a-z or _ (granular requires it)'
                elif base in codecs.UNSUPPORTED_TYPES:
                    problem = f'type {type_name!r} of key {key!r} is not supported by loadr'
        if problem:
            raise WriterError(f'bad spec: {problem}', self.path)
        if shardlen is not None and (isinstance(shardlen, bool) or not isinstance(shardlen, int)
                                     or shardlen < 1):
            raise WriterError(f'shardlen must be a positive int or None, not {shardlen!r}',
                              self.path)
        self.spec = dict(sorted(spec.items()))
        self._types = {k: parse_type(t) for k, t in self.spec.items()}
        self.shardlen = shardlen
        self._dataset_dirs: list[str] = []       # relative to the staged directory
        self._bags: dict[str, BagFileWriter] | None = None
        self._shard_count = 0          # datapoints in the open shard
        self._length = 0
        self._stage(storage_options)
        self._tmp = self._out.path

    def __len__(self) -> int:
        return self._length

    def _open_shard(self) -> None:
        if self.shardlen is None:
            directory = ''
        else:
            directory = f'{len(self._dataset_dirs):06}'
            self._out.mkdir(directory)
        self._dataset_dirs.append(directory)
        self._bags = {}
        for key in (REFS_KEY, *self.spec):
            name = os.path.join(directory, f'{key}.bag')
            self._bags[key] = BagFileWriter(self._out.join(name), out=self._out.open_write(name))
        self._shard_count = 0

    def _close_shard(self) -> None:
        for bag in self._bags.values():
            bag.close()
        self._bags = None

    def _encode(self, number: int, key: str, base: str, value, position=None) -> bytes:
        where = key if position is None else f'{key}[{position}]'
        try:
            data = codecs.encode(base, value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise WriterError(f'datapoint {number}, key {where!r} ({base}): {exc}', self.path,
                              number) from exc
        if not data:
            raise WriterError(f'datapoint {number}, key {where!r}: an empty value cannot be '
                              f'stored (bag records must be non-empty, as in granular)',
                              self.path, number)
        return data

    def append(self, datapoint: Mapping) -> int:
        """Check, encode and write one datapoint; returns its index."""
        if self.closed:
            raise WriterError('append to a closed writer', self.path)
        number = self._length
        if not isinstance(datapoint, Mapping):
            raise WriterError(f'datapoint {number} must be a dict, not '
                              f'{type(datapoint).__name__}', self.path, number)
        missing = [k for k in self.spec if k not in datapoint]
        if missing:
            raise WriterError(f'datapoint {number} misses key {missing[0]!r} (spec keys: '
                              f'{list(self.spec)})', self.path, number)
        extra = [k for k in datapoint if k not in self.spec]
        if extra:
            raise WriterError(f'datapoint {number} has key {extra[0]!r}, which is not in the '
                              f'spec {list(self.spec)}', self.path, number)
        encoded = {}
        for key, (base, is_seq) in self._types.items():
            value = datapoint[key]
            if not is_seq:
                encoded[key] = self._encode(number, key, base, value)
                continue
            if not isinstance(value, (list, tuple)) and not (
                    isinstance(value, np.ndarray) and value.ndim >= 1):
                raise WriterError(f'datapoint {number}, key {key!r} is a sequence '
                                  f'({self.spec[key]}), so its value must be a list, not '
                                  f'{type(value).__name__}', self.path, number)
            encoded[key] = [self._encode(number, key, base, v, p) for p, v in enumerate(value)]
        if self._bags is None:
            self._open_shard()
        refs = []
        for key, (_, is_seq) in self._types.items():
            bag = self._bags[key]
            if is_seq:
                indices = [bag.append(data) for data in encoded[key]]
                refs.append([indices[0], len(indices)] if indices else [])
            else:
                refs.append(bag.append(encoded[key]))
        self._bags[REFS_KEY].append(msgpack.packb(refs))
        self._length += 1
        self._shard_count += 1
        if self.shardlen is not None and self._shard_count >= self.shardlen:
            self._close_shard()
        return number

    # -- conversion into a bag dataset (loadr convert) --------------------------

    @classmethod
    def plan(cls, plan: Plan, dst: str, types: dict, **options) -> None:
        bad = [k for k in types if not _CONVERTIBLE_KEY.match(k)]
        if bad:
            raise ConfigError(f'key {bad[0]!r} cannot be a bag key (a bag key starts with a-z '
                              f'or _); leave it out with --keys', plan.source.path)
        plan.settings['spec'] = dict(types)

    @classmethod
    def describe_plan(cls, plan: Plan) -> str:
        return f'bag with spec {plan.settings["spec"]}'

    @classmethod
    def from_plan(cls, plan: Plan, dst: str, shardlen: int | None = None,
                  **options) -> BagWriter:
        return cls(dst, plan.settings['spec'], shardlen=shardlen, **_known(cls, options))

    @classmethod
    def datapoint_for(cls, plan: Plan, index: int, dp):
        return {'data': dp} if plan.source.raw else dp

    def _finish(self) -> None:
        """Finish every bag and write spec.json (last, so a cut write never opens)."""
        if self._bags is None and not self._dataset_dirs:
            self._open_shard()          # no datapoints: still a valid, empty dataset
        if self._bags is not None:
            self._close_shard()
        spec_json = json.dumps(self.spec).encode('utf-8')   # granular's exact bytes
        for directory in self._dataset_dirs:
            self._out.write_file(os.path.join(directory, SPEC_NAME), spec_json)

    def _release(self) -> None:
        if self._bags is not None:
            for bag in self._bags.values():
                bag.abort()
            self._bags = None


# ---------------------------------------------------------------------------
# check and detect


def detect(path: str) -> bool:
    """True for a directory with spec.json, or with shard directories holding one.

    >>> detect(FIXTURES / 'bag_sharded'), detect(FIXTURES / 'bag_raw')
    (True, False)
    """
    try:
        path = os.fspath(path)
        storage = storage_for(path)
        if not storage.isdir(path):
            return False
        if storage.isfile(os.path.join(path, SPEC_NAME)):
            return True
        return any(SHARD_NAME.match(name)
                   and storage.isfile(os.path.join(path, name, SPEC_NAME))
                   for name in storage.list(path))
    except Exception:       # detection never raises, whatever the path is
        return False


def _problem(exc: LoadrError, path: str, index: int | None = None) -> Problem:
    return Problem(exc.path or path, exc.index if exc.index is not None else index, exc.message)


def _check_dataset(files: Storage, directory: str, start: int, first_spec: dict | None,
                   problems: list[Problem]) -> tuple[int, dict | None]:
    """Append the problems of one dataset directory; returns (datapoints, spec)."""
    try:
        spec, _ = _read_spec(files, directory)
    except LoadrError as exc:           # FormatError, or ReadError (e.g. EACCES)
        problems.append(_problem(exc, directory))
        return 0, first_spec
    spec_dict = dict(sorted(spec))
    if first_spec is not None and spec_dict != first_spec:
        problems.append(Problem(os.path.join(directory, SPEC_NAME), None,
                                f'spec differs from the first shard\'s {first_spec}'))
    bags = {}
    for key in (REFS_KEY, *spec_dict):
        bag_path = os.path.join(directory, f'{key}.bag')
        bags[key] = None
        if not files.isfile(bag_path):
            problems.append(Problem(bag_path, None, f'missing bag file for key {key!r}'))
            continue
        try:
            bag = Bag(bag_path, files)
            bag.validate()
            bags[key] = bag
        except LoadrError as exc:
            problems.append(_problem(exc, bag_path))
    try:
        names = files.list(directory)
    except LoadrError as exc:
        problems.append(_problem(exc, directory))
        names = []
    for name in names:
        if name.endswith('.bag') and name[:-4] not in bags:
            problems.append(Problem(os.path.join(directory, name), None,
                                    'bag file of a key that is not in spec.json'))
    if bags[REFS_KEY] is None:
        return 0, first_spec or spec_dict
    problem = _empty_refs_problem(bags)
    if problem:
        problems.append(Problem(bags[REFS_KEY].path, None, problem))
        return 0, first_spec or spec_dict
    dataset = _Dataset(directory, spec, bags, start)
    readable = [k for k, t in spec
                if bags[k] is not None and parse_type(t)[0] not in codecs.UNSUPPORTED_TYPES]
    for local in range(len(dataset)):
        try:
            dataset.refs(local)
        except LoadrError as exc:
            problems.append(_problem(exc, directory, start + local))
            continue
        for key in readable:        # key by key: one bad value must not hide the others
            try:
                dataset.read(local, {key: True}, decode_images=True)
            except LoadrError as exc:
                problems.append(_problem(exc, directory, start + local))
    files.close()           # one shard's descriptors at a time
    return len(dataset), first_spec or spec_dict


def records(path: str | os.PathLike) -> dict:
    """Where the records of each file lie and whose they are, for :mod:`loadr.digests`.

    Every bag's records (with the datapoint each belongs to, from refs.bag);
    spec.json as a whole.
    """
    from ..digests import FileRecords
    out: dict = {}
    with BagReader(path, decode_images=False) as reader:
        for shard in reader._shards:
            out[os.path.join(shard.path, SPEC_NAME)] = None
            owners = {key: np.full(len(bag), -1, np.int64) for key, bag in shard.bags.items()}
            owners[REFS_KEY][:] = shard.start + np.arange(len(shard))
            for local in range(len(shard)):
                for (key, _), ref in zip(shard.spec, shard.refs(local)):
                    if not shard._types[key][1]:
                        owners[key][ref] = shard.start + local
                    elif ref:
                        owners[key][ref[0]:ref[0] + ref[1]] = shard.start + local
            for key, bag in shard.bags.items():
                ends = bag._load_table(None).astype(np.int64)
                starts = np.concatenate([np.zeros(1, np.int64), ends[:-1]])
                out[bag.path] = FileRecords(starts, ends, owners[key])
    return out


def check(path: str | os.PathLike) -> list[Problem]:
    """Every problem of a bag dataset or sharded dataset, each naming file and index.

    Checks the shard numbering, each spec.json, that every key has its bag
    (and no bag lacks a key), every bag's whole index table, every refs
    record against the spec and the bag lengths, and that every value
    decodes (images fully). Values of unsupported video types are not
    decoded. The index is the datapoint's for refs and values, the record's
    for a bag's table.

    >>> check(FIXTURES / 'bag_sharded')
    []
    """
    path = os.fspath(path)
    try:
        files = storage_for(path)
    except LoadrError as exc:
        return [_problem(exc, path)]
    dirs, fatal, odd = _list_shards(files, path)
    problems = fatal + odd
    start, spec = 0, None
    try:
        for directory in dirs:
            count, spec = _check_dataset(files, directory, start, spec, problems)
            start += count
    finally:
        files.close()
    return problems


FORMAT = Format('bag', detect, BagReader, BagWriter, check, records=records)

