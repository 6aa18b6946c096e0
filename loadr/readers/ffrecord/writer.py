"""The FFRecord writer and its conversion planning."""

from __future__ import annotations

import os
import struct

import numpy as np

from ...errors import ConfigError, WriterError
from ..base import Writer, known_options
from ..records import Plan
from .layout import SUFFIX, crc32, header_bytes
from .samples import pack_msgpack


class FFRecordWriter(Writer):
    """Writes ``n`` samples to one ``.ffr`` file, byte-identical to ffrecord's FileWriter.

    The header is reserved, samples are appended, and the header is filled on
    close. Everything goes to a hidden temporary file beside ``path`` that is
    renamed to ``path`` only when all ``n`` samples were written; otherwise it
    is removed, so nothing that looks complete is left behind (the staged
    lifecycle of :class:`~loadr.readers.base.Writer`).

    ``write_one(bytes)`` appends a sample as it is; ``append(datapoint)``
    appends a dict as one msgpack map (what ``decode='msgpack'`` reads back).

    Example::

        with FFRecordWriter('out.ffr', n=2) as w:
            w.write_one(b'first')
            w.append({'label': 2})
    """

    format_name = 'ffrecord'
    directory = False
    overwrite = True            # as ffrecord's FileWriter: an existing file is replaced on success

    def __init__(self, path: str | os.PathLike, n: int, storage_options: dict | None = None):
        if isinstance(n, bool) or not hasattr(n, '__index__'):
            raise TypeError(f'n must be an integer, not {type(n).__name__}')
        n = n.__index__()
        if n < 0:
            raise WriterError(f'n must be >= 0, not {n}', path)
        self.path = os.fspath(path)
        self.n = n
        self.count = 0
        self._crcs = np.zeros(n, '<u4')
        self._offsets = np.zeros(n, '<i8')
        self._pos = header_bytes(n)
        # Hidden and not ending in .ffr: a directory reader never picks it up.
        self._stage(storage_options)
        self._tmp = self._out.path

    def write_one(self, data: bytes | bytearray | memoryview) -> None:
        """Append one sample. Example: ``w.write_one(msgpack.packb({'label': 3}))``."""
        if self.closed:
            raise WriterError('writer is closed', self.path, self.count)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise WriterError(f'a sample must be bytes, bytearray or memoryview, '
                              f'not {type(data).__name__}', self.path, self.count)
        if self.count >= self.n:
            raise WriterError(f'writer was made for n={self.n} samples; this would be '
                              f'sample {self.count + 1}',
                              self.path, self.count)
        view = memoryview(data)
        if not view.c_contiguous:
            raise WriterError('a memoryview sample must be C-contiguous', self.path, self.count)
        view = view.cast('B')
        self._crcs[self.count] = crc32(view)
        self._offsets[self.count] = self._pos
        self._file.pwrite(view, self._pos)
        self._pos += len(view)
        self.count += 1

    def append(self, datapoint) -> int:
        """Append a datapoint (a dict, stored as a msgpack map) or raw bytes; returns its index.

        Example: ``w.append({'label': 3, 'image': jpeg_bytes})``.
        """
        if isinstance(datapoint, (bytes, bytearray, memoryview)):
            data = datapoint
        elif isinstance(datapoint, dict):
            data = pack_msgpack(datapoint, self.path, self.count)
        else:
            raise WriterError(f'a datapoint must be a dict (or bytes), not '
                              f'{type(datapoint).__name__}', self.path, self.count)
        self.write_one(data)
        return self.count - 1

    # -- conversion into FFRecord (loadr convert) -------------------------------

    @classmethod
    def plan(cls, plan: Plan, dst: str, types: dict, **options) -> None:
        """Any keys fit: one msgpack map per datapoint, numpy values as msgpack-numpy stores
        them (:func:`pack_msgpack`); samples that are opaque bytes are copied as they are."""
        if not dst.endswith(SUFFIX):
            raise ConfigError(f'an ffrecord output is one file ending in {SUFFIX}', dst)

    @classmethod
    def describe_plan(cls, plan: Plan) -> str:
        what = 'raw sample bytes' if plan.source.raw else f'msgpack maps of {plan.keys}'
        return f'ffrecord, {what}'

    @classmethod
    def from_plan(cls, plan: Plan, dst: str, **options) -> FFRecordWriter:
        return cls(dst, len(plan.source), **known_options(cls, options))

    def _finish(self) -> None:
        """Fill the header; WriterError (and no file) if short of ``n``."""
        if self.count != self.n:
            raise WriterError(f'closed after {self.count} of {self.n} samples; '
                              f'the file was not written', self.path)
        body = struct.pack('<q', self.n) + self._crcs.tobytes() + self._offsets.tobytes()
        self._file.pwrite(struct.pack('<I', crc32(body)) + body, 0)
