"""The assembler's write path: its fast writer writes the very bytes of the checked one.

``Assembler._write_rows``, the fast writer, writes a run of rows key by key
when every datapoint is the common kind (a dict, or a tuple for a spec keyed
``0 .. k-1``, holding ndarrays of the spec's dtype and shape and plain
scalars), and refuses anything else, which ``_write_checked``, the general
path with every check, writes one by one. Each test fills the same batch
twice, once as the assembler does and once through ``_write_checked`` alone,
a row at a time as it comes (:class:`General`), and compares the bytes of
every array, the list keys' values, and any error (type, message, index). No
test times anything.
"""

from __future__ import annotations

import errno
import pickle
import threading

import numpy as np
import pytest

import loadr
from loadr.assemble import ROW_GROUP_BYTES, Assembler
from loadr.errors import SampleFailure, SpecError
from loadr.order import Order
from loadr.spec import infer_spec
from loadr.stats import StageClock, row_width

pytestmark = pytest.mark.timeout(120)

I64, F32, F64 = np.dtype(np.int64), np.dtype(np.float32), np.dtype(np.float64)
SENTINEL = 0xA5     # every byte of a slot before the fill: a row left unwritten shows


class General(Assembler):
    """The assembler with its fast writer left out: every row is written as it comes
    (no rows kept), with the full checks."""

    def _write_rows(self, dps, first, arrays, extras):
        return False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._group = 1


def slots(spec: dict, batch: int) -> dict:
    """Batch arrays as a worker's slot holds them, every byte set to SENTINEL."""
    out = {}
    for key, (dtype, shape) in spec.items():
        if np.dtype(dtype) != object:
            out[key] = np.empty((batch,) + tuple(shape), dtype)
            out[key].view(np.uint8).fill(SENTINEL)
    return out


def fill(cls, data: list, spec: dict, fns=(), on_error='raise', clock=False, shuffle=False):
    """``(arrays, extras, replaced)`` of one batch of all of ``data``, filled by ``cls``."""
    asm = cls(data, list(fns), spec, on_error)
    if clock:
        asm.clock = StageClock(np.zeros(row_width(len(asm.fns))), len(asm.fns), inline=True)
    arrays = slots(spec, len(data))
    extras, replaced = asm.fill(Order(len(data), seed=3, shuffle=shuffle), 0, len(data), arrays)
    return arrays, extras, replaced


def assert_same_fill(data: list, spec: dict, **kw) -> tuple:
    """Fill with the fast path and the general one; every byte and value must agree."""
    fast, general = fill(Assembler, data, spec, **kw), fill(General, data, spec, **kw)
    (fa, fe, fr), (ga, ge, gr) = fast, general
    assert fa.keys() == ga.keys()
    for key in fa:
        assert fa[key].dtype == ga[key].dtype and fa[key].shape == ga[key].shape
        assert fa[key].tobytes() == ga[key].tobytes(), key
    assert fe.keys() == ge.keys()
    for key in fe:
        assert [type(v) for v in fe[key]] == [type(v) for v in ge[key]]
        assert pickle.dumps(fe[key]) == pickle.dumps(ge[key]), key
    assert fr == gr
    return fast


def write_error(cls, dp, spec: dict, index: int = 11) -> BaseException:
    """The exception one datapoint's write raises (pytest fails if it raises none)."""
    asm = cls([], [], spec)
    extras = {k: [] for k in asm.list_keys}
    with pytest.raises(Exception) as info:
        asm._write(dp, 0, index, slots(spec, 1), extras)
    return info.value


def assert_same_error(dp, spec: dict) -> BaseException:
    fast, general = write_error(Assembler, dp, spec), write_error(General, dp, spec)
    assert type(fast) is type(general)
    assert str(fast) == str(general)
    assert getattr(fast, 'index', None) == getattr(general, 'index', None)
    return fast


TRIVIAL = {'label': (I64, ()), 'vec': (F32, (16,))}


def trivial(n: int, label=np.int64) -> list:
    vecs = np.random.default_rng(0).standard_normal((n, 16), dtype=np.float32)
    return [{'label': label(i % 1000), 'vec': vecs[i]} for i in range(n)]


# ---------------------------------------------------------------------------
# Same bytes


def test_array_only_spec_same_bytes():
    data = trivial(300)
    arrays, extras, replaced = assert_same_fill(data, TRIVIAL)
    assert extras == {} and replaced == []
    assert arrays['label'].tolist() == [i % 1000 for i in range(300)]
    assert arrays['vec'].tobytes() == np.stack([dp['vec'] for dp in data]).tobytes()


def test_shuffled_with_a_fn_and_the_stage_clock_same_bytes():
    # The timed rows (loadr.stats) are kept and written as the others.
    def double(dp, seed):
        return {'label': dp['label'], 'vec': dp['vec'] * 2}

    arrays, _, _ = assert_same_fill(trivial(600), TRIVIAL, fns=[double], clock=True,
                                    shuffle=True)
    assert sorted(arrays['label'].tolist()) == sorted(i % 1000 for i in range(600))


@pytest.mark.parametrize('values,dtype', [
    ([np.int64(5), 7, -(2**63), 2**63 - 1, 0, np.int64(-3)], I64),
    ([1.5, np.float64(-0.0), float('nan'), float('inf'), 1e-310, 3.0], F64),
    ([np.float32(1.5), np.float32('nan'), np.float32(-0.0)], F32),
    ([True, np.bool_(False), False], np.dtype(bool)),
    ([1 + 2j, np.complex128(-1j)], np.dtype(np.complex128)),
    ([np.uint8(0), np.uint8(255)], np.dtype(np.uint8)),
    ([np.int32(-7), np.int32(2**31 - 1)], np.dtype(np.int32)),
    # Equal dtype, another scalar type or a 0-d array: the general path, same bytes.
    ([np.longlong(4), np.array(9), np.array(-1, dtype=np.longlong)], I64),
])
def test_scalar_specs_same_bytes(values, dtype):
    spec = {'x': (dtype, ())}
    arrays, _, _ = assert_same_fill([{'x': v} for v in values], spec)
    assert arrays['x'].tobytes() == np.array([np.asarray(v) for v in values], dtype).tobytes()


def test_nan_payloads_kept():
    quiet = np.frombuffer(np.uint64(0x7FF8_0000_0000_1234).tobytes(), F64)[0]
    assert_same_fill([{'x': float(quiet)}, {'x': quiet}], {'x': (F64, ())})


def test_numpy_scalar_and_python_int_same_bytes():
    mixed = trivial(40)
    for i, dp in enumerate(mixed):
        dp['label'] = int(dp['label']) if i % 2 else dp['label']
    fast_np = assert_same_fill(trivial(40), TRIVIAL)[0]
    fast_mixed = assert_same_fill(mixed, TRIVIAL)[0]
    fast_int = assert_same_fill(trivial(40, label=int), TRIVIAL)[0]
    for key in TRIVIAL:
        assert fast_np[key].tobytes() == fast_mixed[key].tobytes() == fast_int[key].tobytes()


def test_mixed_spec_with_list_keys_same_bytes():
    spec = {'name': (object, ()), 'vec': (F32, (4,)), 'raw': (object, ()),
            'meta': (object, ()), 'label': (I64, ())}
    data = [{'name': f'n{i}', 'vec': np.full(4, i, np.float32), 'raw': bytes([i]) * i,
             'meta': {'i': i, 'tags': ['a'] * i}, 'label': i} for i in range(20)]
    _, extras, _ = assert_same_fill(data, spec)
    assert extras['name'] == [f'n{i}' for i in range(20)]
    assert extras['meta'][3] == {'i': 3, 'tags': ['a'] * 3}


def test_keys_in_another_order_same_bytes():
    data = [{'vec': dp['vec'], 'label': dp['label']} for dp in trivial(10)]
    assert_same_fill(data, TRIVIAL)


def test_tuple_datapoints_same_bytes():
    data = [(np.full((2, 3), i, np.uint8), i, f'c{i}') for i in range(12)]
    spec = infer_spec(data[0])
    assert spec == {0: (np.dtype(np.uint8), (2, 3)), 1: (I64, ()), 2: (np.dtype(object), ())}
    arrays, extras, _ = assert_same_fill(data, spec)
    assert arrays[1].tolist() == list(range(12)) and extras[2][5] == 'c5'
    # A dict keyed 0 .. k-1 fills a tuple spec as well.
    assert_same_fill([dict(enumerate(t)) for t in data], spec)
    # Keys listed out of order still match a tuple by position.
    assert_same_fill(data, {2: spec[2], 0: spec[0], 1: spec[1]})


class Sub(np.ndarray):
    """An ndarray subclass: the fast path leaves it to the general one."""


def test_values_the_fast_path_leaves_to_the_general_one_same_bytes():
    base = np.arange(32, dtype=np.float32)
    values = [base[::2],                                # a strided view
              base[:16].view(Sub),                      # an ndarray subclass
              list(np.arange(16, dtype=np.float32)),          # a list of numpy scalars
              np.arange(16, dtype=np.float32).reshape(16)]
    data = [{'label': 1, 'vec': v} for v in values]
    assert_same_fill(data, TRIVIAL)


def test_torch_tensor_values_same_bytes():
    torch = pytest.importorskip('torch')
    data = [{'label': torch.tensor(i), 'vec': torch.arange(16, dtype=torch.float32) + i}
            for i in range(8)]
    assert_same_fill(data, TRIVIAL)


def test_replacements_under_skip_same_bytes():
    data = trivial(64)
    data[5] = {'label': 5}                                  # missing key
    data[9] = {'label': 9, 'vec': np.zeros(15, np.float32)}  # wrong shape
    arrays, _, replaced = assert_same_fill(data, TRIVIAL, on_error='skip')
    assert [r[0] for r in replaced] == [5, 9]


def fails_at(bad: set):
    """A fn that raises on the datapoints whose label is in ``bad``."""
    def fn(dp, seed=None):
        if int(dp['label']) in bad:
            raise ValueError(f'bad label {int(dp["label"])}')
        return dp
    return fn


@pytest.mark.parametrize('on_error', ['raise', 'skip'])
def test_a_kept_row_that_does_not_fit_is_reported_before_a_later_failed_fn(on_error):
    # Rows are kept and written at the batch's end (_write_rows); a fn that
    # fails at row 9 must not jump ahead of the wrong shape at row 5, which
    # the row-by-row path meets first.
    data = trivial(32)
    data[5] = {'label': 5, 'vec': np.zeros(15, np.float32)}
    fns = [fails_at({9, 21})]
    if on_error == 'skip':
        _, _, replaced = assert_same_fill(data, TRIVIAL, fns=fns, on_error='skip')
        assert [r[0] for r in replaced] == [5, 9, 21]
        return
    failures = []
    for cls in (Assembler, General):
        with pytest.raises(SampleFailure) as info:
            fill(cls, data, TRIVIAL, fns=fns)
        failures.append(info.value)
    assert [(f.index, str(f.exc)) for f in failures] == [(5, str(failures[1].exc))] * 2


@pytest.mark.parametrize('odd', [
    {'label': 3, 'vec': np.zeros(16, np.float32)},              # a Python int: still fast
    {'label': np.int64(3), 'vec': np.zeros(16, np.float32)[None]},   # shape (1, 16)
    {'label': 2**63, 'vec': np.zeros(16, np.float32)},          # past int64
    ({'label': np.int64(3), 'vec': np.zeros(16, np.float32)}, 'extra'),  # not a dict
])
@pytest.mark.parametrize('on_error', ['raise', 'skip'])
def test_one_odd_row_among_kept_rows_same_result(odd, on_error):
    data = trivial(16)
    data[7] = odd
    fast = general = None
    try:
        fast = fill(Assembler, data, TRIVIAL, on_error=on_error)
    except SampleFailure as exc:
        fast = exc
    try:
        general = fill(General, data, TRIVIAL, on_error=on_error)
    except SampleFailure as exc:
        general = exc
    if isinstance(general, SampleFailure):
        assert isinstance(fast, SampleFailure) and str(fast) == str(general)
        return
    for key in general[0]:
        assert fast[0][key].tobytes() == general[0][key].tobytes()
    assert fast[1:] == general[1:]


def test_loader_batches_identical_to_the_general_path():
    # workers=0 runs the same Assembler in this process; compare with the general path.
    data = trivial(512)
    with loadr.Loader(data, batch=128, shuffle=True, seed=4, workers=0) as loader:
        it = iter(loader)
        got = [next(it) for _ in range(4)]
    order = Order(len(data), seed=4, shuffle=True)
    for b, batch in enumerate(got):
        asm = General(data, [], TRIVIAL)
        arrays = slots(TRIVIAL, 128)
        asm.fill(order, 128 * b, 128, arrays)
        for key in TRIVIAL:
            assert np.asarray(batch[key]).tobytes() == arrays[key].tobytes()


class Counting(Assembler):
    """The assembler, counting the datapoints that its fast path leaves to the general one."""

    checked = 0

    def _write_checked(self, *args):
        self.checked += 1
        return super()._write_checked(*args)


@pytest.mark.parametrize('data,spec,general', [
    (trivial(8), TRIVIAL, 0),
    (trivial(8, label=int), TRIVIAL, 0),
    ([(np.zeros(3, np.float32), i, 'x') for i in range(8)],
     {0: (F32, (3,)), 1: (I64, ()), 2: (object, ())}, 0),
    ([{'x': float(i), 'b': bool(i)} for i in range(8)],
     {'x': (F64, ()), 'b': (np.dtype(bool), ())}, 0),
    ([{'label': 1, 'vec': np.arange(32, dtype=np.float32)[::2]} for _ in range(8)], TRIVIAL, 0),
    ([{'label': 1, 'vec': np.zeros(16, np.float32).view(Sub)} for _ in range(8)], TRIVIAL, 8),
    ([{'label': np.array(1), 'vec': np.zeros(16, np.float32)} for _ in range(8)], TRIVIAL, 0),
    ([{'label': np.longlong(1), 'vec': np.zeros(16, np.float32)} for _ in range(8)], TRIVIAL, 0
     if np.longlong is np.int64 else 8),
])
def test_which_datapoints_take_the_fast_path(data, spec, general):
    # The equivalence tests above only mean something if the fast path is taken.
    asm = Counting(data, [], spec)
    asm.fill(Order(len(data), seed=0, shuffle=False), 0, len(data), slots(spec, len(data)))
    assert asm.checked == general


@pytest.mark.parametrize('crossed', ['spec', 'data', 'both'])
@pytest.mark.parametrize('codec', ['pickle', 'dill'])
def test_what_crossed_a_pickle_takes_the_fast_path(codec, crossed):
    # A spawned worker gets its spec (and a list reader its arrays) through
    # dill: equal dtypes, but copies, not numpy's own instances. The fast path
    # once told dtypes apart by identity alone, and either side crossing
    # alone sent every datapoint to the full checks.
    codec = pytest.importorskip(codec)
    spec, data = TRIVIAL, trivial(8)
    if crossed == 'both':
        spec, data = codec.loads(codec.dumps((spec, data)))
    elif crossed == 'spec':
        spec = codec.loads(codec.dumps(spec))
    else:
        data = codec.loads(codec.dumps(data))
    assert (spec['vec'][0] is F32) != (crossed != 'data')     # the condition under test
    asm = Counting(data, [], spec)
    arrays = slots(spec, len(data))
    asm.fill(Order(len(data), seed=0, shuffle=False), 0, len(data), arrays)
    assert asm.checked == 0
    expected, _, _ = fill(General, data, TRIVIAL)
    for key in expected:
        assert arrays[key].tobytes() == expected[key].tobytes()


# ---------------------------------------------------------------------------
# Same errors


@pytest.mark.parametrize('dp', [
    {'label': 1},                                                   # missing
    {'label': 1, 'vec': np.zeros(16, np.float32), 'extra': 2},      # unexpected
    {'label': 1, 'other': np.zeros(16, np.float32)},                # missing and unexpected
    {},
    {'label': 1, 'vec': np.zeros(16, np.float64)},                  # dtype
    {'label': 1, 'vec': np.zeros(17, np.float32)},                  # shape
    {'label': 1, 'vec': np.zeros((16, 1), np.float32)},
    {'label': 1.0, 'vec': np.zeros(16, np.float32)},                # float for int64
    {'label': True, 'vec': np.zeros(16, np.float32)},               # bool for int64
    {'label': np.int32(1), 'vec': np.zeros(16, np.float32)},
    {'label': 2**63, 'vec': np.zeros(16, np.float32)},              # past int64: uint64
    {'label': -(2**63) - 1, 'vec': np.zeros(16, np.float32)},
    {'label': np.zeros(1, np.int64), 'vec': np.zeros(16, np.float32)},
    {'label': 1, 'vec': 'not an array'},
    {'label': 1, 'vec': None},
    (1, np.zeros(16, np.float32)),                                  # tuple, named spec
])
def test_bad_datapoints_same_errors(dp):
    err = assert_same_error(dp, TRIVIAL)
    assert isinstance(err, SpecError) and err.index == 11
    assert str(err).startswith('[index 11]: ')


@pytest.mark.parametrize('dp', [
    (np.zeros(3, np.float32),),                                     # too short
    (np.zeros(3, np.float32), 1, 2),                                # too long
    (np.zeros(3, np.float32), 'x'),
    (np.zeros(3, np.int64), 1),
    {0: np.zeros(3, np.float32), 2: 1},
])
def test_bad_tuple_datapoints_same_errors(dp):
    spec = {0: (F32, (3,)), 1: (I64, ())}
    err = assert_same_error(dp, spec)
    assert isinstance(err, SpecError) and err.index == 11


def test_list_key_that_does_not_pickle_same_error():
    spec = {'vec': (F32, (2,)), 'lock': (object, ())}
    err = assert_same_error({'vec': np.zeros(2, np.float32), 'lock': threading.Lock()}, spec)
    assert 'cannot be sent between processes' in str(err) and err.index == 11
    err = assert_same_error({'vec': np.zeros(2, np.float32), 'other': 'x'}, spec)
    assert "missing ['lock'], unexpected ['other']" in str(err)


def test_failed_sample_in_a_fill_same_error():
    data = trivial(32)
    data[20] = {'label': 20, 'vec': np.zeros(16, np.float64)}
    failures = []
    for cls in (Assembler, General):
        with pytest.raises(SampleFailure) as info:
            fill(cls, data, TRIVIAL)
        failures.append(info.value)
    fast, general = failures
    assert (fast.index, fast.position) == (general.index, general.position) == (20, 20)
    assert type(fast.exc) is type(general.exc) is SpecError
    assert str(fast.exc) == str(general.exc)
    assert str(fast.exc) == ('[index 20]: key \'vec\' is float64[16], the spec says '
                             'float32[16]')


# ---------------------------------------------------------------------------
# Groups: rows kept and written together


def test_kept_rows_with_rows_left_to_the_general_path_between_same_bytes():
    # Every third datapoint takes the general path (so the column rows are not
    # one run), one takes it after its first key went into a column (the label
    # passes, the vec does not), and two are replaced under skip.
    data = trivial(90)
    for i in range(0, 90, 3):
        data[i] = {'label': i, 'vec': data[i]['vec'].view(Sub)}
    data[40] = {'label': 40, 'vec': [np.float32(0.5)] * 16}
    data[50] = {'label': 50}
    data[61] = {'label': 61, 'vec': np.zeros(16, np.float64)}
    arrays, _, replaced = assert_same_fill(data, TRIVIAL, on_error='skip')
    assert [r[0] for r in replaced] == [50, 61]
    assert (arrays['vec'][40] == 0.5).all() and arrays['label'][40] == 40


def test_kept_rows_cover_values_of_many_shapes_and_a_large_row_same_bytes():
    spec = {'m': (F32, (3, 4)), 'b': (np.dtype(bool), ()), 'x': (F64, ()),
            'big': (np.dtype(np.uint8), (8192,)), 'c': (np.dtype(np.complex128), ())}
    rng = np.random.default_rng(1)
    data = [{'m': rng.standard_normal((3, 4), dtype=np.float32), 'b': bool(i % 2),
             'x': float(i) / 3, 'big': rng.integers(0, 256, 8192, dtype=np.uint8),
             'c': complex(i, -i)} for i in range(40)]
    assert_same_fill(data, spec)


@pytest.mark.parametrize('row_bytes,group', [(300_000, 3), (ROW_GROUP_BYTES + 8, 1)])
@pytest.mark.parametrize('on_error', ['raise', 'skip'])
def test_large_rows_written_a_group_at_a_time_same_bytes(row_bytes, group, on_error):
    # Large rows are written a few at a time (one, past ROW_GROUP_BYTES), not at
    # the batch's end: a group with an odd row is written row by row, checked,
    # and one that failed midway (a fn) is written before the failure is handled.
    spec = {'big': (np.dtype(np.uint8), (row_bytes,)), 'label': (I64, ())}
    rng = np.random.default_rng(2)
    data = [{'big': rng.integers(0, 256, row_bytes, dtype=np.uint8), 'label': i}
            for i in range(10)]
    data[4] = {'big': data[4]['big'].view(Sub), 'label': 4}             # left to the checks
    data[6] = {'big': data[6]['big'][:-1], 'label': 6}                  # does not fit
    assert Assembler(data, [], spec)._group == group
    fns = [fails_at({8})]
    if on_error == 'skip':
        _, _, replaced = assert_same_fill(data, spec, fns=fns, on_error='skip')
        assert [r[0] for r in replaced] == [6, 8]
        return
    failures = []
    for cls in (Assembler, General):
        with pytest.raises(SampleFailure) as info:
            fill(cls, data, spec, fns=fns)
        failures.append(info.value)
    assert [(f.index, str(f.exc)) for f in failures] == [(6, str(failures[1].exc))] * 2


def test_a_fill_cut_short_leaves_nothing_for_the_next():
    data = trivial(64)
    data[30] = {'label': 30, 'vec': np.zeros(16, np.float64)}
    asm = Assembler(data, [], TRIVIAL)
    with pytest.raises(SampleFailure):
        asm.fill(Order(64, seed=0, shuffle=False), 0, 64, slots(TRIVIAL, 64))
    arrays = slots(TRIVIAL, 16)
    asm.fill(Order(64, seed=0, shuffle=False), 0, 16, arrays)
    assert arrays['label'].tolist() == list(range(16))
    assert arrays['vec'].tobytes() == np.stack([dp['vec'] for dp in data[:16]]).tobytes()


# ---------------------------------------------------------------------------
# The read


class Flaky:
    """A reader whose first read of each index fails with ``error`` (each read counted)."""

    def __init__(self, n: int, error: BaseException):
        self.data, self.error, self.reads = trivial(n), error, []

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        self.reads.append(index)
        if self.reads.count(index) == 1:
            raise self.error
        return self.data[index]


def test_a_transient_read_error_is_tried_again_and_others_are_not(monkeypatch):
    monkeypatch.setattr('loadr.assemble.READ_RETRY_DELAYS_S', (0.0, 0.0))
    flaky = Flaky(4, OSError(errno.EIO, 'I/O error'))
    asm = Assembler(flaky, [], TRIVIAL)
    assert asm.datapoint(2, 0)['label'] == 2
    assert flaky.reads == [2, 2]                    # the failed read, then one more
    broken = Flaky(4, ValueError('corrupt'))
    asm = Assembler(broken, [], TRIVIAL)
    with pytest.raises(ValueError, match='corrupt'):
        asm.datapoint(3, 0)
    assert broken.reads == [3]                      # not read a second time


def relabel(dp, seed=None):
    """A fn that makes a new dict (as most do) from the one it is given."""
    return {'label': dp['label'], 'vec': dp['vec']}


class Returns:
    """A reader whose datapoint at ``odd`` is ``value``; the others are trivial ones."""

    def __init__(self, n: int, odd: int, value):
        self.data, self.odd, self.value = trivial(n), odd, value

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.value if index == self.odd else self.data[index]


@pytest.mark.parametrize('value', [None, ['a', 'list'], 7,
                                   ({'label': np.int64(1), 'vec': np.zeros(16, np.float32)},)])
def test_what_the_reader_returns_is_checked_as_datapoint_does(value):
    # The fill reads the common row (a dict) itself; anything else is checked
    # as datapoint() checks it, with the same error, at the same index.
    errors = []
    for cls in (Assembler, General):
        asm = cls(Returns(16, 6, value), [relabel], TRIVIAL)
        with pytest.raises(SampleFailure) as info:
            asm.fill(Order(16, seed=0, shuffle=False), 0, 16, slots(TRIVIAL, 16))
        errors.append(info.value)
    assert errors[0].index == errors[1].index == 6
    assert type(errors[0].exc) is type(errors[1].exc)
    assert str(errors[0].exc) == str(errors[1].exc)


@pytest.mark.parametrize('returns', [None, [1, 2], 'text'])
def test_a_fn_that_returns_no_datapoint_gets_the_same_error(returns):
    def odd(dp, seed=None):
        return returns if int(dp['label']) == 9 else dp
    errors = []
    for cls in (Assembler, General):
        asm = cls(trivial(16), [odd], TRIVIAL)
        with pytest.raises(SampleFailure) as info:
            asm.fill(Order(16, seed=0, shuffle=False), 0, 16, slots(TRIVIAL, 16))
        errors.append(info.value)
    assert errors[0].index == errors[1].index == 9
    assert str(errors[0].exc) == str(errors[1].exc)
    assert 'returned' in str(errors[0].exc)


@pytest.mark.parametrize('bad', ['read', 'fn', 'returns'])
def test_a_timed_row_fails_as_a_row_not_timed(bad):
    # Every row is timed here (a clock whose stride is 1): the timed row is read by
    # the same code, its fns wrapped in laps; errors must name the fn, not a lap.
    def odd(dp, seed=None):
        if int(dp['label']) == 9 and bad != 'read':
            if bad == 'fn':
                raise ValueError('bad 9')
            return ['not', 'a', 'datapoint']
        return dp
    data = trivial(16)
    if bad == 'read':
        data[9] = 'not a datapoint'
    errors = []
    for timed in (True, False):
        asm = Assembler(data, [odd], TRIVIAL)
        if timed:
            asm.clock = StageClock(np.zeros(row_width(1)), 1, inline=True)
            asm.timer.every = 1
        with pytest.raises(SampleFailure) as info:
            asm.fill(Order(16, seed=0, shuffle=False), 0, 16, slots(TRIVIAL, 16))
        errors.append((info.value.index, type(info.value.exc), str(info.value.exc)))
        if timed:
            assert asm.timer.sampled > 0 and asm.timer.acc[1] > 0    # rows 0 .. 8 timed
    assert errors[0] == errors[1] and errors[0][0] == 9
    if bad == 'returns':
        assert 'odd' in errors[0][2] and 'Lap' not in errors[0][2]


def test_tuples_from_the_reader_through_a_fn_same_bytes():
    data = [(np.full(3, i, np.float32), i) for i in range(12)]
    spec = {0: (F32, (3,)), 1: (I64, ())}
    assert_same_fill(data, spec, fns=[lambda dp, seed=None: (dp[0] * 2, dp[1])])


def test_a_transient_read_error_in_a_fill_is_tried_again(monkeypatch):
    # The fill's own read of the common row keeps the retry policy.
    monkeypatch.setattr('loadr.assemble.READ_RETRY_DELAYS_S', (0.0, 0.0))
    flaky = Flaky(8, OSError(errno.EIO, 'I/O error'))
    asm = Assembler(flaky, [relabel], TRIVIAL)
    arrays = slots(TRIVIAL, 8)
    asm.fill(Order(8, seed=0, shuffle=False), 0, 8, arrays)
    assert arrays['label'].tolist() == list(range(8))
    assert flaky.reads == [i for i in range(8) for _ in range(2)]
    broken = Flaky(8, ValueError('corrupt'))
    asm = Assembler(broken, [relabel], TRIVIAL)
    with pytest.raises(SampleFailure) as info:
        asm.fill(Order(8, seed=0, shuffle=False), 0, 8, slots(TRIVIAL, 8))
    assert info.value.index == 0 and 'corrupt' in str(info.value.exc)
    assert broken.reads == [0]                      # not read a second time


def test_an_empty_fill_writes_nothing_and_fails_nothing():
    asm = Assembler(trivial(8), [relabel], TRIVIAL)
    arrays = slots(TRIVIAL, 8)
    assert asm.fill(Order(8, seed=0), 3, 0, arrays) == ({}, [])
    assert set(arrays['vec'].view(np.uint8).ravel().tolist()) == {SENTINEL}


def test_a_replacement_that_does_not_fit_the_spec_is_passed_over():
    # Under skip, index 5 fails (a missing key) and so does its first
    # candidate (a wrong shape): the second candidate replaces it, the same
    # on the fast path and the row-by-row one. It once raised the candidate's
    # SpecError out of the skip.
    data = trivial(32)
    order = Order(32, seed=3)
    first, second = order.alternative(5, 1), order.alternative(5, 2)
    data[5] = {'label': 5}
    data[first] = {'label': first, 'vec': np.zeros(15, np.float32)}
    arrays, _, replaced = assert_same_fill(data, TRIVIAL, on_error='skip')
    assert [r[0] for r in replaced] == [5, first]
    row = 5
    assert arrays['label'][row] == second and arrays['vec'][row].tobytes() == \
        data[second]['vec'].tobytes()


def test_no_candidate_that_fits_names_the_index():
    data = [{'label': np.int64(i), 'vec': np.zeros(15, np.float32)} for i in range(8)]
    asm = Assembler(data, [], TRIVIAL, 'skip')          # not one fits
    with pytest.raises(loadr.LoadrError, match='fits the spec found to replace index 3'):
        asm.fill(Order(8, seed=0, shuffle=False), 3, 1, slots(TRIVIAL, 1))


class ReadsAhead(list):
    """A list source that reads ahead, recording each call of its prefetch."""

    prefetches = True

    def prefetch(self, indices) -> None:
        self.calls.append(list(indices))


def test_the_tasks_a_worker_holds_are_read_ahead_in_one_call():
    # One call for every task queued: the reader plans their requests together (a
    # file's ranges of every batch in one request), and no task is asked twice.
    source = ReadsAhead(trivial(48))
    source.calls = []
    spec = infer_spec(source[0])
    asm = Assembler(source, [], spec)
    order = Order(len(source), 3, shuffle=True)
    asm.prefetch_tasks([(order, 0, 8), (order, 8, 8), (order, 16, 8)])
    assert source.calls == [order.indices(0, 24).tolist()]
    asm.prefetch_tasks([(order, 8, 8), (order, 16, 8), (order, 24, 8)])
    assert source.calls[1:] == [order.indices(24, 8).tolist()]
    for start in (0, 8, 16, 24):
        asm.fill(order, start, 8, slots(spec, 8))
    assert len(source.calls) == 2           # fill does not ask again
    asm.fill(order, 32, 8, slots(spec, 8))
    assert source.calls[2:] == [order.indices(32, 8).tolist()]
