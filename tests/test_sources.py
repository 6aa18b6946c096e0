"""The declared source protocols (loadr.sources): who declares what, and hooks looked up once."""

from __future__ import annotations

import re

import numpy as np
import pytest

import loadr
from loadr.assemble import Assembler
from loadr.mix import Mix
from loadr.order import Order
from loadr.readers.base import Reader
from loadr.sources import (
    BatchSource,
    Caching,
    Composite,
    ErrorNaming,
    Identified,
    Locating,
    Ordering,
    Prefetching,
    SeededSource,
    Sharing,
    Warming,
    hooks_of,
)
from loadr.spec import infer_spec
from tests.readers.common import check_protocols

pytestmark = pytest.mark.timeout(60)


def data(n: int) -> list:
    return [{'x': np.float32(i), 'y': i} for i in range(n)]


def test_a_list_is_a_source_with_no_optional_protocol():
    assert check_protocols(data(3)) == []
    hooks = hooks_of(data(3))
    assert repr(hooks) == 'Hooks()'


def test_a_mix_declares_what_it_implements():
    mix = Mix({'a': data(4), 'b': Mix({'c': data(2)})})
    assert check_protocols(mix) == [SeededSource, ErrorNaming, Prefetching, Caching, Ordering,
                                    Identified, Composite, Sharing, Locating]
    hooks = hooks_of(mix)
    assert hooks.read_seeded == mix.read_seeded and hooks.make_order == mix.make_order
    assert hooks.prefetch is None and hooks.cache_clock is None    # local sources


def test_each_reader_declares_what_it_implements(fixtures):
    base = [BatchSource, Prefetching, Caching, Identified, Locating]
    bag = loadr.open(fixtures / 'bag')
    assert check_protocols(bag) == [BatchSource, Prefetching, Caching, Warming, Identified,
                                    Locating]
    assert check_protocols(loadr.open(fixtures / 'gulp')) == base
    ffr = loadr.open(fixtures / 'ffrecord' / 'single.ffr')
    assert check_protocols(ffr) == base
    # The base class's read_batch is a loop: the assembler reads one by one itself.
    assert hooks_of(bag).read_batch is None and hooks_of(ffr).read_batch == ffr.read_batch
    assert hooks_of(bag).warm == bag.warm


class Declares(Reader, Warming):
    """Names Warming but has no warm() of its own."""

    def __len__(self):
        return 1


class Undeclared:
    """Has a batch read it does not name."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return {'x': i}

    def read_batch(self, indices):
        return [self[i] for i in indices]


class WrongParameters(BatchSource):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return {'x': i}

    def read_batch(self, positions):
        return [self[i] for i in positions]


@pytest.mark.parametrize('source,message', [
    (Declares(), "Declares and Warming: warm is only the protocol's stub"),
    (Undeclared(), 'Undeclared and BatchSource: not named'),
    (WrongParameters(), "read_batch('positions',), the protocol says ['indices']"),
])
def test_the_shared_check_finds_a_declaration_that_does_not_hold(source, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_protocols(source)


class Counted(list):
    """A list source that reads ahead, counting how often it is asked whether it does."""

    asked = 0
    ahead: list

    @property
    def prefetches(self) -> bool:
        type(self).asked += 1
        return True

    def prefetch(self, indices) -> None:
        self.ahead.extend(indices)


def test_hooks_are_looked_up_once_not_per_batch():
    # A Mix once asked each source `prefetches` at every batch's read-ahead, and
    # read_seeded by getattr at every row.
    source = Counted(data(64))
    source.ahead = []
    mix = Mix({'a': source, 'b': data(64)}, source_key=None)
    spec = infer_spec(mix[0])
    asm = Assembler(mix, [], spec)
    asked = Counted.asked
    order = mix.make_order(0)
    for start in range(0, 64, 8):
        arrays = {k: np.empty((8, *s), d) for k, (d, s) in spec.items()}
        asm.fill(order, start, 8, arrays)
    assert Counted.asked == asked           # nothing asked again, batch after batch
    assert source.ahead                     # and its reads were started ahead


def test_order_and_state_use_the_declared_hooks():
    mix = Mix({'a': data(5), 'b': data(3)})
    assert type(loadr.order.order_for(mix, 0)).__name__ == 'MixOrder'
    assert isinstance(loadr.order.order_for(data(4), 0), Order)
    with loadr.Loader(mix, batch=4, workers=0, seed=1) as loader:
        assert loader._hooks.make_order == mix.make_order
        next(iter(loader))
        state = loader.save()
    assert state['dataset']['kind'] == 'Mix'      # the Mix's identity()
    with loadr.Loader(mix, batch=4, workers=0, seed=1) as loader:
        loader.load(state)
