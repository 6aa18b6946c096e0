"""Writers for the on-disk formats: where users import them from.

Each is defined in its format's package, beside the reader and the byte
layout they share (``loadr.readers.bag.writer``, ``loadr.readers.gulp.writer``,
…): a change to a format's bytes is one folder. This module names them all.

Every writer writes under a hidden temporary name and renames on success, so
an interrupted write never leaves a file that opens as a complete dataset;
the next writer of the same target removes what a killed one left
(:mod:`loadr.storage.staging`).

Example::

    with loadr.writers.FFRecordWriter('out.ffr', n=2) as w:
        w.write_one(b'first')
        w.write_one(b'second')
"""

from __future__ import annotations

from ..readers.bag.writer import BagWriter
from ..readers.ffrecord.writer import FFRecordWriter
from ..readers.gulp.writer import GulpWriter
from ..readers.parquet import ParquetWriter
from ..readers.webdataset.writer import WebDatasetWriter

__all__ = ['GulpWriter', 'FFRecordWriter', 'BagWriter', 'WebDatasetWriter',
           'ParquetWriter']
