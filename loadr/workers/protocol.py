"""The messages between the main process and its workers, versioned.

Every message is a ZeroMQ multipart message whose first frame is a fixed
``struct`` header; tasks are a few dozen bytes, one per batch, never one per
sample. The pixels never travel here: they are in shared memory.

    main -> worker   TASK   header(task id, slot, first row, seed, start position, count,
                                   flags): fill rows row .. row + count - 1 of the slot
                     STOP   header
                     MEND   header: nothing to do (completes a message a Ctrl-C cut short)
    worker -> main   HELLO  header(pid)
                     DONE   header(task id) [+ pickled {list key: values}, replaced indices]
                     FAIL   header(task id) + pickled failure record

Trust: payload frames are pickled, and are unpickled only by the main
process from the one socket it binds in a private directory (mode 0700), to
which only the processes it started can connect; workers never unpickle
anything from a socket (task headers are plain structs).

An exception travels whole when it survives a pickle round trip in the
worker; otherwise as a :class:`Portrait` (class by module and qualname,
``args`` and attributes as plain data), from which the main process makes an
instance of the same class without calling its ``__init__``. ``VERSION``
changes whenever a header or a payload's layout does.

Why MEND: a ROUTER message is two frames ([worker identity, header]) sent by
two calls, and a Ctrl-C can land between them. The frame sent next would
then finish the cut message, and a worker would read another worker's
identity as a header. After a possible cut the pool sends a lone MEND
header: it either completes the cut message as a MEND for that worker, which
ignores it, or, when nothing was cut, names no worker and is dropped.

The records: :class:`Task` is a TASK header, field for field in wire order,
so it packs and unpacks with no reordering; :class:`Done`, :class:`Failed`,
:class:`Lost` and :class:`Fatal` are the pool's events (``WorkerPool.poll``),
the first two made from a worker's reply. They are NamedTuples: a tuple's
cost, read by name.

A :class:`Failure` ends in the caller's thread: :func:`raise_failure` raises
the original exception, its message naming the file and the index, chained
to a :class:`~loadr.errors.WorkerError` that says which worker and where.

Example::

    frames = task(Task(task_id=7, slot=1, row=0, seed=0, start=448, count=64))
    parse(frames[0])        # (TASK, Task(task_id=7, slot=1, row=0, ..., flags=0))
"""

from __future__ import annotations

import importlib
import pickle
import struct
import sys
import traceback
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import DataError, LoadrError, WorkerError
from ..sources import file_of

__all__ = ['VERSION', 'TASK', 'STOP', 'HELLO', 'DONE', 'FAIL', 'MEND', 'READ_ONE_BY_ONE', 'Task',
           'Done', 'Failed', 'Lost', 'Fatal', 'task', 'stop', 'mend', 'hello', 'done', 'fail',
           'parse', 'Failure', 'Portrait', 'raise_failure', 'SKIP_SETTING', 'SKIP_HINT',
           'SKIP_HINT_DATA']

VERSION = 5
TASK, STOP, HELLO, DONE, FAIL, MEND = b'T', b'S', b'H', b'D', b'F', b'M'
# TASK flag: read the samples one by one, not with the reader's batch read
# (sent after a worker died inside a batch read, so the culprit gets named).
READ_ONE_BY_ONE = 1


class Task(NamedTuple):
    """A TASK header: fill ``count`` rows of ``slot`` from ``row`` on with the stream
    positions ``start ..`` of seed ``seed``'s order. The fields are in wire order."""

    task_id: int
    slot: int
    row: int
    seed: int
    start: int
    # A field named like tuple.count: mypy flags the shadowing; reads give the int.
    count: int  # type: ignore[assignment]
    flags: int = 0


class Done(NamedTuple):
    """Event: a worker filled task ``task_id``'s rows (or dropped it, cancelled); ``extras``
    are the list keys' values, ``replaced`` the samples replaced under on_error='skip'."""

    task_id: int
    extras: dict
    replaced: list


class Failed(NamedTuple):
    """Event: task ``task_id`` failed (a sample raised, or killed workers too often)."""

    task_id: int
    failure: Failure


class Lost(NamedTuple):
    """Event: task ``task_id``'s worker died (or was killed) with it: send it again."""

    task_id: int


class Fatal(NamedTuple):
    """Event: workers cannot start at all; nothing can be made."""

    failure: Failure


_HEAD = struct.Struct('<Bc')
_TASK = struct.Struct('<BcQIIQQIB')     # the head, then a Task's fields
_BODY = {
    TASK: struct.Struct('<' + _TASK.format[3:]),
    STOP: struct.Struct(''),
    MEND: struct.Struct(''),
    HELLO: struct.Struct('<Q'),      # pid
    DONE: struct.Struct('<Q'),       # task id
    FAIL: struct.Struct('<Q'),       # task id
}


def _pack(kind: bytes, *fields) -> bytes:
    return _HEAD.pack(VERSION, kind) + _BODY[kind].pack(*fields)


def parse(header: bytes) -> tuple[bytes, tuple]:
    """``(kind, fields)`` of a message's first frame; ValueError if it is not ours."""
    if len(header) < _HEAD.size:
        raise ValueError('short loadr message')
    version, kind = _HEAD.unpack_from(header)
    if version != VERSION or kind not in _BODY:
        raise ValueError(f'unknown loadr message (version {version}, kind {kind!r})')
    fields = _BODY[kind].unpack_from(header, _HEAD.size)
    return kind, (Task._make(fields) if kind == TASK else fields)


def task(header: Task) -> list[bytes]:
    """The frames of a TASK message."""
    return [_TASK.pack(VERSION, TASK, *header)]


def stop() -> list[bytes]:
    return [_pack(STOP)]


def mend() -> list[bytes]:
    return [_pack(MEND)]


def hello(pid: int) -> list[bytes]:
    return [_pack(HELLO, pid)]


def done(task_id: int, extras: dict, replaced: list) -> list[bytes]:
    frames = [_pack(DONE, task_id)]
    if extras or replaced:
        frames.append(pickle.dumps((extras, replaced), protocol=pickle.HIGHEST_PROTOCOL))
    return frames


def fail(task_id: int, failure: Failure) -> list[bytes]:
    return [_pack(FAIL, task_id), pickle.dumps(failure, protocol=pickle.HIGHEST_PROTOCOL)]


# What a Portrait keeps as it is: data that pickles to itself and runs no code
# when it is unpickled. Anything else is kept as its repr(), cut to this length.
_PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_PLAIN_CONTAINERS = (tuple, list, set, frozenset)
_PLAIN_MAX_ITEMS = 10_000
_PLAIN_MAX_DEPTH = 8
_REPR_MAX_CHARS = 1000
_OSERROR_FIELDS = ('errno', 'strerror', 'filename', 'filename2')


def _is_plain(value, depth: int = 0, budget: list | None = None) -> bool:
    budget = [_PLAIN_MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0 or depth > _PLAIN_MAX_DEPTH:
        return False
    kind = type(value)          # exact types: a subclass may pickle as anything
    if kind in _PLAIN_SCALARS:
        return True
    if kind in _PLAIN_CONTAINERS:
        return all(_is_plain(v, depth + 1, budget) for v in value)
    if kind is dict:
        return all(_is_plain(k, depth + 1, budget) and _is_plain(v, depth + 1, budget)
                   for k, v in value.items())
    return False


def _plain(value):
    """``value`` if it is plain data, else its (shortened) repr."""
    if _is_plain(value):
        return value
    try:
        text = repr(value)
    except Exception:   # noqa: BLE001 - a broken __repr__ must not hide the error itself
        text = f'<{type(value).__qualname__} object>'
    return text if len(text) <= _REPR_MAX_CHARS else text[:_REPR_MAX_CHARS - 3] + '...'


def _find_class(module: str, qualname: str):
    """The exception class ``module.qualname`` in this process, or None.

    Found by import and attribute lookup only; a class defined inside a
    function (``<locals>`` in its qualname) cannot be found this way.
    """
    if module == '__mp_main__':        # the main script, as a spawned worker names it
        module = '__main__'
    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = importlib.import_module(module)
        except Exception:   # noqa: BLE001 - not importable here: the caller falls back
            return None
    obj: object = mod
    for part in qualname.split('.'):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


@dataclass
class Portrait:
    """An exception that does not survive pickling, as plain data.

    ``args`` and ``state`` (the instance's ``__dict__``) hold plain data
    only (None, bool, numbers, str, bytes, and tuples, lists, sets and dicts
    of those); any other value is replaced by its repr. The main process
    rebuilds it with :meth:`rebuild`.

    >>> class Odd(Exception):
    ...     def __init__(self, *, code):
    ...         super().__init__(f'code {code}')
    ...         self.code = code
    >>> p = Portrait.of(Odd(code=3))
    >>> (p.args, p.state)
    (('code 3',), {'code': 3})
    """

    module: str
    qualname: str
    args: tuple
    state: dict
    oserror: tuple | None = None        # errno, strerror, filename, filename2 of an OSError

    @classmethod
    def of(cls, exc: BaseException) -> Portrait:
        kind = type(exc)
        state = {k: _plain(v) for k, v in getattr(exc, '__dict__', {}).items()
                 if type(k) is str}
        oserror = None
        if isinstance(exc, OSError):
            oserror = tuple(_plain(getattr(exc, f, None)) for f in _OSERROR_FIELDS)
        return cls(kind.__module__, kind.__qualname__, tuple(_plain(a) for a in exc.args),
                   state, oserror)

    def rebuild(self) -> BaseException | None:
        """An instance of the original class, made without calling its ``__init__``;
        None if the class cannot be found in this process."""
        kind = _find_class(self.module, self.qualname)
        if kind is None:
            return None
        try:
            try:
                exc = kind.__new__(kind, *self.args)
            except TypeError:               # a __new__ with its own signature
                exc = kind.__new__(kind)
            exc.args = self.args
            if self.oserror is not None:
                for field, value in zip(_OSERROR_FIELDS, self.oserror):
                    if value is not None:
                        setattr(exc, field, value)
            exc.__dict__.update(self.state)
        except Exception:   # noqa: BLE001 - a class that cannot be made so: the caller falls back
            return None
        return exc


@dataclass
class Failure:
    """What went wrong in a worker, in a form that crosses processes."""

    type_name: str
    message: str
    traceback: str
    index: int | None
    position: int | None
    worker: int | None
    exc_blob: bytes | None = None
    portrait: Portrait | None = None

    @classmethod
    def capture(cls, exc: BaseException, index, position, worker, tb: str | None = None):
        """The record of ``exc``: pickled whole if that round trip works here, and
        its :class:`Portrait` in any case (the fallback where unpickling fails)."""
        try:
            blob = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(blob)      # our own bytes, just made: does it come back?
        except Exception:   # noqa: BLE001 - any failure means "the portrait only"
            blob = None
        portrait = Portrait.of(exc)
        if tb is None:
            tb = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            message = str(exc)
        except Exception:   # noqa: BLE001 - a broken __str__ must not hide the error itself
            message = f'<{type(exc).__qualname__}: str() failed>'
        return cls(f'{type(exc).__module__}.{type(exc).__qualname__}', message, tb,
                   index, position, worker, blob, portrait)

    def exception(self) -> BaseException | None:
        """The original exception: unpickled, or rebuilt from its portrait; None
        when neither works (the class cannot be found here)."""
        if self.exc_blob is not None:
            try:
                return pickle.loads(self.exc_blob)
            except Exception:   # noqa: BLE001 - fall back to the portrait, or to None
                pass
        return self.portrait.rebuild() if self.portrait is not None else None


# The end of a failing datapoint's error when on_error='raise': skipping exists. An error
# of the data says so plainly; any other may be a bug in a fn, which skipping would hide.
# (The command line says it in its pipeline's words instead of SKIP_SETTING.)
SKIP_SETTING = "Loader(on_error='skip')"
SKIP_HINT_DATA = f'{SKIP_SETTING} replaces a datapoint that fails like this with another one, ' \
    'and logs it'
SKIP_HINT = f'if the data and not the code is at fault, {SKIP_SETTING} replaces each ' \
    'datapoint that fails with another one, and logs it'


def _tell_where(exc: BaseException, index: int, path: str | None, hint: str | None) -> None:
    """Make ``exc``'s own message name the datapoint (file and index) and end with
    ``hint``: the last line of a traceback is all many users read. A loadr error gets
    its path and index filled in; a builtin exception whose text is its one argument
    (ValueError('...')) gets the words appended; any other (a KeyError, an OSError, a
    class of the user's own) gets them as a note, shown under its line."""
    if exc.__dict__.get('loadr_where') is not None:
        return                                  # raised once already: said
    tail = f'; {hint}' if hint else ''
    if isinstance(exc, LoadrError):
        if exc.path is None and path is not None:
            exc.path = path
        if exc.index is None:
            exc.index = index
        exc.message += tail
        exc.args = (exc.message,)
        said = tail
    else:
        said = f" (dataset index {index}{f', in {path}' if path else ''}){tail}"
        # Only Python's own classes, whose text is their one argument: the args of a
        # class of the user's own may mean more than their text.
        if type(exc).__module__ == 'builtins' and type(exc).__str__ is BaseException.__str__ \
                and len(exc.args) <= 1 and all(isinstance(a, str) for a in exc.args):
            exc.args = ((exc.args[0] if exc.args else '') + said,)
        elif hasattr(exc, 'add_note'):
            exc.add_note(f'loadr:{said}')
    exc.__dict__['loadr_where'] = said


def raise_failure(failure: Failure, exc: BaseException | None = None,
                   source=None, on_error: str = 'raise'):
    """Raise the original exception, chained to a WorkerError that says where.

    The original's own message names the file (``source``'s, see :func:`file_of`)
    and the index too, and, under ``on_error='raise'``, ends with the hint that
    ``on_error='skip'`` exists."""
    original = exc if exc is not None else failure.exception()
    path = file_of(source, failure.index, original)
    where = []
    if failure.index is not None:
        where.append(f'dataset index {failure.index}' + (f' ({path})' if path else ''))
    if failure.position is not None:
        where.append(f'stream position {failure.position}')
    who = 'the main process' if failure.worker is None else f'loadr worker {failure.worker}'
    at = f" at {', '.join(where)}" if where else ''
    message = failure.message
    if failure.index is not None:
        # A loadr error's own "[index N]" would name the index a second time.
        tag = f'[index {failure.index}]'
        message = (message[len(tag) + 2:] if message.startswith(f'{tag}: ')
                   else message.replace(f' {tag}:', ':', 1))
        if path and message.startswith(f'{path}: '):
            message = message[len(path) + 2:]   # and its path, named just above
    text = f'{failure.type_name} in {who}{at}: {message}'
    if failure.traceback:
        text += f'\n\nWorker traceback:\n{failure.traceback}'
    cause = WorkerError(text, index=failure.index)
    cause.position = failure.position
    cause.worker_traceback = failure.traceback
    if original is None:
        raise cause
    original.__dict__.setdefault('loadr_index', failure.index)
    original.__dict__.setdefault('loadr_position', failure.position)
    if failure.index is not None:
        try:
            _tell_where(original, failure.index, path,
                        None if on_error == 'skip' else
                        SKIP_HINT_DATA if isinstance(original, DataError) else SKIP_HINT)
        except Exception:   # noqa: BLE001 - an exception that will not be changed: raised as is
            pass
    raise original from cause
