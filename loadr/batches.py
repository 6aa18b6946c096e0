"""A Loader's iterator (:class:`_Batches`) and how a failure in a worker is raised
in the caller (``_raise_failure``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import WorkerError
from .workers import protocol

if TYPE_CHECKING:
    from .loader import Loader


def _raise_failure(failure: protocol.Failure, exc: BaseException | None = None):
    """Raise the original exception, chained to a WorkerError that says where."""
    where = []
    if failure.index is not None:
        where.append(f'dataset index {failure.index}')
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
    text = f'{failure.type_name} in {who}{at}: {message}'
    if failure.traceback:
        text += f'\n\nWorker traceback:\n{failure.traceback}'
    cause = WorkerError(text, index=failure.index)
    cause.position = failure.position
    cause.worker_traceback = failure.traceback
    original = exc if exc is not None else failure.exception()
    if original is None:
        raise cause
    original.__dict__.setdefault('loadr_index', failure.index)
    original.__dict__.setdefault('loadr_position', failure.position)
    raise original from cause


class _Batches:
    """A Loader's iterator (``iter(loader)``, ``loader.epoch(e)``): its batches in order.

    An exception from ``next()`` (a worker's error, ``on_stats``, Ctrl-C) leaves
    the batch that was due due: the loader's step has not moved past it, and
    the next ``next()`` goes on from the step, so that batch comes next. A
    generator that raised would be over, and its batch lost to the caller.
    """

    __slots__ = ('_loader', '_epoch', '_drop_last', '_gen', '_over')

    def __init__(self, loader: 'Loader', epoch: int | None, drop_last: bool):
        self._loader, self._epoch, self._drop_last = loader, epoch, drop_last
        self._gen, self._over = None, False

    def __iter__(self):
        return self

    def __next__(self):
        if self._gen is None:
            if self._over:
                raise StopIteration
            self._gen = self._loader._stream(self._epoch, self._drop_last)
        try:
            return next(self._gen)
        except StopIteration:
            self._gen, self._over = None, True
            raise
        except BaseException:
            self._gen = None            # that generator is over; the next next() resumes
            raise

    def close(self) -> None:
        """End the iteration now: its batches in flight are given back."""
        self._over = True
        if self._gen is not None:
            gen, self._gen = self._gen, None
            gen.close()
