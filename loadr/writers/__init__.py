"""Writers for the on-disk formats; each lives beside its reader in ``loadr.readers``.

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
