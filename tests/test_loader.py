import gc
import json
import os
import signal
import time

import numpy as np
import pytest

import loadr
from loadr.errors import ConfigError, SpecError, StateError, WorkerError
from loadr.loader import LEASED_SLOTS
from loadr.order import Order

from .loader_helpers import (
    alive,
    batch_digest,
    noisy,
    our_segments,
    slowed,
    stream_digests,
    trivial,
)
from .waiting import wait_until


def test_batches_follow_the_stream_contract():
    data = trivial(50)
    with loadr.Loader(data, batch=16, seed=7, workers=0) as loader:
        it = iter(loader)
        order = Order(50, 7)
        for k in range(10):                       # crosses several epoch boundaries
            batch = next(it)
            assert batch['label'].tolist() == order.indices(16 * k, 16).tolist()
            assert batch['vec'].shape == (16, 16) and batch['vec'].dtype == np.float32


def test_spec_and_list_keys():
    data = [{'x': i, 'name': f'item{i}', 'img': np.zeros((2, 3), np.uint8)} for i in range(10)]
    with loadr.Loader(data, batch=4, workers=2, shuffle=False) as loader:
        spec = loader.spec
        assert spec['x'] == (np.dtype('int64'), ())
        assert spec['img'] == (np.dtype('uint8'), (2, 3))
        assert spec['name'][0] == np.dtype(object)
        batch = next(iter(loader))
        assert batch['name'] == ['item0', 'item1', 'item2', 'item3']
        assert batch['img'].shape == (4, 2, 3)


def test_the_first_batch_after_a_jump_is_split_between_workers_and_joined_in_order():
    def named(dp, seed):
        if dp['x'] in (4, 58):       # not the first datapoint, which gives the spec
            raise ValueError('unreadable')   # replaced under on_error='skip'
        return {**dp, 'name': f"item{dp['x']}", 'seed': np.uint64(seed)}

    data = [{'x': i} for i in range(100)]
    options = dict(batch=10, fns=[named], seed=6, on_error='skip', max_error_fraction=0.5)
    with loadr.Loader(data, workers=0, **options) as ref:
        it = iter(ref)
        expected = [next(it) for _ in range(30)]
        errors = ref.errors
    with loadr.Loader(data, workers=3, **options) as loader:
        it = iter(loader)
        got = [next(it) for _ in range(10)]       # batch 0 made by three workers, rows 0-2,
        loader.load({'step': 200, 'seed': 6})     # 3-5 and 6-9; so is batch 20 after the jump
        got += [next(it) for _ in range(10)]
        loader.load({'step': 100, 'seed': 6})
        got += [next(it) for _ in range(10)]
        assert loader.errors == errors
    order = expected[:10] + expected[20:30] + expected[10:20]
    for mine, theirs in zip(got, order):
        assert mine['name'] == theirs['name']       # list keys joined in row order
        assert batch_digest(mine) == batch_digest(theirs)


class ArrayLike:
    """Not an ndarray, and not picklable: only its __array__ can carry it (as a torch
    Tensor's does)."""

    def __init__(self, values):
        self.values = np.asarray(values)

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)

    def __reduce__(self):
        raise TypeError('an ArrayLike must never be pickled')


class DLPackOnly:
    """Only the DLPack protocol (as some GPU-free array libraries have)."""

    def __init__(self, values):
        self.values = np.asarray(values)

    def __dlpack__(self, **kwargs):
        return self.values.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.values.__dlpack_device__()

    def __reduce__(self):
        raise TypeError('never pickled')


@pytest.mark.parametrize('workers', [0, 2])
@pytest.mark.parametrize('wrap', [ArrayLike, DLPackOnly])
def test_array_like_values_are_batched_as_arrays(workers, wrap):
    data = [{'x': wrap(np.full(3, i, np.float32)), 'y': wrap(np.int64(i))} for i in range(12)]
    with loadr.Loader(data, batch=4, shuffle=False, workers=workers) as loader:
        assert loader.spec == {'x': (np.dtype(np.float32), (3,)), 'y': (np.dtype(np.int64), ())}
        batch = next(iter(loader))
    assert batch['x'].tolist() == [[i] * 3 for i in range(4)]
    assert batch['y'].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize('workers', [0, 2])
def test_torch_tensors_are_batched_as_arrays(workers):
    torch = pytest.importorskip('torch')
    data = [{'x': torch.full((2, 2), float(i)), 'y': torch.tensor(i)} for i in range(8)]
    with loadr.Loader(data, batch=4, shuffle=False, workers=workers) as loader:
        batch = next(iter(loader))
    assert isinstance(batch['x'], np.ndarray) and batch['x'].shape == (4, 2, 2)
    assert batch['y'].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize('workers', [0, 2])
def test_tuple_datapoints_give_tuple_batches(workers):
    data = [(np.full(2, i, np.uint8), i, f'item{i}') for i in range(10)]

    def shift(dp, seed):
        x, y, name = dp
        return x + 1, y, name

    with loadr.Loader(data, batch=4, fns=[shift], shuffle=False, workers=workers) as loader:
        assert list(loader.spec) == [0, 1, 2]
        x, y, names = next(iter(loader))
        first = [batch_digest({str(k): v for k, v in enumerate(b)}) for b in loader.epoch(1)]
    assert x.tolist() == [[i + 1] * 2 for i in range(4)] and y.tolist() == [0, 1, 2, 3]
    assert names == ['item0', 'item1', 'item2', 'item3']
    with loadr.Loader(data, batch=4, fns=[shift], shuffle=False, workers=0) as ref:
        assert [batch_digest({str(k): v for k, v in enumerate(b)}) for b in ref.epoch(1)] == first


def test_fns_get_a_seed_from_seed_and_position():
    seen = []
    data = trivial(10)
    with loadr.Loader(data, batch=5, fns=[noisy], seed=3, workers=0) as loader:
        first = next(iter(loader))
    assert first['seed'].tolist() == Order(10, 3).seeds(0, 5)
    del seen


@pytest.mark.parametrize('workers,prefetch', [(1, None), (2, None), (2, 1), (2, 7), (8, 3)])
def test_same_bytes_for_any_worker_count_and_prefetch(workers, prefetch):
    data = trivial(300)
    with loadr.Loader(data, batch=32, fns=[noisy], seed=5, workers=0) as ref:
        expected = stream_digests(ref, 300)         # 32 epochs: every batch hashed
    with loadr.Loader(data, batch=32, fns=[noisy], seed=5, workers=workers,
                      prefetch=prefetch) as loader:
        assert stream_digests(loader, 300) == expected


def test_spawn_workers_take_lambdas_and_give_the_same_bytes():
    data = trivial(100)
    fns = [lambda dp, seed: {**dp, 'double': dp['label'] * 2}]
    with loadr.Loader(data, batch=10, fns=fns, seed=1, workers=0) as ref:
        expected = stream_digests(ref, 25)
    with loadr.Loader(data, batch=10, fns=fns, seed=1, workers=2, start_method='spawn') as lo:
        assert stream_digests(lo, 25) == expected


@pytest.mark.parametrize('workers', [0, 2])
def test_save_and_load_at_any_step(workers):
    data = trivial(97)
    with loadr.Loader(data, batch=10, fns=[noisy], seed=2, workers=workers) as loader:
        expected = stream_digests(loader, 200)
    for stop in (0, 1, 9, 10, 23, 157):
        with loadr.Loader(data, batch=10, fns=[noisy], seed=2, workers=workers) as loader:
            it = iter(loader)
            for _ in range(stop):
                next(it)
            state = json.loads(json.dumps(loader.save()))
        assert state['step'] == stop * 10 and state['seed'] == 2
        with loadr.Loader(data, batch=10, fns=[noisy], seed=99, workers=workers) as resumed:
            resumed.load(state, strict=False)       # another seed: refused unless not strict
            assert stream_digests(resumed, 200 - stop) == expected[stop:]


def test_load_after_iteration_has_started():
    data = trivial(64)
    with loadr.Loader(data, batch=8, seed=4, workers=2) as loader:
        expected = stream_digests(loader, 30)
    with loadr.Loader(data, batch=8, seed=4, workers=2) as loader:
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.save()
        for _ in range(12):
            next(it)
        loader.load(state)                         # rewind while batches are in flight
        assert [batch_digest(next(it)) for _ in range(10)] == expected[5:15]
        loader.load({'step': 8 * 20, 'seed': 4})   # and jump ahead
        assert [batch_digest(next(it)) for _ in range(5)] == expected[20:25]


def test_load_cancels_the_batches_in_flight(tmp_path):
    # Every sample a worker finishes is logged; after load() the batches
    # queued for the old position are not started and the ones in hand stop
    # after their current sample, so the new position is not kept waiting.
    log = str(tmp_path / 'log')

    def logged(dp, seed):
        time.sleep(0.02)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, b'%d\n' % dp['label'])
        os.close(fd)
        return dp

    with loadr.Loader(trivial(1000), batch=8, fns=[logged], shuffle=False, workers=2) as loader:
        it = iter(loader)
        for _ in range(2):
            next(it)                    # positions 0-15; 16-47 are now in flight
        loader.load({'step': 800, 'seed': 0})
        with open(log, 'ab') as f:
            f.write(b'load\n')
        assert next(it)['label'].tolist() == list(range(800, 808))
    lines = open(log).read().split()
    after = [int(x) for x in lines[lines.index('load') + 1:]]
    stale = [i for i in after if i < 800]
    assert len(stale) <= 2, stale       # at most the sample each worker had in hand


def test_a_new_iterator_takes_over_and_dropping_the_old_one_harms_nothing():
    data = trivial(200)
    with loadr.Loader(data, batch=8, fns=[noisy], seed=3, workers=0) as ref:
        expected = stream_digests(ref, 60)
    with loadr.Loader(data, batch=8, fns=[noisy], seed=3, workers=2) as loader:
        old = iter(loader)
        got = [batch_digest(next(old)) for _ in range(5)]
        new = iter(loader)              # goes on from the step the old one reached
        got += [batch_digest(next(new)) for _ in range(3)]
        del old                         # closing it must not touch the new one's batches
        gc.collect()
        got += [batch_digest(next(new)) for _ in range(52)]
    assert got == expected


@pytest.mark.parametrize('workers', [0, 2])
def test_a_peek_inside_the_loop_takes_the_next_batch_and_the_loop_goes_on(workers):
    # Every iterator of a loader goes on from loader.step: the stream is one,
    # whichever iterator asks. next(iter(loader)) inside `for batch in loader`
    # (peeking for logging) takes the batch that was due; the loop goes on
    # after it, with no batch twice and no batch made of two.
    data = trivial(200)
    with loadr.Loader(data, batch=8, fns=[noisy], seed=3, workers=0) as ref:
        expected = stream_digests(ref, 40)
    with loadr.Loader(data, batch=8, fns=[slowed(0.0005)], seed=3, workers=workers) as loader:
        got = []
        for k, batch in enumerate(loader):
            got.append(batch_digest(batch))
            if k % 3 == 1:
                got.append(batch_digest(next(iter(loader))))
            if len(got) >= 40:
                break
    assert got == expected[:len(got)]


def test_interleaved_iterators_give_what_workers_0_gives():
    data = trivial(90)

    def script(workers):
        out = []
        with loadr.Loader(data, batch=8, fns=[noisy], seed=5, workers=workers) as loader:
            a, b = iter(loader), iter(loader)
            for _ in range(4):
                out += [batch_digest(next(a)), batch_digest(next(b))]
            e1 = loader.epoch(1)
            out += [batch_digest(next(e1)), batch_digest(next(a)), batch_digest(next(e1))]
            state = loader.save()
            out += [batch_digest(next(b)) for _ in range(3)]
            loader.load(state)
            out += [batch_digest(next(e1)), batch_digest(next(a))]
            e0 = loader.epoch(0, drop_last=True)
            out += [batch_digest(b) for b in e0] + [batch_digest(next(b))]
            out.append(loader.save()['step'])
        return out

    assert script(2) == script(0)


def test_shards_split_the_global_batch_and_resume_on_fewer_hosts():
    data = trivial(200)
    with loadr.Loader(data, batch=48, fns=[noisy], seed=8, workers=0) as one:
        whole = [next(it) for it in [iter(one)] for _ in range(200)]
    shards = [loadr.Loader(data, batch=12, fns=[noisy], seed=8, workers=w, shard_id=s,
                           num_shards=4) for s, w in zip(range(4), (0, 1, 0, 2))]
    its = [iter(s) for s in shards]
    for k in range(100):
        parts = [next(it) for it in its]
        for key in ('label', 'vec', 'seed'):
            assert np.array_equal(np.concatenate([p[key] for p in parts]), whole[k][key])
    states = [s.save() for s in shards]
    assert all(st == states[0] for st in states)
    for s in shards:
        s.close()
    halves = [loadr.Loader(data, batch=24, fns=[noisy], seed=0, workers=0, shard_id=s,
                           num_shards=2) for s in range(2)]
    for h in halves:
        h.load(states[0], strict=False)         # another seed: refused unless not strict
    its = [iter(h) for h in halves]
    for k in range(100, 200):
        parts = [next(it) for it in its]
        assert np.array_equal(np.concatenate([p['vec'] for p in parts]), whole[k]['vec'])


@pytest.mark.parametrize('workers', [0, 2])
def test_epochs(workers):
    data = trivial(23)
    with loadr.Loader(data, batch=5, seed=1, workers=workers) as loader:
        batches = list(loader.epoch(0))
        assert [len(b['label']) for b in batches] == [5, 5, 5, 5, 3]
        assert sorted(np.concatenate([b['label'] for b in batches]).tolist()) == list(range(23))
        assert loader.save()['step'] == 23
        second = list(loader.epoch(1, drop_last=True))
        assert [len(b['label']) for b in second] == [5, 5, 5, 5]
        assert np.concatenate([b['label'] for b in second]).tolist() == \
            Order(23, 1).indices(23, 20).tolist()


def test_every_shard_yields_the_same_number_of_batches_per_epoch():
    # N=41, batch 3, 4 shards: 3 full global batches and 5 positions left,
    # split 1, 1, 1, 2 (it used to be 3, 2, 0, 0: shards yielded 4, 4, 3, 3).
    data = [{'label': i, 'name': f'item{i}'} for i in range(41)]
    shards = [loadr.Loader(data, batch=3, seed=2, workers=w, shard_id=s, num_shards=4)
              for s, w in zip(range(4), (0, 2, 0, 1))]
    try:
        epochs = [list(shard.epoch(1)) for shard in shards]
        assert [len(e) for e in epochs] == [4, 4, 4, 4]
        assert all(shard.batches_per_epoch() == 4 for shard in shards)
        assert [len(e[-1]['label']) for e in epochs] == [1, 1, 1, 2]
        stream = np.concatenate([b['label'] for k in range(4) for b in (e[k] for e in epochs)])
        assert stream.tolist() == Order(41, 2).indices(41, 41).tolist()
        assert [e[-1]['name'] for e in epochs][3] == [f'item{i}' for i in stream[-2:]]
        assert all(shard.save() == shards[0].save() for shard in shards)
        dropped = [list(shard.epoch(2, drop_last=True)) for shard in shards]
        assert [len(e) for e in dropped] == [3] * 4
        assert all(shard.batches_per_epoch(drop_last=True) == 3 for shard in shards)
    finally:
        for shard in shards:
            shard.close()


@pytest.mark.parametrize('workers', [0, 2])
def test_a_shard_left_no_position_yields_an_empty_batch(workers):
    data = [{'label': i, 'name': f'item{i}'} for i in range(38)]   # 2 left for 4 shards
    counts = []
    for s in range(4):
        with loadr.Loader(data, batch=3, workers=workers, shard_id=s, num_shards=4) as loader:
            batches = list(loader.epoch(0))
            counts.append([len(b['label']) for b in batches])
            last = batches[-1]
            if not len(last['label']):
                assert last['label'].shape == (0,) and last['name'] == []
    assert counts == [[3, 3, 3, 0], [3, 3, 3, 1], [3, 3, 3, 0], [3, 3, 3, 1]]


def test_len_is_a_type_error_that_says_what_to_use():
    with loadr.Loader(trivial(10), batch=3, workers=0) as loader:
        with pytest.raises(TypeError, match=r'batches_per_epoch\(\).*epoch\(e\)'):
            len(loader)
        assert loader                       # truthy all the same
        assert loader.batches_per_epoch() == 4 and loader.batches_per_epoch(True) == 3
        assert len(list(loader.epoch(0))) == loader.batches_per_epoch()


@pytest.mark.parametrize('workers', [0, 2])
def test_an_epoch_with_drop_last_run_twice_gives_the_epoch_twice(workers):
    data = trivial(23)
    with loadr.Loader(data, batch=5, fns=[noisy], seed=1, workers=workers) as loader:
        first = [batch_digest(b) for b in loader.epoch(0, drop_last=True)]
        assert loader.step == 23            # the dropped tail is passed: epoch 1 is next
        again = [batch_digest(b) for b in loader.epoch(0, drop_last=True)]
        it = loader.epoch(0, drop_last=True)
        stopped = [batch_digest(next(it)) for _ in range(4)]    # no StopIteration seen
        del it
        third = [batch_digest(b) for b in loader.epoch(0, drop_last=True)]
    assert len(first) == 4 and first == again == stopped == third


def test_epoch_resumes_inside_the_epoch():
    data = trivial(30)
    with loadr.Loader(data, batch=4, seed=6, workers=0) as loader:
        full = [b['label'].tolist() for b in loader.epoch(2)]
    with loadr.Loader(data, batch=4, seed=6, workers=0) as loader:
        loader.load({'step': 60 + 12, 'seed': 6})
        assert [b['label'].tolist() for b in loader.epoch(2)] == full[3:]


@pytest.mark.parametrize('workers', [0, 2])
def test_a_failing_fn_raises_the_original_type_with_index_and_position(workers):
    data = trivial(40)

    def explode(dp, seed):
        if dp['label'] == 17:
            raise KeyError('no such thing')
        return dp

    with loadr.Loader(data, batch=8, fns=[explode], seed=0, shuffle=False,
                      workers=workers) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(KeyError) as info:
            next(it)
            next(it)
        cause = info.value.__cause__
        assert isinstance(cause, WorkerError)
        assert cause.index == 17 and cause.position == 17
        assert 'dataset index 17' in str(cause) and 'stream position 17' in str(cause)
        assert 'explode' in cause.worker_traceback
        # The loader is still usable after the error: skip past it.
        loader.load({'step': 24, 'seed': 0})
        assert next(iter(loader))['label'].tolist() == list(range(24, 32))


@pytest.mark.parametrize('workers', [0, 1, 2])
@pytest.mark.parametrize('make', [lambda: memoryview(b'abc'), lambda: (i for i in range(3)),
                                  lambda: {'nested': memoryview(b'x')}])
def test_a_list_key_that_cannot_cross_processes_fails_alike_for_every_worker_count(workers, make):
    data = [{'x': i, 'blob': b'abc'} for i in range(20)]
    data[13] = {'x': 13, 'blob': make()}

    def fresh(dp, seed):
        return dict(dp, blob=make()) if dp['x'] == 13 else dp

    with loadr.Loader(data, batch=4, fns=[fresh], shuffle=False, workers=workers) as loader:
        it = iter(loader)
        for _ in range(3):
            assert next(it)['blob'] == [b'abc'] * 4
        with pytest.raises(SpecError, match="key 'blob' holds a") as info:
            next(it)
        assert info.value.index == 13
    with loadr.Loader(data, batch=4, fns=[fresh], shuffle=False, workers=workers,
                      on_error='skip', max_error_fraction=0.5) as loader:
        batches = [next(it) for it in [iter(loader)] for _ in range(5)]
        assert [b['blob'] for b in batches] == [[b'abc'] * 4] * 5    # replaced, alike


def test_spec_mismatch_names_index_and_key():
    data = [{'x': np.zeros(3)} for _ in range(10)]
    data[6] = {'x': np.zeros(4)}
    with loadr.Loader(data, batch=5, shuffle=False, workers=2) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(SpecError) as info:
            next(it)
        assert "'x'" in str(info.value) and info.value.index == 6


def test_a_killed_worker_is_replaced_and_its_batch_redone():
    data = trivial(500)

    slow = slowed(0.0005)
    with loadr.Loader(data, batch=20, fns=[slow], seed=3, workers=0) as ref:
        expected = stream_digests(ref, 40)
    with loadr.Loader(data, batch=20, fns=[slow], seed=3, workers=2) as loader:
        it = iter(loader)
        got = []
        for k in range(40):
            if k in (3, 11, 25):
                os.kill(loader.worker_pids[k % 2], signal.SIGKILL)
            got.append(batch_digest(next(it)))
        assert got == expected
        assert loader._pool.restarts >= 3


def test_a_sample_that_always_kills_its_worker_is_named():
    data = trivial(30)

    def crash(dp, seed):
        if dp['label'] == 13:
            os.kill(os.getpid(), signal.SIGKILL)
        return dp

    with loadr.Loader(data, batch=10, fns=[crash], shuffle=False, workers=2) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(WorkerError) as info:
            next(it)
        assert info.value.index == 13 and 'killed a worker 3 times' in str(info.value)


def test_close_leaves_no_process_and_no_shared_memory():
    loader = loadr.Loader(trivial(100), batch=10, workers=2)
    next(iter(loader))
    pids = loader.worker_pids
    assert len(pids) == 2 and our_segments()
    loader.close()
    loader.close()
    assert not our_segments()
    assert not any(alive(p) for p in pids)
    with pytest.raises(loadr.LoadrError):
        next(iter(loader))


def assert_collected(pids):
    """After the last reference to a loader is dropped: its workers and memory go."""
    gc.collect()
    wait_until(lambda: not any(alive(p) for p in pids),
               lambda: f'workers {[p for p in pids if alive(p)]} to end')
    assert not our_segments()


def test_garbage_collection_cleans_up():
    loader = loadr.Loader(trivial(100), batch=10, workers=2)
    it = iter(loader)
    next(it)
    pids = loader.worker_pids
    del loader, it
    assert_collected(pids)


def test_batches_stay_valid_and_ring_mode_reuses_memory():
    data = trivial(64)
    with loadr.Loader(data, batch=8, seed=1, workers=2, prefetch=2) as loader:
        it = iter(loader)
        kept = [next(it) for _ in range(6)]
        digests = [batch_digest(b) for b in kept]
    with loadr.Loader(data, batch=8, seed=1, workers=0) as ref:
        assert stream_digests(ref, 6) == digests
    with loadr.Loader(data, batch=8, seed=1, workers=2, prefetch=2, ring=True) as loader:
        it = iter(loader)
        for expected in digests:
            batch = next(it)
            assert batch_digest(batch) == expected
            assert not batch['vec'].flags.owndata


def test_held_batches_are_lent_without_a_copy_until_the_caller_keeps_too_many():
    data = trivial(512)
    with loadr.Loader(data, batch=8, seed=2, workers=0) as ref:
        expected = stream_digests(ref, 50)
    with loadr.Loader(data, batch=8, seed=2, workers=2, prefetch=2) as loader:
        it = iter(loader)
        # A training loop drops each batch soon: every one is lent, none copied.
        for k in range(20):
            batch = next(it)
            assert not batch['vec'].flags.owndata
            assert batch_digest(batch) == expected[k]
        del batch
        # A caller that keeps them all: the first LEASED_SLOTS are lent, the
        # rest are copies, and every one stays right while more arrive.
        kept = [next(it) for _ in range(20)]
        owned = [b['vec'].flags.owndata for b in kept]
        assert owned == [False] * LEASED_SLOTS + [True] * (20 - LEASED_SLOTS)
        assert [batch_digest(b) for b in kept] == expected[20:40]
        # A slice of a lent array keeps the whole slot from being reused.
        view, want = kept[0]['vec'][1:3], kept[0]['vec'][1:3].copy()
        del kept
        assert [batch_digest(next(it)) for _ in range(10)] == expected[40:50]
        assert np.array_equal(view, want)


def test_a_batch_kept_past_close_stays_valid_and_leaves_nothing_behind():
    loader = loadr.Loader(trivial(100), batch=10, seed=4, workers=2)
    it = iter(loader)
    batch = next(it)
    want = batch_digest(batch)
    pids = loader.worker_pids
    del loader, it
    assert_collected(pids)                      # the batch did not keep the loader alive
    assert batch_digest(batch) == want


def test_skip_policy_replaces_deterministically_and_gives_up_past_the_fraction():
    data = trivial(200)

    def flaky(dp, seed):
        if dp['label'] % 50 == 7:
            raise ValueError('bad sample')
        return dp

    runs = []
    for workers in (0, 2):
        with loadr.Loader(data, batch=20, fns=[flaky], seed=1, workers=workers,
                          on_error='skip', max_error_fraction=0.05) as loader:
            runs.append(stream_digests(loader, 10))
            assert loader.errors == 4 and loader.samples == 200
    assert runs[0] == runs[1]
    with loadr.Loader(data, batch=20, fns=[flaky], seed=1, workers=0, on_error='skip',
                      max_error_fraction=0.001) as loader:
        with pytest.raises(loadr.LoadrError, match='max_error_fraction'):
            stream_digests(loader, 10)


def bad_at(labels):
    def fn(dp, seed):
        if dp['label'] in labels:
            raise ValueError(f"bad sample {dp['label']}")
        return noisy(dp, seed)
    return fn


@pytest.mark.parametrize('workers', [0, 2])
def test_a_resumed_run_spends_the_error_budget_where_the_uninterrupted_one_does(workers):
    # Positions 3, 13, 23 and 33 fail: the 4th error (batch 3) is more than 5%
    # of the 40 datapoints made in this error window, so the run stops there, resumed
    # or not.
    options = dict(batch=10, fns=[bad_at({3, 13, 23, 33})], shuffle=False, workers=workers,
                   on_error='skip', max_error_fraction=0.05)
    with loadr.Loader(trivial(200), **options) as loader:
        it = iter(loader)
        expected = [batch_digest(next(it)) for _ in range(3)]
        with pytest.raises(loadr.LoadrError, match='4 of 40 datapoints failed'):
            next(it)
        assert loader.step == 30                # the batch that spent the budget is not done
    with loadr.Loader(trivial(200), **options) as loader:
        it = iter(loader)
        got = [batch_digest(next(it)) for _ in range(2)]
        state = json.loads(json.dumps(loader.save()))
    with loadr.Loader(trivial(200), **options) as resumed:
        resumed.load(state)
        it = iter(resumed)
        got.append(batch_digest(next(it)))
        with pytest.raises(loadr.LoadrError, match='4 of 40 datapoints failed'):
            next(it)
        assert resumed.step == 30
    assert got == expected
    assert state['skipped'] == [0, 2, 20]       # window, errors, samples


@pytest.mark.parametrize('workers', [0, 2])
def test_a_bad_datapoint_at_position_0_is_replaced_under_skip(workers):
    data = trivial(20)
    with loadr.Loader(data, batch=4, fns=[bad_at({0})], shuffle=False, workers=workers,
                      on_error='skip') as loader:
        assert loader.spec['vec'] == (np.dtype(np.float32), (16,))
        first = next(iter(loader))
    replacement = Order(20, 0, shuffle=False).alternative(0, 1)
    assert first['label'].tolist() == [replacement, 1, 2, 3]
    with loadr.Loader(data, batch=4, fns=[bad_at({0})], shuffle=False, workers=workers) as lo:
        with pytest.raises(ValueError, match='bad sample 0'):
            _ = lo.spec


class Reversed:
    """An order of the reader's own (a Mix has one): position p holds index n-1-(p % n)."""

    def __init__(self, n, seed):
        self.n, self.inner = n, Order(n, seed, shuffle=False)

    def indices(self, start, count):
        return self.n - 1 - self.inner.indices(start, count)

    def seeds(self, start, count):
        return self.inner.seeds(start, count)

    def index_at(self, position):
        return int(self.indices(position, 1)[0])

    def alternative(self, index, k):
        return (index + k) % self.n


class Seeded:
    """A reader with its own order and seeded reads (the two seams a Mix uses)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n + 5               # the order, not len(), says how long an epoch is

    def __getitem__(self, i):
        raise AssertionError('read_seeded is used instead')

    def read_seeded(self, index, seed):
        return {'i': index, 'seed': np.uint64(seed)}

    def make_order(self, seed, shuffle, version):
        return Reversed(self.n, seed)


@pytest.mark.parametrize('workers', [0, 2])
def test_a_reader_s_own_order_and_seeded_reads_are_used_by_every_worker_count(workers):
    with loadr.Loader(Seeded(10), batch=4, seed=3, workers=workers) as loader:
        assert loader.n == 10 and loader.batches_per_epoch() == 3
        batches = list(loader.epoch(1))
    assert [b['i'].tolist() for b in batches] == [[9, 8, 7, 6], [5, 4, 3, 2], [1, 0]]
    assert np.concatenate([b['seed'] for b in batches]).tolist() == \
        Order(10, 3, shuffle=False).seeds(10, 10)


def test_resume_far_away_in_a_huge_dataset():
    class Huge:
        def __len__(self):
            return 10**9

        def __getitem__(self, i):
            return {'i': i}

    with loadr.Loader(Huge(), batch=4, seed=0, workers=0) as loader:
        loader.load({'step': 10**12, 'seed': 0})
        batch = next(iter(loader))
        assert batch['i'].tolist() == Order(10**9, 0).indices(10**12, 4).tolist()


def test_bad_arguments_and_states():
    data = trivial(10)
    for kwargs in ({'batch': 0}, {'batch': 2, 'workers': -1}, {'batch': 2, 'shard_id': 2,
                   'num_shards': 2}, {'batch': 2, 'seed': -3}, {'batch': 2, 'on_error': 'x'}):
        with pytest.raises(ConfigError):
            loadr.Loader(data, **kwargs)
    with pytest.raises(ConfigError):
        loadr.Loader([], batch=2)
    loader = loadr.Loader(data, batch=2, workers=0)
    for state in ({'seed': 0}, {'step': -1, 'seed': 0}, {'step': 0, 'seed': 0, 'n': 11},
                  {'step': 0, 'seed': 0, 'shuffle': False}, {'step': 0, 'seed': 0, 'version': 99}):
        with pytest.raises(StateError):
            loader.load(state)


@pytest.mark.parametrize('name,value', [
    ('batch', 10**400), ('batch', 2.0), ('workers', 10**9), ('prefetch', 0),
    ('prefetch', -3), ('prefetch', 10**30), ('prefetch', 2.5), ('stats_every', 0),
    ('num_shards', True), ('num_shards', 10**20), ('max_error_fraction', float('nan')),
    ('max_error_fraction', float('inf')), ('max_error_fraction', -0.1),
    ('max_error_fraction', 1.5), ('max_error_fraction', 10**400), ('max_error_fraction', '1'),
    ('timeout', float('nan')), ('timeout', float('inf')), ('timeout', 0), ('timeout', -1),
    ('timeout', 10**400), ('timeout', '30')], ids=lambda v: str(v)[:12])
def test_every_numeric_setting_is_checked_once_finite_and_in_range(name, value):
    # nan and inf used to pass (no deadline at all, OverflowError later), prefetch=0 was
    # silently made 1; each is now a ConfigError naming the setting.
    kwargs = {'batch': 2, 'workers': 0, name: value}
    with pytest.raises(ConfigError, match=f'^{name} must be'):
        loadr.Loader(trivial(10), **kwargs)


def test_numeric_settings_in_range_are_kept():
    with loadr.Loader(trivial(10), batch=2, workers=1, prefetch=3, timeout=2.5,
                      max_error_fraction=np.float32(0.5), stats_every=np.int64(2)) as lo:
        assert (lo.prefetch, lo.timeout, lo.max_error_fraction) == (3, 2.5, 0.5)


class _Flaky:
    """An on_stats that raises at the calls listed (counted from 1)."""

    def __init__(self, *raise_at):
        self.raise_at, self.calls = set(raise_at), 0

    def __call__(self, stats):
        self.calls += 1
        if self.calls in self.raise_at:
            raise RuntimeError(f'on_stats call {self.calls}')


@pytest.mark.parametrize('workers', [0, 2])
def test_a_raising_on_stats_loses_no_batch_and_a_state_saved_then_has_it_due(workers):
    # The step had moved past the batch before on_stats ran: the batch was never
    # yielded, the iterator was over, and a state saved then counted it as consumed.
    made = dict(batch=3, seed=4, fns=[noisy], workers=workers)
    with loadr.Loader(trivial(20), **made) as loader:
        expected = stream_digests(loader, 12)
    with loadr.Loader(trivial(20), stats_every=2, on_stats=_Flaky(2, 3), **made) as loader:
        it = iter(loader)
        got, states = [], []
        while len(got) < 12:
            try:
                got.append(batch_digest(next(it)))
            except RuntimeError as exc:
                assert 'on_stats call' in str(exc)
                states.append((len(got), loader.save()))
        assert loader.stats().batches == 12
    assert got == expected
    assert [k for k, _ in states] == [3, 3]            # raised twice at the 4th batch
    for k, state in states:
        with loadr.Loader(trivial(20), **made) as fresh:
            fresh.load(state)
            assert stream_digests(fresh, 12 - k) == expected[k:]


def test_a_raising_on_stats_in_an_epoch_keeps_the_epoch_whole():
    made = dict(batch=4, seed=2, workers=0)
    with loadr.Loader(trivial(10), **made) as loader:
        expected = [batch_digest(b) for b in loader.epoch(1)]
    with loadr.Loader(trivial(10), stats_every=1, on_stats=_Flaky(3), **made) as loader:
        it, got = loader.epoch(1), []
        with pytest.raises(RuntimeError):
            for batch in it:
                got.append(batch_digest(batch))
        got += [batch_digest(b) for b in it]
    assert got == expected


def test_an_epoch_past_the_last_position_is_refused_when_asked_for():
    # epoch(10**30) was a ValueError ("positions ... out of range") at the first batch.
    loader = loadr.Loader(trivial(10), batch=2, workers=0)
    last = (2**63 - 1) // 10 - 1
    for bad in (10**30, last + 1, True, -1, 1.0):
        with pytest.raises(ConfigError, match='^epoch must be'):
            loader.epoch(bad)
    assert len(next(iter(loader.epoch(last)))['label']) == 2


def test_the_default_start_method_is_fork_until_jax_starts_its_threads():
    """Importing JAX (as loadr.jax or a test collector does) starts no thread: fork stays
    (taking it away sent every later Loader of the process through a pickle); once JAX's
    backends run, their threads make a fork unsafe and workers start another way."""
    import importlib.util
    import subprocess
    import sys
    if importlib.util.find_spec('jax') is None:
        pytest.skip('jax is not installed (the adapters extra)')
    code = ('import jax, loadr.jax; from loadr.workers.starting import default_start_method as d; '
            'a = d(); jax.devices(); print(a, d())')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ['fork', 'forkserver']
