"""A gulp directory on disk: its chunks, the ``.gmeta`` index of every video (JSON, or a
pickle read only when allowed, by a restricted unpickler) and where each frame lies.
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
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...errors import FormatError, LoadrError, UnsafeFormatError
from ...shared import decode, encode_items
from ...storage import Storage
from ..base import open_each

DATA_NAME = re.compile(r'data_(\d+)\.gulp')
META_NAME = re.compile(r'meta_(\d+)\.gmeta')
LABEL2IDX_NAME = 'label2idx.json'
PAD_MULTIPLE_BYTES = 4
JPEG_SOI = b'\xff\xd8'
PICKLE_PROTO_BYTE = b'\x80'      # every pickle of protocol 2+ starts with PROTO
SPEC = {'id': 'utf8', 'frames': 'jpg[]', 'meta': 'json'}
# Types of values (or lists of them) that a video's JSON meta can hold.
JSON_TYPES = ('utf8', 'int', 'i64', 'u64', 'msgpack')

# gulpio2 pickles its frame triples as this namedtuple; gulpio2 is not a
# dependency, so the restricted unpickler maps its name to this local twin.
ImgInfo = collections.namedtuple('ImgInfo', ['loc', 'pad', 'length'])
_PICKLE_ALLOWED = {
    ('collections', 'OrderedDict'): collections.OrderedDict,
    ('gulpio2.fileio', 'ImgInfo'): ImgInfo,
    ('gulpio.fileio', 'ImgInfo'): ImgInfo,       # the same triple, as gulpio 1 named it
}


class Chunk:
    """One chunk pair ``data_<k>.gulp`` and ``meta_<k>.gmeta``: files, sizes, frames before."""

    __slots__ = ('k', 'data_path', 'meta_path', 'data_size', 'meta_size', 'frames', 'digests')

    def __init__(self, k: int, data_path: str, meta_path: str):
        self.k, self.data_path, self.meta_path = k, data_path, meta_path
        self.data_size = self.meta_size = 0          # bytes, once the index is loaded
        self.frames = 0                              # frames of the videos before, so far
        self.digests: tuple[bytes, str] | None = None    # (digests, sidecar) when verifying


# One video: its id, chunk, (offset, pad, total_length) triples, meta, and the record
# number of its frame 0 in its chunk's .gulp.
_Video = collections.namedtuple('_Video', ['id', 'chunk', 'frames', 'meta', 'first'])


class Videos:
    """The videos of a gulp directory in datapoint order, held in flat numpy arrays.

    A million videos as Python objects (an id, a tuple of frame triples, a meta
    dict each) were ~1 GB that every forked worker copied page by page as it
    read them (each read writes reference counts); in arrays a worker reads only
    the pages of the videos it reads, and writes none. Per video:
    its chunk (``chunk_of``), its frames ``triples[fstart[i]:fstart[i+1]]``
    (rows ``(offset, pad, total_length)``), the record number of its frame 0 in
    its chunk's ``.gulp`` (``first``); its id, UTF-8 in ``id_blob`` at
    ``id_off[i]:id_off[i+1]``, and its meta, stored as :mod:`loadr.shared`
    stores an item (msgpack; a pickle this process made of what msgpack cannot
    hold exactly), decoded into a new object on each read.
    """

    __slots__ = ('chunks', 'chunk_of', 'fstart', 'first', 'triples', 'id_off', 'id_blob',
                 'meta_off', 'meta_blob')
    chunks: list[Chunk]
    chunk_of: np.ndarray        # int32, per video
    fstart: np.ndarray          # int64, per video and one more
    first: np.ndarray           # int64, per video
    triples: np.ndarray         # int64, (frames, 3)
    id_off: np.ndarray          # int64, per video and one more
    id_blob: bytes
    meta_off: np.ndarray        # int64, per video and one more
    meta_blob: bytes

    def __len__(self) -> int:
        return len(self.chunk_of)

    def __getitem__(self, i: int) -> _Video:
        """Video ``i`` whole, as Python objects (the reader reads only the parts it needs)."""
        return _Video(self.id(i), self.chunk(i), self.frames(i), self.meta(i),
                      int(self.first[i]))

    def chunk(self, i: int) -> Chunk:
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

    def used_chunks(self) -> list[Chunk]:
        """The chunks that hold a video, in order."""
        return [self.chunks[c] for c in np.unique(self.chunk_of).tolist()]


def _offsets(lengths) -> np.ndarray:
    """``[0, l0, l0 + l1, ...]`` (int64): where each of the parts of these lengths starts."""
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def list_chunks(storage: Storage, path: str) -> tuple[list[Chunk], list[tuple[str, str]]]:
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
            chunks.append(Chunk(k, data[k], meta[k]))
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


def load_gmeta(storage: Storage, meta_path: str, allow_pickle: bool) -> dict:
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


def video_problems(id_: str, entry: Any, chunk: Chunk, gulp_size: int
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


def load_index(storage: Storage, path: str, allow_pickle: bool) -> Videos:
    """Every video of the directory in datapoint order, validated; raises on the first problem."""
    chunks, problems = list_chunks(storage, path)
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
            for file, message in video_problems(id_, entry, chunk, gulp_size):
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
    # (There is a chunk: list_chunks says so of a directory with none.)
    joined = {k: np.concatenate(v) for k, v in parts.items() if k not in ('ids', 'metas')}
    videos = Videos()
    videos.chunks = chunks
    videos.chunk_of, videos.first, videos.triples = (joined['chunk_of'], joined['first'],
                                                     joined['frames'])
    videos.fstart = _offsets(joined['counts'])
    videos.id_off, videos.id_blob = _offsets(joined['id_lens']), b''.join(parts['ids'])
    videos.meta_off, videos.meta_blob = _offsets(joined['meta_lens']), b''.join(parts['metas'])
    return videos


def read_plan(frames: Sequence[tuple[int, int, int]], positions: Sequence[int]
               ) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Group the wanted frames into reads: ``[(offset, length, [(start, end), ...])]``.

    Consecutive requested frames that lie back to back on disk share one
    read; ``start:end`` slices each frame's JPEG bytes (padding dropped) out
    of its read's buffer.

    >>> read_plan([(0, 1, 8), (8, 0, 4), (12, 2, 8)], [0, 1, 2])
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


def frame_positions(value, n: int, index: int) -> Sequence[int]:
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
