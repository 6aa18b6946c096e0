"""The FFRecord reader: samples as bytes or decoded, a batch read in coalesced runs."""

from __future__ import annotations

import bisect
import itertools
import json
import os
import pickle
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import numpy as np

from ...digests import check_record
from ...errors import ChecksumError, ConfigError, DecodeError, FormatError, ReadError, SpecError
from ...sources import BatchSource
from ...storage import storage_for
from ..base import Reader, check_index, known_options, open_each, select_keys
from ..records import Source, infer_types
from .layout import (
    Header,
    checked_indices,
    coalesced_runs,
    crc32,
    describe,
    header_bytes,
    list_files,
    load_header,
    lone_and_adjacent,
    read_table,
)
from .samples import detect_decode, unpack_numpy

# Adjacent small samples asked for together share one pread: it saves a
# syscall per sample but costs a copy, and a buffer past glibc's 128 KiB
# mmap threshold costs page faults. Measured on 256 sequential samples:
# 1 KB samples 25% faster, 8 KB 10%, 30 KB and up slower, hence the caps.
MAX_COALESCED_READ_BYTES = 120 << 10
MAX_COALESCED_SAMPLE_BYTES = 16 << 10
# A batch with fewer repeats and neighbours than 1 in FEW_NEIGHBOURS of its samples
# is read in the order asked, without sorting and merging (a random batch).
FEW_NEIGHBOURS = 8


DECODERS = ('msgpack', 'json', 'pickle')


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
        self.files = list_files(self._files, self.path)
        self._headers: list[Header] | None = None
        self._spec: dict | None = None
        headers = self._load()
        self._counts = [h.n for h in headers]
        self._starts = [h.base for h in headers]
        self._n = sum(self._counts)
        if decode == 'auto':
            # What sample 0 is: never 'pickle', which is only ever used when named.
            self.decode = detect_decode(self.read_one(0)) if self._n else None

    # -- headers, once per process ------------------------------------------

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_headers'] = None     # each process reads (and checks) its own
        return state

    def _load(self) -> list[Header]:
        headers = self._headers
        if headers is None:
            headers, base = [], 0
            expected = getattr(self, '_counts', None)
            # Behind a URL the files' tables are read concurrently (their round trips
            # wait together), then checked in order as before.
            tables = open_each(self._files, lambda p: read_table(self._files, p), self.files)
            for k, (path, table) in enumerate(zip(self.files, tables)):
                h = load_header(self._files, path, k, base, self.check_data, table)
                if expected is not None and h.n != expected[k]:
                    raise FormatError(f'file changed since the reader was made: it held '
                                      f'{expected[k]} samples, now {h.n}', path)
                headers.append(h)
                base += h.n
            if self.verify:
                from ...digests import load
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
        with cls(path, decode='auto', **known_options(cls, options)) as probe:
            return probe.decode

    @classmethod
    def probe(cls, path: str, decode='auto', **options) -> FFRecordReader:
        """The reader with ``decode`` detected from sample 0 (``'auto'``)."""
        return cls(path, decode=cls._chosen_decode(path, decode, options),
                   **known_options(cls, options))

    def details(self) -> dict:
        decode = self.decode if self.decode is None or isinstance(self.decode, str) \
            else getattr(self.decode, '__name__', 'a function')
        return {'files': len(self.files), 'decode': decode or 'none (raw bytes)'}

    @classmethod
    def source(cls, path: str, decode='auto', **options) -> Source:
        """Samples decoded as ``decode`` (``'auto'``: detected); opaque bytes stay ``raw``."""
        chosen = cls._chosen_decode(path, decode, options)
        if chosen is None:
            return Source(path, cls.format_name, cls(path, **known_options(cls, options)),
                          {'data': 'bytes'}, raw=True)
        reader = cls(path, decode=chosen, **known_options(cls, options))
        # Every sample is read to type the keys (a list empty in sample 0 is still jpg[]).
        return Source(path, cls.format_name, reader, infer_types(reader))

    def _locate(self, index: int) -> tuple[Header, int]:
        headers = self._load()
        if len(headers) == 1:
            return headers[0], index
        h = headers[bisect.bisect_right(self._starts, index) - 1]
        return h, index - h.base

    def where(self, index: int) -> str | None:
        """The .ffr file that holds sample ``index``."""
        return self._locate(check_index(index, self._n))[0].path

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

    def _verified(self, h: Header, local: int, data) -> None:
        if h.digests is not None:
            check_record(h.digests, h.path, local, data, h.base + local)
        if self.check_data:
            actual = crc32(data)
            stored = h.crc_at[local]
            if actual != stored:
                raise ChecksumError(f'sample {local} of this file (index {h.base + local}): '
                                    f'CRC32 is {actual:#010x}, header says {stored:#010x}',
                                    h.path, h.base + local)

    def _sample(self, h: Header, local: int) -> bytes:
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
        wanted = checked_indices(indices, self._n)
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
            lone_at, stretches = lone_and_adjacent(ordered)
            for stretch in stretches:
                self._read_adjacent(h, stretch, found)
            keys = (lone_at + h.base).tolist()
            found.update(zip(keys, self._read_each(h, lone_at, keys)))
        return list(map(found.__getitem__, wanted))

    def _read_each(self, h: Header, at: np.ndarray, keys: list[int]) -> list[bytes]:
        """The samples ``at`` (local indices; ``keys``: their indices), one pread each, checked.

        One read_many names the file and index of a failed read. The ranges come
        from numpy and the CRCs are compared as two lists: per sample Python work
        here cost as much as the pread. A CRC mismatch is read again by
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

    def _read_adjacent(self, h: Header, stretch: list[int], found: dict) -> None:
        """Read consecutive samples with as few preads as the size limits allow."""
        base = h.base
        for start, end, run in coalesced_runs(stretch, h.bound_at, MAX_COALESCED_READ_BYTES,
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
                                        object_hook=unpack_numpy)
            elif decode == 'json':
                value = json.loads(data)
            elif decode == 'pickle':
                value = pickle.loads(data)   # the user asked for it by name
            elif callable(decode):
                value = decode(data)
            else:                            # no other name gets past __init__
                raise TypeError(f'unknown decode {decode!r}')
        except Exception as exc:
            h, local = self._locate(index)
            how = decode if isinstance(decode, str) else getattr(decode, '__name__', 'decode')
            raise DecodeError(f'sample {local} of this file does not decode with {how}: '
                              f'{type(exc).__name__}: {exc}', h.path, index) from exc
        return value if isinstance(value, dict) else {'data': value}

    def _masked(self, index: int, dp: dict, mask: dict | None) -> dict:
        if mask is None:
            return dp
        return select_keys(dp, mask, 'FFRecord datapoints have no sequence keys', lambda key:
                           SpecError(f'datapoint has no key {key!r} (it has '
                                     f'{sorted(map(str, dp))})', self._locate(index)[0].path,
                                     index))

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
                key: describe(value) for key, value in self._get(0, None).items()}
        return self._spec
