"""FFRecord files (HFAiLab ffrecord): reader, writer, check and detection.

One ``.ffr`` file, all little-endian::

    u32 meta_crc | i64 N | u32 crc[N] | i64 offset[N] | sample 0 | sample 1 | ...

``meta_crc`` is zlib's CRC32 chained over the bytes of N, ``crc[]`` and
``offset[]``; sample i spans ``offset[i] .. offset[i+1]`` and the last one
ends at the end of the file. A metadata checksum of 0 marks a file from an
old ffrecord version: it is read, with a warning. A directory means its
``*.ffr`` files sorted by name, concatenated into one index space.

Samples are opaque bytes; ``decode`` says how to turn them into a datapoint.

Its modules, one concern each:

- :mod:`.layout`: a file's preamble and table, CRC32, coalesced runs of samples.
- :mod:`.samples`: what a sample's bytes hold (msgpack with numpy values, JSON).
- :mod:`.reader`: :class:`FFRecordReader`.
- :mod:`.writer`: :class:`FFRecordWriter`, and what a conversion into ffrecord becomes.
- :mod:`.checks`: :func:`check`, and where samples lie for the digests.

Example::

    with FFRecordWriter('train.ffr', n=2) as w:
        w.write_one(msgpack.packb({'label': 1}))
        w.write_one(msgpack.packb({'label': 2}))
    r = FFRecordReader('train.ffr', decode='msgpack')
    r[1]                  # {'label': 2}
    r.read([1, 0])        # the raw bytes of samples 1 and 0
"""

from __future__ import annotations

import os

from ...storage import storage_for
from ..base import Format
from .checks import check, records
from .layout import SUFFIX, crc32, crc32_combine, header_bytes
from .reader import FFRecordReader
from .samples import pack_msgpack
from .writer import FFRecordWriter

__all__ = ['FFRecordReader', 'FFRecordWriter', 'FORMAT', 'check', 'detect', 'pack_msgpack',
           'crc32', 'crc32_combine', 'header_bytes']


def detect(path: str | os.PathLike, storage_options=None) -> bool:
    """True for a ``.ffr`` file or a directory directly holding ``*.ffr`` files; never raises.

    >>> detect(FIXTURES / 'ffrecord/multi')
    True
    """
    try:
        path = os.fspath(path)
        storage = storage_for(path, storage_options)
        if storage.isfile(path):
            return path.endswith(SUFFIX)
        if storage.isdir(path):
            return any(n.endswith(SUFFIX) and storage.isfile(os.path.join(path, n))
                       for n in storage.list(path))
    except Exception:       # detection never raises, whatever the path is
        return False
    return False


FORMAT = Format('ffrecord', detect, FFRecordReader, FFRecordWriter, check,
                checksums='CRC32 of every sample', records=records)
