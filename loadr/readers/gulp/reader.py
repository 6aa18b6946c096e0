"""The gulp reader: a datapoint per video, frames decoded or as JPEG bytes."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...codecs import decode_image
from ...digests import check_record
from ...errors import ConfigError, DecodeError, FormatError
from ...storage import Storage, storage_for
from ..base import Reader, check_index, known_options
from ..records import Source
from .layout import JPEG_SOI, LABEL2IDX_NAME, SPEC, Videos, frame_positions, load_index, read_plan


class GulpReader(Reader):       # loadr.sources: the protocols of Reader, no more
    """Random access to the videos of a gulp directory.

    ``decode_images=False`` returns each frame as its JPEG bytes;
    ``allow_pickle=True`` accepts a pickled ``.gmeta`` (restricted to what
    gulpio2 writes); ``verify=True`` checks every frame read against the
    digests ``loadr check --write-digests`` recorded (:mod:`loadr.digests`).
    The ``.gmeta`` files are parsed once per process: here when the reader is
    built (so bad metadata fails at open), and in another process on first
    use after unpickling.

    Example::

        r = GulpReader('../shared/fixtures/gulp')
        r[0]['meta']                        # {'label': 'café au lait', 'label_idx': 0}
        r.get('10', frames=[0, 2])['frames']
        r.available(0)['frames']            # range(0, 5)
    """

    format_name = 'gulp'

    def __init__(self, path: str | os.PathLike, decode_images: bool = True,
                 allow_pickle: bool = False, storage_options: dict | None = None,
                 verify: bool = False):
        self.path = os.fspath(path)
        self.decode_images = decode_images
        self.allow_pickle = allow_pickle
        self.verify = bool(verify)
        self._storage_options = storage_options
        self._files = storage_for(self.path, storage_options)
        self._videos: Videos | None = None
        self._where: dict[str, int] | None = None      # id -> index, made when first asked
        self._label2idx: Any = _UNSET
        self._index()

    def __getstate__(self):
        # The index is rebuilt by each process from the files; the options travel, and
        # the storage (which remembers the files as this process first saw them).
        return {'path': self.path, 'decode_images': self.decode_images,
                'allow_pickle': self.allow_pickle, '_files': self._files,
                'verify': self.verify, '_storage_options': self._storage_options}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._videos = self._where = None
        self._label2idx = _UNSET

    def _index(self) -> Videos:
        if self._videos is None:
            videos = load_index(self._files, self.path, self.allow_pickle)
            if self.verify:
                from ...digests import load
                recorded = load(self.path, self._storage_options, required=True)
                for chunk in videos.used_chunks():
                    chunk.digests = recorded.for_file(chunk.data_path)
            self._videos = videos
        return self._videos

    def _identity_files(self) -> dict[str, int]:
        out = {}
        for chunk in self._index().used_chunks():
            out[chunk.data_path] = chunk.data_size
            out[chunk.meta_path] = chunk.meta_size
        return out

    def __len__(self) -> int:
        return len(self._index())

    @property
    def spec(self) -> dict:
        """What each key holds: ``{'id': 'utf8', 'frames': 'jpg[]', 'meta': 'json'}``."""
        return dict(SPEC)

    @property
    def ids(self) -> list[str]:
        """Video ids in datapoint order. Example: ``r.ids[:2] == ['vid_a', 'vid_b']``."""
        return self._index().ids()

    def index_of(self, id_: str) -> int:
        """Datapoint index of a video id; KeyError naming the id and path if absent.

        >>> GulpReader(FIXTURES / 'gulp').index_of('10')
        3
        """
        if self._where is None:
            # Built when first asked (get by id): a dict of every id is the kind of
            # Python object a worker that only reads by index should not hold.
            self._where = {id_: i for i, id_ in enumerate(self._index().ids())}
        key = str(id_) if isinstance(id_, int) and not isinstance(id_, bool) else id_
        try:
            return self._where[key]
        except (KeyError, TypeError):
            raise KeyError(f'no video with id {id_!r} in {self.path}') from None

    def get(self, id_: str, frames: None | slice | range | Sequence[int] = None) -> dict:
        """The datapoint of video ``id_``, with only the frames asked for (read from disk).

        ``frames`` is None (all), a slice, a range or a list of positions
        (negative positions count from the end, as in gulpio2).

        Example: ``r.get('vid_b', frames=slice(1, 10, 2))``.
        """
        index = self.index_of(id_)
        if isinstance(frames, (list, tuple, np.ndarray)):
            frames = _from_end(frames, self._index().count(index))
        return self._get(index, {'id': True, 'frames': True if frames is None else frames,
                                 'meta': True})

    def frame_info(self, index: int) -> list[tuple[int, int, int]]:
        """The ``(offset, pad, total_length)`` of each frame of datapoint ``index``, as stored.

        >>> GulpReader(FIXTURES / 'gulp').frame_info(0)[1]
        (2536, 3, 1364)
        """
        return list(self._index().frames(check_index(index, len(self))))

    def details(self) -> dict:
        videos = self._index()
        return {'chunks': len(videos.used_chunks()),
                'frames': int(videos.fstart[-1]),
                'label2idx': f'{len(self.label2idx)} labels' if self.label2idx else 'none'}

    @classmethod
    def source(cls, path: str, **options) -> Source:
        """Videos with their frames as JPEG bytes; the meta is a map (``msgpack``)."""
        reader = cls(path, **dict(known_options(cls, options), decode_images=False))
        return Source(path, cls.format_name, reader, dict(reader.spec, meta='msgpack'),
                      extras={'label2idx': reader.label2idx})

    @property
    def label2idx(self) -> dict | None:
        """The ``label2idx.json`` mapping, or None when the directory has none."""
        if self._label2idx is _UNSET:
            self._label2idx = load_label2idx(self._files, self.path)
        return self._label2idx

    def _ranges(self, indices: list[int]) -> list[tuple]:
        videos = self._index()
        out: list[tuple] = []
        for index in indices:
            path = videos.chunk(index).data_path
            out.extend((path, offset, length, index)
                       for offset, _, length in videos.frames(index))
        return out

    def available(self, index: int) -> dict:
        videos = self._index()
        return {'id': True, 'meta': True, 'frames': range(videos.count(check_index(index,
                                                                                  len(self))))}

    def _get(self, index: int, mask: dict | None) -> dict:
        videos = self._index()
        if mask is None:
            mask = dict.fromkeys(SPEC, True)
        out: dict[str, Any] = {}
        for key, value in mask.items():
            if key not in SPEC:
                raise ConfigError(f'mask key {key!r} is not one of {sorted(SPEC)}')
            if value is False:
                continue
            if key != 'frames' and value is not True:
                raise TypeError(f'mask value for {key!r} must be True or False, not {value!r:.40}')
            if key == 'id':
                out['id'] = videos.id(index)
            elif key == 'meta':
                # A new object on each read: a caller who edits it changes nothing here.
                out['meta'] = videos.meta(index)
            else:
                out['frames'] = self._frames(index, videos,
                                             frame_positions(value, videos.count(index), index))
        return out

    def _frames(self, index: int, videos: Videos, positions: Sequence[int]) -> list:
        chunk = videos.chunk(index)
        path, digests = chunk.data_path, chunk.digests
        frames = videos.frames(index)
        jpegs = []
        k = 0
        for offset, length, cuts in read_plan(frames, positions):
            buf = self._files.read(path, offset, length, index)
            for a, b in cuts:
                if digests is not None:     # the frame's record: its JPEG and its padding
                    p = positions[k]
                    check_record(digests, path, int(videos.first[index]) + p,
                                 buf[a:a + frames[p][2]], index)
                k += 1
                jpegs.append(buf[a:b])
        out: list[np.ndarray | bytes] = []
        for p, jpeg in zip(positions, jpegs):
            if jpeg[:2] != JPEG_SOI:
                raise DecodeError(f'frame {p} of video {videos.id(index)!r} is not a JPEG '
                                  f'(starts with {jpeg[:4].hex() or "nothing"})', path, index)
            if self.decode_images:
                try:
                    out.append(decode_image(jpeg))
                except DecodeError as exc:
                    raise DecodeError(f'frame {p} of video {videos.id(index)!r}: {exc.message}',
                                      path, index) from exc
            else:
                out.append(jpeg)
        return out


_UNSET = object()


def _from_end(positions, n: int) -> list:
    """Negative positions counted from the end (``-1`` is the last frame), as gulpio2 allows."""
    return [p + n if isinstance(p, (int, np.integer)) and not isinstance(p, bool)
            and -n <= p < 0 else p for p in positions]


def load_label2idx(storage: Storage, path: str) -> dict | None:
    """The ``label2idx.json`` of the gulp directory ``path``, or None when it has none."""
    file = os.path.join(path, LABEL2IDX_NAME)
    if not storage.exists(file):
        return None
    raw = storage.read_all(file)
    try:
        table = json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FormatError(f'label2idx.json is not valid JSON: {exc}', file) from exc
    if not isinstance(table, dict):
        raise FormatError(f'label2idx.json holds a {type(table).__name__}, not an object', file)
    return table
