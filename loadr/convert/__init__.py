"""``loadr convert``: any dataset format to any other, where the data fits.

Nothing here knows a format by name: the source is opened by its format's
``Reader.source`` (encoded images stay bytes, every key typed as a bag type
of :mod:`loadr.codecs`), and the target's writer decides, in its ``plan``,
how the keys map onto its layout, or refuses with a ConfigError that says
why the data does not fit and what would (``--keys``, another target). Each
format's module documents what a datapoint becomes in it.

Images are copied as their encoded bytes, never decoded and re-encoded, so
a conversion loses nothing. Output is all-or-nothing: every writer writes
under a temporary name and renames on success.

Example::

    plan = plan_conversion('data/train', 'train.ffr', 'ffrecord')
    convert('data/train', 'train.ffr', 'ffrecord', keys=['image', 'label'])
"""

from __future__ import annotations

import os

from .. import readers
from ..errors import ConfigError
from ..readers.records import Plan, Source, infer_types, join_types, value_type
from ..storage import StorageSettings, is_url, settings_for, storage_for

__all__ = ['TARGETS', 'Plan', 'Source', 'plan_conversion', 'convert', 'open_source',
           'infer_type', 'infer_types', 'join_types', 'value_type']

READ_BATCH = 64           # datapoints read at once (FFRecord coalesces the reads)

# The bag type that stores a value; kept under its old name.
infer_type = value_type


def open_source(path: str | os.PathLike, decode: str = 'auto',
                storage_options: StorageSettings | dict | None = None, **options) -> Source:
    """Open ``path`` (any format) for copying; ``decode`` and ``options`` go to its format,
    ``storage_options`` (a URL's) to the detection and the reader.

    ``decode='auto'`` lets a format whose samples are opaque bytes find out
    what they hold (a msgpack map, a JSON object, or bytes); ``allow_pickle``
    lets a format that can only be read by unpickling be read (trusted files
    only).

    >>> open_source(FIXTURES / 'gulp').types
    {'id': 'utf8', 'frames': 'jpg[]', 'meta': 'msgpack'}
    """
    path = os.fspath(path)
    settings = settings_for(path, storage_options)
    if settings is not None:
        options['storage_options'] = settings
    return readers.detect(path, settings).reader.source(path, decode=decode, **options)


def __getattr__(name: str):
    # TARGETS: the names of the detection table's formats, once loadr.readers is whole.
    if name == 'TARGETS':
        return tuple(f.name for f in readers.formats())
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def _format(target: str):
    for fmt in readers.formats():
        if fmt.name == target:
            return fmt
    targets = ', '.join(f.name for f in readers.formats())
    raise ConfigError(f'unknown target format {target!r}; use one of {targets}')


def plan_conversion(source: Source | str, dst: str | os.PathLike, target: str,
                    keys: list | None = None, **options) -> Plan:
    """Decide the mapping, or raise ConfigError saying why the data does not fit.

    ``options`` are the target's (``frames=`` for gulp, …); others are ignored.
    ``storage_options`` among them are those of ``dst``, a URL.
    """
    if not isinstance(source, Source):
        source = open_source(source)
    dst = os.fspath(dst)
    fmt = _format(target)
    if storage_for(dst, options.get('storage_options')).exists(dst):
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
    plan = Plan(source, fmt.name, list(types), fmt.writer)
    fmt.writer.plan(plan, dst, types, **options)
    return plan


def _datapoints(source: Source, keys: list):
    """Yield ``(index, datapoint)`` (the bytes for a raw source), reading in batches."""
    n = len(source)
    for start in range(0, n, READ_BATCH):
        indices = range(start, min(n, start + READ_BATCH))
        batch = source.reader.read_batch(indices)
        if source.raw:
            batch = [dp['data'] for dp in batch]
        else:
            batch = [{k: dp[k] for k in keys if k in dp} for dp in batch]
        yield from zip(indices, batch, strict=True)


def convert(src, dst: str | os.PathLike, target: str, keys: list | None = None,
            decode: str = 'auto', progress=None,
            storage_options: StorageSettings | dict | None = None,
            **options) -> Plan:
    """Copy every datapoint of ``src`` into a new ``target`` dataset at ``dst``.

    ``options`` go to the target (``shardlen=``, ``videos_per_chunk=``,
    ``frames=``, …) and, when ``src`` is a path, to the source. ``progress``,
    if given, gets ``update(1)`` per datapoint. ``storage_options`` go to
    whichever of ``src`` (a path) and ``dst`` is a URL (``loadr --storage-option
    ... convert``): each gets settings of its own. Returns the :class:`Plan`
    that was followed.

    Example::

        convert('../shared/fixtures/ffrecord/single.ffr', 'out_bag', 'bag')
    """
    if isinstance(src, Source):
        source = src
    else:
        source = open_source(src, decode, storage_options if is_url(os.fspath(src)) else None,
                             **options)
    dst = os.fspath(dst)
    settings = settings_for(dst, storage_options if is_url(dst) else None)
    if settings is not None:
        options = {**options, 'storage_options': settings}
    plan = plan_conversion(source, dst, target, keys, **options)
    tick = progress.update if progress is not None else (lambda n=1: None)
    with plan.open(dst, **options) as w:
        for index, dp in _datapoints(source, plan.keys):
            w.append(plan.datapoint(index, dp))
            tick(1)
    return plan
