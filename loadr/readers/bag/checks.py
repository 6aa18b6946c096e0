"""``loadr check`` of a bag dataset, and where its records lie (for the digests)."""

from __future__ import annotations

import os

import numpy as np

from ... import codecs
from ...errors import LoadrError
from ...storage import Storage, storage_for
from ..base import Problem
from .file import REFS_KEY, SPEC_NAME, Bag, parse_type
from .layout import Dataset, empty_refs_problem, list_shards, read_spec
from .reader import BagReader


def _problem(exc: LoadrError, path: str, index: int | None = None) -> Problem:
    return Problem(exc.path or path, exc.index if exc.index is not None else index, exc.message)


def _check_dataset(files: Storage, directory: str, start: int, first_spec: dict | None,
                   problems: list[Problem]) -> tuple[int, dict | None]:
    """Append the problems of one dataset directory; returns (datapoints, spec)."""
    try:
        spec, _ = read_spec(files, directory)
    except LoadrError as exc:           # FormatError, or ReadError (e.g. EACCES)
        problems.append(_problem(exc, directory))
        return 0, first_spec
    spec_dict = dict(sorted(spec))
    if first_spec is not None and spec_dict != first_spec:
        problems.append(Problem(os.path.join(directory, SPEC_NAME), None,
                                f'spec differs from the first shard\'s {first_spec}'))
    bags: dict[str, Bag | None] = {}
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
    refs = bags[REFS_KEY]
    if refs is None:
        return 0, first_spec or spec_dict
    problem = empty_refs_problem(bags)
    if problem:
        problems.append(Problem(refs.path, None, problem))
        return 0, first_spec or spec_dict
    dataset = Dataset(directory, spec, bags, start)
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


def records(path: str | os.PathLike, storage_options=None) -> dict:
    """Where the records of each file lie and whose they are, for :mod:`loadr.digests`.

    Every bag's records (with the datapoint each belongs to, from refs.bag);
    spec.json as a whole. ``storage_options``: the settings of a URL's open.
    """
    from ...digests import FileRecords
    out: dict = {}
    with BagReader(path, decode_images=False, storage_options=storage_options) as reader:
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


def check(path: str | os.PathLike, storage_options=None) -> list[Problem]:
    """Every problem of a bag dataset or sharded dataset, each naming file and index.

    Checks the shard numbering, each spec.json, that every key has its bag
    (and no bag lacks a key), every bag's whole index table, every refs
    record against the spec and the bag lengths, and that every value
    decodes (images fully). Values of unsupported video types are not
    decoded. The index is the datapoint's for refs and values, the record's
    for a bag's table. ``storage_options``: the settings of a URL's open.

    >>> check(FIXTURES / 'bag_sharded')
    []
    """
    path = os.fspath(path)
    try:
        files = storage_for(path, storage_options)
    except LoadrError as exc:
        return [_problem(exc, path)]
    dirs, fatal, odd = list_shards(files, path)
    problems = fatal + odd
    start, spec = 0, None
    try:
        for directory in dirs:
            count, spec = _check_dataset(files, directory, start, spec, problems)
            start += count
    finally:
        files.close()
    return problems
