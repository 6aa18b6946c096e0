"""In-memory datasets the workers share instead of copying: :class:`SharedList`.

A list of a million small dicts is ~500 MiB of Python objects in the main
process. Forked workers share those pages only until they read an item:
reading writes the item's reference counts, so the page is copied, and the
items of a shuffled epoch are spread over every page. After a few epochs
each worker holds its own copy of most of the list (torch's "memory leak
with num_workers > 0"); with ``start_method='spawn'`` each worker gets a
full copy from the start, pickled.

A :class:`SharedList` serialises the items once, in the main process, into
one flat buffer: an ``int64`` offsets array (``n + 1`` entries) followed by
the items' bytes, back to back. Item *i* is ``blob[offsets[i]:offsets[i+1]]``,
decoded on each read into a new object. The buffer is a memfd (or, with
``LOADR_SHM=devshm`` or no memfd, a file in an owned /dev/shm directory
that is unlinked as soon as it is open): workers read it, never write it,
so its pages stay shared, and a worker's private memory holds only the
items of the batch in hand. Ownership, as for the batch slots
(:mod:`loadr.workers.shm`): the process that made the list holds the
descriptor until :meth:`SharedList.close` (or garbage collection); a forked
worker has the mapping already, a spawned one maps
``/proc/<owner pid>/fd/<n>`` (checked by inode). Nothing has a name in
/dev/shm past the few instructions that make it, so a SIGKILL of the main
process leaves nothing behind: the memory goes with the last process that
maps it.

How an item is stored: msgpack (with strict types, so a tuple stays a
tuple, a bool a bool, a ``np.float32`` a ``np.float32``) where every value
in it is a plain one (``None``, bool, int up to 64 bits, float, str,
bytes, list, tuple, dict) or a numpy array or scalar (extension types:
``(dtype.str, shape, C-order bytes)`` as :func:`loadr.codecs.encode_array`
packs them, read back as a new writable array; a ``bytearray`` is read back as a
new ``bytearray``, a ``memoryview`` as a memoryview of a new ``bytearray`` (of
``bytes`` if it was read-only) cast to the original's format and shape, so a
fn that edits one in place does the same shared or not; a memoryview of a
format ``memoryview.cast`` cannot make, such as ``'>i'``, cannot be shared).
Anything else (the user's
own classes, a subclass of dict, a namedtuple, a structured array) is
pickled: the bytes come from the user's own process. A pickle starts with
``0x80`` and is at least 2 bytes; the one msgpack value that starts with
``0x80`` is the empty map, 1 byte: that tells them apart with no tag.

The Loader shares a ``list`` or ``tuple`` source by itself when it starts
its workers (:func:`share`; ``LOADR_SHARE=0`` turns it off), and each list
or tuple source of a Mix (:meth:`loadr.mix.Mix.shared`), within the
shared-memory budget (:func:`loadr.workers.shm.shm_budget`): a source that
does not fit, or holds an item that cannot be serialised, is used as it
is, with a warning that says why. A user's own Dataset class wraps its big
lists itself::

    class Boxes:
        def __init__(self, records):
            self.records = loadr.SharedList(records)    # [{'name', 'label', 'box'}, ...]
        def __len__(self):
            return len(self.records)
        def __getitem__(self, i):
            return self.records[i]

Serialising costs ~0.6-0.7 s per million small dicts here (README, "Memory").
"""

from __future__ import annotations

import collections.abc
import ctypes
import gc
import io
import itertools
import logging
import mmap
import operator
import os
import pickle
import sys
import time
import weakref

import msgpack
import numpy as np

from .errors import LoadrError, ResourceError

__all__ = ['SharedList', 'share', 'release', 'share_default', 'python_bytes', 'CHUNK_ITEMS',
           'SHARE_MIN_BYTES']

log = logging.getLogger('loadr')

CHUNK_ITEMS = 65536             # items serialised (and held as bytes objects) at a time
# Unless LOADR_SHARE says otherwise, a list is shared once its objects take this
# much: below it a worker's copy is small, and reading a shared item costs ~1 us
# (decoding), which would slow the trivial workload by half (1.5 -> 2.8 worker-us a
# sample measured with every list shared).
SHARE_MIN_BYTES = 64 * 2**20
SIZE_SAMPLES = 256              # items sized to estimate a list's size (python_bytes)
_ARRAY_HEADER_BYTES = sys.getsizeof(np.empty(0))
_EXT_ARRAY, _EXT_SCALAR, _EXT_TUPLE, _EXT_BYTEARRAY, _EXT_MEMORYVIEW = 1, 2, 3, 4, 5
# Types msgpack packs as themselves and that hold nothing msgpack would change.
_LEAVES = frozenset({type(None), bool, int, float, str, bytes, np.ndarray})
_CONTAINERS = frozenset({dict, list, tuple})
_BUFFERS = frozenset({bytearray, memoryview})
_MAX_DEPTH = 512                # msgpack's own nesting limit is 511
_SCAN_ITEMS = 512               # items scanned for buffers at a time
_PICKLE_FIRST = 0x80            # every pickle of protocol 2+ starts with PROTO (0x80)
_OFF = ('0', 'false', 'no', 'off')


def share_default() -> bool | None:
    """``LOADR_SHARE``: False for 0 (or false, no, off: never share), True for 1 (or
    true, yes, on: share every list or tuple), None when unset (by size: :func:`share`).

    >>> share_default() in (True, False, None)
    True
    """
    text = os.environ.get('LOADR_SHARE', '').strip().lower()
    if not text:
        return None
    return text not in _OFF


def python_bytes(items, samples: int = SIZE_SAMPLES) -> int:
    """About what a worker that reads every item of ``items`` would copy, from ``samples``
    of them evenly spread: containers and what they hold; of an array its header, not
    its data, and of a long str or bytes one page (a read writes only the reference
    count, in the header).

    >>> python_bytes([{'x': 1}] * 1000) > 100_000
    True
    """
    n = len(items)
    if n == 0:
        return 0
    step = max(1, n // samples)
    picked = range(0, n, step)
    total = sum(_deep_size(items[i]) for i in picked)
    return int(total / len(picked) * n) + sys.getsizeof(items)


def _deep_size(value, depth: int = 0) -> int:
    if isinstance(value, np.ndarray):
        return _ARRAY_HEADER_BYTES
    size = sys.getsizeof(value)
    if isinstance(value, (bytes, str, bytearray)):
        # A read writes the header's reference count: one page of a long one is copied.
        return min(size, mmap.PAGESIZE)
    if depth > 8:
        return size
    if isinstance(value, dict):
        size += sum(_deep_size(k, depth + 1) + _deep_size(v, depth + 1)
                    for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        size += sum(_deep_size(v, depth + 1) for v in value)
    return size


# -- encoding ---------------------------------------------------------------------------


def _plain_dtype(dtype: np.dtype) -> bool:
    # Structured and object dtypes do not survive dtype.str: pickle those.
    return dtype.fields is None and not dtype.hasobject and dtype.itemsize > 0


class _Buffer:
    """A bytearray or memoryview on its way to :func:`_default` (msgpack would pack
    either as bytes, and read it back as bytes: immutable, where the original was not)."""

    __slots__ = ('value',)

    def __init__(self, value):
        self.value = value


def _holds_buffer(value) -> bool:
    """Whether a bytearray or memoryview is in ``value`` (through dicts, lists and tuples)."""
    cls = type(value)
    if cls is bytearray or cls is memoryview:
        return True
    if cls is dict:
        # The common datapoint answers in two C-level passes.
        if _LEAVES.issuperset(map(type, value.values())) and _LEAVES.issuperset(map(type, value)):
            return False
        return any(map(_holds_buffer, value.values())) or any(map(_holds_buffer, value))
    if cls is list or cls is tuple:
        return not _LEAVES.issuperset(map(type, value)) and any(map(_holds_buffer, value))
    return False


def _any_buffer(items) -> bool:
    """Whether a bytearray or memoryview is in any of ``items``, through dicts, lists and
    tuples; one level of a few hundred items at a time, in C-level passes (~0.4 us a small
    dict, where packing it is ~0.25 us). True also for what nests deeper than msgpack packs."""
    # A few hundred at a time: a level holds every object one level down (items holding
    # long lists would otherwise make a list of tens of millions of references).
    return any(_any_buffer_in(items[lo:lo + _SCAN_ITEMS])
               for lo in range(0, len(items), _SCAN_ITEMS))


def _any_buffer_in(level) -> bool:
    for _ in range(_MAX_DEPTH):
        types = set(map(type, level))
        if not _BUFFERS.isdisjoint(types):
            return True
        if _CONTAINERS.isdisjoint(types):
            return False
        # A dict's referents are its values (and its keys, unless all are str).
        level = gc.get_referents(*itertools.compress(
            level, map(_CONTAINERS.__contains__, map(type, level))))
    return True


def _marked(value):
    """``value`` with each bytearray and memoryview in it wrapped in a :class:`_Buffer`."""
    cls = type(value)
    if cls is bytearray or cls is memoryview:
        return _Buffer(value)
    if not _holds_buffer(value):
        return value
    if cls is dict:
        return {_marked(k): _marked(v) for k, v in value.items()}
    return cls(map(_marked, value))


def _pack_buffer(value) -> msgpack.ExtType:
    if type(value) is bytearray:
        return msgpack.ExtType(_EXT_BYTEARRAY, bytes(value))
    shape = list(value.shape)
    try:
        # What the reader will do: a view of the bytes, cast to the format and shape.
        memoryview(bytearray(value.nbytes)).cast(value.format, shape)
    except (TypeError, ValueError) as exc:
        raise TypeError(f'a memoryview of format {value.format!r} cannot be shared') from exc
    return msgpack.ExtType(_EXT_MEMORYVIEW, msgpack.packb(
        [value.format, shape, value.readonly, value.tobytes()]))


def _default(value):
    """msgpack's hook for what strict types do not pack: numpy values, tuples and the
    buffers :func:`_marked` wrapped."""
    cls = type(value)
    if cls is tuple:
        return msgpack.ExtType(_EXT_TUPLE, _pack_nested(list(value)))
    if cls is _Buffer:
        return _pack_buffer(value.value)
    if cls is np.ndarray and _plain_dtype(value.dtype):
        # A header the reader looks up whole in a cache (a batch's arrays share a few),
        # then the C-order bytes: half the cost of a nested msgpack to decode.
        head = f'{value.dtype.str}|{",".join(map(str, value.shape))}'.encode()
        if len(head) > 254:
            raise TypeError('an array of too many dimensions is pickled')
        return msgpack.ExtType(_EXT_ARRAY, bytes((len(head) + 1,)) + head
                               + np.ascontiguousarray(value).tobytes())
    if isinstance(value, np.generic) and _plain_dtype(value.dtype) and \
            cls is value.dtype.type:
        return msgpack.ExtType(_EXT_SCALAR, msgpack.packb((value.dtype.str, value.tobytes())))
    raise TypeError(f'{cls.__name__} is pickled')


def _pack_nested(value) -> bytes:
    # A Packer is not reentrant: the hook packs with one of its own.
    return msgpack.packb(value, strict_types=True, default=_default)


_HEADS: dict = {}               # an array's header -> (dtype, shape)
_MAX_HEADS = 4096


def _ext(code: int, data: bytes):
    if code == _EXT_TUPLE:
        return tuple(_unpack(data))
    if code == _EXT_ARRAY:
        k = data[0]
        head = data[:k]
        got = _HEADS.get(head)
        if got is None:
            # From the right: a 1-byte dtype's str starts with '|' ('|u1', '|b1', '|S5'),
            # a shape never holds one.
            dtype, _, shape = head[1:].decode().rpartition('|')
            got = (np.dtype(dtype), tuple(int(d) for d in shape.split(',') if d))
            if len(_HEADS) < _MAX_HEADS:
                _HEADS[head] = got
        arr = np.frombuffer(data, got[0], offset=k)
        if len(got[1]) != 1:
            arr = arr.reshape(got[1])
        # A new writable array, as the original was: a fn may change it in place.
        return arr.copy()
    if code == _EXT_SCALAR:
        dtype, raw = msgpack.unpackb(data)
        return np.frombuffer(raw, np.dtype(dtype))[0]
    if code == _EXT_BYTEARRAY:
        return bytearray(data)
    if code == _EXT_MEMORYVIEW:
        fmt, shape, readonly, raw = msgpack.unpackb(data)
        # Read-only over bytes (hashable, as the original of bytes was), else writable.
        return memoryview(raw if readonly else bytearray(raw)).cast(fmt, shape)
    return msgpack.ExtType(code, data)


def _unpack(data):
    return msgpack.unpackb(data, strict_map_key=False, ext_hook=_ext)


class _Pickler(pickle.Pickler):
    """pickle's, but a strided array is pickled as its C-order copy: numpy pickles a
    strided array of a byte-swapped dtype ('>f8', '>U2') in native order."""

    def reducer_override(self, obj):
        if type(obj) is np.ndarray and not (obj.flags.c_contiguous or obj.flags.f_contiguous):
            return np.ascontiguousarray, (np.ascontiguousarray(obj),)
        return NotImplemented


def _pickled(item) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(item)
    return out.getvalue()


def _encode_one(item, index: int, packer) -> bytes:
    try:
        return packer.pack(_marked(item))
    except Exception:
        pass
    try:
        return _pickled(item)
    except Exception as exc:
        raise LoadrError(f'the item cannot be serialised for sharing: '
                         f'{type(exc).__name__}: {exc}', index=index) from exc


def decode(data) -> object:
    """One item back from its stored bytes (see the module docstring).

    A pickle here is one this process's owner made, of its own objects
    (:meth:`SharedList.__init__`), in memory only its user can open (0600,
    reached through ``/proc/<pid>/fd``, which needs the right to trace it).

    >>> decode(encode_items([{'x': (1, 2.5)}])[0])
    {'x': (1, 2.5)}
    """
    if len(data) > 1 and data[0] == _PICKLE_FIRST:
        return pickle.loads(data)
    return _unpack(data)


def encode_items(items, start: int = 0) -> list[bytes]:
    """Each item's stored bytes (msgpack, or pickle for what msgpack cannot hold exactly).

    >>> [len(b) for b in encode_items([{}, 'ab'])]
    [1, 3]
    """
    packer = msgpack.Packer(strict_types=True, default=_default)
    if not _any_buffer(items):
        try:
            # The common case in one C-level loop: ~0.2 us an item.
            return list(map(packer.pack, items))
        except Exception:
            packer = msgpack.Packer(strict_types=True, default=_default)
    return [_encode_one(item, start + k, packer) for k, item in enumerate(items)]


# -- the buffer -------------------------------------------------------------------------


def _anonymous_fd() -> int:
    """A descriptor of new shared memory that has no name anywhere once this returns."""
    from .workers.shm import PREFIX, SHM_DIR, owned_dir, remove_owned, use_memfd

    if use_memfd():
        try:
            fd = os.memfd_create(f'{PREFIX}shared-list', os.MFD_CLOEXEC)
        except OSError as exc:
            raise ResourceError(f'cannot create shared memory (memfd): {exc.strerror}') \
                from exc
        os.fchmod(fd, 0o600)
        return fd
    # An owned directory, so that reclaim_stale() may remove it should we be
    # killed in the next few lines; the file goes as soon as it is open.
    where = owned_dir(SHM_DIR)
    try:
        path = os.path.join(where, 'shared-list')
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ResourceError(f'cannot create shared memory: {exc.strerror}', path) from exc
        os.unlink(path)
    finally:
        remove_owned(where)
    return fd


def _write_all(fd: int, data, at: int) -> None:
    view = memoryview(data)
    while view.nbytes:
        try:
            wrote = os.pwrite(fd, view, at)
        except OSError as exc:
            raise ResourceError(f'no room for the shared copy of the items: {exc.strerror}; '
                                'lower the size of the items, or set LOADR_SHARE=0') from exc
        view, at = view[wrote:], at + wrote


def _map_readonly(fd: int, size: int):
    """A read-only mapping of ``fd`` that holds no descriptor (Python's mmap keeps a
    duplicate: a second fd on the memfd for as long as it lives); unmapped when the
    last object using it is collected."""
    from .workers.shm import load_libc

    libc = load_libc()
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise ResourceError(f'cannot map the shared copy of the items: {os.strerror(err)}')
    buf = (ctypes.c_ubyte * size).from_address(addr)
    weakref.finalize(buf, libc.munmap, addr, size).atexit = False
    return buf


def _mib(n: int) -> str:
    return f'{n / 2**20:.1f} MiB'


def _close(fd) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


class SharedList(collections.abc.Sequence):
    """A read-only sequence of datapoints in shared memory, read by every worker without a copy.

    ``items`` is a sequence (``len`` and ``[i]``); each item is serialised
    once, now (see the module docstring for how), and ``shared[i]`` decodes
    a new, equal object on each read. Pickling a SharedList (a spawned
    worker) sends where the buffer is, not the items. ``max_bytes``: raise
    :class:`~loadr.errors.ResourceError` rather than take more shared
    memory than that. ``nbytes`` is its size, ``serialise_s`` what making
    it took; ``close()`` gives the memory back (also done when it is
    collected); workers that map it keep it until they exit.

    ``identity()`` is the wrapped sequence's type and length, so a loader
    state saved with the plain list loads with the SharedList and back.

    >>> shared = SharedList([{'label': 3, 'box': (0.5, 1.0)}, {'label': 4, 'box': None}])
    >>> shared[0], len(shared)
    ({'label': 3, 'box': (0.5, 1.0)}, 2)
    >>> shared.close()
    """

    # None once closed, or (the descriptor, the finalizer) in a process that only maps it.
    _fd: int | None
    _path: str | None
    _offsets: memoryview | None
    _blob: memoryview | None
    _finalizer: weakref.finalize | None

    def __init__(self, items, max_bytes: int | None = None):
        try:
            n = len(items)
        except TypeError as exc:
            raise LoadrError(f'SharedList needs a sequence (len and [i]), got '
                             f'{type(items).__name__}') from exc
        self._n = n
        self._kind = type(items).__name__
        t0 = time.perf_counter()
        fd = _anonymous_fd()
        try:
            self.nbytes = self._fill(fd, items, n, max_bytes)
            mapped = _map_readonly(fd, self.nbytes)
            # Read a byte of every page once: pages this process maps are counted
            # as shared in a worker's smaps, not as its own (USS), as they are.
            np.frombuffer(mapped, np.uint8)[::mmap.PAGESIZE].sum()
        except BaseException:
            _close(fd)
            raise
        self._fd, self._ino = fd, os.fstat(fd).st_ino
        self._path = f'/proc/{os.getpid()}/fd/{fd}'
        self._map(mapped)
        # The mapping goes with the last view of it; the descriptor with us.
        self._finalizer = weakref.finalize(self, _close, fd)
        self.serialise_s = time.perf_counter() - t0

    @staticmethod
    def _fill(fd: int, items, n: int, max_bytes: int | None) -> int:
        """Write the offsets and the items' bytes to ``fd``; return the size."""
        offsets = np.zeros(n + 1, np.int64)
        data_at = offsets.nbytes
        pos = 0
        plain = type(items) in (list, tuple)
        for lo in range(0, n, CHUNK_ITEMS):
            hi = min(n, lo + CHUNK_ITEMS)
            chunk = items[lo:hi] if plain else [items[i] for i in range(lo, hi)]
            parts = encode_items(chunk, lo)
            del chunk
            np.cumsum(np.fromiter(map(len, parts), np.int64, hi - lo), out=offsets[lo + 1:hi + 1])
            offsets[lo + 1:hi + 1] += pos
            blob = b''.join(parts)
            del parts
            if max_bytes is not None and data_at + pos + len(blob) > max_bytes:
                raise ResourceError(
                    f'the items take more than the shared-memory budget of {_mib(max_bytes)} '
                    f'once serialised ({_mib(data_at + pos + len(blob))} for the first {hi} '
                    f'of {n})')
            _write_all(fd, blob, data_at + pos)
            pos += len(blob)
        _write_all(fd, offsets, 0)
        return data_at + pos

    def _map(self, mapped) -> None:
        self._mapped = mapped
        whole = memoryview(mapped).cast('B')
        self._offsets = whole[:8 * (self._n + 1)].cast('q')
        self._blob = whole[8 * (self._n + 1):]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index):
        offsets, blob = self._offsets, self._blob
        if type(index) is int and 0 <= index < self._n and offsets is not None \
                and blob is not None:
            # The workers' path, kept short: a read is ~1 us, and a batch has hundreds.
            data = blob[offsets[index]:offsets[index + 1]]
            if data[0] != _PICKLE_FIRST or len(data) == 1:
                return msgpack.unpackb(data, strict_map_key=False, ext_hook=_ext)
            return decode(data)     # the one place that unpickles (SECURITY.md)
        return self._get_slow(index)

    def _get_slow(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n))]
        i = operator.index(index)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f'SharedList index {index} out of range (len {self._n})')
        if self._blob is None:
            self._attach()
        offsets, blob = self._offsets, self._blob
        if offsets is None or blob is None:
            raise LoadrError('this SharedList is closed')
        return decode(blob[offsets[i]:offsets[i + 1]])

    def identity(self) -> dict:
        """What a loader state records of it: the wrapped sequence's type and length."""
        return {'type': self._kind, 'n': self._n}

    # -- between processes -------------------------------------------------------

    def __getstate__(self) -> dict:
        if self._path is None:
            raise LoadrError('this SharedList is closed')
        return {'n': self._n, 'kind': self._kind, 'nbytes': self.nbytes, 'path': self._path,
                'ino': self._ino, 'serialise_s': self.serialise_s}

    def __setstate__(self, state: dict) -> None:
        self._n, self._kind, self.nbytes = state['n'], state['kind'], state['nbytes']
        self._path, self._ino = state['path'], state['ino']
        self.serialise_s = state['serialise_s']
        self._fd = None             # the owner holds the descriptor; we only map
        self._mapped = self._offsets = self._blob = None
        self._finalizer = None

    def _attach(self) -> None:
        """Map the owner's buffer (a spawned worker), by ``/proc/<pid>/fd/<n>`` and inode."""
        if self._path is None:
            raise LoadrError('this SharedList is closed')
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise LoadrError(f'the SharedList is gone: the process that made it closed it or '
                             f'ended ({exc.strerror})', self._path) from exc
        try:
            if os.fstat(fd).st_ino != self._ino:
                raise LoadrError('the SharedList is gone: the process that made it closed it',
                                 self._path)
            mapped = _map_readonly(fd, self.nbytes)
        finally:
            os.close(fd)
        self._map(mapped)

    def close(self) -> None:
        """Give the shared memory back (workers that map it keep it until they exit)."""
        self._offsets = self._blob = None
        self._mapped = None
        if self._finalizer is not None:
            self._finalizer()
        self._fd = None
        self._path = None

    @property
    def closed(self) -> bool:
        return self._path is None and self._blob is None

    def __repr__(self) -> str:
        return f'SharedList(n={self._n}, of={self._kind}, nbytes={self.nbytes})'


# -- the Loader's hook ------------------------------------------------------------------


def share(reader):
    """What the workers read for ``reader``: a :class:`SharedList` of it if it is a plain
    ``list`` or ``tuple`` whose objects take ``SHARE_MIN_BYTES`` or more (or any size with
    ``LOADR_SHARE=1``; none with ``LOADR_SHARE=0``) and it fits the shared-memory
    budget; for a source that declares :class:`loadr.sources.Sharing` (a Mix), its
    ``shared()`` (its list sources shared the same way); else ``reader`` itself.

    Anything else (a reader, a user's Dataset) is left as it is: its ``[i]``
    may read files, and serialising it all would read the whole dataset. A list
    that does not fit, or that holds an item that cannot be serialised, is used
    as it is, with a warning that says why.
    """
    wanted = share_default()
    if wanted is False:
        return reader
    if type(reader) not in (list, tuple):
        from .sources import Sharing

        return reader.shared() if isinstance(reader, Sharing) else reader
    if wanted is None and python_bytes(reader) < SHARE_MIN_BYTES:
        return reader
    from .workers.shm import shm_budget, use_memfd

    budget, how = shm_budget(None, use_memfd())
    try:
        shared = SharedList(reader, max_bytes=budget)
    except ResourceError as exc:
        log.warning('loadr: the %s of %d datapoints is not shared with the workers (%s; '
                    'the budget: %s): each worker copies the items it reads', type(reader).__name__,
                    len(reader), exc, how)
        return reader
    except LoadrError as exc:
        log.warning('loadr: the %s of %d datapoints is not shared with the workers (%s): each '
                    'worker copies the items it reads', type(reader).__name__, len(reader), exc)
        return reader
    log.info('loadr: shared the %s of %d datapoints with the workers: %s in %.2f s',
             type(reader).__name__, len(reader), _mib(shared.nbytes), shared.serialise_s)
    return shared


def release(source, reader) -> None:
    """Give back what :func:`share` made of ``reader`` for the workers (``source``): close a
    SharedList it made (not the user's own), or what a Sharing source's ``shared()`` took."""
    if source is reader:
        return
    if isinstance(source, SharedList):
        source.close()
    else:
        from .sources import Sharing

        if isinstance(reader, Sharing):
            reader.release_shared(source)
