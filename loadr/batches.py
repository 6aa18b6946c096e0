"""A Loader's iterator (:class:`_Batches`) and how a failure in a worker is raised
in the caller (``_raise_failure``), naming the datapoint's file (:func:`file_of`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import DataError, LoadrError, WorkerError
from .sources import Locating
from .workers import protocol

if TYPE_CHECKING:
    from .loader import Loader


# The end of a failing datapoint's error when on_error='raise': skipping exists. An error
# of the data says so plainly; any other may be a bug in a fn, which skipping would hide.
# (The command line says it in its pipeline's words instead of SKIP_SETTING.)
SKIP_SETTING = "Loader(on_error='skip')"
SKIP_HINT_DATA = f'{SKIP_SETTING} replaces a datapoint that fails like this with another one, ' \
    'and logs it'
SKIP_HINT = f'if the data and not the code is at fault, {SKIP_SETTING} replaces each ' \
    'datapoint that fails with another one, and logs it'


def file_of(source, index: int | None, exc: BaseException | None = None) -> str | None:
    """The file (or URL) that datapoint ``index`` of ``source`` comes from: the one a
    loadr error names, else the one the source says holds it (:class:`Locating`);
    None when neither can tell (a list of dicts). Never raises."""
    path = getattr(exc, 'path', None) if isinstance(exc, LoadrError) else None
    if path is not None:
        return str(path)
    if index is None or not isinstance(source, Locating):
        return None
    try:
        where = source.where(index)
    except Exception:   # noqa: BLE001 - naming the file is a courtesy; the error is the news
        return None
    return where if isinstance(where, str) else None


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


def _raise_failure(failure: protocol.Failure, exc: BaseException | None = None,
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
