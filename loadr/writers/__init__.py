"""Writers for the on-disk formats; each lives beside its reader in ``loadr.readers``.

Every writer writes under a temporary name and renames on success, so an
interrupted write never leaves a file that opens as a complete dataset.

Example::

    with loadr.writers.FFRecordWriter('out.ffr', n=2) as w:
        w.write_one(b'first')
        w.write_one(b'second')
"""

from __future__ import annotations

from ..readers.bag import BagWriter
from ..readers.ffrecord import FFRecordWriter
from ..readers.gulp import GulpWriter

__all__ = ['GulpWriter', 'FFRecordWriter', 'BagWriter']
