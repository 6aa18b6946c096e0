"""Bag datasets (granular 0.20.x): bag files, datasets, sharded datasets.

Three small layers, as granular has them (byte layout: docs/FORMATS.md §3):

- :class:`Bag` is one bag file: non-empty records, then a table of uint64
  little-endian offsets; the last 8 bytes say where the table starts.
  Version 2 stores the end of each record; version 1 stores the start of
  each record and then the end of the last, so its first entry is 0. A
  zero-byte file is an empty bag. A contiguous range of records is one read.
- A dataset is a directory: ``spec.json`` (``{"key": "type"}``, sorted),
  ``refs.bag`` (one msgpack record per datapoint, a list aligned with the
  spec keys: an int for a plain key, ``[start, length]`` or ``[]`` for a
  sequence key ``"type[]"``), and ``<key>.bag`` per key.
- A sharded dataset is a directory of datasets ``000000/``, ``000001/``, …;
  datapoint indices run through the shards in order.

:class:`BagReader` reads a dataset or a sharded dataset, :class:`BagWriter`
writes one (byte-identical to granular's ``DatasetWriter`` and
``ShardedDatasetWriter`` for the same datapoints), :func:`check` finds every
problem, :func:`detect` recognises the layout. Values are decoded with
:mod:`loadr.codecs`.

Everything read from disk is checked before it is used: a table must start
inside the file, be a whole number of entries, and its offsets must not
decrease or run past the data; refs must have the spec's shape and point
inside their bags. A bad file raises FormatError (a bad value DecodeError)
naming the file and the datapoint index; sizes always come from the file
size, so a lying table never makes us allocate for it.

Its modules, one concern each:

- :mod:`.file`: one bag file, read (:class:`Bag`) and written (:class:`BagFileWriter`).
- :mod:`.layout`: a dataset and its shards on disk (spec, refs, values decoded).
- :mod:`.reader`: :class:`BagReader`, with its read-ahead of remote records.
- :mod:`.writer`: :class:`BagWriter`, and what a conversion into bag becomes.
- :mod:`.checks`: :func:`check`, and where records lie for the digests.

Example::

    with BagWriter('data/train', {'image': 'jpg', 'label': 'int'}) as w:
        w.append({'image': pixels, 'label': 3})
    r = BagReader('data/train')
    r[0]['label']                                   # 3
    r[0, {'label': True}]                           # reads only label.bag
"""

from __future__ import annotations

import os

from ...storage import storage_for
from ..base import Format
from .checks import check, records
from .file import SHARD_NAME, SPEC_NAME, Bag, BagFileWriter, parse_type
from .reader import BagReader
from .writer import BagWriter

__all__ = ['Bag', 'BagFileWriter', 'BagReader', 'BagWriter', 'FORMAT', 'check', 'detect',
           'parse_type']


def detect(path: str, storage_options=None) -> bool:
    """True for a directory with spec.json, or with shard directories holding one.

    >>> detect(FIXTURES / 'bag_sharded'), detect(FIXTURES / 'bag_raw')
    (True, False)
    """
    try:
        path = os.fspath(path)
        storage = storage_for(path, storage_options)
        if not storage.isdir(path):
            return False
        if storage.isfile(os.path.join(path, SPEC_NAME)):
            return True
        return any(SHARD_NAME.match(name)
                   and storage.isfile(os.path.join(path, name, SPEC_NAME))
                   for name in storage.list(path))
    except Exception:       # detection never raises, whatever the path is
        return False


FORMAT = Format('bag', detect, BagReader, BagWriter, check, records=records)
