"""The bag writer, byte-identical to granular's, and its conversion planning."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import msgpack
import numpy as np

from ... import codecs
from ...errors import ConfigError, WriterError
from ..base import Writer, known_options
from ..records import Plan
from .file import (
    CONVERTIBLE_KEY,
    GRANULAR_NAME,
    REFS_KEY,
    SPEC_NAME,
    BagFileWriter,
    parse_type,
    spec_problem,
)


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
        problem = spec_problem(dict(spec) if isinstance(spec, Mapping) else spec)
        if problem is None:
            for key, type_name in spec.items():
                base, _ = parse_type(type_name)
                if not GRANULAR_NAME.match(key):
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

    def _open_shard(self) -> dict[str, BagFileWriter]:
        if self.shardlen is None:
            directory = ''
        else:
            directory = f'{len(self._dataset_dirs):06}'
            self._dir.mkdir(directory)
        self._dataset_dirs.append(directory)
        self._bags = bags = {}
        for key in (REFS_KEY, *self.spec):
            name = os.path.join(directory, f'{key}.bag')
            bags[key] = BagFileWriter(self._dir.join(name), out=self._dir.open_write(name))
        self._shard_count = 0
        return bags

    def _close_shard(self, bags: dict[str, BagFileWriter]) -> None:
        for bag in bags.values():
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
        whole: dict[str, bytes] = {}            # the encoded values, by key
        parts: dict[str, list[bytes]] = {}      # the encoded elements of each sequence
        for key, (base, is_seq) in self._types.items():
            value = datapoint[key]
            if not is_seq:
                whole[key] = self._encode(number, key, base, value)
                continue
            if not isinstance(value, (list, tuple)) and not (
                    isinstance(value, np.ndarray) and value.ndim >= 1):
                raise WriterError(f'datapoint {number}, key {key!r} is a sequence '
                                  f'({self.spec[key]}), so its value must be a list, not '
                                  f'{type(value).__name__}', self.path, number)
            parts[key] = [self._encode(number, key, base, v, p) for p, v in enumerate(value)]
        bags = self._bags if self._bags is not None else self._open_shard()
        refs: list[int | list[int]] = []
        for key, (_, is_seq) in self._types.items():
            bag = bags[key]
            if is_seq:
                indices = [bag.append(data) for data in parts[key]]
                refs.append([indices[0], len(indices)] if indices else [])
            else:
                refs.append(bag.append(whole[key]))
        bags[REFS_KEY].append(msgpack.packb(refs))
        self._length += 1
        self._shard_count += 1
        if self.shardlen is not None and self._shard_count >= self.shardlen:
            self._close_shard(bags)
        return number

    # -- conversion into a bag dataset (loadr convert) --------------------------

    @classmethod
    def plan(cls, plan: Plan, dst: str, types: dict, **options) -> None:
        bad = [k for k in types if not CONVERTIBLE_KEY.match(k)]
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
        return cls(dst, plan.settings['spec'], shardlen=shardlen, **known_options(cls, options))

    @classmethod
    def datapoint_for(cls, plan: Plan, index: int, dp):
        return {'data': dp} if plan.source.raw else dp

    def _finish(self) -> None:
        """Finish every bag and write spec.json (last, so a cut write never opens)."""
        bags = self._bags
        if bags is None and not self._dataset_dirs:
            bags = self._open_shard()   # no datapoints: still a valid, empty dataset
        if bags is not None:
            self._close_shard(bags)
        spec_json = json.dumps(self.spec).encode('utf-8')   # granular's exact bytes
        for directory in self._dataset_dirs:
            self._dir.write_file(os.path.join(directory, SPEC_NAME), spec_json)

    def _release(self) -> None:
        if self._bags is not None:
            for bag in self._bags.values():
                bag.abort()
            self._bags = None
