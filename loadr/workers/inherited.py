"""Open files a dataset holds when the workers are forked: every worker would share them.

A forked worker inherits the main process's open files as they are: the same
open file description, so one file offset for all of them. A dataset that
opened its file in ``__init__`` (the natural wrapper of a tar, a zip or a
Parquet file) then reads with ``seek`` + ``read`` from several processes at
once: the reads interleave and return another record's bytes, which surface
as "a damaged JPEG" far from their cause. :func:`open_files` finds such files
by walking the dataset's attributes (a bounded walk, never calling the
dataset's own code; an object that records the pid its files were opened in
reopens them, and is believed); the pool warns once when it forks workers over them,
and a worker's error names them (:func:`note`). ``os.pread`` on a shared
descriptor is safe (it takes no offset): that is why this warns and does not
refuse.

    >>> import tempfile
    >>> class Tar:
    ...     def __init__(self, path): self.f = open(path, 'rb')
    >>> with tempfile.NamedTemporaryFile() as tmp:
    ...     open_files(Tar(tmp.name)) == [f'dataset.f ({tmp.name})']
    True
"""

from __future__ import annotations

import io
import os
import socket
import sys
import types

__all__ = ['open_files', 'note']

# The walk's bounds: objects looked at, and how deep (dataset.a.b.c.d).
MAX_OBJECTS = 2000
MAX_DEPTH = 5
# Items of a list, tuple or dict looked at (a dataset of many records holds them there).
MAX_ITEMS = 64
# Values that hold no file and need no look inside.
_LEAVES = (str, bytes, bytearray, memoryview, int, float, complex, bool, type(None), range,
           types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
           types.MethodType)


# Modules whose objects deal with a fork themselves (loadr's storage reopens its files
# in a new process; an fsspec or aiohttp session its connections), or hold nothing of a
# dataset's: not looked into.
_FORK_AWARE = ('loadr.storage', 'asyncio', 'aiohttp',
               'fsspec', 's3fs', 'gcsfs', 'zmq', 'threading', 'logging', 'multiprocess',
               'multiprocessing', 'concurrent', 'numpy')
_STD_STREAMS = ('stdin', 'stdout', 'stderr', '__stdin__', '__stdout__', '__stderr__')


def _is_open_file(obj) -> bool:
    """A file object over an OS descriptor (whose offset a fork shares), or a socket."""
    try:
        if isinstance(obj, socket.socket):
            return obj.fileno() != -1
        if not isinstance(obj, io.IOBase) or obj.closed:
            return False
        if any(obj is getattr(sys, name, None) for name in _STD_STREAMS):
            return False
        obj.fileno()            # io.BytesIO and the like have none: nothing shared
        return True
    except Exception:   # noqa: BLE001 - an object that cannot say is not reported
        return False


def _fork_aware(obj) -> bool:
    module = type(obj).__module__ or ''
    return any(module == m or module.startswith(m + '.') for m in _FORK_AWARE)


def _name_of(obj) -> str:
    name = getattr(obj, 'name', None)
    if isinstance(name, (str, bytes)) and name:
        return f' ({name.decode(errors="replace") if isinstance(name, bytes) else name})'
    if isinstance(obj, socket.socket):
        return ' (a socket)'
    return ''


def _children(obj):
    if isinstance(obj, dict):
        for i, (key, value) in enumerate(obj.items()):
            if i >= MAX_ITEMS:
                return
            yield f'[{key!r}]', value
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            if i >= MAX_ITEMS:
                return
            yield f'[{i}]', value
        return
    if _fork_aware(obj):
        return
    try:
        attrs = vars(obj)
    except TypeError:
        attrs = {}
    # An object that records the pid it opened its files in (README's way: reopen when
    # os.getpid() differs) is taken at its word: what it holds is this process's own.
    pid = os.getpid()
    if any(type(v) is int and v == pid for v in attrs.values()):
        return
    for key, value in list(attrs.items())[:MAX_ITEMS]:
        yield f'.{key}', value
    for key in getattr(type(obj), '__slots__', ()):
        if isinstance(key, str) and key not in attrs:
            try:
                yield f'.{key}', object.__getattribute__(obj, key)
            except AttributeError:
                pass


def open_files(dataset, root: str = 'dataset') -> list[str]:
    """The open files (and sockets) reachable from ``dataset``'s attributes, each as
    ``'dataset.attr (its name)'``; a bounded walk (``MAX_OBJECTS``, ``MAX_DEPTH``)."""
    found: list[str] = []
    seen: set[int] = set()
    todo = [(root, dataset, 0)]
    while todo and len(seen) < MAX_OBJECTS:
        path, obj, depth = todo.pop(0)
        if isinstance(obj, _LEAVES) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if _is_open_file(obj):
            found.append(f'{path}{_name_of(obj)}')
            continue
        if depth < MAX_DEPTH:
            todo.extend((path + step, child, depth + 1) for step, child in _children(obj))
    return found


def note(files: list[str]) -> str:
    """What a worker's error says about ``files`` (see the module docstring)."""
    return (f'note: the dataset held files opened before the workers started, which every '
            f'forked worker shares, one file offset for all ({", ".join(files)}): reads that '
            f'interleave return another record\'s bytes. Open each file once per process, '
            f'on its first read (README, "Your own data").')
