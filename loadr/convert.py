"""``loadr convert``: any dataset format to any other, where the data fits.

What a datapoint becomes in each target:

- **bag**: one key per datapoint key, typed as the source says (a bag keeps
  its spec; gulp is ``{id: utf8, frames: jpg[], meta: msgpack}``; an
  FFRecord sample's keys are typed from the first sample: JPEG/PNG bytes as
  ``jpg``/``png``, a list of JPEGs as ``jpg[]``, other bytes as ``bytes``,
  ints as ``int``, strings as ``utf8``, anything else as ``msgpack``).
  Undecoded FFRecord samples become ``{data: bytes}``.
- **ffrecord**: one msgpack map per datapoint (undecoded FFRecord samples
  are copied byte for byte). numpy arrays (bag ``array``/``tree``) have no
  msgpack form and are refused.
- **gulp**: a video per datapoint: frames from the ``jpg[]`` key (or a
  single ``jpg`` key as a one-frame video), the id from an ``id`` key (else
  the index), and the meta from a ``meta`` map (when it is the only other
  key) or from the other keys, which must be JSON values.

Images are copied as their encoded bytes, never decoded and re-encoded, so
a conversion loses nothing. Output is all-or-nothing: every writer writes
under a temporary name and renames on success.

Example::

    plan = plan_conversion('data/train', 'train.ffr', 'ffrecord')
    convert('data/train', 'train.ffr', 'ffrecord', keys=['image', 'label'])
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import msgpack

from .errors import ConfigError
from .readers import BagReader, FFRecordReader, GulpReader, detect
from .storage import storage_for

__all__ = ['TARGETS', 'Plan', 'plan_conversion', 'convert', 'open_source', 'infer_type']

TARGETS = ('bag', 'ffrecord', 'gulp')
READ_BATCH = 64           # datapoints read at once (FFRecord coalesces the reads)

_JPEG_MAGIC = b'\xff\xd8'
_PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
_NO_MSGPACK = ('array', 'tree')                         # numpy values
_JSON_TYPES = ('utf8', 'int', 'i64', 'u64', 'msgpack')  # values (or lists) a gulp meta holds
_BAG_KEY = re.compile(r'[a-z_][^/\\\x00]*\Z')


def infer_type(value) -> str:
    """The bag type that stores ``value`` (from a decoded FFRecord sample).

    >>> infer_type(b'\\xff\\xd8...'), infer_type(3), infer_type({'a': 1})
    ('jpg', 'int', 'msgpack')
    """
    if isinstance(value, bool) or value is None:
        return 'msgpack'
    if isinstance(value, int):
        return 'int'
    if isinstance(value, str):
        return 'utf8' if value else 'msgpack'
    if isinstance(value, (bytes, bytearray)):
        if value.startswith(_JPEG_MAGIC):
            return 'jpg'
        if value.startswith(_PNG_MAGIC):
            return 'png'
        return 'bytes' if value else 'msgpack'
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (bytes, bytearray)) for v in value):
        if all(v.startswith(_JPEG_MAGIC) for v in value):
            return 'jpg[]'
        if all(v.startswith(_PNG_MAGIC) for v in value):
            return 'png[]'
    return 'msgpack'


@dataclasses.dataclass
class Source:
    """A dataset opened for copying: images stay encoded bytes.

    ``types`` is ``{key: bag type}``; ``raw`` is True for FFRecord samples
    that are opaque bytes (``{'data': bytes}``).
    """

    path: str
    format: str
    reader: object
    types: dict
    raw: bool = False
    label2idx: dict | None = None

    def __len__(self) -> int:
        return len(self.reader)


def _ffrecord_decode(reader: FFRecordReader, decode: str) -> str | None:
    if decode != 'auto':
        return None if decode in (None, 'none') else decode
    if len(reader) == 0:
        return None
    data = reader.read_one(0)
    try:
        if isinstance(msgpack.unpackb(data, raw=False, strict_map_key=False), dict):
            return 'msgpack'
    except Exception:   # noqa: BLE001 - any failure just means "not msgpack"
        pass
    try:
        if isinstance(json.loads(data), dict):
            return 'json'
    except ValueError:
        pass
    return None


def open_source(path: str | os.PathLike, decode: str = 'auto',
                allow_pickle: bool = False) -> Source:
    """Open ``path`` (any format) for copying; FFRecord samples decoded as ``decode``.

    ``decode='auto'`` reads the first sample as a msgpack map, else a JSON
    object, else leaves the samples as bytes. ``allow_pickle`` lets a gulp
    directory with pickled ``.gmeta`` files be read (trusted files only).

    >>> open_source('../shared/fixtures/gulp').types     # doctest: +SKIP
    {'id': 'utf8', 'frames': 'jpg[]', 'meta': 'msgpack'}
    """
    path = os.fspath(path)
    fmt = detect(path).name
    if fmt == 'gulp':
        reader = GulpReader(path, decode_images=False, allow_pickle=allow_pickle)
        return Source(path, fmt, reader, dict(reader.spec, meta='msgpack'),
                      label2idx=reader.label2idx)
    if fmt == 'bag':
        reader = BagReader(path, decode_images=False)
        return Source(path, fmt, reader, dict(reader.spec))
    probe = FFRecordReader(path)
    chosen = _ffrecord_decode(probe, decode)
    probe.close()
    if chosen is None:
        return Source(path, fmt, FFRecordReader(path), {'data': 'bytes'}, raw=True)
    reader = FFRecordReader(path, decode=chosen)
    first = reader[0] if len(reader) else {}
    return Source(path, fmt, reader, {str(k): infer_type(v) for k, v in first.items()})


@dataclasses.dataclass
class Plan:
    """How datapoints of ``source`` map onto the ``target`` format."""

    source: Source
    target: str
    keys: list                      # the source keys that are copied
    spec: dict | None = None        # bag: the output spec
    frames: str | None = None       # gulp: the key holding the frames
    id_key: str | None = None       # gulp: the key holding the id (None: the index)
    meta_keys: list = dataclasses.field(default_factory=list)
    meta_is_map: bool = False       # gulp: the single 'meta' key is the meta dict

    def describe(self) -> str:
        """One line per decision, for the command's output."""
        src = f'{self.source.format} {self.source.path}'
        if self.target == 'bag':
            return f'{src} -> bag with spec {self.spec}'
        if self.target == 'ffrecord':
            what = 'raw sample bytes' if self.source.raw else f'msgpack maps of {self.keys}'
            return f'{src} -> ffrecord, {what}'
        id_from = f'key {self.id_key!r}' if self.id_key else 'the datapoint index'
        meta = ('the meta map' if self.meta_is_map
                else f'keys {self.meta_keys}' if self.meta_keys else 'nothing')
        return (f'{src} -> gulp: frames from {self.frames!r}, id from {id_from}, '
                f'meta from {meta}')


def plan_conversion(source: Source | str, dst: str | os.PathLike, target: str,
                    keys: list | None = None, frames: str | None = None) -> Plan:
    """Decide the mapping, or raise ConfigError saying why the data does not fit."""
    if not isinstance(source, Source):
        source = open_source(source)
    dst = os.fspath(dst)
    if target not in TARGETS:
        raise ConfigError(f'unknown target format {target!r}; use one of {", ".join(TARGETS)}')
    if storage_for(dst).exists(dst):
        raise ConfigError('the output already exists; remove it or pick another path', dst)
    types = source.types
    if keys:
        unknown = [k for k in keys if k not in types]
        if unknown:
            raise ConfigError(f'--keys names {unknown[0]!r}, which the source does not have '
                              f'(it has {list(types)})', source.path)
        types = {k: types[k] for k in keys}
    if not types:
        raise ConfigError('nothing to convert: no keys chosen', source.path)
    plan = Plan(source, target, list(types))
    if target == 'bag':
        bad = [k for k in types if not _BAG_KEY.match(k)]
        if bad:
            raise ConfigError(f'key {bad[0]!r} cannot be a bag key (a bag key starts with a-z '
                              f'or _); leave it out with --keys', source.path)
        plan.spec = dict(types)
    elif target == 'ffrecord':
        if not dst.endswith('.ffr'):
            raise ConfigError('an ffrecord output is one file ending in .ffr', dst)
        bad = [k for k, t in types.items() if t.rstrip('[]') in _NO_MSGPACK]
        if bad:
            raise ConfigError(f'key {bad[0]!r} holds numpy arrays ({types[bad[0]]}), which an '
                              f'ffrecord msgpack sample cannot hold; leave it out with --keys '
                              f'(e.g. --keys {",".join(k for k in types if k not in bad)}) '
                              f'or convert to bag', source.path)
    else:
        _plan_gulp(plan, types, frames)
    return plan


def _plan_gulp(plan: Plan, types: dict, frames: str | None) -> None:
    path = plan.source.path
    if plan.source.raw:
        raise ConfigError('these FFRecord samples are opaque bytes (not msgpack or JSON maps), '
                          'so there are no frames to make a gulp video of', path)
    if frames is None:
        sequences = [k for k, t in types.items() if t == 'jpg[]']
        singles = [k for k, t in types.items() if t == 'jpg']
        if 'frames' in sequences:
            frames = 'frames'
        elif len(sequences) == 1:
            frames = sequences[0]
        elif not sequences and len(singles) == 1:
            frames = singles[0]
        elif sequences or singles:
            raise ConfigError(f'several JPEG keys ({sequences + singles}); choose the frames '
                              f'with --frames KEY', path)
        else:
            raise ConfigError(f'gulp holds videos of JPEG frames, and no key holds JPEGs '
                              f'(keys: {types}); convert to bag or ffrecord instead', path)
    elif types.get(frames) not in ('jpg', 'jpg[]'):
        raise ConfigError(f'--frames {frames!r} must name a jpg or jpg[] key; the keys are '
                          f'{types}', path)
    plan.frames = frames
    rest = [k for k in types if k != frames]
    if 'id' in rest and types['id'] in ('utf8', 'int', 'i64', 'u64'):
        plan.id_key = 'id'
        rest.remove('id')
    bad = [k for k in rest if types[k].removesuffix('[]') not in _JSON_TYPES]
    if bad:
        raise ConfigError(f'key {bad[0]!r} ({types[bad[0]]}) has no place in a gulp video: '
                          f'the meta holds JSON values only; leave it out with --keys', path)
    plan.meta_keys = rest
    plan.meta_is_map = rest == ['meta'] and types['meta'] == 'msgpack'


def _datapoints(source: Source, keys: list):
    """Yield ``(index, datapoint)`` (raw bytes for raw FFRecord), reading in batches."""
    n = len(source)
    for start in range(0, n, READ_BATCH):
        indices = range(start, min(n, start + READ_BATCH))
        if source.raw:
            batch = source.reader.read(indices)
        else:
            batch = source.reader.read_batch(indices)
            batch = [{k: dp[k] for k in keys if k in dp} for dp in batch]
        yield from zip(indices, batch, strict=True)


def convert(src, dst: str | os.PathLike, target: str, keys: list | None = None,
            frames: str | None = None, shardlen: int | None = None,
            videos_per_chunk: int = 100, decode: str = 'auto', progress=None) -> Plan:
    """Copy every datapoint of ``src`` into a new ``target`` dataset at ``dst``.

    ``progress``, if given, gets ``update(1)`` per datapoint. Returns the
    :class:`Plan` that was followed.

    Example::

        convert('../shared/fixtures/ffrecord/single.ffr', 'out_bag', 'bag')
    """
    from .writers import BagWriter, FFRecordWriter, GulpWriter
    source = src if isinstance(src, Source) else open_source(src, decode)
    plan = plan_conversion(source, dst, target, keys, frames)
    dst = os.fspath(dst)
    tick = progress.update if progress is not None else (lambda n=1: None)
    items = _datapoints(source, plan.keys)
    if target == 'bag':
        with BagWriter(dst, plan.spec, shardlen=shardlen) as w:
            for _, dp in items:
                w.append({'data': dp} if source.raw else dp)
                tick(1)
    elif target == 'ffrecord':
        with FFRecordWriter(dst, len(source)) as w:
            for _, dp in items:
                w.write_one(dp if source.raw else msgpack.packb(dp, use_bin_type=True))
                tick(1)
    else:
        label2idx = source.label2idx if source.format == 'gulp' else None
        with GulpWriter(dst, videos_per_chunk=videos_per_chunk, label2idx=label2idx) as w:
            for index, dp in items:
                video = dp[plan.frames]
                video = list(video) if plan.source.types[plan.frames] == 'jpg[]' else [video]
                id_ = dp[plan.id_key] if plan.id_key else str(index)
                if plan.meta_is_map and isinstance(dp['meta'], dict):
                    meta = dp['meta']
                else:
                    meta = {k: dp[k] for k in plan.meta_keys}
                w.append(id_, meta, video)
                tick(1)
    return plan

