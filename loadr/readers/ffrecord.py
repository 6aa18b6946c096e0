"""FFRecord files (HFAiLab ffrecord): reader, writer, check and detection.

One ``.ffr`` file, all little-endian::

    u32 meta_crc | i64 N | u32 crc[N] | i64 offset[N] | sample 0 | sample 1 | ...

``meta_crc`` is zlib's CRC32 chained over the bytes of N, ``crc[]`` and
``offset[]``; sample i spans ``offset[i] .. offset[i+1]`` and the last one
ends at the end of the file. A metadata checksum of 0 marks a file from an
old ffrecord version: it is read, with a warning. A directory means its
``*.ffr`` files sorted by name, concatenated into one index space.

Samples are opaque bytes; ``decode`` says how to turn them into a datapoint.

Example::

    with FFRecordWriter('train.ffr', n=2) as w:
        w.write_one(msgpack.packb({'label': 1}))
        w.write_one(msgpack.packb({'label': 2}))
    r = FFRecordReader('train.ffr', decode='msgpack')
    r[1]                  # {'label': 2}
    r.read([1, 0])        # the raw bytes of samples 1 and 0
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import os
import pickle
import struct
import warnings
from typing import Any, Callable, Iterable

import msgpack
import numpy as np

from ..codecs import array_from_parts
from ..errors import ChecksumError, ConfigError, DecodeError, FormatError, LoadrError, \
    ReadError, SpecError, WriterError
from ..digests import check_record
from ..sources import BatchSource
from ..storage import Storage, storage_for
from .base import (Format, Plan, Problem, Reader, Source, Writer, _known, check_index,
                   infer_types, open_each)

try:
    # ISA-L's CRC-32 gives zlib's values ~6x faster (4 KiB: 0.22 us against 1.4 us), and
    # the check was a third of a random 4 KiB read's cost. zlib where isal has no wheel.
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency wherever it has wheels
    from zlib import crc32

__all__ = ['FFRecordReader', 'FFRecordWriter', 'FORMAT', 'check', 'detect', 'pack_msgpack']

SUFFIX = '.ffr'
PREAMBLE_BYTES = 12          # u32 meta_crc + i64 N
ENTRY_BYTES = 12             # u32 crc + i64 offset, per sample
# Adjacent small samples asked for together share one pread: it saves a
# syscall per sample but costs a copy, and a buffer past glibc's 128 KiB
# mmap threshold costs page faults. Measured on 256 sequential samples:
# 1 KB samples 25% faster, 8 KB 10%, 30 KB and up slower, hence the caps.
MAX_COALESCED_READ_BYTES = 120 << 10
MAX_COALESCED_SAMPLE_BYTES = 16 << 10
# A batch with fewer repeats and neighbours than 1 in FEW_NEIGHBOURS of its samples
# is read in the order asked, without sorting and merging (a random batch).
FEW_NEIGHBOURS = 8
# check() streams samples larger than this in pieces instead of reading them whole,
# and reads a file's table this many entries (12 bytes each) at a time.
CHECK_BLOCK_BYTES = 16 << 20
CHECK_TABLE_ENTRIES = 1 << 20
# check() lists at most this many problems per file (a table of garbage has N of them).
MAX_PROBLEMS_PER_FILE = 1000

DECODERS = ('msgpack', 'json', 'pickle')


def header_bytes(n: int) -> int:
    """Size of the header of a file holding ``n`` samples.

    >>> header_bytes(20)
    252
    """
    return PREAMBLE_BYTES + ENTRY_BYTES * n


@dataclasses.dataclass
class _Header:
    """The parsed, validated header of one file; ``bounds[i] .. bounds[i+1]`` is sample i."""

    path: str
    file_index: int          # position in the reader's files
    base: int                # global index of this file's sample 0
    n: int
    meta_crc: int
    crcs: np.ndarray         # uint32[n]
    bounds: np.ndarray       # int64[n + 1]: the offsets, then the file size
    # The same two tables seen as Python ints: indexing a memoryview costs a
    # fraction of a numpy scalar and its int(), and the read loop does it per sample.
    crc_at: memoryview = dataclasses.field(init=False, repr=False)
    bound_at: memoryview = dataclasses.field(init=False, repr=False)
    # (record digests, sidecar) when the reader verifies against loadr.digests
    digests: tuple | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        self.crcs = np.ascontiguousarray(self.crcs, dtype=np.uint32)
        self.bounds = np.ascontiguousarray(self.bounds, dtype=np.int64)
        self.crc_at = memoryview(self.crcs).cast('B').cast('I')
        self.bound_at = memoryview(self.bounds).cast('B').cast('q')


def _read_preamble(files: Storage, path: str) -> tuple[int, int, int]:
    """``(meta_crc, n, file size)``, with N checked against the file size before
    anything is allocated for it."""
    size = files.size(path)
    if size < PREAMBLE_BYTES:
        raise FormatError(f'too short for an FFRecord header: {size} bytes, '
                          f'need at least {PREAMBLE_BYTES}', path)
    preamble = files.read(path, 0, PREAMBLE_BYTES)
    meta_crc, n = struct.unpack('<Iq', preamble)
    if n < 0:
        raise FormatError(f'header claims a negative number of samples ({n})', path)
    if n > (size - PREAMBLE_BYTES) // ENTRY_BYTES:
        raise FormatError(f'header claims {n} samples, whose table needs '
                          f'{header_bytes(n)} bytes, but the file has only {size}', path)
    return meta_crc, n, size


def _read_table(files: Storage, path: str):
    """Read the preamble and the table: (meta_crc, n, crcs, offsets, size, table bytes).

    N is checked against the file size before anything is allocated for it.
    """
    meta_crc, n, size = _read_preamble(files, path)
    table = files.read(path, PREAMBLE_BYTES, ENTRY_BYTES * n)
    crcs = np.frombuffer(table, '<u4', n, 0)
    offsets = np.frombuffer(table, '<i8', n, 4 * n)
    return meta_crc, n, crcs, offsets, size, struct.pack('<q', n) + table


def _bad_offsets(n: int, offsets: np.ndarray, size: int) -> tuple[np.ndarray, list[str]]:
    """Local indices of samples whose offset is wrong, and why, in index order."""
    start = header_bytes(n)
    if n == 0:
        return np.zeros(0, np.int64), []
    previous = np.empty(n, np.int64)
    previous[0] = start
    previous[1:] = offsets[:-1]
    bad = (offsets < previous) | (offsets > size)
    bad[0] |= offsets[0] != start
    where = np.flatnonzero(bad)
    reasons = []
    for i in where.tolist():
        off = int(offsets[i])
        if off > size:
            reasons.append(f'offset {off} lies past the end of the file ({size} bytes)')
        elif i == 0:
            reasons.append(f'first offset is {off}, but the samples start at {start} '
                           f'(the end of the header)')
        else:
            reasons.append(f'offset {off} goes back before the previous sample\'s '
                           f'offset {int(offsets[i - 1])}')
    return where, reasons


def _load_header(files: Storage, path: str, file_index: int, base: int,
                 check_data: bool, table: tuple | None = None) -> _Header:
    """Read and validate one file's header; raises FormatError or ChecksumError.

    ``table``: what :func:`_read_table` returned for it, read already.
    """
    meta_crc, n, crcs, offsets, size, covered = table or _read_table(files, path)
    if check_data:
        # The CRC guards the whole table, so a mismatch is the truest account
        # of a damaged header; check it before judging the offsets it covers.
        if meta_crc == 0:
            warnings.warn(f'{path}: metadata checksum is 0, an old-version FFRecord file; '
                          f'reading it without checking the header', stacklevel=2)
        else:
            actual = crc32(covered)
            if actual != meta_crc:
                raise ChecksumError(f'metadata checksum mismatch: stored {meta_crc:#010x}, '
                                    f'computed {actual:#010x}; the header is corrupt', path)
    if n == 0 and size != PREAMBLE_BYTES:
        raise FormatError(f'header claims 0 samples but {size - PREAMBLE_BYTES} bytes follow it',
                          path)
    where, reasons = _bad_offsets(n, offsets, size)
    if len(where):
        local = int(where[0])
        raise FormatError(f'sample {local} of this file: {reasons[0]}', path, base + local)
    bounds = np.empty(n + 1, np.int64)
    bounds[:n] = offsets
    bounds[n] = size
    return _Header(path, file_index, base, n, meta_crc, crcs, bounds)


def _list_files(storage: Storage, path: str) -> list[str]:
    """The ``.ffr`` files of ``path`` in index order: itself, or a directory's, by name."""
    if storage.isdir(path):
        try:
            names = [n for n in storage.list(path) if n.endswith(SUFFIX)]
        except LoadrError as exc:
            raise FormatError(f'cannot list directory: {exc.message}', path) from exc
        files = [os.path.join(path, name) for name in names]
        files = [f for f in files if storage.isfile(f)]
        if not files:
            raise FormatError(f'directory holds no *{SUFFIX} files', path)
        return files
    return [path]


def _checked_indices(indices: Iterable[int], n: int) -> list[int]:
    """``indices`` as a list of ints in ``[0, n)``; IndexError/TypeError otherwise.

    Plain ints in range, the usual case, are checked in bulk.
    """
    wanted = list(indices)
    if wanted and set(map(type, wanted)) == {int} and min(wanted) >= 0 and max(wanted) < n:
        return wanted
    return [check_index(i, n) for i in wanted]


def _lone_and_adjacent(a: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
    """Split sorted distinct indices into lone ones and stretches of consecutive ones.

    Numpy finds the neighbours; only the stretches, rare in a random batch, are
    cut out in Python (cutting at every gap cost more per sample than its pread).

    >>> _lone_and_adjacent(np.array([1, 4, 5, 6, 9, 11, 12]))
    (array([1, 9]), [[4, 5, 6], [11, 12]])
    """
    a = np.asarray(a, np.int64)
    at = np.flatnonzero(a[1:] - a[:-1] == 1)       # a[k] and a[k + 1] are neighbours
    if not len(at):
        return a, []
    in_stretch = np.zeros(len(a), bool)
    in_stretch[at] = True
    in_stretch[at + 1] = True
    ks = at.tolist()
    stretches, start = [], ks[0]
    for k, following in zip(ks, ks[1:] + [-1]):
        if following != k + 1:                     # the stretch that began at start ends
            stretches.append(a[start:k + 2].tolist())
            start = following
    return a[~in_stretch], stretches


def _runs(locals_sorted: list[int], bounds, max_bytes: int,
          max_sample_bytes: int | None = None):
    """Group sorted local indices into runs of adjacent samples, one pread each.

    A run spans at most ``max_bytes`` (a single larger sample is a run of its
    own) and, if ``max_sample_bytes`` is given, joins only samples up to that
    size. Yields ``(start_byte, end_byte, [local indices])``; a repeated index
    joins the run it repeats.
    """
    run: list[int] = []
    for i in locals_sorted:
        if run and i == run[-1]:
            run.append(i)
            continue
        if run and i == run[-1] + 1 and bounds[i + 1] - bounds[run[0]] <= max_bytes:
            if max_sample_bytes is None or max(bounds[i + 1] - bounds[i],
                                               bounds[i] - bounds[i - 1]) <= max_sample_bytes:
                run.append(i)
                continue
        if run:
            yield int(bounds[run[0]]), int(bounds[run[-1] + 1]), run
        run = [i]
    if run:
        yield int(bounds[run[0]]), int(bounds[run[-1] + 1]), run


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f'array {value.dtype} {value.shape}'
    return type(value).__name__


class FFRecordReader(Reader, BatchSource):    # its own read_batch: one read per run
    """Reads one ``.ffr`` file, or a directory of them as one index space.

    ``check_data`` verifies the metadata CRC on open and each sample's CRC32
    on read; ``verify`` also checks each sample against the digests that
    ``loadr check --write-digests`` recorded (:mod:`loadr.digests`).
    ``decode`` turns a sample's bytes into the datapoint:

    - ``None``: ``{'data': bytes}``
    - ``'auto'``: what sample 0 is, read once when the reader is made: ``'msgpack'`` for
      a msgpack map (what ``loadr convert`` and :meth:`FFRecordWriter.append` write),
      ``'json'`` for a JSON object, else None; ``self.decode`` then says which, and
      never ``'pickle'``. The default of :func:`loadr.open`; this class's is None
    - ``'msgpack'`` / ``'json'``: the map as a dict (any other value ->
      ``{'data': value}``); numpy values stored as msgpack-numpy stores them
      (what :class:`FFRecordWriter` writes) come back as arrays
    - ``'pickle'``: ``pickle.loads``, unsafe on untrusted files, so only when named
    - a callable ``f(bytes)``: a dict it returns is the datapoint, any other
      value becomes ``{'data': value}``

    The headers are validated when the reader is made, and read again
    (once) in each process the reader is pickled to. ``storage_options``
    go to the storage of a URL (:func:`loadr.storage.storage_for`).

    Example::

        r = FFRecordReader('train.ffr', decode='msgpack')
        r.n, r[0]['label'], r.read([3, 1])
    """

    format_name = 'ffrecord'
    open_defaults = {'decode': 'auto'}      # loadr.open(x.ffr): what convert wrote, as maps

    def __init__(self, path: str | os.PathLike, check_data: bool = True,
                 decode: None | str | Callable[[bytes], Any] = None,
                 storage_options: dict | None = None, verify: bool = False):
        self.path = os.fspath(path)
        self._files = storage_for(self.path, storage_options)
        self.check_data = bool(check_data)
        self.verify = bool(verify)
        self._storage_options = storage_options
        if decode is not None and not callable(decode):
            if not isinstance(decode, str):
                raise TypeError(f'decode must be None, a name or a callable, '
                                f'not {type(decode).__name__}')
            if decode not in DECODERS + ('auto', 'none'):
                raise ConfigError(f'unknown decode {decode!r}; use None, \'auto\', '
                                  f'{", ".join(map(repr, DECODERS))} or a callable')
        self.decode = None if decode in ('auto', 'none') else decode
        self.files = _list_files(self._files, self.path)
        self._headers: list[_Header] | None = None
        self._spec: dict | None = None
        headers = self._load()
        self._counts = [h.n for h in headers]
        self._starts = [h.base for h in headers]
        self._n = sum(self._counts)
        if decode == 'auto':
            # What sample 0 is: never 'pickle', which is only ever used when named.
            self.decode = _detect_decode(self.read_one(0)) if self._n else None

    # -- headers, once per process ------------------------------------------

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_headers'] = None     # each process reads (and checks) its own
        return state

    def _load(self) -> list[_Header]:
        headers = self._headers
        if headers is None:
            headers, base = [], 0
            expected = getattr(self, '_counts', None)
            # Behind a URL the files' tables are read concurrently (their round trips
            # wait together), then checked in order as before.
            tables = open_each(self._files, lambda p: _read_table(self._files, p), self.files)
            for k, (path, table) in enumerate(zip(self.files, tables)):
                h = _load_header(self._files, path, k, base, self.check_data, table)
                if expected is not None and h.n != expected[k]:
                    raise FormatError(f'file changed since the reader was made: it held '
                                      f'{expected[k]} samples, now {h.n}', path)
                headers.append(h)
                base += h.n
            if self.verify:
                from ..digests import load
                recorded = load(self.path, self._storage_options, required=True)
                for h in headers:
                    h.digests = recorded.for_file(h.path)
            self._headers = headers
        return headers

    def _identity_files(self) -> dict[str, int]:
        return {h.path: int(h.bounds[-1]) for h in self._load()}

    # -- for inspect and convert (through the format table) --------------------

    @classmethod
    def _chosen_decode(cls, path: str, decode, options: dict):
        """``decode``, or for ``'auto'`` what sample 0 is: a msgpack map, a JSON object, bytes."""
        if decode != 'auto':
            return None if decode in (None, 'none') else decode
        with cls(path, decode='auto', **_known(cls, options)) as probe:
            return probe.decode

    @classmethod
    def probe(cls, path: str, decode='auto', **options) -> FFRecordReader:
        """The reader with ``decode`` detected from sample 0 (``'auto'``)."""
        return cls(path, decode=cls._chosen_decode(path, decode, options),
                   **_known(cls, options))

    def details(self) -> dict:
        decode = self.decode if self.decode is None or isinstance(self.decode, str) \
            else getattr(self.decode, '__name__', 'a function')
        return {'files': len(self.files), 'decode': decode or 'none (raw bytes)'}

    @classmethod
    def source(cls, path: str, decode='auto', **options) -> Source:
        """Samples decoded as ``decode`` (``'auto'``: detected); opaque bytes stay ``raw``."""
        chosen = cls._chosen_decode(path, decode, options)
        if chosen is None:
            return Source(path, cls.format_name, cls(path, **_known(cls, options)),
                          {'data': 'bytes'}, raw=True)
        reader = cls(path, decode=chosen, **_known(cls, options))
        # Every sample is read to type the keys (a list empty in sample 0 is still jpg[]).
        return Source(path, cls.format_name, reader, infer_types(reader))

    def _locate(self, index: int) -> tuple[_Header, int]:
        headers = self._load()
        if len(headers) == 1:
            return headers[0], index
        h = headers[bisect.bisect_right(self._starts, index) - 1]
        return h, index - h.base

    def file_info(self, file_index: int) -> dict:
        """The header of ``files[file_index]``, as the fixtures' manifest lists it.

        >>> FFRecordReader('x.ffr').file_info(0)['header_size']   # doctest: +SKIP
        252
        """
        h = self._load()[file_index]
        return {'path': h.path, 'n': h.n, 'meta_checksum': h.meta_crc,
                'header_size': header_bytes(h.n), 'file_size': int(h.bounds[-1]),
                'crc32': h.crcs.tolist(), 'offsets': h.bounds[:-1].tolist()}

    def locate(self, index: int) -> dict:
        """Where sample ``index`` lives: path, file_index, local_index, offset, length, crc32.

        >>> FFRecordReader('multi').locate(7)['local_index']   # doctest: +SKIP
        0
        """
        h, local = self._locate(check_index(index, self._n))
        start, end = int(h.bounds[local]), int(h.bounds[local + 1])
        return {'path': h.path, 'file_index': h.file_index, 'local_index': local,
                'offset': start, 'length': end - start, 'crc32': int(h.crcs[local])}

    # -- raw bytes -----------------------------------------------------------

    @property
    def n(self) -> int:
        """Number of samples (the original's ``FileReader.n``)."""
        return self._n

    def __len__(self) -> int:
        return self._n

    def _verified(self, h: _Header, local: int, data) -> None:
        if h.digests is not None:
            check_record(h.digests, h.path, local, data, h.base + local)
        if self.check_data:
            actual = crc32(data)
            stored = h.crc_at[local]
            if actual != stored:
                raise ChecksumError(f'sample {local} of this file (index {h.base + local}): '
                                    f'CRC32 is {actual:#010x}, header says {stored:#010x}',
                                    h.path, h.base + local)

    def _sample(self, h: _Header, local: int) -> bytes:
        start, end = h.bound_at[local], h.bound_at[local + 1]
        data = self._files.read(h.path, start, end - start, h.base + local)
        self._verified(h, local, data)
        return data

    def read_one(self, index: int) -> bytes:
        """The raw bytes of sample ``index``. Example: ``r.read_one(0)[:4]``."""
        return self._sample(*self._locate(check_index(index, self._n)))

    def read(self, indices: Iterable[int]) -> list[bytes]:
        """The raw bytes of each sample in ``indices``, in the order asked.

        Samples are grouped by file; adjacent samples are read with one pread.

        >>> [len(b) for b in FFRecordReader('x.ffr').read([2, 0])]   # doctest: +SKIP
        [1139, 5129]
        """
        wanted = _checked_indices(indices, self._n)
        if not wanted:
            return []
        headers = self._load()
        by_file: dict[int, list[int]] = {}
        if len(headers) == 1:
            by_file[0] = wanted
        else:
            for g in wanted:
                by_file.setdefault(bisect.bisect_right(self._starts, g) - 1, []).append(g)
        found: dict[int, bytes] = {}
        for k, globals_ in by_file.items():
            h = headers[k]
            asked = np.fromiter(globals_, np.int64, len(globals_))
            if h.base:
                asked -= h.base
            ordered = np.sort(asked)
            if np.count_nonzero(ordered[1:] - ordered[:-1] <= 1) * FEW_NEIGHBOURS <= len(asked):
                # A random batch: its few repeats and neighbours are not worth a sort and a
                # merge in Python (~1 us per sample); one pread each, in the order asked.
                datas = self._read_each(h, asked, globals_)
                if len(by_file) == 1:
                    return datas
                found.update(zip(globals_, datas))
                continue
            distinct = ordered[1:] != ordered[:-1]
            if not distinct.all():
                ordered = ordered[np.concatenate(([True], distinct))]
            lone_at, stretches = _lone_and_adjacent(ordered)
            for stretch in stretches:
                self._read_adjacent(h, stretch, found)
            keys = (lone_at + h.base).tolist()
            found.update(zip(keys, self._read_each(h, lone_at, keys)))
        return list(map(found.__getitem__, wanted))

    def _read_each(self, h: _Header, at: np.ndarray, keys: list[int]) -> list[bytes]:
        """The samples ``at`` (local indices; ``keys``: their indices), one pread each, checked.

        One read_many names the file and index of a failed read. The ranges come
        from numpy and the CRCs are compared as two lists: per sample Python work
        here cost as much as the pread (issue 15). A CRC mismatch is read again by
        _sample, which raises naming the sample, or returns the data if the
        trouble has passed.
        """
        starts = h.bounds[at]
        datas = self._files.read_many(list(zip(
            itertools.repeat(h.path), starts.tolist(), (h.bounds[at + 1] - starts).tolist(),
            keys)))
        if h.digests is not None:
            for local, data in zip(at.tolist(), datas):
                self._verified(h, local, data)
        elif self.check_data and list(map(crc32, datas)) != h.crcs[at].tolist():
            for j, (local, data) in enumerate(zip(at.tolist(), datas)):
                if crc32(data) != h.crc_at[local]:
                    datas[j] = self._sample(h, local)
        return datas

    def _read_adjacent(self, h: _Header, stretch: list[int], found: dict) -> None:
        """Read consecutive samples with as few preads as the size limits allow."""
        base = h.base
        for start, end, run in _runs(stretch, h.bound_at, MAX_COALESCED_READ_BYTES,
                                     MAX_COALESCED_SAMPLE_BYTES):
            if len(run) == 1:
                found[base + run[0]] = self._sample(h, run[0])
                continue
            try:
                data = self._files.read(h.path, start, end - start, base + run[0])
            except (FormatError, ReadError):
                # The file shrank under us, or the read failed (one bad record fails the
                # read of its neighbours): read one by one, so that only an unreadable
                # sample fails, named.
                for local in run:
                    found[base + local] = self._sample(h, local)
                continue
            view = memoryview(data)
            for local in run:
                a, b = h.bound_at[local] - start, h.bound_at[local + 1] - start
                self._verified(h, local, view[a:b])
                found[base + local] = bytes(view[a:b])

    # -- datapoints ----------------------------------------------------------

    def _decoded(self, index: int, data: bytes) -> dict:
        decode = self.decode
        if decode is None:
            return {'data': data}
        try:
            if decode == 'msgpack':
                value = msgpack.unpackb(data, raw=False, strict_map_key=False,
                                        object_hook=_unpack_numpy)
            elif decode == 'json':
                value = json.loads(data)
            elif decode == 'pickle':
                value = pickle.loads(data)   # the user asked for it by name
            else:
                value = decode(data)
        except Exception as exc:
            h, local = self._locate(index)
            how = decode if isinstance(decode, str) else getattr(decode, '__name__', 'decode')
            raise DecodeError(f'sample {local} of this file does not decode with {how}: '
                              f'{type(exc).__name__}: {exc}', h.path, index) from exc
        return value if isinstance(value, dict) else {'data': value}

    def _masked(self, index: int, dp: dict, mask: dict | None) -> dict:
        if mask is None:
            return dp
        out = {}
        for key, want in mask.items():
            if want is False:
                continue
            if want is not True:
                raise TypeError(f'mask value for {key!r} must be True or False; FFRecord '
                                f'datapoints have no sequence keys')
            if key not in dp:
                h, _ = self._locate(index)
                raise SpecError(f'datapoint has no key {key!r} (it has {sorted(map(str, dp))})',
                                h.path, index)
            out[key] = dp[key]
        return out

    def _get(self, index: int, mask: dict | None) -> dict:
        return self._masked(index, self._decoded(index, self.read_one(index)), mask)

    def read_batch(self, indices: Iterable[int]) -> list[dict]:
        """Datapoints for ``indices`` in order, read with :meth:`read`."""
        wanted = [check_index(i, self._n) for i in indices]
        return [self._decoded(i, data) for i, data in zip(wanted, self.read(wanted))]

    def _ranges(self, indices: list[int]) -> list[tuple]:
        out = []
        for index in indices:
            h, local = self._locate(index)
            start = int(h.bound_at[local])
            out.append((h.path, start, int(h.bound_at[local + 1]) - start, index))
        return out

    def available(self, index: int) -> dict:
        """``{key: True}`` for each key of datapoint ``index``.

        Undecoded this is ``{'data': True}`` without any read; with ``decode``
        the sample must be read and decoded to learn its keys.
        """
        index = check_index(index, self._n)
        if self.decode is None:
            return {'data': True}
        return {key: True for key in self._get(index, None)}

    @property
    def spec(self) -> dict:
        """What each key holds: ``{'data': 'bytes'}``, or with ``decode`` datapoint 0's keys.

        >>> FFRecordReader('single.ffr', decode='msgpack').spec   # doctest: +SKIP
        {'image': 'bytes', 'label': 'int'}
        """
        if self.decode is None:
            return {'data': 'bytes'}
        if self._spec is None:
            self._spec = {} if self._n == 0 else {
                key: _describe(value) for key, value in self._get(0, None).items()}
        return self._spec


class FFRecordWriter(Writer):
    """Writes ``n`` samples to one ``.ffr`` file, byte-identical to ffrecord's FileWriter.

    The header is reserved, samples are appended, and the header is filled on
    close. Everything goes to a hidden temporary file beside ``path`` that is
    renamed to ``path`` only when all ``n`` samples were written; otherwise it
    is removed, so nothing that looks complete is left behind (the staged
    lifecycle of :class:`~loadr.readers.base.Writer`).

    ``write_one(bytes)`` appends a sample as it is; ``append(datapoint)``
    appends a dict as one msgpack map (what ``decode='msgpack'`` reads back).

    Example::

        with FFRecordWriter('out.ffr', n=2) as w:
            w.write_one(b'first')
            w.append({'label': 2})
    """

    format_name = 'ffrecord'
    directory = False
    overwrite = True            # as ffrecord's FileWriter: an existing file is replaced on success

    def __init__(self, path: str | os.PathLike, n: int, storage_options: dict | None = None):
        if isinstance(n, bool) or not hasattr(n, '__index__'):
            raise TypeError(f'n must be an integer, not {type(n).__name__}')
        n = n.__index__()
        if n < 0:
            raise WriterError(f'n must be >= 0, not {n}', path)
        self.path = os.fspath(path)
        self.n = n
        self.count = 0
        self._crcs = np.zeros(n, '<u4')
        self._offsets = np.zeros(n, '<i8')
        self._pos = header_bytes(n)
        # Hidden and not ending in .ffr: a directory reader never picks it up.
        self._stage(storage_options)
        self._tmp = self._out.path

    def write_one(self, data: bytes | bytearray | memoryview) -> None:
        """Append one sample. Example: ``w.write_one(msgpack.packb({'label': 3}))``."""
        if self.closed:
            raise WriterError('writer is closed', self.path, self.count)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise WriterError(f'a sample must be bytes, bytearray or memoryview, '
                              f'not {type(data).__name__}', self.path, self.count)
        if self.count >= self.n:
            raise WriterError(f'writer was made for n={self.n} samples; this would be '
                              f'sample {self.count + 1}',
                              self.path, self.count)
        view = memoryview(data)
        if not view.c_contiguous:
            raise WriterError('a memoryview sample must be C-contiguous', self.path, self.count)
        view = view.cast('B')
        self._crcs[self.count] = crc32(view)
        self._offsets[self.count] = self._pos
        self._out.pwrite(view, self._pos)
        self._pos += len(view)
        self.count += 1

    def append(self, datapoint) -> int:
        """Append a datapoint (a dict, stored as a msgpack map) or raw bytes; returns its index.

        Example: ``w.append({'label': 3, 'image': jpeg_bytes})``.
        """
        if isinstance(datapoint, (bytes, bytearray, memoryview)):
            data = datapoint
        elif isinstance(datapoint, dict):
            data = pack_msgpack(datapoint, self.path, self.count)
        else:
            raise WriterError(f'a datapoint must be a dict (or bytes), not '
                              f'{type(datapoint).__name__}', self.path, self.count)
        self.write_one(data)
        return self.count - 1

    # -- conversion into FFRecord (loadr convert) -------------------------------

    @classmethod
    def plan(cls, plan: Plan, dst: str, types: dict, **options) -> None:
        """Any keys fit: one msgpack map per datapoint, numpy values as msgpack-numpy stores
        them (:func:`pack_msgpack`); samples that are opaque bytes are copied as they are."""
        if not dst.endswith(SUFFIX):
            raise ConfigError(f'an ffrecord output is one file ending in {SUFFIX}', dst)

    @classmethod
    def describe_plan(cls, plan: Plan) -> str:
        what = 'raw sample bytes' if plan.source.raw else f'msgpack maps of {plan.keys}'
        return f'ffrecord, {what}'

    @classmethod
    def from_plan(cls, plan: Plan, dst: str, **options) -> FFRecordWriter:
        return cls(dst, len(plan.source), **_known(cls, options))

    def _finish(self) -> None:
        """Fill the header; WriterError (and no file) if short of ``n``."""
        if self.count != self.n:
            raise WriterError(f'closed after {self.count} of {self.n} samples; '
                              f'the file was not written', self.path)
        body = struct.pack('<q', self.n) + self._crcs.tobytes() + self._offsets.tobytes()
        self._out.pwrite(struct.pack('<I', crc32(body)) + body, 0)


def pack_msgpack(datapoint: dict, path: str | None = None, index: int | None = None) -> bytes:
    """One datapoint as the msgpack map an FFRecord sample holds; numpy values as msgpack-numpy.

    An array becomes ``{b'nd': True, b'type': dtype.str, b'kind': b'', b'shape': shape,
    b'data': C-order bytes}`` and a numpy scalar ``{b'nd': False, b'type', b'data'}``,
    exactly what ``msgpack_numpy.encode`` gives, so its users read the samples as they
    are; ``decode='msgpack'`` turns them back into arrays.

    >>> msgpack.unpackb(pack_msgpack({'label': 3}))
    {'label': 3}
    """
    try:
        return msgpack.packb(datapoint, use_bin_type=True, default=_pack_numpy)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WriterError(f'datapoint {index} cannot be stored as msgpack: {exc}', path,
                          index) from exc


def _pack_numpy(value):
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.hasobject or value.dtype.kind == 'V':
            raise TypeError(f'numpy values of dtype {value.dtype} cannot be stored as bytes')
        if isinstance(value, np.generic):
            return {b'nd': False, b'type': value.dtype.str, b'data': value.tobytes()}
        if not value.flags.c_contiguous:      # (ascontiguousarray would make 0-d arrays 1-d)
            value = value.copy(order='C')
        return {b'nd': True, b'type': value.dtype.str, b'kind': b'', b'shape': value.shape,
                b'data': value.tobytes()}
    raise TypeError(f'can not serialize {type(value).__name__!r} object')


def _unpack_numpy(obj: dict):
    """``object_hook`` of the msgpack decoder: msgpack-numpy's maps back into numpy values.

    Arrays come back read-only, checked before anything is allocated
    (:func:`loadr.codecs.array_from_parts`); structured (``kind`` V) and object
    dtypes are refused.
    """
    nd = obj.get(b'nd')
    if nd is None or b'type' not in obj or b'data' not in obj:
        return obj
    if nd is True:
        if obj.get(b'kind', b'') != b'':
            raise DecodeError(f'a numpy array of kind {obj[b"kind"]!r} (structured) is not '
                              f'supported')
        return array_from_parts(obj[b'type'], obj.get(b'shape'), obj[b'data'])
    if nd is False:
        return array_from_parts(obj[b'type'], [], obj[b'data'])[()]
    return obj


def records(path: str | os.PathLike) -> dict:
    """Where the samples of each file lie, for :mod:`loadr.digests`: ``{file: FileRecords}``."""
    from ..digests import FileRecords
    with FFRecordReader(path, check_data=False) as reader:
        return {h.path: FileRecords(h.bounds[:-1].copy(), h.bounds[1:].copy(),
                                    h.base + np.arange(h.n, dtype=np.int64))
                for h in reader._load()}


def check(path: str | os.PathLike) -> list[Problem]:
    """Every problem in an FFRecord file or directory: header, offsets, each sample's CRC,
    and each sample's content (:class:`_Contents`): it decodes as the first one does (a
    msgpack map, a JSON object, or bytes), and every JPEG or PNG in it decodes whole.

    >>> check(FIXTURES / 'ffrecord/single.ffr')
    []
    """
    path = os.fspath(path)
    try:
        files = storage_for(path)
        paths = _list_files(files, path)
    except LoadrError as exc:
        return [Problem(exc.path or path, exc.index, exc.message)]
    problems: list[Problem] = []
    contents = _Contents()
    base = 0
    try:
        for file in paths:
            base += _check_file(files, file, base, problems, contents)
    finally:
        files.close()
    return problems + contents.strays()


def _check_file(files: Storage, path: str, base: int, problems: list[Problem],
                contents: _Contents | None = None) -> int:
    """Append this file's problems; return its sample count (0 if the header is unreadable).

    The table is read :data:`CHECK_TABLE_ENTRIES` entries at a time, so the
    memory used does not grow with the number of samples (a file may claim
    any N its size allows, e.g. a sparse file of holes); the metadata CRC is
    summed over the pieces as they pass. At most :data:`MAX_PROBLEMS_PER_FILE`
    problems are listed per file, then one line counting the rest.
    """
    try:
        meta_crc, n, size = _read_preamble(files, path)
    except LoadrError as exc:
        problems.append(Problem(exc.path or path, exc.index, exc.message))
        return 0
    found: list[Problem] = []
    if n == 0 and size != PREAMBLE_BYTES:
        found.append(Problem(path, None, f'header claims 0 samples but '
                                         f'{size - PREAMBLE_BYTES} bytes follow it'))
    # The CRC covers N, crc[] and offset[], in that order; both tables are read a piece at
    # a time, so the two parts are summed apart and joined at the end.
    crc_head = crc32(struct.pack('<q', n)) if meta_crc else 0
    crc_offsets = 0
    start = header_bytes(n)
    crc_table, offset_table = PREAMBLE_BYTES, PREAMBLE_BYTES + 4 * n
    previous = start               # the offset before this piece's first (as stored)
    try:
        for lo in range(0, n, CHECK_TABLE_ENTRIES):
            hi = min(n, lo + CHECK_TABLE_ENTRIES)
            raw_crcs = files.read(path, crc_table + 4 * lo, 4 * (hi - lo))
            raw_offsets = files.read(path, offset_table + 8 * lo, 8 * (hi - lo))
            if meta_crc:
                crc_head = crc32(raw_crcs, crc_head)
                crc_offsets = crc32(raw_offsets, crc_offsets)
            crcs = np.frombuffer(raw_crcs, '<u4')
            offsets = np.frombuffer(raw_offsets, '<i8')
            following = size if hi == n else struct.unpack(
                '<q', files.read(path, offset_table + 8 * hi, 8))[0]
            _check_piece(files, path, base, lo, start, size, previous, following, crcs,
                         offsets, found, contents)
            previous = int(offsets[-1])
            if len(found) > MAX_PROBLEMS_PER_FILE:
                break
    except LoadrError as exc:
        found.append(Problem(exc.path or path, exc.index, exc.message))
    if meta_crc and len(found) <= MAX_PROBLEMS_PER_FILE:
        actual = crc32_combine(crc_head, crc_offsets, 8 * n)
        if actual != meta_crc:
            found.insert(0, Problem(path, None, f'metadata checksum mismatch: stored '
                                                f'{meta_crc:#010x}, computed {actual:#010x}'))
    if len(found) > MAX_PROBLEMS_PER_FILE:
        found[MAX_PROBLEMS_PER_FILE:] = [Problem(path, None, (
            f'more than {MAX_PROBLEMS_PER_FILE} problems in this file; the check stopped '
            f'after listing {MAX_PROBLEMS_PER_FILE}'))]
    problems += found
    return n


def _check_piece(files: Storage, path: str, base: int, lo: int, start: int, size: int,
                 previous: int, following: int, crcs: np.ndarray, offsets: np.ndarray,
                 found: list[Problem], contents: _Contents | None = None) -> None:
    """The problems of samples ``lo .. lo + len(offsets) - 1`` of one file.

    ``previous`` is the stored offset before ``offsets[0]`` (the end of the
    header for sample 0), ``following`` the one after the last (the file
    size after the last sample). A sample's CRC is checked when both its
    ends are sane; the others are reported as bad offsets.
    """
    count = len(offsets)
    # bounds[i] .. bounds[i + 1] is sample lo + i; around them the offsets just outside.
    edges = np.empty(count + 2, np.int64)
    edges[0], edges[1:-1], edges[-1] = previous, offsets, following
    # Compared, not subtracted: a table of garbage holds offsets whose differences overflow.
    bad = (offsets < edges[:-2]) | (offsets > size)
    if lo == 0:
        bad[0] |= offsets[0] != start
    before = edges[:-2]
    for i in np.flatnonzero(bad).tolist():
        off = int(offsets[i])
        if off > size:
            reason = f'offset {off} lies past the end of the file ({size} bytes)'
        elif lo + i == 0:
            reason = (f'first offset is {off}, but the samples start at {start} '
                      f'(the end of the header)')
        else:
            reason = f'offset {off} goes back before the previous sample\'s offset {int(before[i])}'
        found.append(Problem(path, base + lo + i, f'sample {lo + i} of this file: {reason}'))
    # The last bound is the next piece's first offset (or the file size), bad if it goes
    # back or past the end.
    bounds = edges[1:]
    with np.errstate(over='ignore'):       # only the lengths of sane samples are used
        lengths = bounds[1:] - bounds[:-1]
    last_bad = following != size and (following < offsets[-1] or following > size)
    if bad.any() or last_bad:
        bad_bound = np.empty(count + 1, bool)
        bad_bound[:count] = bad
        bad_bound[count] = last_bad
        sane = ~bad_bound[:-1] & ~bad_bound[1:]
    else:
        sane = np.ones(count, bool)
    # Empty samples need no read: their CRC32 is 0. Listed with the others in index order.
    mismatches: list[Problem] = []
    for i in np.flatnonzero(sane & (lengths == 0) & (crcs != 0)).tolist():
        mismatches.append(Problem(path, base + lo + i, f'sample {lo + i} of this file: CRC32 is '
                                                  f'0x00000000, header says {int(crcs[i]):#010x}'))
    readable = np.flatnonzero(sane & (lengths > 0)).tolist()
    for first, end, run in _runs(readable, bounds, CHECK_BLOCK_BYTES):
        view = None
        if end - first > CHECK_BLOCK_BYTES:       # one big sample: stream it
            crc = 0
            for at in range(first, end, CHECK_BLOCK_BYTES):
                piece = files.read(path, at, min(CHECK_BLOCK_BYTES, end - at),
                                   base + lo + run[0])
                crc = crc32(piece, crc)
            actual = {run[0]: crc}
        else:
            view = memoryview(files.read(path, first, end - first, base + lo + run[0]))
            actual = {i: crc32(view[int(bounds[i]) - first:int(bounds[i + 1]) - first])
                      for i in run}
        for i, crc in actual.items():
            if crc != int(crcs[i]):
                mismatches.append(Problem(path, base + lo + i, f'sample {lo + i} of this file: '
                                                               f'CRC32 is {crc:#010x}, header '
                                                               f'says {int(crcs[i]):#010x}'))
            elif contents is not None:
                # The bytes are the ones written: now whether they are what they claim to be.
                a, b = int(bounds[i]), int(bounds[i + 1])
                data = (view[a - first:b - first] if view is not None
                        else files.read(path, a, b - a, base + lo + i))
                contents.visit(path, base + lo + i, lo + i, data, mismatches)
    if contents is not None and contents.decode not in (False, None):
        # An empty sample is no map: listed (up to the limit) where the samples are maps.
        empty = np.flatnonzero(sane & (lengths == 0) & (crcs == 0))[:MAX_PROBLEMS_PER_FILE + 1]
        for i in empty.tolist():
            contents.visit(path, base + lo + i, lo + i, b'', mismatches)
    found += sorted(mismatches, key=lambda p: p.index)


class _Contents:
    """What ``check`` finds inside the samples whose CRC is right.

    How samples are read is detected from the first one visited, as
    ``decode='auto'`` does: a msgpack map (what ``loadr convert`` and
    :meth:`FFRecordWriter.append` write), a JSON object, or opaque bytes.
    Every later sample must read the same way. Each bytes value (and each
    bytes item of a list) that starts like a JPEG or PNG is decoded whole; a
    key that holds images in most samples but something else in a few has
    those few reported (:meth:`strays`): the Loader's image fns would fail on them.
    """

    def __init__(self):
        self.decode: str | None | bool = False      # False: not detected yet
        self.images: dict = {}                      # key -> samples with an image there
        self.others: dict = {}                      # key -> [(path, index, local, head, n)]

    def visit(self, path: str, index: int, local: int, data, found: list[Problem]) -> None:
        data = bytes(data)
        if self.decode is False:
            self.decode = _detect_decode(data)
        dp = {'data': data}
        if self.decode is not None:
            try:
                value = _decode_named(self.decode, data)
            except Exception as exc:  # noqa: BLE001 - any failure is this sample's problem
                found.append(Problem(path, index, f'sample {local} of this file does not decode '
                                                  f'as {self.decode}, as the first sample '
                                                  f'does: {type(exc).__name__}: {exc}'))
                return
            if not isinstance(value, dict):
                found.append(Problem(path, index, f'sample {local} of this file is a '
                                                  f'{self.decode} {type(value).__name__}, not a '
                                                  f'map as the first sample is'))
                return
            dp = value
        for key, value in dp.items():
            items = value if isinstance(value, (list, tuple)) else [value]
            for position, item in enumerate(items):
                if isinstance(item, (bytes, bytearray, memoryview)):
                    where = key if items is not value else f'{key}[{position}]'
                    self._image(path, index, local, key, where, bytes(item), found)

    def _image(self, path, index, local, key, where, data: bytes, found) -> None:
        from ..codecs import decode_image, image_kind
        if image_kind(data) not in ('JPEG', 'PNG'):
            others = self.others.setdefault(key, [])
            if len(others) <= MAX_PROBLEMS_PER_FILE:
                others.append((path, index, local, where, data[:8], len(data)))
            return
        self.images[key] = self.images.get(key, 0) + 1
        try:
            decode_image(data)
        except DecodeError as exc:
            found.append(Problem(path, index, f'sample {local} of this file, key {where!r}: '
                                              f'{exc.message}'))

    def strays(self) -> list[Problem]:
        """The non-images of keys that hold images in at least as many samples."""
        out = []
        for key, others in self.others.items():
            images = self.images.get(key, 0)
            if not images or len(others) > images:
                continue
            for path, index, local, where, head, n in others[:MAX_PROBLEMS_PER_FILE]:
                out.append(Problem(path, index, f'sample {local} of this file, key {where!r}: '
                                                f'not a JPEG or PNG ({n} bytes starting '
                                                f'{head!r}), while {images} other values of '
                                                f'{key!r} are images'))
        return sorted(out, key=lambda p: p.index)


def _detect_decode(data: bytes) -> str | None:
    """``'msgpack'`` for a msgpack map, ``'json'`` for a JSON object, else None (bytes)."""
    try:
        if isinstance(msgpack.unpackb(data, raw=False, strict_map_key=False), dict):
            return 'msgpack'
    except Exception:   # noqa: BLE001 - any failure just means "not msgpack"
        pass
    try:
        if isinstance(json.loads(data), dict):
            return 'json'
    except (ValueError, RecursionError):
        pass
    return None


def _decode_named(decode: str, data: bytes):
    if decode == 'msgpack':
        return msgpack.unpackb(data, raw=False, strict_map_key=False, object_hook=_unpack_numpy)
    return json.loads(data)


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)`` (zlib's algorithm).

    >>> import zlib
    >>> crc32_combine(zlib.crc32(b'head'), zlib.crc32(b'tail'), 4) == zlib.crc32(b'headtail')
    True
    """
    if len2 <= 0:
        return crc1

    def times(matrix, vector):
        total, i = 0, 0
        while vector:
            if vector & 1:
                total ^= matrix[i]
            vector >>= 1
            i += 1
        return total

    def square(matrix):
        return [times(matrix, matrix[k]) for k in range(32)]

    odd = [0xEDB88320] + [1 << k for k in range(31)]     # one zero bit
    even = square(odd)                                   # two zero bits
    odd = square(even)                                   # four zero bits
    while True:                                          # apply len2 zero bytes to crc1
        even = square(odd)
        if len2 & 1:
            crc1 = times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = square(even)
        if len2 & 1:
            crc1 = times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def detect(path: str | os.PathLike) -> bool:
    """True for a ``.ffr`` file or a directory directly holding ``*.ffr`` files; never raises.

    >>> detect(FIXTURES / 'ffrecord/multi')
    True
    """
    try:
        path = os.fspath(path)
        storage = storage_for(path)
        if storage.isfile(path):
            return path.endswith(SUFFIX)
        if storage.isdir(path):
            return any(n.endswith(SUFFIX) and storage.isfile(os.path.join(path, n))
                       for n in storage.list(path))
    except Exception:       # detection never raises, whatever the path is
        return False
    return False


FORMAT = Format('ffrecord', detect, FFRecordReader, FFRecordWriter, check,
                checksums='CRC32 of every sample', records=records)
