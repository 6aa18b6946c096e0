"""Gulp chunk directories (GulpIO / gulpio2): reader, writer, checker, detector.

A gulp directory holds chunk pairs ``data_<k>.gulp`` (JPEG frames, each
NUL-padded to a multiple of 4 bytes) and ``meta_<k>.gmeta`` (JSON
``{id: {"frame_info": [[offset, pad, total_length], ...], "meta_data": [meta]}}``),
plus an optional ``label2idx.json``. See ``docs/FORMATS.md`` §1 for the bytes.

Datapoint ``i`` is the i-th video, counting chunks in NUMERIC order of ``k``
(``data_2`` before ``data_10``) and videos in ``.gmeta`` key order. gulpio2's
``GulpDirectory`` sorts the file names as strings instead (``data_10`` before
``data_2``), so with ten or more chunks its iteration order differs from
ours; ids are the same either way, so look videos up by id (``r.get(id)``)
when the order of another tool matters. Chunks must be numbered ``0..n-1``
with no gaps.

A datapoint is ``{'id': str, 'frames': [...], 'meta': meta_data[0]}``; frames
decode with Pillow to uint8 H×W×3 (RGB) or H×W (grayscale) arrays, or stay
JPEG bytes (padding removed) with ``decode_images=False``. A pickled
``.gmeta`` (gulpio2's ``pickle_serializer``) is refused unless the reader is
built with ``allow_pickle=True``, and even then only the two classes
gulpio2 pickles (``collections.OrderedDict``, ``gulpio2.fileio.ImgInfo``)
are allowed.

Its modules, one concern each:

- :mod:`.layout`: the chunks and their ``.gmeta`` index on disk, where each frame lies.
- :mod:`.reader`: :class:`GulpReader`.
- :mod:`.writer`: :class:`GulpWriter`, and what a conversion into gulp becomes.
- :mod:`.checks`: :func:`check`, and where frames lie for the digests.

Example::

    r = GulpReader('../shared/fixtures/gulp')
    video = r.get('vid_a', frames=slice(0, 4, 2))     # frames 0 and 2
    part = r[1, {'frames': range(2, 6)}]             # 4 frames, one read

    with GulpWriter('out/gulp', videos_per_chunk=100) as w:
        w.append('clip1', {'label': 'running'}, [frame0, frame1])
"""

from __future__ import annotations

import fnmatch
import os

from ...storage import storage_for
from ..base import Format
from .checks import check, records
from .reader import GulpReader
from .writer import GulpWriter

__all__ = ['GulpReader', 'GulpWriter', 'check', 'detect', 'FORMAT']


def detect(path: str | os.PathLike, storage_options=None) -> bool:
    """True for a directory holding ``data_*.gulp`` or ``meta_*.gmeta`` files. Never raises.

    >>> detect(FIXTURES / 'gulp')
    True
    """
    try:
        path = os.fspath(path)
        storage = storage_for(path, storage_options)
        if not storage.isdir(path):
            return False
        return any(fnmatch.fnmatchcase(n, 'data_*.gulp') or fnmatch.fnmatchcase(n, 'meta_*.gmeta')
                   for n in storage.list(path))
    except Exception:
        return False


FORMAT = Format('gulp', detect, GulpReader, GulpWriter, check, records=records)
