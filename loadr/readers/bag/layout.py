"""A bag dataset on disk: ``spec.json``, ``refs.bag`` and a bag per key, and a directory
of such datasets as shards; refs checked and values decoded.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence

import msgpack
import numpy as np

from ... import codecs
from ...errors import ConfigError, DecodeError, FormatError, LoadrError, ReadError
from ...storage import Storage
from ..base import Problem, remote
from .file import (
    ENTRY_BYTES,
    IMAGE_TYPES,
    REFS_KEY,
    SHARD_NAME,
    SPEC_MAX_BYTES,
    SPEC_NAME,
    Bag,
    parse_type,
    spec_problem,
)


def read_spec(storage: Storage, directory: str) -> tuple[list[tuple[str, str]], int]:
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
    problem = spec_problem(spec)
    if problem:
        raise FormatError(f'spec.json: {problem}', path)
    return list(spec.items()), len(raw)


def list_shards(storage: Storage, path: str
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


def read_headers(files: Storage, bags: Sequence[Bag]) -> None:
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


def read_tables(files: Storage, bags: Sequence[Bag]) -> None:
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


class Dataset:
    """One dataset directory: its spec, its bags, and how to read a datapoint."""

    def __init__(self, path: str, spec: list[tuple[str, str]], bags: dict, start: int,
                 spec_size: int = 0):
        self.path = path
        self.spec_size = spec_size        # bytes of spec.json
        self.spec = spec                  # (key, type) in spec.json order = refs order
        self.bags = bags                  # 'refs' and every key -> Bag (None: unusable)
        self.start = start                # global index of datapoint 0
        self._types = {k: parse_type(t) for k, t in spec}
        self._last_refs: tuple[int, list] | None = None     # (local index, refs), per process
        self._refs_ahead: dict[int, list] = {}    # local index -> refs read ahead, per process

    @classmethod
    def open(cls, path: str, files: Storage, cache_index: bool, cache_keys: Sequence[str],
             start: int) -> Dataset:
        if remote(files):
            try:
                files.list(path)        # every file's size and version in one round trip
            except LoadrError:
                pass                    # no listing: each file is asked on its own
        spec, spec_size = read_spec(files, path)
        bags = {}
        for key in (REFS_KEY, *(k for k, _ in spec)):
            bag_path = os.path.join(path, f'{key}.bag')
            if not files.isfile(bag_path):
                raise FormatError(f'missing bag file for key {key!r}', bag_path)
            # Behind a URL only refs.bag's header is read at open (it gives the length):
            # the value bags' are read on first use, many at once (read_headers).
            bags[key] = Bag(bag_path, files, cache_index, key in cache_keys,
                            lazy=key != REFS_KEY and remote(files))
        problem = empty_refs_problem(bags)
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
        for (key, _type_name), ref in zip(self.spec, refs):
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


def empty_refs_problem(bags: dict) -> str | None:
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
