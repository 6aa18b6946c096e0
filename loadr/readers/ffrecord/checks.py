"""``loadr check`` of FFRecord files, and where their samples lie (for the digests)."""

from __future__ import annotations

import os
import struct
from typing import Literal

import numpy as np

from ...errors import DecodeError, LoadrError
from ...storage import Storage, storage_for
from ..base import Problem
from .layout import (
    PREAMBLE_BYTES,
    coalesced_runs,
    crc32,
    crc32_combine,
    header_bytes,
    list_files,
    read_preamble,
)
from .reader import FFRecordReader
from .samples import decode_named, detect_decode

# check() streams samples larger than this in pieces instead of reading them whole,
# and reads a file's table this many entries (12 bytes each) at a time.
CHECK_BLOCK_BYTES = 16 << 20
CHECK_TABLE_ENTRIES = 1 << 20
# check() lists at most this many problems per file (a table of garbage has N of them).
MAX_PROBLEMS_PER_FILE = 1000


def records(path: str | os.PathLike, storage_options=None) -> dict:
    """Where the samples of each file lie, for :mod:`loadr.digests`: ``{file: FileRecords}``;
    ``storage_options``: the settings of a URL's open."""
    from ...digests import FileRecords
    with FFRecordReader(path, check_data=False, storage_options=storage_options) as reader:
        return {h.path: FileRecords(h.bounds[:-1].copy(), h.bounds[1:].copy(),
                                    h.base + np.arange(h.n, dtype=np.int64))
                for h in reader._load()}


def check(path: str | os.PathLike, storage_options=None) -> list[Problem]:
    """Every problem in an FFRecord file or directory: header, offsets, each sample's CRC,
    and each sample's content (:class:`_Contents`): it decodes as the first one does (a
    msgpack map, a JSON object, or bytes), and every JPEG or PNG in it decodes whole.
    ``storage_options``: the settings of a URL's open.

    >>> check(FIXTURES / 'ffrecord/single.ffr')
    []
    """
    path = os.fspath(path)
    try:
        files = storage_for(path, storage_options)
        paths = list_files(files, path)
    except LoadrError as exc:
        return [Problem(exc.path or path, exc.index, exc.message)]
    problems: list[Problem] = []
    contents = _Contents()
    base = 0
    try:
        for file in paths:
            base += _check_file(files, file, base, problems, contents)
    finally:
        files.close()
    return problems + contents.strays()


def _check_file(files: Storage, path: str, base: int, problems: list[Problem],
                contents: _Contents | None = None) -> int:
    """Append this file's problems; return its sample count (0 if the header is unreadable).

    The table is read :data:`CHECK_TABLE_ENTRIES` entries at a time, so the
    memory used does not grow with the number of samples (a file may claim
    any N its size allows, e.g. a sparse file of holes); the metadata CRC is
    summed over the pieces as they pass. At most :data:`MAX_PROBLEMS_PER_FILE`
    problems are listed per file, then one line counting the rest.
    """
    try:
        meta_crc, n, size = read_preamble(files, path)
    except LoadrError as exc:
        problems.append(Problem(exc.path or path, exc.index, exc.message))
        return 0
    found: list[Problem] = []
    if n == 0 and size != PREAMBLE_BYTES:
        found.append(Problem(path, None, f'header claims 0 samples but '
                                         f'{size - PREAMBLE_BYTES} bytes follow it'))
    # The CRC covers N, crc[] and offset[], in that order; both tables are read a piece at
    # a time, so the two parts are summed apart and joined at the end.
    crc_head = crc32(struct.pack('<q', n)) if meta_crc else 0
    crc_offsets = 0
    start = header_bytes(n)
    crc_table, offset_table = PREAMBLE_BYTES, PREAMBLE_BYTES + 4 * n
    previous = start               # the offset before this piece's first (as stored)
    try:
        for lo in range(0, n, CHECK_TABLE_ENTRIES):
            hi = min(n, lo + CHECK_TABLE_ENTRIES)
            raw_crcs = files.read(path, crc_table + 4 * lo, 4 * (hi - lo))
            raw_offsets = files.read(path, offset_table + 8 * lo, 8 * (hi - lo))
            if meta_crc:
                crc_head = crc32(raw_crcs, crc_head)
                crc_offsets = crc32(raw_offsets, crc_offsets)
            crcs = np.frombuffer(raw_crcs, '<u4')
            offsets = np.frombuffer(raw_offsets, '<i8')
            following = size if hi == n else struct.unpack(
                '<q', files.read(path, offset_table + 8 * hi, 8))[0]
            _check_piece(files, path, base, lo, start, size, previous, following, crcs,
                         offsets, found, contents)
            previous = int(offsets[-1])
            if len(found) > MAX_PROBLEMS_PER_FILE:
                break
    except LoadrError as exc:
        found.append(Problem(exc.path or path, exc.index, exc.message))
    if meta_crc and len(found) <= MAX_PROBLEMS_PER_FILE:
        actual = crc32_combine(crc_head, crc_offsets, 8 * n)
        if actual != meta_crc:
            found.insert(0, Problem(path, None, f'metadata checksum mismatch: stored '
                                                f'{meta_crc:#010x}, computed {actual:#010x}'))
    if len(found) > MAX_PROBLEMS_PER_FILE:
        found[MAX_PROBLEMS_PER_FILE:] = [Problem(path, None, (
            f'more than {MAX_PROBLEMS_PER_FILE} problems in this file; the check stopped '
            f'after listing {MAX_PROBLEMS_PER_FILE}'))]
    problems += found
    return n


def _check_piece(files: Storage, path: str, base: int, lo: int, start: int, size: int,
                 previous: int, following: int, crcs: np.ndarray, offsets: np.ndarray,
                 found: list[Problem], contents: _Contents | None = None) -> None:
    """The problems of samples ``lo .. lo + len(offsets) - 1`` of one file.

    ``previous`` is the stored offset before ``offsets[0]`` (the end of the
    header for sample 0), ``following`` the one after the last (the file
    size after the last sample). A sample's CRC is checked when both its
    ends are sane; the others are reported as bad offsets.
    """
    count = len(offsets)
    # bounds[i] .. bounds[i + 1] is sample lo + i; around them the offsets just outside.
    edges = np.empty(count + 2, np.int64)
    edges[0], edges[1:-1], edges[-1] = previous, offsets, following
    # Compared, not subtracted: a table of garbage holds offsets whose differences overflow.
    bad = (offsets < edges[:-2]) | (offsets > size)
    if lo == 0:
        bad[0] |= offsets[0] != start
    before = edges[:-2]
    for i in np.flatnonzero(bad).tolist():
        off = int(offsets[i])
        if off > size:
            reason = f'offset {off} lies past the end of the file ({size} bytes)'
        elif lo + i == 0:
            reason = (f'first offset is {off}, but the samples start at {start} '
                      f'(the end of the header)')
        else:
            reason = f'offset {off} goes back before the previous sample\'s offset {int(before[i])}'
        found.append(Problem(path, base + lo + i, f'sample {lo + i} of this file: {reason}'))
    # The last bound is the next piece's first offset (or the file size), bad if it goes
    # back or past the end.
    bounds = edges[1:]
    with np.errstate(over='ignore'):       # only the lengths of sane samples are used
        lengths = bounds[1:] - bounds[:-1]
    last_bad = following != size and (following < offsets[-1] or following > size)
    if bad.any() or last_bad:
        bad_bound = np.empty(count + 1, bool)
        bad_bound[:count] = bad
        bad_bound[count] = last_bad
        sane = ~bad_bound[:-1] & ~bad_bound[1:]
    else:
        sane = np.ones(count, bool)
    # Empty samples need no read: their CRC32 is 0. Listed with the others in index order.
    mismatches: list[Problem] = []
    for i in np.flatnonzero(sane & (lengths == 0) & (crcs != 0)).tolist():
        mismatches.append(Problem(path, base + lo + i, f'sample {lo + i} of this file: CRC32 is '
                                                  f'0x00000000, header says {int(crcs[i]):#010x}'))
    readable = np.flatnonzero(sane & (lengths > 0)).tolist()
    for first, end, run in coalesced_runs(readable, bounds, CHECK_BLOCK_BYTES):
        view = None
        if end - first > CHECK_BLOCK_BYTES:       # one big sample: stream it
            crc = 0
            for at in range(first, end, CHECK_BLOCK_BYTES):
                piece = files.read(path, at, min(CHECK_BLOCK_BYTES, end - at),
                                   base + lo + run[0])
                crc = crc32(piece, crc)
            actual = {run[0]: crc}
        else:
            view = memoryview(files.read(path, first, end - first, base + lo + run[0]))
            actual = {i: crc32(view[int(bounds[i]) - first:int(bounds[i + 1]) - first])
                      for i in run}
        for i, crc in actual.items():
            if crc != int(crcs[i]):
                mismatches.append(Problem(path, base + lo + i, f'sample {lo + i} of this file: '
                                                               f'CRC32 is {crc:#010x}, header '
                                                               f'says {int(crcs[i]):#010x}'))
            elif contents is not None:
                # The bytes are the ones written: now whether they are what they claim to be.
                a, b = int(bounds[i]), int(bounds[i + 1])
                data = (view[a - first:b - first] if view is not None
                        else files.read(path, a, b - a, base + lo + i))
                contents.visit(path, base + lo + i, lo + i, data, mismatches)
    if contents is not None and contents.decode not in (False, None):
        # An empty sample is no map: listed (up to the limit) where the samples are maps.
        empty = np.flatnonzero(sane & (lengths == 0) & (crcs == 0))[:MAX_PROBLEMS_PER_FILE + 1]
        for i in empty.tolist():
            contents.visit(path, base + lo + i, lo + i, b'', mismatches)
    found += sorted(mismatches, key=lambda p: -1 if p.index is None else p.index)


class _Contents:
    """What ``check`` finds inside the samples whose CRC is right.

    How samples are read is detected from the first one visited, as
    ``decode='auto'`` does: a msgpack map (what ``loadr convert`` and
    :meth:`FFRecordWriter.append` write), a JSON object, or opaque bytes.
    Every later sample must read the same way. Each bytes value (and each
    bytes item of a list) that starts like a JPEG or PNG is decoded whole; a
    key that holds images in most samples but something else in a few has
    those few reported (:meth:`strays`): the Loader's image fns would fail on them.
    """

    def __init__(self):
        self.decode: str | None | Literal[False] = False    # False: not detected yet
        self.images: dict = {}                      # key -> samples with an image there
        self.others: dict = {}                      # key -> [(path, index, local, head, n)]

    def visit(self, path: str, index: int, local: int, data, found: list[Problem]) -> None:
        data = bytes(data)
        if self.decode is False:
            self.decode = detect_decode(data)
        dp = {'data': data}
        if self.decode is not None:
            try:
                value = decode_named(self.decode, data)
            except Exception as exc:  # noqa: BLE001 - any failure is this sample's problem
                found.append(Problem(path, index, f'sample {local} of this file does not decode '
                                                  f'as {self.decode}, as the first sample '
                                                  f'does: {type(exc).__name__}: {exc}'))
                return
            if not isinstance(value, dict):
                found.append(Problem(path, index, f'sample {local} of this file is a '
                                                  f'{self.decode} {type(value).__name__}, not a '
                                                  f'map as the first sample is'))
                return
            dp = value
        for key, value in dp.items():
            items = value if isinstance(value, (list, tuple)) else [value]
            for position, item in enumerate(items):
                if isinstance(item, (bytes, bytearray, memoryview)):
                    where = key if items is not value else f'{key}[{position}]'
                    self._image(path, index, local, key, where, bytes(item), found)

    def _image(self, path, index, local, key, where, data: bytes, found) -> None:
        from ...codecs import decode_image, image_kind
        if image_kind(data) not in ('JPEG', 'PNG'):
            others = self.others.setdefault(key, [])
            if len(others) <= MAX_PROBLEMS_PER_FILE:
                others.append((path, index, local, where, data[:8], len(data)))
            return
        self.images[key] = self.images.get(key, 0) + 1
        try:
            decode_image(data)
        except DecodeError as exc:
            found.append(Problem(path, index, f'sample {local} of this file, key {where!r}: '
                                              f'{exc.message}'))

    def strays(self) -> list[Problem]:
        """The non-images of keys that hold images in at least as many samples."""
        out = []
        for key, others in self.others.items():
            images = self.images.get(key, 0)
            if not images or len(others) > images:
                continue
            for path, index, local, where, head, n in others[:MAX_PROBLEMS_PER_FILE]:
                out.append(Problem(path, index, f'sample {local} of this file, key {where!r}: '
                                                f'not a JPEG or PNG ({n} bytes starting '
                                                f'{head!r}), while {images} other values of '
                                                f'{key!r} are images'))
        return sorted(out, key=lambda p: -1 if p.index is None else p.index)
