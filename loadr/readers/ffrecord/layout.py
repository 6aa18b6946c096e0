"""One ``.ffr`` file on disk: its preamble and table, checked; CRC32; and the runs of
adjacent samples a read coalesces.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from ...errors import ChecksumError, FormatError, LoadrError
from ...storage import Storage
from ..base import check_index

try:
    # ISA-L's CRC-32 gives zlib's values ~6x faster (4 KiB: 0.22 us against 1.4 us), and
    # the check was a third of a random 4 KiB read's cost. zlib where isal has no wheel.
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency wherever it has wheels
    from zlib import crc32


SUFFIX = '.ffr'
PREAMBLE_BYTES = 12          # u32 meta_crc + i64 N
ENTRY_BYTES = 12             # u32 crc + i64 offset, per sample


def header_bytes(n: int) -> int:
    """Size of the header of a file holding ``n`` samples.

    >>> header_bytes(20)
    252
    """
    return PREAMBLE_BYTES + ENTRY_BYTES * n


@dataclasses.dataclass
class Header:
    """The parsed, validated header of one file; ``bounds[i] .. bounds[i+1]`` is sample i."""

    path: str
    file_index: int          # position in the reader's files
    base: int                # global index of this file's sample 0
    n: int
    meta_crc: int
    crcs: np.ndarray         # uint32[n]
    bounds: np.ndarray       # int64[n + 1]: the offsets, then the file size
    # The same two tables seen as Python ints: indexing a memoryview costs a
    # fraction of a numpy scalar and its int(), and the read loop does it per sample.
    crc_at: memoryview = dataclasses.field(init=False, repr=False)
    bound_at: memoryview = dataclasses.field(init=False, repr=False)
    # (record digests, sidecar) when the reader verifies against loadr.digests
    digests: tuple | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        self.crcs = np.ascontiguousarray(self.crcs, dtype=np.uint32)
        self.bounds = np.ascontiguousarray(self.bounds, dtype=np.int64)
        self.crc_at = self.crcs.data.cast('B').cast('I')
        self.bound_at = self.bounds.data.cast('B').cast('q')


def read_preamble(files: Storage, path: str) -> tuple[int, int, int]:
    """``(meta_crc, n, file size)``, with N checked against the file size before
    anything is allocated for it."""
    size = files.size(path)
    if size < PREAMBLE_BYTES:
        raise FormatError(f'too short for an FFRecord header: {size} bytes, '
                          f'need at least {PREAMBLE_BYTES}', path)
    preamble = files.read(path, 0, PREAMBLE_BYTES)
    meta_crc, n = struct.unpack('<Iq', preamble)
    if n < 0:
        raise FormatError(f'header claims a negative number of samples ({n})', path)
    if n > (size - PREAMBLE_BYTES) // ENTRY_BYTES:
        raise FormatError(f'header claims {n} samples, whose table needs '
                          f'{header_bytes(n)} bytes, but the file has only {size}', path)
    return meta_crc, n, size


def read_table(files: Storage, path: str):
    """Read the preamble and the table: (meta_crc, n, crcs, offsets, size, table bytes).

    N is checked against the file size before anything is allocated for it.
    """
    meta_crc, n, size = read_preamble(files, path)
    table = files.read(path, PREAMBLE_BYTES, ENTRY_BYTES * n)
    crcs = np.frombuffer(table, '<u4', n, 0)
    offsets = np.frombuffer(table, '<i8', n, 4 * n)
    return meta_crc, n, crcs, offsets, size, struct.pack('<q', n) + table


def _bad_offsets(n: int, offsets: np.ndarray, size: int) -> tuple[np.ndarray, list[str]]:
    """Local indices of samples whose offset is wrong, and why, in index order."""
    start = header_bytes(n)
    if n == 0:
        return np.zeros(0, np.int64), []
    previous = np.empty(n, np.int64)
    previous[0] = start
    previous[1:] = offsets[:-1]
    bad = (offsets < previous) | (offsets > size)
    bad[0] |= offsets[0] != start
    where = np.flatnonzero(bad)
    reasons = []
    for i in where.tolist():
        off = int(offsets[i])
        if off > size:
            reasons.append(f'offset {off} lies past the end of the file ({size} bytes)')
        elif i == 0:
            reasons.append(f'first offset is {off}, but the samples start at {start} '
                           f'(the end of the header)')
        else:
            reasons.append(f'offset {off} goes back before the previous sample\'s '
                           f'offset {int(offsets[i - 1])}')
    return where, reasons


def load_header(files: Storage, path: str, file_index: int, base: int,
                 check_data: bool, table: tuple | None = None) -> Header:
    """Read and validate one file's header; raises FormatError or ChecksumError.

    ``table``: what :func:`read_table` returned for it, read already.
    """
    meta_crc, n, crcs, offsets, size, covered = table or read_table(files, path)
    if check_data:
        # The CRC guards the whole table, so a mismatch is the truest account
        # of a damaged header; check it before judging the offsets it covers.
        if meta_crc == 0:
            warnings.warn(f'{path}: metadata checksum is 0, an old-version FFRecord file; '
                          f'reading it without checking the header', stacklevel=2)
        else:
            actual = crc32(covered)
            if actual != meta_crc:
                raise ChecksumError(f'metadata checksum mismatch: stored {meta_crc:#010x}, '
                                    f'computed {actual:#010x}; the header is corrupt', path)
    if n == 0 and size != PREAMBLE_BYTES:
        raise FormatError(f'header claims 0 samples but {size - PREAMBLE_BYTES} bytes follow it',
                          path)
    where, reasons = _bad_offsets(n, offsets, size)
    if len(where):
        local = int(where[0])
        raise FormatError(f'sample {local} of this file: {reasons[0]}', path, base + local)
    bounds = np.empty(n + 1, np.int64)
    bounds[:n] = offsets
    bounds[n] = size
    return Header(path, file_index, base, n, meta_crc, crcs, bounds)


def list_files(storage: Storage, path: str) -> list[str]:
    """The ``.ffr`` files of ``path`` in index order: itself, or a directory's, by name."""
    if storage.isdir(path):
        try:
            names = [n for n in storage.list(path) if n.endswith(SUFFIX)]
        except LoadrError as exc:
            raise FormatError(f'cannot list directory: {exc.message}', path) from exc
        files = [os.path.join(path, name) for name in names]
        files = [f for f in files if storage.isfile(f)]
        if not files:
            raise FormatError(f'directory holds no *{SUFFIX} files', path)
        return files
    return [path]


def checked_indices(indices: Iterable[int], n: int) -> list[int]:
    """``indices`` as a list of ints in ``[0, n)``; IndexError/TypeError otherwise.

    Plain ints in range, the usual case, are checked in bulk.
    """
    wanted = list(indices)
    if wanted and set(map(type, wanted)) == {int} and min(wanted) >= 0 and max(wanted) < n:
        return wanted
    return [check_index(i, n) for i in wanted]


def lone_and_adjacent(a: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
    """Split sorted distinct indices into lone ones and stretches of consecutive ones.

    Numpy finds the neighbours; only the stretches, rare in a random batch, are
    cut out in Python (cutting at every gap cost more per sample than its pread).

    >>> lone_and_adjacent(np.array([1, 4, 5, 6, 9, 11, 12]))
    (array([1, 9]), [[4, 5, 6], [11, 12]])
    """
    a = np.asarray(a, np.int64)
    at = np.flatnonzero(a[1:] - a[:-1] == 1)       # a[k] and a[k + 1] are neighbours
    if not len(at):
        return a, []
    in_stretch = np.zeros(len(a), bool)
    in_stretch[at] = True
    in_stretch[at + 1] = True
    ks = at.tolist()
    stretches, start = [], ks[0]
    for k, following in zip(ks, ks[1:] + [-1]):
        if following != k + 1:                     # the stretch that began at start ends
            stretches.append(a[start:k + 2].tolist())
            start = following
    return a[~in_stretch], stretches


def coalesced_runs(locals_sorted: list[int], bounds, max_bytes: int,
          max_sample_bytes: int | None = None):
    """Group sorted local indices into runs of adjacent samples, one pread each.

    A run spans at most ``max_bytes`` (a single larger sample is a run of its
    own) and, if ``max_sample_bytes`` is given, joins only samples up to that
    size. Yields ``(start_byte, end_byte, [local indices])``; a repeated index
    joins the run it repeats.
    """
    run: list[int] = []
    for i in locals_sorted:
        if run and i == run[-1]:
            run.append(i)
            continue
        if run and i == run[-1] + 1 and bounds[i + 1] - bounds[run[0]] <= max_bytes:
            if max_sample_bytes is None or max(bounds[i + 1] - bounds[i],
                                               bounds[i] - bounds[i - 1]) <= max_sample_bytes:
                run.append(i)
                continue
        if run:
            yield int(bounds[run[0]]), int(bounds[run[-1] + 1]), run
        run = [i]
    if run:
        yield int(bounds[run[0]]), int(bounds[run[-1] + 1]), run


def describe(value: Any) -> str:
    """What ``value`` is, for a message: an array's dtype and shape, else its type's name."""
    if isinstance(value, np.ndarray):
        return f'array {value.dtype} {value.shape}'
    return type(value).__name__


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)`` (zlib's algorithm).

    >>> import zlib
    >>> crc32_combine(zlib.crc32(b'head'), zlib.crc32(b'tail'), 4) == zlib.crc32(b'headtail')
    True
    """
    if len2 <= 0:
        return crc1

    def times(matrix, vector):
        total, i = 0, 0
        while vector:
            if vector & 1:
                total ^= matrix[i]
            vector >>= 1
            i += 1
        return total

    def square(matrix):
        return [times(matrix, matrix[k]) for k in range(32)]

    odd = [0xEDB88320] + [1 << k for k in range(31)]     # one zero bit
    even = square(odd)                                   # two zero bits
    odd = square(even)                                   # four zero bits
    while True:                                          # apply len2 zero bytes to crc1
        even = square(odd)
        if len2 & 1:
            crc1 = times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = square(even)
        if len2 & 1:
            crc1 = times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2
