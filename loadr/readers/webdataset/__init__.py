"""WebDataset ``.tar`` shards, read in place at random: index, reader, writer, check.

- :mod:`.index`: the member index of a tar (one pass over its headers) and
  its sidecar file ``<tar>.loadr-index`` (byte layout in that module).
- :mod:`.reader`: :class:`WebDatasetReader`, a datapoint per sample.
- :mod:`.writer`: :class:`WebDatasetWriter`, shards the ``webdataset``
  package reads.

Example::

    r = loadr.open('shards/train-{000000..000009}.tar')
    r[0]['cls'], len(r)
"""

from __future__ import annotations

import os

from ...errors import LoadrError
from ...storage import settings_for, storage_for
from ..base import Format, Problem
from ..patterns import expand, names_files
from .index import SIDECAR_SUFFIX, TarIndex, parse_sidecar, same_index, scan
from .reader import (
    COMPRESSED_SUFFIXES,
    SUFFIXES,
    WebDatasetReader,
    decode_member,
    index_shard,
    list_shards,
)
from .writer import WebDatasetWriter

__all__ = ['WebDatasetReader', 'WebDatasetWriter', 'FORMAT', 'check', 'detect', 'build_index',
           'TarIndex']

_IMAGES = ('jpg', 'jpeg', 'png')
MAX_PROBLEMS_PER_FILE = 1000


def _is_tar_name(name) -> bool:
    return isinstance(name, str) and name.endswith(SUFFIXES + COMPRESSED_SUFFIXES)


def detect(path, storage_options=None) -> bool:
    """True for a tar, a list or pattern of tars, or a directory directly holding tars.

    Never raises.
    """
    try:
        if isinstance(path, (list, tuple)):
            return bool(path) and all(_is_tar_name(os.fspath(p)) for p in path)
        path = os.fspath(path)
        if names_files(path, storage_options):
            files = expand(path, storage_options)
            return _is_tar_name(files[0]) and storage_for(files[0], storage_options).isfile(
                files[0])
        storage = storage_for(path, storage_options)
        if storage.isfile(path):
            return _is_tar_name(path)
        if storage.isdir(path):
            return any(_is_tar_name(n) and not n.startswith('.') for n in storage.list(path))
    except Exception:       # detection never raises, whatever the path is
        return False
    return False


def build_index(path, write: bool | str = True, progress=None,
                rebuild: bool = False, storage_options=None) -> list[tuple[str, TarIndex]]:
    """Index every tar of ``path`` and write each sidecar (``loadr index``); ``rebuild``
    scans tars whose sidecar is good too.

    ``progress(done_bytes, total_bytes)`` follows the scan. Returns ``[(tar, index)]``;
    an index's ``bytes_read`` says how much of its tar the scan read (0: sidecar was good).
    ``storage_options``: a URL's (the settings of the open, or a dict of them).
    """
    settings = settings_for(path, storage_options)
    _, tars = list_shards(path, settings)
    storage = storage_for(tars[0], settings)
    sizes = [storage.size(t) for t in tars]
    total, done, out = sum(sizes), 0, []
    for tar, size in zip(tars, sizes):
        def step(at, done=done):
            if progress is not None:
                progress(done + at, total)
        out.append((tar, index_shard(storage, tar, write, progress=step, rebuild=rebuild)))
        done += size
        if progress is not None:
            progress(done, total)
    return out


def check(path, storage_options=None) -> list[Problem]:
    """Every problem of the shards: headers, the sidecar against the tar, every member read
    and decoded (images whole). Each names the tar, and the member and index where known.
    ``storage_options``: the settings of a URL's open."""
    from ...codecs import decode_image
    try:
        settings = settings_for(path, storage_options)
        _, tars = list_shards(path, settings)
        storage = storage_for(tars[0], settings)
    except LoadrError as exc:
        return [Problem(exc.path or str(path), exc.index, exc.message)]
    problems: list[Problem] = []
    base = 0
    for tar in tars:
        found: list[Problem] = []
        try:
            index = scan(storage, tar)
        except LoadrError as exc:
            problems.append(Problem(exc.path or tar, None if exc.index is None else
                                    base + exc.index, exc.message))
            continue
        side = tar + SIDECAR_SUFFIX
        try:
            if storage.isfile(side):
                kept = parse_sidecar(storage.read_all(side), index.tar_size)
                if kept is None or not same_index(kept, index):
                    found.append(Problem(side, None, 'the sidecar index does not match the tar '
                                                     '(stale or damaged); `loadr index '
                                                     f'{tar}` writes it again'))
        except LoadrError as exc:
            found.append(Problem(exc.path or side, None, exc.message))
        for local in range(index.samples):
            start, end = index.span(local)
            key = index.key(local)
            try:
                data = storage.read(tar, start, end - start, base + local)
            except LoadrError as exc:
                found.append(Problem(tar, base + local, exc.message))
                continue
            for m in index.member_range(local):
                ext = index.exts[index.ext[m]]
                a = int(index.offset[m]) - start
                value = data[a:a + int(index.size[m])]
                try:
                    decode_member(ext, value)
                    if ext.rsplit('.', 1)[-1] in _IMAGES:
                        decode_image(value)
                except Exception as exc:  # noqa: BLE001 - every failure is this member's
                    msg = getattr(exc, 'message', None) or f'{type(exc).__name__}: {exc}'
                    found.append(Problem(tar, base + local, f'member {key}.{ext} (sample {local} '
                                                            f'of this tar): {msg}'))
            if len(found) > MAX_PROBLEMS_PER_FILE:
                found.append(Problem(tar, None, f'more than {MAX_PROBLEMS_PER_FILE} problems '
                                                f'in this tar; the check stopped here'))
                break
        problems += found
        base += index.samples
        storage.close()
    return problems


FORMAT = Format('webdataset', detect, WebDatasetReader, WebDatasetWriter, check)
