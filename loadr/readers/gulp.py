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

Example::

    r = GulpReader('../shared/fixtures/gulp')
    video = r.get('vid_a', frames=slice(0, 4, 2))     # frames 0 and 2
    part = r[1, {'frames': range(2, 6)}]             # 4 frames, one read

    with GulpWriter('out/gulp', videos_per_chunk=100) as w:
        w.append('clip1', {'label': 'running'}, [frame0, frame1])
"""

from __future__ import annotations

import bisect
import collections
import fnmatch
import io
import json
import os
import pickle
import re
from collections.abc import Mapping
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..codecs import JPEG_QUALITY, decode_image, encode_image
from ..errors import (ConfigError, DecodeError, FormatError, LoadrError, UnsafeFormatError,
                      WriterError)
from ..digests import check_record
from ..shared import decode, encode_items
from ..storage import Storage, is_url, storage_for
from .base import (Format, Plan, Problem, Reader, Source, Writer, _known, check_index,
                   open_each)

__all__ = ['GulpReader', 'GulpWriter', 'check', 'detect', 'FORMAT']

DATA_NAME = re.compile(r'data_(\d+)\.gulp')
META_NAME = re.compile(r'meta_(\d+)\.gmeta')
LABEL2IDX_NAME = 'label2idx.json'
PAD_MULTIPLE_BYTES = 4
JPEG_SOI = b'\xff\xd8'
PICKLE_PROTO_BYTE = b'\x80'      # every pickle of protocol 2+ starts with PROTO
SPEC = {'id': 'utf8', 'frames': 'jpg[]', 'meta': 'json'}
# Types of values (or lists of them) that a video's JSON meta can hold.
_JSON_TYPES = ('utf8', 'int', 'i64', 'u64', 'msgpack')

# gulpio2 pickles its frame triples as this namedtuple; gulpio2 is not a
# dependency, so the restricted unpickler maps its name to this local twin.
ImgInfo = collections.namedtuple('ImgInfo', ['loc', 'pad', 'length'])
_PICKLE_ALLOWED = {
    ('collections', 'OrderedDict'): collections.OrderedDict,
    ('gulpio2.fileio', 'ImgInfo'): ImgInfo,
    ('gulpio.fileio', 'ImgInfo'): ImgInfo,       # the same triple, as gulpio 1 named it
}


# ----------------------------------------------------------------------------- layout

class _Chunk:
    __slots__ = ('k', 'data_path', 'meta_path', 'data_size', 'meta_size', 'frames', 'digests')

    def __init__(self, k: int, data_path: str, meta_path: str):
        self.k, self.data_path, self.meta_path = k, data_path, meta_path
        self.data_size = self.meta_size = 0          # bytes, once the index is loaded
        self.frames = 0                              # frames of the videos before, so far
        self.digests = None                          # (digests, sidecar) when verifying


# One video: its id, chunk, (offset, pad, total_length) triples, meta, and the record
# number of its frame 0 in its chunk's .gulp.
_Video = collections.namedtuple('_Video', ['id', 'chunk', 'frames', 'meta', 'first'])


class _Videos:
    """The videos of a gulp directory in datapoint order, held in flat numpy arrays.

    A million videos as Python objects (an id, a tuple of frame triples, a meta
    dict each) were ~1 GB that every forked worker copied page by page as it
    read them (each read writes reference counts); in arrays a worker reads only
    the pages of the videos it reads, and writes none (issue 27). Per video:
    its chunk (``chunk_of``), its frames ``triples[fstart[i]:fstart[i+1]]``
    (rows ``(offset, pad, total_length)``), the record number of its frame 0 in
    its chunk's ``.gulp`` (``first``); its id, UTF-8 in ``id_blob`` at
    ``id_off[i]:id_off[i+1]``, and its meta, stored as :mod:`loadr.shared`
    stores an item (msgpack; a pickle this process made of what msgpack cannot
    hold exactly), decoded into a new object on each read.
    """

    __slots__ = ('chunks', 'chunk_of', 'fstart', 'first', 'triples', 'id_off', 'id_blob',
                 'meta_off', 'meta_blob')

    def __len__(self) -> int:
        return len(self.chunk_of)

    def __getitem__(self, i: int) -> _Video:
        """Video ``i`` whole, as Python objects (the reader reads only the parts it needs)."""
        return _Video(self.id(i), self.chunk(i), self.frames(i), self.meta(i),
                      int(self.first[i]))

    def chunk(self, i: int) -> _Chunk:
        return self.chunks[self.chunk_of[i]]

    def count(self, i: int) -> int:
        """How many frames video ``i`` has."""
        return int(self.fstart[i + 1] - self.fstart[i])

    def frames(self, i: int) -> tuple:
        """Video ``i``'s ``(offset, pad, total_length)`` triples, as Python ints."""
        a, b = self.fstart[i:i + 2].tolist()
        return tuple(map(tuple, self.triples[a:b].tolist()))

    def id(self, i: int) -> str:
        a, b = self.id_off[i:i + 2].tolist()
        return self.id_blob[a:b].decode('utf-8', 'surrogatepass')

    def ids(self) -> list[str]:
        return [self.id(i) for i in range(len(self))]

    def meta(self, i: int) -> Any:
        """A new copy of video ``i``'s meta (a caller who edits it changes nothing here)."""
        a, b = self.meta_off[i:i + 2].tolist()
        return decode(self.meta_blob[a:b])

    def used_chunks(self) -> list[_Chunk]:
        """The chunks that hold a video, in order."""
        return [self.chunks[c] for c in np.unique(self.chunk_of).tolist()]


def _offsets(lengths) -> np.ndarray:
    """``[0, l0, l0 + l1, ...]`` (int64): where each of the parts of these lengths starts."""
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _list_chunks(storage: Storage, path: str) -> tuple[list[_Chunk], list[tuple[str, str]]]:
    """The chunks of a gulp directory in numeric order, and (file, problem) pairs.

    Every pair that does not match, every gap and every unparseable chunk
    name is a problem; the chunks returned are the complete pairs.
    """
    if not storage.isdir(path):
        return [], [(path, 'not a directory (a gulp dataset is a directory of chunk files)')]
    try:
        names = storage.list(path)
    except LoadrError as exc:
        return [], [(path, f'cannot list the directory: {exc.message}')]
    problems: list[tuple[str, str]] = []
    data: dict[int, str] = {}
    meta: dict[int, str] = {}
    for name in sorted(names):
        for pattern, glob, found in ((DATA_NAME, 'data_*.gulp', data),
                                     (META_NAME, 'meta_*.gmeta', meta)):
            if not fnmatch.fnmatchcase(name, glob):
                continue
            full = os.path.join(path, name)
            m = pattern.fullmatch(name)
            if m is None:
                problems.append((full, f'{name} is not a chunk file name '
                                       f'({glob} with a decimal number)'))
            elif int(m.group(1)) in found:
                problems.append((full, f'{name} and {os.path.basename(found[int(m.group(1))])} '
                                       f'are both chunk {int(m.group(1))}'))
            else:
                found[int(m.group(1))] = full
    if not data and not meta and not problems:
        return [], [(path, 'no gulp chunks (data_<k>.gulp and meta_<k>.gmeta files) here')]
    chunks = []
    for k in sorted(set(data) | set(meta)):
        if k not in meta:
            problems.append((data[k], f'data_{k}.gulp has no meta_{k}.gmeta beside it'))
        elif k not in data:
            problems.append((meta[k], f'meta_{k}.gmeta has no data_{k}.gulp beside it'))
        else:
            chunks.append(_Chunk(k, data[k], meta[k]))
    present = set(data) | set(meta)
    if present and len(present) != max(present) + 1:
        # One problem for all gaps: a name like data_99999999999.gulp must not make a loop.
        first = next(k for k in range(len(present) + 1) if k not in present)
        missing = max(present) + 1 - len(present)
        problems.append((os.path.join(path, f'data_{first}.gulp'),
                         f'chunk {first} is missing ({missing} missing in all; chunks '
                         f'must be numbered 0..{max(present)} without gaps)'))
    return chunks, problems


class _DuplicateKey(Exception):
    pass


def _unique_pairs(pairs):
    result = dict(pairs)
    if len(result) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return result


class _GulpUnpickler(pickle.Unpickler):
    """Unpickles only what gulpio2's pickle serializer writes."""

    def __init__(self, file, meta_path: str):
        super().__init__(file)
        self._meta_path = meta_path

    def find_class(self, module, name):
        try:
            return _PICKLE_ALLOWED[(module, name)]
        except KeyError:
            raise UnsafeFormatError(
                f'pickled .gmeta refers to {module}.{name}; only what gulpio2 writes '
                f'(collections.OrderedDict, gulpio2.fileio.ImgInfo) is unpickled',
                self._meta_path) from None


def _load_gmeta(storage: Storage, meta_path: str, allow_pickle: bool) -> dict:
    """The ``{id: entry}`` mapping of one ``.gmeta`` file, in file order."""
    return _parse_gmeta(storage.read_all(meta_path), meta_path, allow_pickle)


def _parse_gmeta(raw: bytes, meta_path: str, allow_pickle: bool) -> dict:
    """The ``{id: entry}`` mapping of the bytes of a ``.gmeta`` file."""
    if not raw:
        raise FormatError('.gmeta file is empty', meta_path)
    if raw[:1] == PICKLE_PROTO_BYTE:
        if not allow_pickle:
            raise UnsafeFormatError(
                'this .gmeta is a pickle (gulpio2 pickle_serializer), which can run '
                'arbitrary code when loaded; refusing it. If you trust the file, pass '
                'allow_pickle=True to read it with a restricted unpickler', meta_path)
        try:
            table = _GulpUnpickler(io.BytesIO(raw), meta_path).load()
        except LoadrError:
            raise
        except Exception as exc:  # untrusted bytes can raise anything from the unpickler
            raise FormatError(f'cannot unpickle .gmeta: {type(exc).__name__}: {exc}',
                              meta_path) from exc
    else:
        try:
            table = json.loads(raw.decode('utf-8'), object_pairs_hook=_unique_pairs)
        except UnicodeDecodeError as exc:
            raise FormatError(f'.gmeta is not UTF-8 JSON: {exc}', meta_path) from exc
        except json.JSONDecodeError as exc:
            raise FormatError(f'.gmeta is not valid JSON: {exc}', meta_path) from exc
        except _DuplicateKey as exc:
            raise FormatError(f'.gmeta has the key {exc.args[0]!r} twice in one object',
                              meta_path) from None
        except RecursionError as exc:
            raise FormatError('.gmeta JSON is nested too deeply', meta_path) from exc
    if not isinstance(table, dict):
        raise FormatError(f'.gmeta holds a {type(table).__name__}, not an object of videos',
                          meta_path)
    out = {}
    for key, entry in table.items():
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)      # gulpio2 stringifies ids; an old pickle may not have
        if not isinstance(key, str):
            raise FormatError(f'.gmeta has a video id of type {type(key).__name__}: {key!r:.60}',
                              meta_path)
        if key in out:
            raise FormatError(f'.gmeta has the video id {key!r} twice', meta_path)
        out[key] = entry
    return out


def _is_count(x) -> bool:
    return type(x) is int and x >= 0


def _video_problems(id_: str, entry: Any, chunk: _Chunk, gulp_size: int
                    ) -> Iterator[tuple[str, str]]:
    """(file, problem) for everything wrong with one video's ``.gmeta`` entry."""
    what = f'video {id_!r}'
    if not isinstance(entry, dict):
        yield chunk.meta_path, f'{what}: entry is a {type(entry).__name__}, not an object'
        return
    info = entry.get('frame_info')
    if not isinstance(info, (list, tuple)):
        yield chunk.meta_path, f'{what}: frame_info is missing or not a list'
    else:
        for j, triple in enumerate(info):
            if not (isinstance(triple, (list, tuple)) and len(triple) == 3
                    and all(_is_count(x) for x in triple)):
                yield chunk.meta_path, (f'{what} frame {j}: frame_info entry {triple!r:.80} '
                                        f'is not three non-negative integers')
                continue
            offset, pad, length = triple
            if pad >= PAD_MULTIPLE_BYTES:
                yield chunk.meta_path, f'{what} frame {j}: pad {pad} is not below 4'
            elif pad > length:
                yield chunk.meta_path, (f'{what} frame {j}: pad {pad} is larger than '
                                        f'the frame length {length}')
            elif offset + length > gulp_size:
                yield chunk.data_path, (
                    f'{what} frame {j}: frame_info says bytes {offset}..{offset + length}, '
                    f'past the end of the file ({gulp_size} bytes)')
    meta = entry.get('meta_data')
    if not isinstance(meta, (list, tuple)) or not meta:
        yield chunk.meta_path, f'{what}: meta_data is missing or not a non-empty list'


def _load_index(storage: Storage, path: str, allow_pickle: bool) -> _Videos:
    """Every video of the directory in datapoint order, validated; raises on the first problem."""
    chunks, problems = _list_chunks(storage, path)
    if problems:
        raise FormatError(problems[0][1], problems[0][0])
    where: dict[str, int] = {}          # only while loading: to name a repeated id
    starts: list[int] = []              # the index of each chunk's first video
    # Each chunk's part of every array, made when the chunk is done: the Python
    # objects of one chunk at a time.
    parts: dict[str, list] = {k: [] for k in ('chunk_of', 'counts', 'first', 'frames',
                                              'ids', 'id_lens', 'metas', 'meta_lens')}
    n = 0
    # Behind a URL the chunks' metadata is read concurrently, then checked in order.
    raws = open_each(storage, lambda c: storage.read_all(c.meta_path), chunks)
    for c, (chunk, raw) in enumerate(zip(chunks, raws)):
        table = _parse_gmeta(raw, chunk.meta_path, allow_pickle)
        gulp_size = storage.size(chunk.data_path)
        chunk.meta_size, chunk.data_size = len(raw), gulp_size
        starts.append(n)
        counts, firsts, triples, ids, metas = [], [], [], [], []
        for id_, entry in table.items():
            for file, message in _video_problems(id_, entry, chunk, gulp_size):
                raise FormatError(message, file, n)
            if id_ in where:
                first = chunks[bisect.bisect_right(starts, where[id_]) - 1].meta_path
                raise FormatError(f'video id {id_!r} is also in {first} '
                                  f'(index {where[id_]}); ids must be unique',
                                  chunk.meta_path, n)
            where[id_] = n
            info = entry['frame_info']
            for triple in info:
                triples.extend(triple)
            counts.append(len(info))
            firsts.append(chunk.frames)
            chunk.frames += len(info)
            ids.append(id_.encode('utf-8', 'surrogatepass'))
            metas.append(entry['meta_data'][0])
            n += 1
        del table
        encoded = encode_items(metas, n - len(metas))
        parts['chunk_of'].append(np.full(len(metas), c, np.int32))
        parts['counts'].append(np.asarray(counts, np.int64))
        parts['first'].append(np.asarray(firsts, np.int64))
        parts['frames'].append(np.asarray(triples, np.int64).reshape(-1, 3))
        parts['ids'].append(b''.join(ids))
        parts['id_lens'].append(np.fromiter(map(len, ids), np.int64, len(ids)))
        parts['metas'].append(b''.join(encoded))
        parts['meta_lens'].append(np.fromiter(map(len, encoded), np.int64, len(encoded)))
        del counts, firsts, triples, ids, metas, encoded
    # (There is a chunk: _list_chunks says so of a directory with none.)
    joined = {k: v if k in ('ids', 'metas') else np.concatenate(v) for k, v in parts.items()}
    videos = _Videos()
    videos.chunks = chunks
    videos.chunk_of, videos.first, videos.triples = (joined['chunk_of'], joined['first'],
                                                     joined['frames'])
    videos.fstart = _offsets(joined['counts'])
    videos.id_off, videos.id_blob = _offsets(joined['id_lens']), b''.join(parts['ids'])
    videos.meta_off, videos.meta_blob = _offsets(joined['meta_lens']), b''.join(parts['metas'])
    return videos


def _read_plan(frames: Sequence[tuple[int, int, int]], positions: Sequence[int]
               ) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Group the wanted frames into reads: ``[(offset, length, [(start, end), ...])]``.

    Consecutive requested frames that lie back to back on disk share one
    read; ``start:end`` slices each frame's JPEG bytes (padding dropped) out
    of its read's buffer.

    >>> _read_plan([(0, 1, 8), (8, 0, 4), (12, 2, 8)], [0, 1, 2])
    [(0, 20, [(0, 7), (8, 12), (12, 18)])]
    """
    plan: list[tuple[int, int, list[tuple[int, int]]]] = []
    for p in positions:
        offset, pad, length = frames[p]
        if plan and plan[-1][0] + plan[-1][1] == offset:
            start, size, cuts = plan[-1]
            cuts.append((size, size + length - pad))
            plan[-1] = (start, size + length, cuts)
        else:
            plan.append((offset, length, [(0, length - pad)]))
    return plan


def _positions(value, n: int, index: int) -> Sequence[int]:
    """Frame positions a mask value or ``get(frames=...)`` asks for, checked against ``n``."""
    if value is True:
        return range(n)
    if isinstance(value, slice):
        return range(*value.indices(n))
    if isinstance(value, range):
        if len(value) and not (0 <= value[0] < n and 0 <= value[-1] < n):
            raise IndexError(f'frames {value} out of range for {n} frames at datapoint {index}')
        return value
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f'frames must be True, a range, a slice or a list of frame '
                        f'positions, not {type(value).__name__}')
    out = []
    for p in value:
        if isinstance(p, (bool, np.bool_)) or not hasattr(p, '__index__'):
            raise TypeError(f'frame position must be an integer, not {type(p).__name__}')
        p = p.__index__()
        if not 0 <= p < n:
            raise IndexError(f'frame {p} out of range for {n} frames at datapoint {index}')
        out.append(p)
    return out


# ----------------------------------------------------------------------------- reader

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
        self._videos: _Videos | None = None
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

    def _index(self) -> _Videos:
        if self._videos is None:
            videos = _load_index(self._files, self.path, self.allow_pickle)
            if self.verify:
                from ..digests import load
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
            frames = _from_end(frames, self._videos.count(index))
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
        reader = cls(path, **dict(_known(cls, options), decode_images=False))
        return Source(path, cls.format_name, reader, dict(reader.spec, meta='msgpack'),
                      extras={'label2idx': reader.label2idx})

    @property
    def label2idx(self) -> dict | None:
        """The ``label2idx.json`` mapping, or None when the directory has none."""
        if self._label2idx is _UNSET:
            self._label2idx = _load_label2idx(self._files, self.path)
        return self._label2idx

    def _ranges(self, indices: list[int]) -> list[tuple]:
        videos = self._index()
        out = []
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
        out = {}
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
                                             _positions(value, videos.count(index), index))
        return out

    def _frames(self, index: int, videos: _Videos, positions: Sequence[int]) -> list:
        chunk = videos.chunk(index)
        path, digests = chunk.data_path, chunk.digests
        frames = videos.frames(index)
        jpegs = []
        k = 0
        for offset, length, cuts in _read_plan(frames, positions):
            buf = self._files.read(path, offset, length, index)
            for a, b in cuts:
                if digests is not None:     # the frame's record: its JPEG and its padding
                    p = positions[k]
                    check_record(digests, path, int(videos.first[index]) + p,
                                 buf[a:a + frames[p][2]], index)
                k += 1
                jpegs.append(buf[a:b])
        out = []
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


def _load_label2idx(storage: Storage, path: str) -> dict | None:
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


# ----------------------------------------------------------------------------- writer

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
        self._data = None
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

    def _append(self, id_: str, meta: dict, frames: Sequence) -> None:
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
            if self._data is None or len(self._meta) == self.videos_per_chunk:
                self._next_chunk()
            for record, pad in records:
                self._data.write(record)
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

    def _next_chunk(self) -> None:
        if self._data is not None:
            self._finish_chunk()
        self._chunk += 1
        self._data = self._out.open_write(f'data_{self._chunk}.gulp')
        self._offset = 0
        self._meta = []

    def _finish_chunk(self) -> None:
        self._data.sync()
        self._data.close()
        # json.dump defaults (', ' and ': ', ensure_ascii) are what gulpio2 writes.
        self._out.write_file(f'meta_{self._chunk}.gmeta',
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
        bad = [k for k in rest if types[k].removesuffix('[]') not in _JSON_TYPES]
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
                   label2idx=plan.source.extras.get('label2idx'), **_known(cls, options))

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
        self._finish_chunk()
        self._data = None
        if self._label2idx_json is not None:
            self._out.write_file(LABEL2IDX_NAME, self._label2idx_json, sync=True)

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


# ----------------------------------------------------------------------------- check, detect

def check(path: str | os.PathLike) -> list[Problem]:
    """Every problem in a gulp directory; an empty list when it is sound. Never raises for bad data.

    Checks what gulpio2's sanity check does (empty files, a ``.gulp`` whose
    size is not the end of its last frame, an id in two chunks) and also
    unreadable or malformed metadata, frames past the end of the file, pads
    that are not NUL, every frame decoded (a JPEG SOI marker first), and
    missing or misnumbered chunk files. Gulp has no checksums: a changed byte
    that still decodes is found only with digests (:mod:`loadr.digests`).

    >>> check(FIXTURES / 'gulp')
    []
    """
    path = os.fspath(path)
    try:
        files = storage_for(path)
    except LoadrError as exc:
        return [Problem(exc.path or path, None, exc.message)]
    chunks, listed = _list_chunks(files, path)
    problems = [Problem(file, None, message) for file, message in listed]
    first_seen: dict[str, tuple[str, int | None]] = {}
    index: int | None = 0          # global datapoint index; None once a chunk is unreadable
    try:
        for chunk in chunks:
            gulp_size, meta_size = _check_sizes(files, chunk, problems)
            if not meta_size:       # empty or unreadable: already reported
                index = None
                continue
            try:
                table = _load_gmeta(files, chunk.meta_path, allow_pickle=False)
            except LoadrError as exc:
                problems.append(Problem(exc.path or chunk.meta_path, None, exc.message))
                index = None
                continue
            if gulp_size is None:
                index = None if index is None else index + len(table)
                continue
            end = None        # where the last video's last frame ends, if it is sound
            for id_, entry in table.items():
                bad = list(_video_problems(id_, entry, chunk, gulp_size))
                problems += [Problem(file, index, message) for file, message in bad]
                if id_ in first_seen:
                    other, other_index = first_seen[id_]
                    problems.append(Problem(chunk.meta_path, index,
                                            f'video id {id_!r} is also in {other} '
                                            f'(index {other_index})'))
                else:
                    first_seen[id_] = (chunk.meta_path, index)
                end = None
                if not bad:
                    problems += _frame_problems(files, chunk, id_, entry['frame_info'], index)
                    if entry['frame_info']:
                        offset, _, length = entry['frame_info'][-1]
                        end = offset + length
                index = None if index is None else index + 1
            if end is not None and end != gulp_size:
                problems.append(Problem(chunk.data_path, None,
                                        f'file is {gulp_size} bytes but its .gmeta says the '
                                        f'last frame ends at byte {end}'))
        if files.isdir(path):
            try:
                _load_label2idx(files, path)
            except LoadrError as exc:
                problems.append(Problem(exc.path or path, None, exc.message))
    finally:
        files.close()
    return problems


def _check_sizes(files: Storage, chunk: _Chunk, problems: list[Problem]
                 ) -> tuple[int | None, int | None]:
    """Sizes of the .gulp and .gmeta files (None if unreadable); empty files are problems."""
    sizes = {}
    for file in (chunk.data_path, chunk.meta_path):
        try:
            sizes[file] = files.size(file)
        except LoadrError as exc:
            problems.append(Problem(file, None, exc.message))
            continue
        if sizes[file] == 0:
            problems.append(Problem(file, None, 'file is empty'))
    return sizes.get(chunk.data_path), sizes.get(chunk.meta_path)


def _frame_problems(files: Storage, chunk: _Chunk, id_: str, info: list, index: int | None
                    ) -> list[Problem]:
    """Frames of one video that do not decode (a JPEG SOI first) or whose pad is not NUL."""
    problems = []
    for j, (offset, pad, length) in enumerate(info):
        try:
            record = files.read(chunk.data_path, offset, length, index)
            head, tail = record[:min(2, length - pad)], record[length - pad:]
        except LoadrError as exc:
            problems.append(Problem(chunk.data_path, index, f'video {id_!r} frame {j}: '
                                                            f'{exc.message}'))
            continue
        if head != JPEG_SOI:
            problems.append(Problem(chunk.data_path, index,
                                    f'video {id_!r} frame {j} does not start with a JPEG '
                                    f'SOI marker (ff d8) but with {head.hex() or "nothing"}'))
        else:
            try:            # a damaged header past the SOI fails only here
                decode_image(record[:length - pad])
            except DecodeError as exc:
                problems.append(Problem(chunk.data_path, index,
                                        f'video {id_!r} frame {j} does not decode: '
                                        f'{exc.message}'))
        if tail.strip(b'\0'):
            problems.append(Problem(chunk.data_path, index,
                                    f'video {id_!r} frame {j}: padding is {tail.hex()}, '
                                    f'not NUL bytes'))
    return problems


def detect(path: str | os.PathLike) -> bool:
    """True for a directory holding ``data_*.gulp`` or ``meta_*.gmeta`` files. Never raises.

    >>> detect(FIXTURES / 'gulp')
    True
    """
    try:
        path = os.fspath(path)
        storage = storage_for(path)
        if not storage.isdir(path):
            return False
        return any(fnmatch.fnmatchcase(n, 'data_*.gulp') or fnmatch.fnmatchcase(n, 'meta_*.gmeta')
                   for n in storage.list(path))
    except Exception:
        return False


def records(path: str | os.PathLike) -> dict:
    """Where the frames of each ``.gulp`` lie and whose they are, for :mod:`loadr.digests`;
    ``.gmeta`` and ``label2idx.json`` as whole files."""
    from ..digests import FileRecords
    path = os.fspath(path)
    storage = storage_for(path)
    videos = _load_index(storage, path, allow_pickle=False)
    # The frames of a chunk's videos are consecutive rows of videos.triples.
    owner = np.repeat(np.arange(len(videos), dtype=np.int64), np.diff(videos.fstart))
    chunk_of = videos.chunk_of[owner]
    out: dict = {}
    for c, chunk in enumerate(videos.chunks):
        mine = chunk_of == c
        offsets, lengths = videos.triples[mine, 0], videos.triples[mine, 2]
        out[chunk.data_path] = FileRecords(offsets, offsets + lengths, owner[mine])
        out[chunk.meta_path] = None
    label2idx = os.path.join(path, LABEL2IDX_NAME)
    if storage.exists(label2idx):
        out[label2idx] = None
    return out


FORMAT = Format('gulp', detect, GulpReader, GulpWriter, check, records=records)
