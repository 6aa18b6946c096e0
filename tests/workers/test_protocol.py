"""The messages between the main process and its workers: round trips, versioning, failures."""

from __future__ import annotations

import errno
import pickle
import struct
import threading

import pytest

from loadr.workers import protocol
from loadr.workers.protocol import Failure, Portrait, Task

pytestmark = pytest.mark.timeout(60)


# -- headers ---------------------------------------------------------------------------------

def test_a_task_round_trips_with_every_field_at_its_limits():
    fields = (2**64 - 1, 2**32 - 1, 2**32 - 1, 2**64 - 1, 2**64 - 1, 2**32 - 1, 255)
    frames = protocol.task(Task(*fields))
    assert len(frames) == 1
    assert protocol.parse(frames[0]) == (protocol.TASK, Task(*fields))
    kind, task = protocol.parse(protocol.task(Task(7, 1, 0, 0, 448, 64))[0])
    assert (task.task_id, task.slot, task.row, task.seed, task.start, task.count,
            task.flags) == (7, 1, 0, 0, 448, 64, 0)


def test_a_task_header_keeps_the_wire_layout_of_version_5():
    # Both ends of a run are the same code, but the layout only changes with VERSION:
    # the named record packs exactly the bytes the positional fields did.
    head = struct.pack('<BcQIIQQIB', 5, b'T', 7, 1, 2, 3, 448, 64, 1)
    assert protocol.VERSION == 5
    assert protocol.task(Task(task_id=7, slot=1, row=2, seed=3, start=448, count=64,
                              flags=1)) == [head]


def test_stop_mend_hello_done_and_fail_round_trip():
    assert protocol.parse(protocol.stop()[0]) == (protocol.STOP, ())
    assert protocol.parse(protocol.mend()[0]) == (protocol.MEND, ())
    assert protocol.parse(protocol.hello(4242)[0]) == (protocol.HELLO, (4242,))
    frames = protocol.done(9, {}, [])
    assert len(frames) == 1                         # nothing to send: no payload frame
    assert protocol.parse(frames[0]) == (protocol.DONE, (9,))
    frames = protocol.done(9, {'name': ['a', 'b']}, [3])
    assert pickle.loads(frames[1]) == ({'name': ['a', 'b']}, [3])
    failure = Failure.capture(KeyError('k'), 5, 6, 1)
    frames = protocol.fail(11, failure)
    assert protocol.parse(frames[0]) == (protocol.FAIL, (11,))
    back = pickle.loads(frames[1])
    assert (back.type_name, back.index, back.position, back.worker) == ('builtins.KeyError', 5,
                                                                        6, 1)


def test_a_header_of_another_version_or_kind_is_refused():
    good = protocol.task(Task(1, 0, 0, 0, 0, 8))[0]
    other_version = bytes([protocol.VERSION + 1]) + good[1:]
    with pytest.raises(ValueError, match=f'version {protocol.VERSION + 1}'):
        protocol.parse(other_version)
    with pytest.raises(ValueError, match='kind'):
        protocol.parse(struct.pack('<Bc', protocol.VERSION, b'Z'))
    with pytest.raises(ValueError, match='short'):
        protocol.parse(b'')
    with pytest.raises(struct.error):
        protocol.parse(good[:-1])                   # a truncated body


def test_the_version_is_the_first_byte_of_every_header():
    for frames in (protocol.task(Task(1, 0, 0, 0, 0, 1)), protocol.stop(), protocol.hello(1),
                   protocol.done(1, {}, []), protocol.fail(1, Failure.capture(ValueError(), 0,
                                                                              0, 0))):
        assert frames[0][0] == protocol.VERSION


# -- failures --------------------------------------------------------------------------------

class KwOnlyError(Exception):
    """Keyword-only arguments: unpickling calls KwOnlyError('code 3') and fails."""

    def __init__(self, *, code):
        super().__init__(f'code {code}')
        self.code = code


class TwoArgError(ValueError):
    """A custom __init__ whose args do not match what it passes to Exception."""

    def __init__(self, path, why):
        super().__init__(f'{path}: {why}')
        self.path, self.why = path, why


class LockedError(RuntimeError):
    """An attribute that cannot be pickled at all."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()
        self.detail = {'attempts': [1, 2], 'where': ('a', b'b')}


class DiskError(OSError):
    """An OSError subclass with its own __init__: errno must come back too."""

    def __init__(self, path):
        super().__init__(errno.EIO, 'disk gave up', path)


def _across(failure: Failure) -> Failure:
    """What the main process gets: the record pickled in the worker, unpickled here."""
    return pickle.loads(pickle.dumps(failure, protocol=pickle.HIGHEST_PROTOCOL))


@pytest.mark.parametrize('exc', [KwOnlyError(code=3), TwoArgError('/x.bag', 'torn'),
                                 LockedError('no luck'), DiskError('/data/x')])
def test_an_exception_that_does_not_pickle_comes_back_as_its_own_class(exc):
    with pytest.raises(Exception):  # noqa: B017 - each class fails its round trip its own way
        pickle.loads(pickle.dumps(exc))             # the premise: a round trip fails
    failure = _across(Failure.capture(exc, 17, 40, 1))
    assert failure.exc_blob is None and failure.portrait is not None
    back = failure.exception()
    assert type(back) is type(exc)
    assert back.args == exc.args and str(back) == str(exc)
    for key, value in vars(exc).items():
        if key != 'lock':
            assert getattr(back, key) == value
    if isinstance(exc, LockedError):
        assert back.lock.startswith('<unlocked _thread.lock')   # its repr, not the object
    if isinstance(exc, OSError):
        assert (back.errno, back.strerror, back.filename) == (errno.EIO, 'disk gave up',
                                                              '/data/x')


def test_an_exception_that_pickles_comes_back_whole():
    failure = _across(Failure.capture(KeyError('k'), 1, 1, 0))
    assert failure.exc_blob is not None
    back = failure.exception()
    assert type(back) is KeyError and back.args == ('k',)


def test_a_class_that_cannot_be_found_gives_none_and_the_record_still_says_what_it_was():
    class Local(Exception):
        pass

    failure = _across(Failure.capture(Local('inside a function'), 3, 4, 0))
    assert failure.exception() is None              # the loader raises WorkerError then
    assert failure.type_name.endswith('Local') and failure.message == 'inside a function'
    assert 'inside a function' in failure.traceback
    missing = Portrait('no_such_module_for_loadr', 'X', ('a',), {})
    assert missing.rebuild() is None
    not_an_exception = Portrait('builtins', 'dict', (), {})
    assert not_an_exception.rebuild() is None


def test_a_portrait_holds_plain_data_only():
    class Gadget:
        def __reduce__(self):
            return (print, ('unpickled!',))

        def __repr__(self):
            return 'Gadget()'

    exc = KwOnlyError(code=1)
    exc.gadget = Gadget()
    exc.nested = [1, {'a': (Gadget(),)}]
    exc.text = 'x' * 5000
    p = Portrait.of(exc)
    assert p.state['gadget'] == 'Gadget()'
    assert p.state['nested'] == "[1, {'a': (Gadget(),)}]"
    assert p.state['text'] == 'x' * 5000            # plain data is kept whole
    assert p.state['code'] == 1
    long = Portrait.of(ValueError(object.__new__(type('Huge', (), {
        '__repr__': lambda self: 'z' * 5000}))))
    assert len(long.args[0]) <= 1000 and long.args[0].endswith('...')
