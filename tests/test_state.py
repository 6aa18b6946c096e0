"""The Loader's state: the shared save/load harness, the fingerprint, old states, bad states."""

import itertools
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import loadr
from loadr import fns as loadr_fns
from loadr.errors import LoadrError, StateError
from loadr.order import Order

from .loader_helpers import batch_digest, noisy, stream_digests, trivial
from .state_harness import Stateful, run_save_load_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def next_epoch(loader):
    return loader.epoch(loader.step // loader.n)


@pytest.mark.parametrize('shard_id,num_shards', [(0, 1), (1, 2)])
def test_the_loader_passes_the_save_load_harness_by_epochs(shard_id, num_shards):
    data = trivial(23)
    covered = run_save_load_state(Stateful(
        make=lambda w: loadr.Loader(data, batch=5 if num_shards == 1 else 3, fns=[noisy],
                                    seed=4, workers=w, shard_id=shard_id,
                                    num_shards=num_shards),
        epoch=next_epoch), worker_counts=(0, 1, 2), epochs=2)
    assert covered['batches'] >= 8 and covered['resumed'] == 3 * (covered['batches'] + 1)


def test_the_loader_passes_the_save_load_harness_on_the_endless_stream():
    data = trivial(30)
    covered = run_save_load_state(Stateful(
        make=lambda w: loadr.Loader(data, batch=7, fns=[noisy], seed=9, workers=w,
                                    on_error='skip'),
        epoch=lambda loader: itertools.islice(iter(loader), 4), endless=True),
        worker_counts=(0, 2), epochs=3)
    assert covered['batches'] == 12


class Files:
    """A reader with an identity (as loadr's readers have): which files, what sizes."""

    def __init__(self, n, sizes):
        self.n, self.sizes = n, sizes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {'label': i, 'vec': np.full(16, i, np.float32)}

    def identity(self):
        return {'format': 'files', 'datapoints': self.n, 'files': self.sizes}


def test_a_state_is_small_json_and_names_what_makes_the_stream():
    fns = [loadr_fns.flip(key='x', p=0.0)] + [noisy] * 40
    with loadr.Loader(trivial(10), batch=2, fns=fns, workers=0, shuffle=False) as loader:
        state = loader.save()
    assert len(json.dumps(state)) < 1024
    assert json.loads(json.dumps(state)) == state
    assert state['version'] == 2 and state['order'] == loadr.order.ORDER_VERSION
    assert state['dataset']['kind'] == 'list' and len(state['fns']) == 41
    assert state['global_batch'] == 2 and state['shuffle'] is False and state['n'] == 10


def test_a_state_is_the_same_in_another_process():
    # Fns' default reprs carry memory addresses; the fingerprint must not.
    code = ('import json, loadr; from tests.loader_helpers import noisy, trivial; '
            'print(json.dumps(loadr.Loader(trivial(10), batch=2, fns=[noisy, lambda d, seed: d], '
            'workers=0).save()))')
    runs = [subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                           text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    out = [r.stdout for r in runs]
    assert out[0] == out[1]
    assert json.loads(out[0])['fns'][0] == loadr.Loader(trivial(10), batch=2, fns=[noisy],
                                                        workers=0).save()['fns'][0]


@pytest.mark.parametrize('change,what', [
    (dict(seed=3), 'seed: the state was saved with seed 1, this loader has seed 3'),
    (dict(shuffle=False), 'shuffle: the state was saved with shuffle=True'),
    (dict(batch=4), 'global batch: the state was saved with 2 datapoints per step'),
    (dict(fns=[]), 'fns: the state was saved with 1 fns, this loader has 0'),
    (dict(fns=[loadr_fns.flip(key='vec', p=0.5)]), "this loader's: flip(key='vec', p=0.5)"),
    (dict(reader=Files(12, {'a': 5})), 'dataset size: the state was saved for 10 datapoints'),
    (dict(reader=Files(10, {'a': 6})), 'dataset: the state was saved reading files'),
])
def test_load_refuses_a_state_of_another_stream_and_says_what_differs(change, what):
    made = dict(reader=Files(10, {'a': 5}), batch=2, seed=1, fns=[noisy], workers=0)
    with loadr.Loader(**made) as loader:
        it = iter(loader)
        next(it)
        state = loader.save()
        expected = [batch_digest(next(it)) for _ in range(3)]
    with loadr.Loader(**{**made, **change}) as other:
        with pytest.raises(StateError) as info:
            other.load(state)
        assert what in str(info.value) and 'strict=False' in str(info.value)
        assert other.step == 0                  # nothing changed
    if 'reader' not in change and 'batch' not in change and 'fns' not in change \
            and 'shuffle' not in change:
        with loadr.Loader(**{**made, **change}) as other:
            other.load(state, strict=False)     # goes on with the state's seed
            assert stream_digests(other, 3) == expected


def test_strict_false_logs_what_differs(caplog):
    with loadr.Loader(trivial(10), batch=2, seed=1, workers=0) as loader:
        state = loader.save()
    with loadr.Loader(trivial(10), batch=2, seed=2, workers=0) as other, \
            caplog.at_level(logging.WARNING, logger='loadr'):
        other.load(state, strict=False)
        assert other.seed == 1
    assert 'seed: the state was saved with seed 1' in caplog.text


@pytest.mark.parametrize('workers', [0, 2])
def test_a_state_of_loadr_0_1_replays_its_stream_with_order_version_1(workers, caplog):
    data = trivial(50)
    v1 = {'version': 1, 'step': 24, 'seed': 7, 'n': 50, 'shuffle': True, 'global_batch': 8}
    with loadr.Loader(data, batch=8, seed=7, workers=workers) as loader, \
            caplog.at_level(logging.WARNING, logger='loadr'):
        it = iter(loader)
        next(it)                                # the pool runs with the default order
        loader.load(v1)
        got = [next(it)['label'].tolist() for _ in range(10)]   # crosses epochs 0-1
        loader.load(v1)
        next(it)
        assert loader.order_version == 1 and loader.save()['order'] == 1
    old = Order(50, 7, True, version=1)
    assert got == [old.indices(24 + 8 * k, 8).tolist() for k in range(10)]
    assert caplog.text.count('was saved with order version 1') == 1    # said once


def test_a_state_of_loadr_0_1_without_shuffle_keeps_the_order():
    v1 = {'version': 1, 'step': 4, 'seed': 0, 'n': 10, 'shuffle': False, 'global_batch': 2}
    with loadr.Loader(trivial(10), batch=2, shuffle=False, workers=0) as loader:
        loader.load(v1)
        assert next(iter(loader))['label'].tolist() == [4, 5]
        assert loader.order_version == loadr.order.ORDER_VERSION


@pytest.mark.parametrize('state', [
    {'step': 2**63, 'seed': 0}, {'step': 2**64, 'seed': 0}, {'step': 1.0, 'seed': 0},
    {'step': True, 'seed': 0}, {'step': 0, 'seed': 0, 'version': 'x'},
    {'step': 0, 'seed': 0, 'version': True}, {'step': 0, 'seed': 0, 'version': 0},
    {'step': 0, 'seed': 0, 'version': 3}, {'step': 0, 'seed': 2**64},
    {'step': 0, 'seed': 0, 'order': 99}, {'step': 0, 'seed': 0, 'shuffle': 'yes'},
    {'step': 0, 'seed': 0, 'fns': 'abc'}, {'step': 0, 'seed': 0, 'skipped': [1, 2]},
    {'step': 0}, [('step', 0)],
])
def test_load_refuses_malformed_states_with_a_state_error(state):
    with loadr.Loader(trivial(10), batch=2, workers=0) as loader:
        with pytest.raises(StateError):
            loader.load(state)
        with pytest.raises(StateError):
            loader.load(state, strict=False)


def test_the_largest_step_loads():
    with loadr.Loader(trivial(10), batch=2, workers=0) as loader:
        loader.load({'step': 2**63 - 1, 'seed': 0})
        assert loader.step == 2**63 - 1


@pytest.mark.parametrize('workers', [0, 1, 2])
def test_next_after_close_says_the_loader_is_closed(workers):
    loader = loadr.Loader(trivial(40), batch=4, workers=workers)
    it = iter(loader)
    next(it)
    epoch = loader.epoch(0)
    next(epoch)
    loader.close()
    for stream in (it, epoch, iter(loader)):
        with pytest.raises(LoadrError, match='this loader is closed'):
            next(stream)


def _mix():
    return loadr.Mix({'a': trivial(30), 'b': trivial(17)}, weights={'a': 2, 'b': 1})


@pytest.mark.parametrize('workers', [0, 2])
@pytest.mark.parametrize('make', [trivial, _mix], ids=['list', 'mix'])
def test_a_refused_load_leaves_the_running_iteration_as_it_was(workers, make):
    # Every load is checked in full before it touches the loader (a Mix is loaded
    # by the same path): the iteration in progress goes on exactly as it would have.
    made = dict(batch=4, seed=1, fns=[noisy], workers=workers)
    with loadr.Loader(make(), **made) as loader:
        expected = stream_digests(loader, 8)
    with loadr.Loader(make(), **made) as loader:
        it = iter(loader)
        got = [batch_digest(next(it)) for _ in range(3)]
        state = loader.save()
        other_order = {**state, 'order': 1 if state['order'] != 1 else 2, 'seed': 5}
        for bad in ({**state, 'seed': 2}, {**state, 'n': state['n'] + 1},
                    {**state, 'fns': []}, {**state, 'global_batch': 8},
                    {**state, 'step': -4}, {**state, 'skipped': [1]}, other_order,
                    {**state, 'version': 99}, {**state, 'step': 'x'}):
            with pytest.raises(StateError):
                loader.load(bad)
            assert loader.save() == state
        got += [batch_digest(next(it)) for _ in range(5)]
    assert got == expected


def test_built_in_fns_keep_their_fingerprints_and_pickles_across_module_moves():
    # Saved states digest each fn's name (its repr; a partial's repr names the class
    # with its module): these values were computed before loadr/fns.py became a
    # package, and a state saved then must still load.
    import functools
    import pickle

    from loadr.state import fingerprint
    F = loadr_fns
    fns = [F.decode_jpeg(size=64), F.random_resized_crop(size=32), F.flip(), F.normalize(),
           F.sample_frames(num=3), F.label_to_index(mapping={'a': 0}), F.select(keys=['image']),
           functools.partial(F.flip, p=1.0)]
    assert fingerprint([{'x': 1}] * 3, fns, 3, True, 2, 2)['fns'] == [
        'fb18af', '3dd94e', 'd0f51d', '94945b', '555ff6', 'd5ccbd', 'df1b0d', 'ec7367']
    # Workers and old pickles find every fn class at its public path.
    assert b'\x8c\tloadr.fns\x94\x8c\x04flip' in pickle.dumps(F.flip(), protocol=4)
    for fn in fns[:-1]:
        assert type(fn).__module__ == 'loadr.fns'
        assert pickle.loads(pickle.dumps(fn)) == fn


def test_check_refuses_a_state_that_differs_only_when_strict():
    mine = {'seed': 1, **loadr.state.fingerprint(trivial(10), [noisy], 10, True, 2, 2)}
    saved = {**mine, 'step': 4, 'seed': 2}
    with pytest.raises(StateError, match='seed: the state was saved with seed 2'):
        loadr.state.check(saved, mine, [noisy])
    parsed, diffs = loadr.state.check(saved, mine, [noisy], strict=False)
    assert parsed['step'] == 4 and diffs == [
        'seed: the state was saved with seed 2, this loader has seed 1']
    assert loadr.state.check({**saved, 'seed': 1}, mine, [noisy]) == ({**saved, 'seed': 1}, [])
