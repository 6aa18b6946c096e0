"""The checks every reader must pass; each format's test file calls them.

Example::

    from tests.readers.common import check_reader_contract
    check_reader_contract(loadr.open(path))
"""

from __future__ import annotations

import inspect
import pickle

import multiprocess
import numpy as np
import pytest

from loadr.sources import OPTIONAL, Source, declared, members


def assert_equal(a, b, where='datapoint'):
    """Deep equality for datapoints: dicts, lists, numpy arrays (dtype and shape too)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, \
            f'{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}'
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), \
            f'{where}: keys {a.keys()} != {b.keys()}'
        for k in a:
            assert_equal(a[k], b[k], f'{where}[{k!r}]')
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f'{where}[{i}]')
    else:
        assert type(a) is type(b) and a == b, f'{where}: {a!r} != {b!r}'


def _read_all(reader):
    return [reader[i] for i in range(len(reader))]


def check_protocols(source) -> list:
    """The source protocols of :mod:`loadr.sources` on one source: it is a ``Source``; it
    implements every protocol its class names among its bases, with members of its own
    (not the protocol's stubs) that take the protocol's parameters; and it has the
    members of no protocol it does not name. Returns the protocols it names."""
    assert isinstance(source, Source)
    cls = type(source)
    named = declared(cls)
    for protocol in OPTIONAL:
        where = f'{cls.__name__} and {protocol.__name__}'
        assert isinstance(source, protocol) == (protocol in named), \
            f'{where}: {"named but not implemented" if protocol in named else "not named"}'
        if protocol not in named:
            continue
        for name in members(protocol):
            owner = next(k for k in cls.__mro__ if name in k.__dict__)
            assert owner not in OPTIONAL, f'{where}: {name} is only the protocol\'s stub'
            stub = protocol.__dict__.get(name)
            if callable(stub):
                want = list(inspect.signature(stub).parameters)[1:]
                got = list(inspect.signature(getattr(source, name)).parameters)
                assert got == want, f'{where}: {name}{tuple(got)}, the protocol says {want}'
            else:
                assert isinstance(getattr(source, name), bool), f'{where}: {name} not a bool'
    return named


def check_reader_contract(reader):
    """The Reader protocol of loadr.readers.base, checked on one reader."""
    check_protocols(reader)
    n = len(reader)
    assert n > 0
    assert isinstance(reader.spec, dict) and reader.spec
    for bad in (-1, n, n + 10, -n - 1):
        with pytest.raises(IndexError):
            reader[bad]
    for bad in ('0', 1.0, None):
        with pytest.raises(TypeError):
            reader[bad]
    everything = _read_all(reader)
    for i, dp in enumerate(everything):
        assert isinstance(dp, dict)
        assert_equal(dp, reader[np.int64(i)], f'numpy index {i}')
        avail = reader.available(i)
        assert set(avail) == set(dp), f'available({i}) keys differ from the datapoint'
    order = list(range(n))[::-1] + [0, 0]
    for i, dp in zip(order, reader.read_batch(order)):
        assert_equal(dp, everything[i], f'read_batch index {i}')
    copy = pickle.loads(pickle.dumps(reader))
    for i, dp in enumerate(_read_all(copy)):
        assert_equal(dp, everything[i], f'unpickled reader index {i}')
    # Another process, with the reader pickled by multiprocess (as workers get it).
    ctx = multiprocess.get_context('spawn')
    with ctx.Pool(1) as pool:
        other = pool.apply(_pickled_read_all, (pickle.dumps(reader),))
    for i, dp in enumerate(other):
        assert_equal(pickle.loads(dp), everything[i], f'other process index {i}')
    return everything


def _pickled_read_all(blob):
    import pickle
    reader = pickle.loads(blob)
    return [pickle.dumps(reader[i]) for i in range(len(reader))]
