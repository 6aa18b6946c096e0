"""Fuzzing the readers: mutated fixtures and random bytes, each read under a deadline and judged.

Shared by the CI fuzz tests (a few hundred inputs per format) and
``benchmarks/fuzz.py`` (10,000 and more). One *input* is a copy of a
reference fixture with one to three mutations applied to its files:

- bytes: flip, overwrite, insert, delete, truncate, replace the whole file
  (random bytes, or nothing);
- lying headers: an integer field of the format (FFRecord ``N``, offsets,
  CRCs, with the metadata CRC recomputed or not; a bag's table start and
  record ends) set to an edge value (0, -1, 2^31, 2^63-1, the file size ± 1, …);
- structure: a ``.gmeta`` / ``spec.json`` / ``label2idx.json`` value or a
  bag ``refs`` record replaced, removed or retyped, written back validly.

Each input is opened and every datapoint read with several reader options;
then ``loadr.check`` runs. :func:`judge` allows only these outcomes:

- a :class:`loadr.errors.LoadrError` (a per-datapoint data error must name
  the file and that datapoint's index), or data that is *correct*: of the
  spec's types, equal to the pristine fixture's wherever the files it comes
  from were not touched, and for CRC-checked FFRecord files equal to it
  everywhere;
- no other exception (IndexError/TypeError included: only valid indices and
  masks are passed), no input over its deadline, no successful read past
  the end of a file, and without image decoding no allocation beyond
  ``MEMORY_BOUND_BYTES`` plus 8 times the input's size (tracemalloc peak);
- ``check()`` never raises, and when it finds nothing, every read succeeded.

Example::

    ws = Workspace(TARGETS['gulp'], tmp_path)
    stats = Stats()
    judge(ws, [('flip', 0, 1234, 0x40)], stats)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import random
import shutil
import signal
import struct
import time
import tracemalloc
import zlib

import msgpack
import numpy as np
from hypothesis import strategies as st

import loadr
from loadr.errors import DataError, LoadrError
from loadr.readers.base import Files

from ..conftest import FIXTURES
from ..readers.common import assert_equal

DEADLINE_S = 10.0                  # per input, every option and check() together
MEMORY_BOUND_BYTES = 16 << 20      # tracemalloc peak over the input's own size, no decoding


@dataclasses.dataclass(frozen=True)
class Target:
    """A fixture to mutate and the reader options to read every input with."""

    name: str
    fmt: str
    fixture: str
    configs: tuple
    check_covers: tuple = ()       # configs whose every read check() vouches for when clean
    differential: tuple = ()       # configs that must agree exactly
    build: str | None = None       # made here by BUILDERS[build](dir) instead of a fixture


def _build_webdataset(root: pathlib.Path) -> pathlib.Path:
    """Two small shards (jpg, cls, json, txt) with their sidecars, as webdataset writes them."""
    import io
    import tarfile

    from PIL import Image
    out = root / 'shards'
    out.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for s in range(2):
        with tarfile.open(out / f'train-{s:06d}.tar', 'w', format=tarfile.PAX_FORMAT) as t:
            for i in range(4):
                k = 4 * s + i
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (8, 8, 3), np.uint8)).save(buf, 'JPEG')
                for ext, data in (('jpg', buf.getvalue()), ('cls', str(k % 3).encode()),
                                  ('json', json.dumps({'k': k}).encode()),
                                  ('txt', f'caption {k}'.encode())):
                    info = tarfile.TarInfo(f'{k:06d}.{ext}')
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
    loadr.open(out)                         # the sidecars
    return out


def _build_parquet(root: pathlib.Path) -> pathlib.Path:
    """One Parquet file of 12 rows in row groups of 4: HF image struct, int, str, float."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    root.mkdir(parents=True, exist_ok=True)
    rows = [{'image': {'bytes': bytes([255, 216]) + bytes(range(k, k + 20)), 'path': f'{k}.jpg'},
             'label': k % 5, 'text': f'row {k}', 'score': k / 2} for k in range(12)]
    path = root / 'data.parquet'
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=4)
    return path


BUILDERS = {'webdataset': _build_webdataset, 'parquet': _build_parquet}


_BAG = ({'decode_images': False}, {'decode_images': False, 'cache_index': False},
        {'decode_images': False, 'cache_keys': ('refs', '*')}, {'decode_images': True})
TARGETS = {
    # decode=None by name: loadr.open's own default for FFRecord is 'auto' (maps decoded).
    'ffrecord': Target('ffrecord', 'ffrecord', 'ffrecord/single.ffr',
                       ({'decode': None}, {'check_data': False, 'decode': None},
                        {'decode': 'msgpack'}), check_covers=(0,)),
    'ffrecord_multi': Target('ffrecord_multi', 'ffrecord', 'ffrecord/multi',
                             ({'decode': None}, {'check_data': False, 'decode': None}),
                             check_covers=(0,)),
    'gulp': Target('gulp', 'gulp', 'gulp', ({'decode_images': False}, {'decode_images': True}),
                   check_covers=(0,)),
    'bag': Target('bag', 'bag', 'bag', _BAG, check_covers=(0, 3), differential=(0, 1, 2)),
    'bag_types': Target('bag_types', 'bag', 'bag_types', _BAG, check_covers=(0, 3),
                        differential=(0, 1, 2)),
    'bag_sharded': Target('bag_sharded', 'bag', 'bag_sharded', _BAG, check_covers=(0, 3),
                          differential=(0, 1, 2)),
    # The index sidecars are part of the input; reading never writes them here (the
    # workspace is restored file by file).
    'webdataset': Target('webdataset', 'webdataset', 'shards',
                         ({'write_index': False}, {'write_index': False, 'decode': False}),
                         check_covers=(0,), build='webdataset'),
    'parquet': Target('parquet', 'parquet', 'data.parquet', ({}, {'columns': ['label']}),
                      check_covers=(0,), build='parquet'),
}
FORMATS = {'ffrecord': ('ffrecord', 'ffrecord_multi'), 'gulp': ('gulp',),
           'bag': ('bag', 'bag_types', 'bag_sharded'), 'webdataset': ('webdataset',),
           'parquet': ('parquet',)}


class Hang(BaseException):
    """An input ran past its deadline (a BaseException, so no reader can swallow it)."""


class Failure(AssertionError):
    """An outcome the contract does not allow."""


@contextlib.contextmanager
def deadline(seconds: float):
    def alarm(signum, frame):
        raise Hang(f'input still running after {seconds} s')
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def audited_reads(stats: Stats):
    """Every Files.read checked against the file's size: none may succeed past its end."""
    original = Files.read

    def read(self, path, offset, length, index=None):
        try:
            data = original(self, path, offset, length, index)
        except LoadrError:
            stats.refused_reads += 1
            raise
        size = os.fstat(self.fd(path)).st_size
        if offset + length > size or len(data) != length:
            raise Failure(f'read of {length} bytes at {offset} succeeded past the end of '
                          f'{path} ({size} bytes)')
        stats.reads += 1
        return data

    Files.read = read
    try:
        yield
    finally:
        Files.read = original


# -- the workspace: one writable copy of a fixture, mutated and restored per input -----------

class Workspace:
    """A writable copy of ``target``'s fixture under ``root`` and its pristine readings."""

    def __init__(self, target: Target, root):
        self.target = target
        source = FIXTURES / target.fixture
        if target.build is not None:
            source = BUILDERS[target.build](pathlib.Path(root) / f'{target.name}-source')
        self.path = pathlib.Path(root) / target.name / source.name
        if self.path.exists():
            shutil.rmtree(self.path.parent)
        self.path.parent.mkdir(parents=True)
        if source.is_dir():
            shutil.copytree(source, self.path)
        else:
            shutil.copy(source, self.path)
        for p in [self.path, *self.path.rglob('*')]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        base = self.path if self.path.is_dir() else self.path.parent
        self.base = base
        self.files = sorted(p.relative_to(base).as_posix()
                            for p in ([self.path] if self.path.is_file() else self.path.rglob('*'))
                            if p.is_file())
        self.original = {rel: (base / rel).read_bytes() for rel in self.files}
        self.size = sum(map(len, self.original.values()))
        self.configs = [self._resolve(c) for c in target.configs]
        self.reference = [self._read_all(c) for c in self.configs]
        self.depends = self._dependencies()

    def _resolve(self, config: dict) -> dict:
        if config.get('cache_keys') == ('refs', '*'):
            keys = sorted(loadr.open(self.path).spec)
            return {**config, 'cache_keys': ('refs', *keys)}
        return dict(config)

    def _read_all(self, config: dict) -> list:
        r = loadr.open(self.path, **config)
        return [r[i] for i in range(len(r))]

    def _dependencies(self) -> list:
        """For each pristine datapoint: {key or None: the files its value comes from}."""
        fmt = self.target.fmt
        n = len(self.reference[0])
        if fmt == 'webdataset':
            r = loadr.open(self.path, write_index=False)
            deps = []
            for i in range(n):
                shard, _ = r._locate(i)
                tar = pathlib.Path(shard.path).relative_to(self.base).as_posix()
                deps.append({None: {tar, tar + '.loadr-index'}})
            return deps
        if fmt == 'parquet':
            return [{None: {self.path.name}} for _ in range(n)]
        if fmt == 'ffrecord':
            r = loadr.open(self.path)
            deps = []
            for i in range(n):
                rel = pathlib.Path(r.locate(i)['path']).relative_to(self.base).as_posix()
                deps.append({None: {rel}})
            return deps
        if fmt == 'gulp':
            deps = []
            r = loadr.open(self.path, decode_images=False)
            for i in range(n):
                k = r._index()[i].chunk.k
                deps.append({None: {f'data_{k}.gulp', f'meta_{k}.gmeta'}})
            return deps
        sharded = not (self.path / 'spec.json').exists()
        shards = sorted(p.name for p in self.path.iterdir()) if sharded else ['']
        deps = []
        for shard in shards:
            prefix = f'{shard}/' if shard else ''
            reader = loadr.open(self.path / shard if shard else self.path)
            for _ in range(len(reader)):
                common = {f'{prefix}spec.json', f'{prefix}refs.bag'}
                deps.append({key: common | {f'{prefix}{key}.bag'} for key in reader.spec})
        return deps

    def apply(self, mutations) -> dict:
        """Write the mutated files; returns {relative path: new bytes} of those changed."""
        contents = dict(self.original)
        for mutation in mutations:
            rel = self.files[mutation[1] % len(self.files)]
            contents[rel] = mutate(self.target.fmt, rel, contents[rel], mutation)
        changed = {rel: data for rel, data in contents.items() if data != self.original[rel]}
        for rel, data in changed.items():
            (self.base / rel).write_bytes(data)
        return changed

    def restore(self, changed: dict) -> None:
        for rel in changed:
            (self.base / rel).write_bytes(self.original[rel])


# -- mutations --------------------------------------------------------------------------------

def _edges(old: int, size: int) -> list[int]:
    return [0, 1, 2, 3, 4, 7, 8, 12, 255, 256, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
            2**40, 2**53, 2**60, 2**63 - 1, -1, -2, -(2**31), -(2**63), size - 1, size, size + 1,
            size // 2, old - 1, old + 1, old * 2, old + 8, old - 8]


def _fields(fmt: str, rel: str, data: bytes) -> list[tuple[int, int]]:
    """Integer fields (offset, width) of a file's header or table, for lying in."""
    if fmt == 'ffrecord' and len(data) >= 12:
        n = struct.unpack_from('<q', data, 4)[0]
        fields = [(0, 4), (4, 8)]
        if 0 <= n <= (len(data) - 12) // 12:
            fields += [(12 + 4 * i, 4) for i in range(n)]
            fields += [(12 + 4 * n + 8 * i, 8) for i in range(n)]
        return fields
    if fmt == 'bag' and rel.endswith('.bag') and len(data) >= 8:
        start = struct.unpack_from('<Q', data, len(data) - 8)[0]
        if start <= len(data) - 8 and (len(data) - start) % 8 == 0:
            return [(off, 8) for off in range(start, len(data), 8)]
        return [(len(data) - 8, 8)]
    return [(off, 4) for off in range(0, max(0, len(data) - 3), 4)][:64]


def _fix_ffrecord_crc(data: bytes) -> bytes:
    """Recompute the metadata CRC, so a lying header passes the checksum."""
    if len(data) < 12:
        return data
    n = struct.unpack_from('<q', data, 4)[0]
    if not 0 <= n <= (len(data) - 12) // 12:
        return data
    body = data[4:12 + 12 * n]
    return struct.pack('<I', zlib.crc32(body)) + data[4:]


JSON_EDGES = [0, -1, 1, 2**31, 2**63, 10**30, -(10**30), 1.5, -0.0, 1e308, 'x', '', None, True,
              False, [], {}, [0, 0, 0], [[0, 0, 0]], [-1, 0, 1], [2**62, 0, 8], {'a': 1},
              '\u00e9\ud800'[:1], 'data_0.gulp', 'jpg', 'int[]', 'array', 'mp4', '../x', '.x']


def _mutate_tree(value, rng: random.Random):
    """A copy of a JSON/msgpack value with one node replaced, dropped or retyped."""
    nodes = []

    def walk(v, parent, key):
        nodes.append((parent, key))
        if isinstance(v, dict):
            for k in list(v):
                walk(v[k], v, k)
        elif isinstance(v, list):
            for i in range(len(v)):
                walk(v[i], v, i)
    value = json.loads(json.dumps(value)) if not isinstance(value, bytes) else value
    walk(value, None, None)
    parent, key = rng.choice(nodes)
    action = rng.random()
    if parent is None:
        return rng.choice(JSON_EDGES)
    if action < 0.6:
        parent[key] = rng.choice(JSON_EDGES)
    elif action < 0.75:
        del parent[key]
    elif action < 0.9 and isinstance(parent, dict):
        parent[rng.choice(['frame_info', 'meta_data', 'x', 'new_key', str(key) + '_'])] = \
            parent[key]
    elif isinstance(parent, list):
        parent.append(parent[key])
    else:
        parent[key] = [parent[key]]
    return value


def _bag_records(data: bytes):
    """The records of a version-2 bag file, or None if it is not one."""
    if len(data) < 8:
        return None
    start = struct.unpack_from('<Q', data, len(data) - 8)[0]
    if start > len(data) - 8 or (len(data) - start) % 8:
        return None
    ends = struct.unpack_from(f'<{(len(data) - start) // 8}Q', data, start)
    if not ends or ends[0] == 0 or list(ends) != sorted(ends) or ends[-1] != start:
        return None
    bounds = [0, *ends]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def _bag_bytes(records: list) -> bytes:
    ends, offset = [], 0
    for record in records:
        offset += len(record)
        ends.append(offset)
    return b''.join(records) + struct.pack(f'<{len(ends)}Q', *ends)


def mutate(fmt: str, rel: str, data: bytes, mutation: tuple) -> bytes:
    """Apply one mutation (see :func:`mutations`) to one file's bytes."""
    op, _, *args = mutation
    size = len(data)
    if op == 'flip':
        pos, xor = args
        if not size:
            return data
        pos %= size
        return data[:pos] + bytes([data[pos] ^ xor]) + data[pos + 1:]
    if op == 'overwrite':
        pos, chunk = args
        pos %= size + 1
        return data[:pos] + chunk + data[pos + len(chunk):]
    if op == 'insert':
        pos, chunk = args
        pos %= size + 1
        return data[:pos] + chunk + data[pos:]
    if op == 'delete':
        pos, n = args
        pos %= size + 1
        return data[:pos] + data[pos + n:]
    if op == 'truncate':
        (pos,) = args
        return data[:pos % (size + 1)]
    if op == 'replace':
        (chunk,) = args
        return chunk
    if op == 'lie':
        which, choice, fix_crc = args
        fields = _fields(fmt, rel, data)
        if not fields:
            return data
        offset, width = fields[which % len(fields)]
        old = int.from_bytes(data[offset:offset + width], 'little')
        edges = _edges(old, size)
        value = edges[choice % len(edges)] % (1 << (8 * width))
        out = data[:offset] + value.to_bytes(width, 'little') + data[offset + width:]
        return _fix_ffrecord_crc(out) if fmt == 'ffrecord' and fix_crc else out
    if op == 'tree':
        (seed,) = args
        rng = random.Random(seed)
        if rel.endswith(('.gmeta', '.json')):
            try:
                value = json.loads(data)
            except ValueError:
                return data
            return json.dumps(_mutate_tree(value, rng)).encode()
        if rel.endswith('refs.bag'):
            records = _bag_records(data)
            if not records:
                return data
            k = rng.randrange(len(records))
            try:
                value = msgpack.unpackb(records[k])
            except ValueError:
                return data
            try:
                records[k] = msgpack.packb(_mutate_tree(value, rng))
            except (OverflowError, ValueError, TypeError):
                return data                 # an edge value msgpack cannot hold
            return _bag_bytes(records)
        return data
    raise ValueError(f'unknown mutation {op!r}')


def mutations(max_bytes: int = 4096):
    """A hypothesis strategy: a list of one to three mutations."""
    file = st.integers(0, 63)
    pos = st.integers(0, 1 << 24)
    chunk = st.binary(min_size=1, max_size=16)
    one = st.one_of(
        st.tuples(st.just('flip'), file, pos, st.integers(1, 255)),
        st.tuples(st.just('overwrite'), file, pos, chunk),
        st.tuples(st.just('insert'), file, pos, chunk),
        st.tuples(st.just('delete'), file, pos, st.integers(1, 64)),
        st.tuples(st.just('truncate'), file, pos),
        st.tuples(st.just('replace'), file, st.binary(max_size=max_bytes)),
        st.tuples(st.just('lie'), file, st.integers(0, 1 << 16), st.integers(0, 63),
                  st.booleans()),
        st.tuples(st.just('tree'), file, st.integers(0, 1 << 32)),
    )
    return st.lists(one, min_size=1, max_size=3)


# -- judging one input ---------------------------------------------------------------------

@dataclasses.dataclass
class Stats:
    """What the inputs did; the benchmark prints it."""

    inputs: int = 0
    distinct: set = dataclasses.field(default_factory=set)
    duplicates: int = 0                  # inputs already judged, skipped (skip_seen=True)
    opened: int = 0
    refused_at_open: int = 0
    datapoints_ok: int = 0
    datapoints_refused: int = 0
    compared: int = 0                    # datapoints checked equal to the pristine fixture
    reads: int = 0
    refused_reads: int = 0
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    max_seconds: float = 0.0
    max_peak_bytes: int = 0
    check_problems: int = 0


def _types_ok(fmt: str, spec: dict, dp: dict, config: dict) -> str | None:
    """Why ``dp`` is not of its format's types, or None."""
    if not isinstance(dp, dict):
        return f'a {type(dp).__name__}, not a dict'
    if fmt == 'ffrecord':
        if config.get('decode') is None and (set(dp) != {'data'}
                                             or not isinstance(dp['data'], bytes)):
            return f'undecoded sample is not {{"data": bytes}}: {sorted(dp)}'
        return None
    if fmt == 'webdataset':
        types = {'__key__': str, 'cls': int, 'txt': str, 'json': dict, 'jpg': bytes}
        if not set(dp) <= set(types) or '__key__' not in dp:
            return f'keys {sorted(dp)} are not members of the shards'
        for key, value in dp.items():
            want = types[key] if config.get('decode', True) or key == '__key__' else bytes
            if not isinstance(value, want):
                return f'{key!r} holds a {type(value).__name__}'
        return None
    if fmt == 'parquet':
        types = {'image': (bytes, type(None)), 'label': int, 'text': str, 'score': float}
        if set(dp) != set(spec):
            return f'keys {sorted(dp)} differ from the columns {sorted(spec)}'
        for key, value in dp.items():
            if not isinstance(value, types[key]):
                return f'{key!r} holds a {type(value).__name__}'
        return None
    if fmt == 'gulp':
        if set(dp) != {'id', 'frames', 'meta'} or not isinstance(dp['id'], str) \
                or not isinstance(dp['frames'], list):
            return f'keys or types: {sorted(dp)}'
        for frame in dp['frames']:
            if config.get('decode_images', True):
                if not (isinstance(frame, np.ndarray) and frame.dtype == np.uint8
                        and frame.ndim in (2, 3)):
                    return 'a decoded frame that is not a uint8 image'
            elif not (isinstance(frame, bytes) and frame[:2] == b'\xff\xd8'):
                return 'an undecoded frame that is not JPEG bytes'
        return None
    if set(dp) != set(spec):
        return f'keys {sorted(dp)} differ from the spec {sorted(spec)}'
    kinds = {'int': int, 'i64': int, 'u64': int, 'utf8': str, 'bytes': bytes,
             'array': np.ndarray}
    for key, type_name in spec.items():
        base, is_seq = (type_name[:-2], True) if type_name.endswith('[]') else (type_name, False)
        values = dp[key] if is_seq else [dp[key]]
        if is_seq and not isinstance(dp[key], list):
            return f'sequence key {key!r} is not a list'
        want = kinds.get(base)
        if base in ('jpg', 'png'):
            want = np.ndarray if config.get('decode_images', True) else bytes
        for v in values:
            if want is not None and not isinstance(v, want):
                return f'{key!r} ({type_name}) holds a {type(v).__name__}'
    return None


def _digest(value) -> str:
    h = hashlib.sha256()

    def feed(v):
        if isinstance(v, np.ndarray):
            h.update(f'{v.dtype}{v.shape}'.encode() + np.ascontiguousarray(v).tobytes())
        elif isinstance(v, dict):
            for k in v:
                h.update(repr(k).encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            h.update(b'[')
            for x in v:
                feed(x)
            h.update(b']')
        else:
            h.update(repr(v).encode())
    feed(value)
    return h.hexdigest()


def _read_config(ws: Workspace, k: int, changed: dict, stats: Stats, describe) -> list | None:
    """Open and read everything with config k; the outcome per datapoint, None if refused."""
    target, config = ws.target, ws.configs[k]
    try:
        r = loadr.open(ws.path, **config)
        n = len(r)
        spec = r.spec
    except LoadrError as exc:
        stats.refused_at_open += 1
        stats.errors[type(exc).__name__] += 1
        return None
    stats.opened += 1
    total = sum(len(d) for d in ws.original.values()) + sum(map(len, changed.values()))
    if not 0 <= n <= total:
        raise Failure(f'{describe()}: len() is {n} for {total} bytes of input')
    reference = ws.reference[k]
    same_indices = n == len(reference)
    outcomes = []
    for i in range(n):
        if k and same_indices and not any(files & set(changed)
                                           for files in ws.depends[i].values()):
            # Untouched, and config 0 already proved such datapoints equal the pristine
            # ones: the other options only need to read what the mutation reached.
            outcomes.append(('skipped', None))
            continue
        try:
            dp = r[i]
        except LoadrError as exc:
            stats.datapoints_refused += 1
            stats.errors[type(exc).__name__] += 1
            if isinstance(exc, DataError) and (exc.path is None or exc.index != i):
                raise Failure(f'{describe()}: datapoint {i} failed with {exc!r}, which does '
                              f'not name the file and index {i}') from exc
            outcomes.append(('error', type(exc).__name__))
            continue
        why = _types_ok(target.fmt, spec, dp, config)
        if why:
            raise Failure(f'{describe()}: datapoint {i}: {why}')
        if same_indices:
            protected = target.fmt == 'ffrecord' and config.get('check_data', True)
            for key, files in ws.depends[i].items():
                if protected or not (files & set(changed)):
                    want = reference[i] if key is None else reference[i][key]
                    got = dp if key is None else dp.get(key)
                    try:
                        assert_equal(got, want, f'datapoint {i} key {key}')
                    except AssertionError as exc:
                        raise Failure(f'{describe()}: datapoint {i} differs from the pristine '
                                      f'one although its files were not touched: {exc}') from exc
                    stats.compared += 1
        stats.datapoints_ok += 1
        outcomes.append(('ok', _digest(dp)))
        if k:
            continue
        try:
            available = r.available(i)
            masked = r[i, {key: value for key, value in available.items()}]
        except LoadrError:
            continue
        try:
            assert_equal(masked, dp, f'datapoint {i} read through its full mask')
        except AssertionError as exc:
            raise Failure(f'{describe()}: {exc}') from exc
    if n and not k:
        try:
            batch = r.read_batch(list(range(n))[::-1])
        except LoadrError as exc:
            if all(kind == 'ok' for kind, _ in outcomes):
                raise Failure(f'{describe()}: read_batch failed where every read worked') from exc
        else:
            if any(kind == 'error' for kind, _ in outcomes):
                raise Failure(f'{describe()}: read_batch worked where a read failed')
            if [_digest(dp) for dp in batch[::-1]] != [d for _, d in outcomes]:
                raise Failure(f'{describe()}: read_batch differs from one-by-one reads')
    r.close()
    return outcomes


def judge(ws: Workspace, mutation_list, stats: Stats, deadline_s: float = DEADLINE_S,
          skip_seen: bool = False) -> None:
    """Apply ``mutation_list``, read the input with every config, check it; raise Failure.

    ``skip_seen`` skips an input whose files are byte for byte one already judged.
    """
    changed = ws.apply(mutation_list)
    key = hashlib.sha256(repr((ws.target.name, sorted(changed.items()))).encode()).hexdigest()
    if skip_seen and key in stats.distinct:
        stats.duplicates += 1
        ws.restore(changed)
        return
    stats.inputs += 1
    stats.distinct.add(key)

    def describe():
        return f'{ws.target.name} with {mutation_list!r} (changed: {sorted(changed)})'

    start = time.monotonic()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        with deadline(deadline_s), audited_reads(stats):
            results = []
            for k, config in enumerate(ws.configs):
                decoding = config.get('decode_images', True) if ws.target.fmt != 'ffrecord' \
                    else False
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                try:
                    results.append(_read_config(ws, k, changed, stats, describe))
                except (LoadrError, Failure, Hang):
                    raise
                except Exception as exc:
                    raise Failure(f'{describe()}: reading with {config} raised '
                                  f'{type(exc).__name__}: {exc}') from exc
                peak = tracemalloc.get_traced_memory()[1] - base
                if not decoding:
                    stats.max_peak_bytes = max(stats.max_peak_bytes, peak)
                    bound = MEMORY_BOUND_BYTES + 8 * (ws.size + sum(map(len, changed.values())))
                    if peak > bound:
                        raise Failure(f'{describe()}: reading with {config} allocated '
                                      f'{peak / 2**20:.1f} MiB (bound {bound / 2**20:.1f} MiB)')
            try:
                report = loadr.check(ws.path)
            except Exception as exc:
                raise Failure(f'{describe()}: check() raised {type(exc).__name__}: {exc}') \
                    from exc
            stats.check_problems += len(report.problems)
            if report.ok:
                for k in ws.target.check_covers:
                    if results[k] is None or any(kind == 'error' for kind, _ in results[k]):
                        raise Failure(f'{describe()}: check() found no problem but reading with '
                                      f'{ws.configs[k]} failed: {results[k]}')
            # Options that only change caching may refuse more or less eagerly (a cached
            # table is validated whole), but where two of them read a datapoint, it is
            # the same datapoint.
            diff = [results[k] for k in ws.target.differential if results[k] is not None]
            for other in diff[1:]:
                if len(other) != len(diff[0]) or any(
                        a != b for a, b in zip(diff[0], other) if a[0] == b[0] == 'ok'):
                    options = [ws.configs[k] for k in ws.target.differential]
                    raise Failure(f'{describe()}: reader options {options} '
                                  f'read different data')
    except Hang as exc:
        raise Failure(f'{describe()}: {exc}') from None
    finally:
        if not tracing:
            tracemalloc.stop()
        ws.restore(changed)
        stats.max_seconds = max(stats.max_seconds, time.monotonic() - start)



def run_fuzz(ws: Workspace, examples: int, stats: Stats, seed: int | None = None,
             shrink: bool = False, skip_seen: bool = False) -> None:
    """Judge ``examples`` hypothesis-made inputs on ``ws``; the first Failure propagates.

    ``seed=None`` is derandomized (the same inputs every run, as CI wants);
    a seed explores new ones. ``shrink`` makes a failure minimal before it
    is raised (slow, for investigating).
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=list(HealthCheck), phases=phases, print_blob=False)
    @given(mutations())
    def fuzz(mutation_list):
        judge(ws, mutation_list, stats, skip_seen=skip_seen)

    if seed is not None:
        fuzz = hypothesis_seed(seed)(fuzz)
    fuzz()
