"""The gulp writer, gulpio2's layout, and its conversion planning."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ...codecs import JPEG_QUALITY, encode_image
from ...errors import ConfigError, WriterError
from ...storage import WriteFile, is_url
from ..base import Writer, known_options
from ..records import Plan
from .layout import JPEG_SOI, JSON_TYPES, LABEL2IDX_NAME, PAD_MULTIPLE_BYTES, SPEC


class GulpWriter(Writer):
    """Writes a gulp directory that gulpio2 reads, byte for byte as gulpio2 writes it.

    Frames are uint8 arrays (H×W×3 or H×W, JPEG-encoded with Pillow at
    quality 90) or JPEG bytes (stored as they are). Every ``videos_per_chunk``
    videos start a new chunk. Output goes to a hidden sibling directory
    that is renamed to ``path`` on a clean close; an exception inside the
    ``with`` removes it (the lifecycle of :class:`~loadr.readers.base.Writer`).

    ``append`` takes a datapoint as the reader gives it, ``{'id', 'frames',
    'meta'}`` (id and meta optional: the video's number and ``{}``), or, as
    before, ``append(id, meta, frames)``.

    Example::

        with GulpWriter('out/gulp', videos_per_chunk=2, label2idx={'run': 0}) as w:
            w.append({'id': 'clip1', 'meta': {'label': 'run'},
                      'frames': [np.zeros((8, 8, 3), np.uint8)]})
            w.append('clip2', {'label': 'run'}, [jpeg_bytes])
    """

    format_name = 'gulp'

    def __init__(self, path: str | os.PathLike, videos_per_chunk: int = 100,
                 label2idx: dict | None = None, storage_options: dict | None = None):
        if isinstance(videos_per_chunk, bool) or not isinstance(videos_per_chunk, int) \
                or videos_per_chunk < 1:
            raise WriterError(f'videos_per_chunk must be a positive int, not {videos_per_chunk!r}')
        path = os.fspath(path)
        self.path = path if is_url(path) else os.path.abspath(path)
        self.videos_per_chunk = videos_per_chunk
        self._label2idx_json = None
        if label2idx is not None:
            if not isinstance(label2idx, dict):
                raise WriterError(f'label2idx must be a dict, not {type(label2idx).__name__}',
                                  self.path)
            self._label2idx_json = _json_bytes(label2idx, 'label2idx', self.path)
        self._ids: set[str] = set()
        self._chunk = -1          # chunk being written; its data file is open in _data
        self._data: WriteFile | None = None
        self._offset = 0          # bytes written to the current data file
        self._meta: list[str] = []   # '"id": {entry}' JSON of each video in the chunk
        self._count = 0
        self._stage(storage_options)
        self._tmp = self._out.path

    def append(self, datapoint, meta: dict | None = None, frames: Sequence | None = None
               ) -> int:
        """Add one video, ``{'id', 'frames', 'meta'}`` or ``(id, meta, frames)``; its index.

        The id is a str (an int is stored as str); meta a JSON-able dict.
        """
        if self.closed:
            raise WriterError('append() after close()', self.path)
        if meta is None and frames is None and isinstance(datapoint, Mapping):
            extra = sorted(set(map(str, datapoint)) - set(SPEC))
            if extra or 'frames' not in datapoint:
                raise WriterError(f'a gulp datapoint has the keys {sorted(SPEC)} (id and meta '
                                  f'optional); this one has {sorted(map(str, datapoint))}',
                                  self.path, self._count)
            id_, meta = datapoint.get('id', str(self._count)), datapoint.get('meta', {})
            frames = datapoint['frames']
        else:
            id_ = datapoint
        self._append(id_, meta, frames)
        self._count += 1
        return self._count - 1

    def _append(self, id_: object, meta: dict | None, frames: Sequence | None) -> None:
        if isinstance(id_, int) and not isinstance(id_, bool):
            id_ = str(id_)
        if not isinstance(id_, str):
            raise WriterError(f'video id must be a str, not {type(id_).__name__}', self.path)
        if id_ in self._ids:
            raise WriterError(f'video id {id_!r} was already appended', self.path)
        if not isinstance(meta, dict):
            raise WriterError(f'meta of video {id_!r} must be a dict, not {type(meta).__name__}',
                              self.path)
        meta_json = _json_bytes(meta, f'meta of video {id_!r}', self.path).decode('ascii')
        if isinstance(frames, (str, bytes, np.ndarray)) or not isinstance(frames, Iterable):
            raise WriterError(f'frames of video {id_!r} must be a list of images or JPEG '
                              f'bytes, not {type(frames).__name__}', self.path)
        # Encode everything before writing a byte, so a bad frame leaves the writer as it was.
        records = [_frame_record(f, id_, j, self.path) for j, f in enumerate(frames)]
        if not records:
            raise WriterError(f'video {id_!r} has no frames', self.path)
        info = []
        try:
            data = self._data
            if data is None or len(self._meta) == self.videos_per_chunk:
                data = self._next_chunk()
            for record, pad in records:
                data.write(record)
                info.append([self._offset, pad, len(record)])
                self._offset += len(record)
        except OSError as exc:
            # A half-written video (disk full, I/O error) cannot be taken back: give up.
            self.abort()
            raise WriterError(f'cannot write video {id_!r}: {exc.strerror or exc}; '
                              f'nothing was kept', self.path) from exc
        # Serialized now, so a meta dict the caller changes later cannot change the file.
        # Keys and separators are exactly what json.dump of gulpio2's dict gives.
        self._meta.append(f'{json.dumps(id_)}: {{"frame_info": {json.dumps(info)}, '
                          f'"meta_data": [{meta_json}]}}')
        self._ids.add(id_)

    def _next_chunk(self) -> WriteFile:
        if self._data is not None:
            self._finish_chunk(self._data)
        self._chunk += 1
        self._data = data = self._dir.open_write(f'data_{self._chunk}.gulp')
        self._offset = 0
        self._meta = []
        return data

    def _finish_chunk(self, data: WriteFile) -> None:
        data.sync()
        data.close()
        # json.dump defaults (', ' and ': ', ensure_ascii) are what gulpio2 writes.
        self._dir.write_file(f'meta_{self._chunk}.gmeta',
                             ('{' + ', '.join(self._meta) + '}').encode('ascii'), sync=True)

    # -- conversion into gulp (loadr convert) -----------------------------------

    @classmethod
    def plan(cls, plan: Plan, dst: str, types: dict, frames: str | None = None,
             **options) -> None:
        """Frames from the ``jpg[]`` key (or one ``jpg`` key), id from ``id``, meta: the rest."""
        path = plan.source.path
        if plan.source.raw:
            raise ConfigError('these samples are opaque bytes (not maps of keys), so there are '
                              'no frames to make a gulp video of', path)
        if frames is None:
            sequences = [k for k, t in types.items() if t == 'jpg[]']
            singles = [k for k, t in types.items() if t == 'jpg']
            if 'frames' in sequences:
                frames = 'frames'
            elif len(sequences) == 1:
                frames = sequences[0]
            elif not sequences and len(singles) == 1:
                frames = singles[0]
            elif sequences or singles:
                raise ConfigError(f'several JPEG keys ({sequences + singles}); choose the '
                                  f'frames with --frames KEY', path)
            else:
                raise ConfigError(f'gulp holds videos of JPEG frames, and no key holds JPEGs '
                                  f'(keys: {types}); convert to another format instead', path)
        elif types.get(frames) not in ('jpg', 'jpg[]'):
            raise ConfigError(f'--frames {frames!r} must name a jpg or jpg[] key; the keys are '
                              f'{types}', path)
        rest = [k for k in types if k != frames]
        id_key = None
        if 'id' in rest and types['id'] in ('utf8', 'int', 'i64', 'u64'):
            id_key = 'id'
            rest.remove('id')
        bad = [k for k in rest if types[k].removesuffix('[]') not in JSON_TYPES]
        if bad:
            raise ConfigError(f'key {bad[0]!r} ({types[bad[0]]}) has no place in a gulp video: '
                              f'the meta holds JSON values only; leave it out with --keys', path)
        plan.settings.update(frames=frames, sequence=types[frames] == 'jpg[]', id_key=id_key,
                             meta_keys=rest,
                             meta_is_map=rest == ['meta'] and types['meta'] == 'msgpack')

    @classmethod
    def describe_plan(cls, plan: Plan) -> str:
        s = plan.settings
        id_from = f'key {s["id_key"]!r}' if s['id_key'] else 'the datapoint index'
        meta = ('the meta map' if s['meta_is_map']
                else f'keys {s["meta_keys"]}' if s['meta_keys'] else 'nothing')
        return f'gulp: frames from {s["frames"]!r}, id from {id_from}, meta from {meta}'

    @classmethod
    def from_plan(cls, plan: Plan, dst: str, videos_per_chunk: int = 100,
                  **options) -> GulpWriter:
        return cls(dst, videos_per_chunk=videos_per_chunk,
                   label2idx=plan.source.extras.get('label2idx'), **known_options(cls, options))

    @classmethod
    def datapoint_for(cls, plan: Plan, index: int, dp) -> dict:
        s = plan.settings
        video = dp[s['frames']]
        if s['meta_is_map'] and isinstance(dp['meta'], dict):
            meta = dp['meta']
        else:
            meta = {k: dp[k] for k in s['meta_keys']}
        return {'id': dp[s['id_key']] if s['id_key'] else str(index), 'meta': meta,
                'frames': list(video) if s['sequence'] else [video]}

    def _finish(self) -> None:
        """Finish the last chunk and write label2idx.json."""
        if self._data is None:
            raise WriterError('no videos were appended; nothing written', self.path)
        self._finish_chunk(self._data)
        self._data = None
        if self._label2idx_json is not None:
            self._dir.write_file(LABEL2IDX_NAME, self._label2idx_json, sync=True)

    def _release(self) -> None:
        if self._data is not None:
            try:
                self._data.close()
            except OSError:
                pass
            self._data = None


def _json_bytes(value, what: str, path: str) -> bytes:
    try:
        return json.dumps(value).encode('ascii')
    except (TypeError, ValueError, RecursionError) as exc:
        raise WriterError(f'{what} is not JSON-serializable: {exc}', path) from exc


def _frame_record(frame, id_: str, j: int, path: str) -> tuple[bytes, int]:
    """A frame's padded record and its pad: JPEG bytes + NULs to a multiple of 4."""
    if isinstance(frame, (bytes, bytearray, memoryview)):
        jpeg = bytes(frame)
        if jpeg[:2] != JPEG_SOI:
            raise WriterError(f'frame {j} of video {id_!r} is bytes but not a JPEG '
                              f'(starts with {jpeg[:4].hex() or "nothing"})', path)
    else:
        try:
            jpeg = encode_image(np.asarray(frame), 'JPEG', JPEG_QUALITY)
        except (ValueError, TypeError, OSError, KeyError) as exc:
            raise WriterError(f'frame {j} of video {id_!r} cannot be JPEG-encoded: {exc}',
                              path) from exc
    pad = (PAD_MULTIPLE_BYTES - len(jpeg) % PAD_MULTIPLE_BYTES) % PAD_MULTIPLE_BYTES
    return jpeg + b'\0' * pad, pad
