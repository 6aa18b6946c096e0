"""The messages between the main process and its workers, versioned.

Every message is a ZeroMQ multipart message whose first frame is a fixed
``struct`` header; tasks are a few dozen bytes, one per batch, never one per
sample. The pixels never travel here: they are in shared memory.

    main -> worker   TASK   header(task id, slot, first row, seed, start position, count,
                                   flags): fill rows row .. row + count - 1 of the slot
                     STOP   header
    worker -> main   HELLO  header(pid)
                     DONE   header(task id) [+ pickled {list key: values}, replaced indices]
                     FAIL   header(task id) + pickled failure record

Trust: payload frames are pickled, and are unpickled only by the main
process from the one socket it binds in a private directory (mode 0700), to
which only the processes it started can connect; workers never unpickle
anything from a socket (task headers are plain structs).

Example::

    frames = task(task_id=7, slot=1, seed=0, start=448, count=64)
    kind, fields = parse(frames[0])     # (TASK, (7, 1, 0, 0, 448, 64, 0))
"""

from __future__ import annotations

import pickle
import struct
import traceback
from dataclasses import dataclass

__all__ = ['VERSION', 'TASK', 'STOP', 'HELLO', 'DONE', 'FAIL', 'READ_ONE_BY_ONE', 'task', 'stop',
           'hello', 'done', 'fail', 'parse', 'Failure']

VERSION = 3
TASK, STOP, HELLO, DONE, FAIL = b'T', b'S', b'H', b'D', b'F'
# TASK flag: read the samples one by one, not with the reader's batch read
# (sent after a worker died inside a batch read, so the culprit gets named).
READ_ONE_BY_ONE = 1

_HEAD = struct.Struct('<Bc')
_BODY = {
    TASK: struct.Struct('<QIIQQIB'),  # task id, slot, row, seed, start, count, flags
    STOP: struct.Struct(''),
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
    return kind, _BODY[kind].unpack_from(header, _HEAD.size)


def task(task_id: int, slot: int, seed: int, start: int, count: int, flags: int = 0,
         row: int = 0) -> list[bytes]:
    return [_pack(TASK, task_id, slot, row, seed, start, count, flags)]


def stop() -> list[bytes]:
    return [_pack(STOP)]


def hello(pid: int) -> list[bytes]:
    return [_pack(HELLO, pid)]


def done(task_id: int, extras: dict, replaced: list) -> list[bytes]:
    frames = [_pack(DONE, task_id)]
    if extras or replaced:
        frames.append(pickle.dumps((extras, replaced), protocol=pickle.HIGHEST_PROTOCOL))
    return frames


def fail(task_id: int, failure: 'Failure') -> list[bytes]:
    return [_pack(FAIL, task_id), pickle.dumps(failure, protocol=pickle.HIGHEST_PROTOCOL)]


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

    @classmethod
    def capture(cls, exc: BaseException, index, position, worker, tb: str | None = None):
        try:
            blob = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(blob)
        except Exception:
            blob = None
        if tb is None:
            tb = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(f'{type(exc).__module__}.{type(exc).__qualname__}', str(exc), tb,
                   index, position, worker, blob)

    def exception(self) -> BaseException | None:
        """The original exception object, when it survives pickling."""
        if self.exc_blob is None:
            return None
        try:
            return pickle.loads(self.exc_blob)
        except Exception:
            return None
