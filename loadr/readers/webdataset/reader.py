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

A sample's small members lie one after the other in the tar and come in
one read (one pread, or one range request), from the header of the first;
a large member is read alone, with its header (locally, a 512-byte pread
beside its own). Every member's header is checked against the index (name
and size): a stale index is a FormatError naming the tar, never one
member's bytes under another's name.

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
from collections.abc import Sequence
from typing import Literal

import msgpack
import numpy as np

from ...errors import ConfigError, DecodeError, FormatError, LoadrError, SpecError
from ...storage import StorageSettings, is_url, storage_for
from ..base import Reader, check_index, known_options
from ..patterns import dataset_files, names_files
from ..records import Source, value_type
from .index import (
    BLOCK,
    SIDECAR_SUFFIX,
    TarIndex,
    compressed_error,
    compressed_kind,
    header_is,
    header_matches,
    header_name,
    header_size,
    load_sidecar,
    same_index,
    scan,
    sidecar_bytes,
)

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


def list_shards(path, storage_options: StorageSettings | dict | None = None
                ) -> tuple[str, list[str]]:
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
    if index is not None and _older(storage, tar + SIDECAR_SUFFIX, tar):
        log.info('%s: its sidecar %s is older than the tar and is not used (the tar is indexed '
                 'again); `loadr index --rebuild` writes it anew', tar, SIDECAR_SUFFIX)
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


def _older(storage, a: str, b: str) -> bool:
    """True if ``a`` was last written before ``b`` (a file's mtime; a URL's Last-Modified, as
    the server said at open); False where either is not known."""
    was, now = storage.modified(a), storage.modified(b)
    return was is not None and now is not None and was < now


class _Shard:
    """One tar of the reader: its path, first global index, and its index (per process)."""

    __slots__ = ('path', 'base', 'count', 'index', 'shipped', 'odd')

    def __init__(self, path: str, base: int, index: TarIndex, shipped: bool):
        self.path, self.base, self.count = path, base, index.samples
        self.index, self.shipped = index, shipped
        # Per process: None until a header's name field came in a form header_matches does
        # not know; then {member: that field} if a fresh scan gave this very index, or False.
        self.odd: dict[int, bytes] | Literal[False] | None = None

    def __getstate__(self):
        # An index read from a sidecar is read again where it is needed (each process
        # reads only the shards it touches); one built in memory travels with the reader.
        return (self.path, self.base, self.count, self.index if self.shipped else None,
                self.shipped)

    def __setstate__(self, state):
        self.path, self.base, self.count, self.index, self.shipped = state
        self.odd = None


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
        self._spec: dict | None = None

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
        """The tar header before member ``m``'s data must be the one the index says (name and
        size): a sidecar of another tar, or a tar changed or replaced after its index was made
        (even with the same size and modification time), is caught where it is read."""
        ext, size = index.exts[index.ext[m]], int(index.size[m])
        a, b = index.key_at[local:local + 2]
        if len(block) == BLOCK and header_is(
                block, b'%s.%s' % (index.key_bytes[a:b], ext.encode('utf-8', 'surrogateescape')),
                size):
            return
        key = index.key(local)
        if header_matches(block, key, ext, size) or self._known_odd(shard, index, m, block):
            return
        if len(block) == BLOCK:
            found = f'its header says {header_name(block)!r}, {header_size(block)} bytes'
        else:
            found = 'the tar has no header there'
        if index.sidecar:
            why = (f'the tar was changed or replaced after its index '
                   f'{os.path.basename(shard.path)}{SIDECAR_SUFFIX} was made, or that sidecar is '
                   f'another tar\'s (a stale index): `loadr index --rebuild {shard.path}` '
                   f'makes it again')
        else:
            why = ('the tar was changed or replaced after the reader indexed it at open (a '
                   'stale index): open the dataset again to read it as it is now')
        raise FormatError(f'the index does not match the tar at member {key}.{ext} (sample '
                          f'{local} of this tar, {size} bytes at byte {int(index.offset[m])}): '
                          f'{found}; {why}', shard.path, i)

    def _known_odd(self, shard: _Shard, index: TarIndex, m: int, block: bytes) -> bool:
        """True if member ``m``'s header, of the index's size but a name field in a form
        :func:`header_matches` does not know (a writer may shorten a long name beside its pax
        ``path`` as it likes), is the tar's as indexed: a fresh scan of the tar's headers,
        once per process, gives this very index."""
        if len(block) != BLOCK or header_size(block) != int(index.size[m]):
            return False
        odd = shard.odd
        if odd is None:
            shard.odd = odd = {} if same_index(scan(self._files, shard.path), index) else False
        if odd is False:
            return False
        field = odd.setdefault(m, block[:100])
        return field == block[:100]

    def _plan(self, i: int, wanted=None) -> tuple:
        """How sample ``i`` (its members in ``wanted``, or all) is read.

        ``(shard, local, members, ranges, where)``: the byte ranges to read,
        and for each member ``(range number, offset in it, size, header's
        range number)``; each member's 512-byte tar header lies just before
        its data (offset - 512 in its range, or at 0 of its header's range),
        and is checked against the index. Small members share one range, from
        the header of the first. A large one is a range of its own: remotely
        with its header (one request), locally after a range of its header
        alone, so that its bytes come straight from the pread, uncopied (a
        100 KB slice cost as much as its pread).
        """
        shard, local = self._locate(i)
        tar = self._index(shard)
        members: Sequence[int] = tar.member_range(local)
        if wanted is not None:
            members = [m for m in members if tar.exts[tar.ext[m]] in wanted]
        ranges: list = []
        where = []
        alone = False                       # the last range holds one large member
        remote = self._files.remote
        for m in members:
            off, size = int(tar.offset[m]), int(tar.size[m])
            small = size <= SMALL_MEMBER_BYTES
            if ranges and small and not alone and off + size - ranges[-1][0] <= MAX_RUN_BYTES:
                ranges[-1][1] = off + size
                at = off - ranges[-1][0]
                where.append((len(ranges) - 1, at, size, len(ranges) - 1))
            elif small or remote:
                ranges.append([off - BLOCK, off + size])
                where.append((len(ranges) - 1, BLOCK, size, len(ranges) - 1))
            else:
                ranges.append([off - BLOCK, off])
                ranges.append([off, off + size])
                where.append((len(ranges) - 1, 0, size, len(ranges) - 2))
            alone = not small
        return shard, local, members, ranges, where

    def _assemble(self, i: int, plan: tuple, datas: list) -> dict:
        shard, local, members, _, where = plan
        tar = shard.index
        key = tar.key(local)
        out = {KEY: key}
        for m, (r, at, size, h) in zip(members, where):
            data = datas[r]
            self._verify(shard, tar, local, i, m, datas[h] if h != r else data[at - BLOCK:at])
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
        spec = self._spec
        if spec is None:
            self._spec = spec = {} if not self._n else {
                k: value_type(v) for k, v in self._get(0, None).items()}
        return spec

    def details(self) -> dict:
        return {'shards': len(self._shards),
                'extensions': sorted({e for s in self._shards for e in self._index(s).exts})}

    @classmethod
    def source(cls, path, **options) -> Source:
        """The shards for copying: members decoded by type (images stay bytes), typed over all."""
        from ..records import infer_types
        reader = cls(path, **known_options(cls, options))
        return Source(str(path), cls.format_name, reader, infer_types(reader))

    def __repr__(self) -> str:
        return f'WebDatasetReader({self.pattern!r}, {len(self._shards)} shards, {self._n} samples)'
