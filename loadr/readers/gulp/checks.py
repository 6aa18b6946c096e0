"""``loadr check`` of a gulp directory, and where its frames lie (for the digests)."""

from __future__ import annotations

import os

import numpy as np

from ...codecs import decode_image
from ...errors import DecodeError, LoadrError
from ...storage import Storage, storage_for
from ..base import Problem
from .layout import (
    JPEG_SOI,
    LABEL2IDX_NAME,
    Chunk,
    list_chunks,
    load_gmeta,
    load_index,
    video_problems,
)
from .reader import load_label2idx


def check(path: str | os.PathLike, storage_options=None) -> list[Problem]:
    """Every problem in a gulp directory; an empty list when it is sound. Never raises for bad data.

    Checks what gulpio2's sanity check does (empty files, a ``.gulp`` whose
    size is not the end of its last frame, an id in two chunks) and also
    unreadable or malformed metadata, frames past the end of the file, pads
    that are not NUL, every frame decoded (a JPEG SOI marker first), and
    missing or misnumbered chunk files. Gulp has no checksums: a changed byte
    that still decodes is found only with digests (:mod:`loadr.digests`).
    ``storage_options``: the settings of a URL's open.

    >>> check(FIXTURES / 'gulp')
    []
    """
    path = os.fspath(path)
    try:
        files = storage_for(path, storage_options)
    except LoadrError as exc:
        return [Problem(exc.path or path, None, exc.message)]
    chunks, listed = list_chunks(files, path)
    problems = [Problem(file, None, message) for file, message in listed]
    first_seen: dict[str, tuple[str, int | None]] = {}
    index: int | None = 0          # global datapoint index; None once a chunk is unreadable
    try:
        for chunk in chunks:
            gulp_size, meta_size = _check_sizes(files, chunk, problems)
            if not meta_size:       # empty or unreadable: already reported
                index = None
                continue
            try:
                table = load_gmeta(files, chunk.meta_path, allow_pickle=False)
            except LoadrError as exc:
                problems.append(Problem(exc.path or chunk.meta_path, None, exc.message))
                index = None
                continue
            if gulp_size is None:
                index = None if index is None else index + len(table)
                continue
            end = None        # where the last video's last frame ends, if it is sound
            for id_, entry in table.items():
                bad = list(video_problems(id_, entry, chunk, gulp_size))
                problems += [Problem(file, index, message) for file, message in bad]
                if id_ in first_seen:
                    other, other_index = first_seen[id_]
                    problems.append(Problem(chunk.meta_path, index,
                                            f'video id {id_!r} is also in {other} '
                                            f'(index {other_index})'))
                else:
                    first_seen[id_] = (chunk.meta_path, index)
                end = None
                if not bad:
                    problems += _frame_problems(files, chunk, id_, entry['frame_info'], index)
                    if entry['frame_info']:
                        offset, _, length = entry['frame_info'][-1]
                        end = offset + length
                index = None if index is None else index + 1
            if end is not None and end != gulp_size:
                problems.append(Problem(chunk.data_path, None,
                                        f'file is {gulp_size} bytes but its .gmeta says the '
                                        f'last frame ends at byte {end}'))
        if files.isdir(path):
            try:
                load_label2idx(files, path)
            except LoadrError as exc:
                problems.append(Problem(exc.path or path, None, exc.message))
    finally:
        files.close()
    return problems


def _check_sizes(files: Storage, chunk: Chunk, problems: list[Problem]
                 ) -> tuple[int | None, int | None]:
    """Sizes of the .gulp and .gmeta files (None if unreadable); empty files are problems."""
    sizes = {}
    for file in (chunk.data_path, chunk.meta_path):
        try:
            sizes[file] = files.size(file)
        except LoadrError as exc:
            problems.append(Problem(file, None, exc.message))
            continue
        if sizes[file] == 0:
            problems.append(Problem(file, None, 'file is empty'))
    return sizes.get(chunk.data_path), sizes.get(chunk.meta_path)


def _frame_problems(files: Storage, chunk: Chunk, id_: str, info: list, index: int | None
                    ) -> list[Problem]:
    """Frames of one video that do not decode (a JPEG SOI first) or whose pad is not NUL."""
    problems = []
    for j, (offset, pad, length) in enumerate(info):
        try:
            record = files.read(chunk.data_path, offset, length, index)
            head, tail = record[:min(2, length - pad)], record[length - pad:]
        except LoadrError as exc:
            problems.append(Problem(chunk.data_path, index, f'video {id_!r} frame {j}: '
                                                            f'{exc.message}'))
            continue
        if head != JPEG_SOI:
            problems.append(Problem(chunk.data_path, index,
                                    f'video {id_!r} frame {j} does not start with a JPEG '
                                    f'SOI marker (ff d8) but with {head.hex() or "nothing"}'))
        else:
            try:            # a damaged header past the SOI fails only here
                decode_image(record[:length - pad])
            except DecodeError as exc:
                problems.append(Problem(chunk.data_path, index,
                                        f'video {id_!r} frame {j} does not decode: '
                                        f'{exc.message}'))
        if tail.strip(b'\0'):
            problems.append(Problem(chunk.data_path, index,
                                    f'video {id_!r} frame {j}: padding is {tail.hex()}, '
                                    f'not NUL bytes'))
    return problems



def records(path: str | os.PathLike, storage_options=None) -> dict:
    """Where the frames of each ``.gulp`` lie and whose they are, for :mod:`loadr.digests`;
    ``.gmeta`` and ``label2idx.json`` as whole files. ``storage_options``: the settings of
    a URL's open."""
    from ...digests import FileRecords
    path = os.fspath(path)
    storage = storage_for(path, storage_options)
    videos = load_index(storage, path, allow_pickle=False)
    # The frames of a chunk's videos are consecutive rows of videos.triples.
    owner = np.repeat(np.arange(len(videos), dtype=np.int64), np.diff(videos.fstart))
    chunk_of = videos.chunk_of[owner]
    out: dict = {}
    for c, chunk in enumerate(videos.chunks):
        mine = chunk_of == c
        offsets, lengths = videos.triples[mine, 0], videos.triples[mine, 2]
        out[chunk.data_path] = FileRecords(offsets, offsets + lengths, owner[mine])
        out[chunk.meta_path] = None
    label2idx = os.path.join(path, LABEL2IDX_NAME)
    if storage.exists(label2idx):
        out[label2idx] = None
    return out
