"""Reading WebDataset shards at random, in place.

``WebDatasetReader('shards/train-{000000..000999}.tar')`` (or a directory of
``.tar`` files, a glob, a list, one tar; local paths and URLs) reads every
sample of every shard, shard after shard, through the member index of
:mod:`.index`: from the sidecar beside each tar when there is a good one,
else built by one pass over the tar's headers (and written beside it when
the tar is local and the directory writable; otherwise kept in memory and
shipped to the workers with the reader).

A datapoint is a dict: ``'__key__'`` (the sample's key) and one entry per
member by extension, decoded as ``webdataset``'s default decoders decode
the safe types (:data:`DECODERS`): ``txt``/``text``/``transcript`` → str,
``cls``/``cls2``/``index``/``inx``/``id`` → int, ``json``/``jsn`` → object,
``mp``/``msg`` → msgpack object, ``npy``/``npz`` → arrays (never pickled
objects). Everything else stays bytes: images for ``decode_jpeg`` and the
other image fns, and ``pyd``/``pickle``/``pkl`` members unless
``allow_pickle=True`` (unpickling runs code: trusted files only).

One sample is one read: its members lie one after the other in the tar, so
the bytes from its first member to its last come in one pread (or one
range request).

Example::

    r = WebDatasetReader('shards/train-{000000..000009}.tar')
    r[0]            # {'__key__': '000000', 'jpg': b'\\xff\\xd8...', 'cls': 3}
    r[0, {'cls': True}]    # reads the cls member only
"""

from __future__ import annotations

import bisect
import io
import json
import logging
import os
import pickle

import msgpack
import numpy as np

from ...convert.records import Source, value_type
from ...errors import ConfigError, DecodeError, FormatError, LoadrError, SpecError
from ...storage import is_url, storage_for
from ..base import Reader, _known, check_index
from ..patterns import dataset_files, names_files
from .index import (BLOCK, SIDECAR_SUFFIX, TarIndex, compressed_error, compressed_kind,
                    header_matches, load_sidecar, scan, sidecar_bytes)

__all__ = ['WebDatasetReader', 'DECODERS', 'PICKLED', 'list_shards', 'decode_member',
           'index_shard']

log = logging.getLogger('loadr')

KEY = '__key__'
# Members up to this size share a read with their neighbours (and are sliced out of it);
# larger ones are read alone. Runs of small members stop at MAX_RUN_BYTES.
SMALL_MEMBER_BYTES = 16 << 10
MAX_RUN_BYTES = 120 << 10
SUFFIXES = ('.tar',)
COMPRESSED_SUFFIXES = ('.tar.gz', '.tgz', '.tar.bz2', '.tar.xz', '.tar.zst')


def _int(data: bytes) -> int:
    return int(data)


def _text(data: bytes) -> str:
    return data.decode('utf-8')


def _npy(data: bytes):
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def _npz(data: bytes) -> dict:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


# webdataset's default decoders (autodecode.decoders) for the types that run no code.
DECODERS = {
    'txt': _text, 'text': _text, 'transcript': _text,
    'cls': _int, 'cls2': _int, 'index': _int, 'inx': _int, 'id': _int,
    'json': json.loads, 'jsn': json.loads,
    'mp': msgpack.unpackb, 'msg': msgpack.unpackb,
    'npy': _npy, 'npz': _npz,
}
PICKLED = ('pyd', 'pickle', 'pkl')


def decode_member(ext: str, data: bytes, allow_pickle: bool = False):
    """The value of a member with extension ``ext`` (by its last part, as webdataset does).

    >>> decode_member('cls', b'7'), decode_member('seg.txt', b'hi'), decode_member('jpg', b'x')
    (7, 'hi', b'x')
    """
    last = ext.rsplit('.', 1)[-1]
    decoder = DECODERS.get(last)
    if decoder is not None:
        return decoder(data)
    if last in PICKLED and allow_pickle:
        return pickle.loads(data)           # asked for by name: trusted files only
    return data


def list_shards(path, storage_options: dict | None = None) -> tuple[str, list[str]]:
    """``(root, tars)``: the tars ``path`` names (pattern, list, directory or one tar).

    ``root`` is the directory the dataset's files are named relative to.
    """
    return dataset_files(path, SUFFIXES + COMPRESSED_SUFFIXES, '.tar', storage_options)


def index_shard(storage, tar: str, write: bool | str = 'local', progress=None,
                rebuild: bool = False) -> TarIndex:
    """The index of one tar: its sidecar if good (and not ``rebuild``), else a scan (written
    as a sidecar when ``write`` is True, or ``'local'`` and the tar is a local file; kept in
    memory where that fails)."""
    if tar.endswith(COMPRESSED_SUFFIXES):
        raise compressed_error(compressed_kind(storage.read(tar, 0, min(8, storage.size(
            tar)))) or 'gzip', tar)
    size = storage.size(tar)
    index = None if rebuild else load_sidecar(storage, tar, size)
    if index is not None and not is_url(tar) and _older(tar + SIDECAR_SUFFIX, tar):
        index = None                        # the tar was written again after its sidecar
    if index is not None:
        return index
    index = scan(storage, tar, progress=progress)
    if write is True or (write == 'local' and not is_url(tar)):
        try:
            with storage.open_write(tar + SIDECAR_SUFFIX) as f:
                f.write(sidecar_bytes(index))
                f.commit()
            index.sidecar = True
        except (LoadrError, OSError) as exc:
            log.info('%s: index kept in memory, not written beside the tar (%s)', tar, exc)
    return index


def _older(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_mtime_ns < os.stat(b).st_mtime_ns
    except OSError:
        return False


class _Shard:
    """One tar of the reader: its path, first global index, and its index (per process)."""

    __slots__ = ('path', 'base', 'count', 'index', 'shipped')

    def __init__(self, path: str, base: int, index: TarIndex, shipped: bool):
        self.path, self.base, self.count = path, base, index.samples
        self.index, self.shipped = index, shipped

    def __getstate__(self):
        # An index read from a sidecar is read again where it is needed (each process
        # reads only the shards it touches); one built in memory travels with the reader.
        return (self.path, self.base, self.count, self.index if self.shipped else None,
                self.shipped)

    def __setstate__(self, state):
        self.path, self.base, self.count, self.index, self.shipped = state


class WebDatasetReader(Reader):
    """WebDataset ``.tar`` shards as one random-access dataset; see the module docstring.

    ``allow_pickle`` unpickles ``pyd``/``pickle``/``pkl`` members (trusted
    files only); ``decode=False`` leaves every member as its bytes;
    ``write_index`` writes the index of a tar without a sidecar beside it
    (``'local'``, the default: local tars only; True: URLs too; False:
    never). ``storage_options`` go to the storage of URLs.
    """

    format_name = 'webdataset'

    def __init__(self, path, allow_pickle: bool = False, decode: bool = True,
                 write_index: bool | str = 'local', storage_options: dict | None = None):
        if write_index not in (True, False, 'local'):
            raise ConfigError(f"write_index must be True, False or 'local', not {write_index!r}")
        self.allow_pickle = bool(allow_pickle)
        self.decode = bool(decode)
        self._storage_options = storage_options
        root, tars = list_shards(path, storage_options)
        self._named = names_files(path, storage_options)
        self.path = root if self._named else os.fspath(path)
        self._root = root
        self.pattern = list(path) if isinstance(path, (list, tuple)) else os.fspath(path)
        self._files = storage_for(tars[0], storage_options)
        self._shards: list[_Shard] = []
        base = 0
        for tar in tars:
            try:
                index = index_shard(self._files, tar, write_index)
            except FormatError as exc:
                raise exc if exc.path else FormatError(exc.message, tar) from exc
            self._shards.append(_Shard(tar, base, index, not index.sidecar))
            base += index.samples
        self._n = base
        self._starts = [s.base for s in self._shards]
        self._spec = None

    # -- the shards ------------------------------------------------------------------

    @property
    def files(self) -> list[str]:
        """The tars, in index order."""
        return [s.path for s in self._shards]

    def _index(self, shard: _Shard) -> TarIndex:
        index = shard.index
        if index is None:
            size = self._files.size(shard.path)
            index = load_sidecar(self._files, shard.path, size)
            if index is None:
                index = scan(self._files, shard.path)
            if index.samples != shard.count:
                raise FormatError(f'file changed since the reader was made: it held '
                                  f'{shard.count} samples, now {index.samples}', shard.path)
            shard.index = index
        return index

    def _locate(self, i: int) -> tuple[_Shard, int]:
        shard = self._shards[bisect.bisect_right(self._starts, i) - 1]
        return shard, i - shard.base

    def where(self, index: int) -> str | None:
        """The tar that holds sample ``index``."""
        return self._locate(check_index(index, self._n))[0].path

    def __len__(self) -> int:
        return self._n

    def _identity_files(self) -> dict[str, int]:
        # The size the index was made for; a shard not loaded in this process is asked.
        return {s.path: s.index.tar_size if s.index is not None else self._files.size(s.path)
                for s in self._shards}

    def _identity_root(self) -> str:
        # Tars named by a pattern or a list: the folder that holds them all.
        return self._root if self._named else super()._identity_root()

    # -- reading ---------------------------------------------------------------------

    def _decoded(self, shard: _Shard, local: int, i: int, name: str, ext: str, data: bytes):
        if not self.decode:
            return data
        try:
            return decode_member(ext, data, self.allow_pickle)
        except Exception as exc:    # noqa: BLE001 - any decoder's failure is this member's
            raise DecodeError(f'member {name!r} (sample {local} of this tar) does not decode '
                              f'as {ext.rsplit(".", 1)[-1]}: {type(exc).__name__}: {exc}',
                              shard.path, i) from exc

    def _verify(self, shard: _Shard, index: TarIndex, local: int, i: int, m: int,
                block: bytes) -> None:
        """The tar header before member ``m``'s data must be the index's (a sidecar of
        another tar, or a tar changed in place, is caught at the first read)."""
        name = f'{index.key(local)}.{index.exts[index.ext[m]]}'
        if not header_matches(block, name, int(index.size[m])):
            raise FormatError(f'the index does not match the tar at member {name!r} (sample '
                              f'{local} of this tar): the tar changed after its index was made, '
                              f'or the sidecar {os.path.basename(shard.path)}{SIDECAR_SUFFIX} '
                              f'is another tar\'s; `loadr index` makes it again', shard.path, i)

    def _plan(self, i: int, wanted=None) -> tuple:
        """How sample ``i`` (its members in ``wanted``, or all) is read.

        ``(shard, local, members, ranges, where)``: the byte ranges to read,
        and for each member ``(range number, offset in it, size)``. Small
        members share one range with the header block before the first member
        (checked against the index); a large one is a range of its own, so its
        bytes come straight from the read, uncopied (a 100 KB slice cost as
        much as its pread).
        """
        shard, local = self._locate(i)
        tar = self._index(shard)
        members = tar.member_range(local)
        if wanted is not None:
            members = [m for m in members if tar.exts[tar.ext[m]] in wanted]
        ranges: list = []
        where = []
        alone = False                       # the last range holds one large member
        for m in members:
            off, size = int(tar.offset[m]), int(tar.size[m])
            small = size <= SMALL_MEMBER_BYTES
            if not ranges:
                ranges.append([off - BLOCK, off + size if small else off])
                if small:
                    where.append((0, BLOCK, size))
                    continue
            elif small and not alone and off + size - ranges[-1][0] <= MAX_RUN_BYTES:
                ranges[-1][1] = off + size
                where.append((len(ranges) - 1, off - ranges[-1][0], size))
                continue
            ranges.append([off, off + size])
            where.append((len(ranges) - 1, 0, size))
            alone = not small
        return shard, local, members, ranges, where

    def _assemble(self, i: int, plan: tuple, datas: list) -> dict:
        shard, local, members, _, where = plan
        tar = shard.index
        key = tar.key(local)
        out = {KEY: key}
        if members:
            self._verify(shard, tar, local, i, members[0], datas[0][:BLOCK])
        for m, (r, at, size) in zip(members, where):
            data = datas[r]
            value = data if at == 0 and size == len(data) else data[at:at + size]
            ext = tar.exts[tar.ext[m]]
            out[ext] = self._decoded(shard, local, i, f'{key}.{ext}', ext, value)
        return out

    def _read(self, plans: list, indices: list) -> list[dict]:
        ranges = [(plan[0].path, a, b - a, i) for plan, i in zip(plans, indices)
                  for a, b in plan[3]]
        datas = self._files.read_many(ranges) if ranges else []
        out, k = [], 0
        for plan, i in zip(plans, indices):
            n = len(plan[3])
            out.append(self._assemble(i, plan, datas[k:k + n]))
            k += n
        return out

    def _get(self, index: int, mask: dict | None) -> dict:
        if mask is None:
            return self._read([self._plan(index)], [index])[0]
        shard, local = self._locate(index)
        tar = self._index(shard)
        have = {tar.exts[tar.ext[m]] for m in tar.member_range(local)}
        wanted = set()
        for key, want in mask.items():
            if want is False:
                continue
            if want is not True:
                raise TypeError(f'mask value for {key!r} must be True or False; WebDataset '
                                f'samples have no sequence keys')
            if key != KEY and key not in have:
                raise SpecError(f'sample {tar.key(local)!r} has no member {key!r} (it has '
                                f'{sorted(have)})', shard.path, index)
            wanted.add(key)
        out = self._read([self._plan(index, wanted)], [index])[0]
        if KEY not in wanted:
            del out[KEY]
        return out

    def read_batch(self, indices) -> list[dict]:
        """The samples of ``indices``, their ranges read together (concurrently for URLs)."""
        wanted = [check_index(i, self._n) for i in indices]
        return self._read([self._plan(i) for i in wanted], wanted)

    def _ranges(self, indices: list[int]) -> list[tuple]:
        return [(plan[0].path, a, b - a, i) for i in indices
                for plan in (self._plan(i),) for a, b in plan[3]]

    def available(self, index: int) -> dict:
        """``{key: True}`` for ``'__key__'`` and each member of sample ``index``; reads nothing
        but the index."""
        shard, local = self._locate(check_index(index, self._n))
        tar = self._index(shard)
        return {KEY: True, **{tar.exts[tar.ext[m]]: True for m in tar.member_range(local)}}

    @property
    def spec(self) -> dict:
        """``{key: bag type}`` of sample 0's values (what ``loadr convert`` would store)."""
        if self._spec is None:
            self._spec = {} if not self._n else {
                k: value_type(v) for k, v in self._get(0, None).items()}
        return self._spec

    def details(self) -> dict:
        return {'shards': len(self._shards),
                'extensions': sorted({e for s in self._shards for e in self._index(s).exts})}

    @classmethod
    def source(cls, path, **options) -> Source:
        """The shards for copying: members decoded by type (images stay bytes), typed over all."""
        from ...convert.records import infer_types
        reader = cls(path, **_known(cls, options))
        return Source(str(path), cls.format_name, reader, infer_types(reader))

    def __repr__(self) -> str:
        return f'WebDatasetReader({self.pattern!r}, {len(self._shards)} shards, {self._n} samples)'
