"""loadr.torch.DataLoader: epochs, ranks, zero copy and resume (torchdata's scenarios).

The resume scenarios port torchdata's test/stateful_dataloader/test_state_dict.py
(interrupt at every step for several worker counts, state before iteration,
end of epoch, many epochs, JSON round trip, another worker count) to ours.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from .conftest import in_ci

try:
    import torch
except ImportError:
    if in_ci():
        raise
    pytest.skip('torch is not installed (pip install torch==2.13.0)', allow_module_level=True)

from loadr.errors import ConfigError, StateError, WorkerError  # noqa: E402
from loadr.torch import DataLoader, rank_and_world_size, to_torch  # noqa: E402
from loadr.torch._tensors import SlotPinner  # noqa: E402

from .loader_helpers import batch_digest, noisy, trivial  # noqa: E402
from .state_harness import Stateful, run_save_load_state  # noqa: E402

N = 23                                   # 6 batches of 4 per epoch, the last one short


def digest(batch) -> str:
    return batch_digest({k: v.numpy() if isinstance(v, torch.Tensor) else v
                         for k, v in batch.items()})


def make(workers=0, n=N, batch=4, seed=3, **kw):
    return DataLoader(trivial(n), batch_size=batch, fns=[noisy], seed=seed,
                      num_workers=workers, **kw)


def epochs(dl, count) -> list[list[str]]:
    return [[digest(b) for b in dl] for _ in range(count)]


@pytest.fixture(scope='module')
def reference() -> list[list[str]]:
    """Three epochs of the uninterrupted run, by digest, epoch by epoch."""
    with make() as dl:
        return epochs(dl, 3)


def flat(reference, epoch, batch):
    """The digests from (epoch, batch) to the end of that epoch."""
    return reference[epoch][batch:]


# -- epochs ------------------------------------------------------------------

@pytest.mark.parametrize('workers', [0, 2])
def test_each_iter_is_one_epoch_and_len_agrees(workers, reference):
    with make(workers) as dl:
        assert len(dl) == 6
        labels = []
        for e in range(3):
            batches = list(dl)
            assert len(batches) == len(dl)
            assert [digest(b) for b in batches] == reference[e]
            assert [len(b['label']) for b in batches] == [4, 4, 4, 4, 4, 3]
            assert all(isinstance(b['vec'], torch.Tensor) and b['vec'].dtype == torch.float32
                       for b in batches)
            got = torch.cat([b['label'] for b in batches]).tolist()
            assert sorted(got) == list(range(N))          # every sample once per epoch
            labels.append(got)
        assert labels[0] != labels[1] != labels[2]        # a fresh shuffle each epoch


def test_drop_last_drops_the_short_batch(reference):
    with make(drop_last=True) as dl:
        assert len(dl) == 5
        first = list(dl)
        assert [len(b['label']) for b in first] == [4] * 5
        assert [digest(b) for b in first] == reference[0][:5]
        second = list(dl)                  # epoch 1 starts at its own first position
        assert [digest(b) for b in second] == reference[1][:5]


@pytest.mark.parametrize('workers', [0, 2])
def test_a_new_iter_after_a_break_starts_the_next_epoch(workers, reference):
    with make(workers) as dl:
        for k, _batch in enumerate(dl):
            if k == 2:
                break
        # As in torch: the abandoned epoch is over, the next iter() is the next epoch.
        old = iter(dl)
        assert digest(next(old)) == reference[1][0]
        assert [digest(b) for b in dl] == reference[2]
        assert next(old, None) is None     # a superseded iterator yields nothing more


def test_an_iterator_never_advanced_costs_no_epoch(reference):
    with make() as dl:
        iter(dl)                     # Lightning does this once, to check the loader
        assert [digest(b) for b in dl] == reference[0]
        probe = iter(dl)
        assert dl.state_dict()['epoch'] == 1        # what that iterator would start
        assert [digest(b) for b in dl] == reference[1]
        assert next(probe, None) is None            # a newer one started first
        assert [digest(b) for b in dl] == reference[2]


@pytest.mark.parametrize('workers', [0, 2])
def test_a_state_loaded_during_an_epoch_moves_the_iteration_in_progress(workers, reference):
    with make(workers) as dl:
        it = iter(dl)
        head = [digest(next(it)) for _ in range(2)]
        dl.load_state_dict(dl.state_dict())          # changes nothing
        head.append(digest(next(it)))
        state = dl.state_dict()
        head.append(digest(next(it)))
        dl.load_state_dict(state)                    # one batch back
        assert head + [digest(b) for b in it] == reference[0][:4] + reference[0][3:]
        later = iter(dl)
        dl.load_state_dict(state)                    # an iterator not started yet
        assert [digest(b) for b in later] == reference[0][3:]
        assert [digest(b) for b in dl] == reference[1]


def test_tensors_are_the_lent_shared_memory_not_copies(reference):
    def in_loadr_shm(t) -> bool:
        address = t.data_ptr()
        with open('/proc/self/maps') as f:
            for line in f:
                parts = line.split()
                # /dev/shm/loadr-<pid>-..., a directory of that name, or /memfd:loadr-...
                if len(parts) >= 6 and re.search(r'(^|[/:])loadr-', parts[5]):
                    lo, hi = (int(x, 16) for x in parts[0].split('-'))
                    if lo <= address < hi:
                        return True
        return False

    with make(2, prefetch=2) as dl:
        for batch in dl:                   # a training loop: every batch is lent
            assert in_loadr_shm(batch['vec']) and in_loadr_shm(batch['label'])
            assert batch['vec'].numpy().base is not None     # a view, not its own memory
        # A batch kept while the epoch goes on stays right (its slot is not reused).
        kept, rest = None, []
        for batch in dl:
            kept = batch if kept is None else kept
            rest.append(digest(batch))
        assert in_loadr_shm(kept['vec']) and digest(kept) == reference[1][0]
        assert rest == reference[1]


def test_values_torch_cannot_hold_stay_as_they_are():
    data = [{'x': np.int16(i), 'name': f'item{i}', 'u': np.array([i], np.uint32)}
            for i in range(5)]
    with DataLoader(data, batch_size=2, shuffle=False, num_workers=0) as dl:
        first = next(iter(dl))
    assert first['x'].dtype == torch.int16 and first['x'].tolist() == [0, 1]
    assert first['u'].dtype == torch.uint32
    assert first['name'] == ['item0', 'item1']
    pair = to_torch((np.arange(3), np.array(['a', 'b'])))
    assert isinstance(pair, tuple) and isinstance(pair[0], torch.Tensor)
    assert isinstance(pair[1], np.ndarray)


# -- ranks -------------------------------------------------------------------

@pytest.mark.parametrize('n,drop_last', [(23, False), (20, False), (20, True)])
def test_ranks_split_each_global_batch_with_no_sample_twice(n, drop_last):
    # n=23: the last global batch has 5 rows for 3 ranks; n=20: 2 rows, one rank gets none.
    world, per_rank = 3, 2
    with make(n=n, batch=per_rank * world, drop_last=drop_last) as one:
        whole = [list(one) for _ in range(2)]
    ranks = [make(n=n, batch=per_rank, rank=r, world_size=world, drop_last=drop_last,
                  workers=(0, 1, 0)[r]) for r in range(world)]
    try:
        assert len({len(dl) for dl in ranks}) == 1 and len(ranks[0]) == len(whole[0])
        for e in range(2):
            parts, inside = [], []
            for dl in ranks:
                parts.append([])
                for batch in dl:
                    parts[-1].append(batch)
                    state = dl.state_dict()
                inside.append(state)       # after the last batch, inside the loop
            assert all(len(p) == len(ranks[0]) for p in parts)     # nobody waits in DDP
            assert inside[1] == inside[0] and inside[2] == inside[0]
            for k, global_batch in enumerate(whole[e]):
                for key in ('label', 'vec', 'seed'):
                    joined = torch.cat([p[k][key] for p in parts])
                    assert torch.equal(joined, global_batch[key])
    finally:
        for dl in ranks:
            dl.close()


def test_the_last_global_batch_is_split_evenly_between_ranks():
    # 20 = 3 * 6 + 2: the last global batch has 2 rows for 3 ranks, so 1, 1 and 0.
    ranks = [make(n=20, batch=2, rank=r, world_size=3) for r in range(3)]
    try:
        last = [list(dl)[-1] for dl in ranks]
        assert sorted(len(b['label']) for b in last) == [0, 1, 1]
        empty = min(last, key=lambda b: len(b['label']))
        assert empty['vec'].shape == (0, 16) and empty['vec'].dtype == torch.float32
    finally:
        for dl in ranks:
            dl.close()


def test_a_four_rank_state_resumes_on_two_ranks_and_on_one():
    def joined(parts) -> str:
        return digest({k: torch.cat([p[k] for p in parts]) for k in parts[0]})

    def ranks(world):
        return [make(batch=8 // world, rank=r, world_size=world, workers=r % 2)
                for r in range(world)]

    with make(batch=8) as one:                    # the same global batch of 8
        whole = epochs(one, 2)
    four = ranks(4)
    its = [iter(dl) for dl in four]
    for k in range(2):
        assert joined([next(it) for it in its]) == whole[0][k]
    state = json.loads(json.dumps(four[0].state_dict()))
    for dl in four:
        dl.close()
    for world in (2, 1):
        resumed = ranks(world)
        resumed[0].load_state_dict(state)
        for dl in resumed[1:]:
            dl.load_state_dict(state)
        for want in (whole[0][2:], whole[1]):
            parts = [list(dl) for dl in resumed]
            assert [joined(batch) for batch in zip(*parts)] == want
        for dl in resumed:
            dl.close()


def test_rank_and_world_size_come_from_the_environment(monkeypatch):
    monkeypatch.setenv('RANK', '2')
    monkeypatch.setenv('WORLD_SIZE', '4')
    assert rank_and_world_size() == (2, 4)
    assert rank_and_world_size(rank=1) == (1, 4)
    monkeypatch.delenv('RANK')
    monkeypatch.delenv('WORLD_SIZE')
    assert rank_and_world_size() == (0, 1)
    monkeypatch.setenv('RANK', 'x')
    with pytest.raises(ConfigError, match='RANK'):
        rank_and_world_size()
    with pytest.raises(ConfigError, match='rank'):
        rank_and_world_size(3, 3)


# -- resume: torchdata's scenarios ---------------------------------------------

def test_state_is_small_json_and_the_same_on_every_rank():
    ranks = [make(rank=r, world_size=2) for r in range(2)]
    try:
        its = [iter(dl) for dl in ranks]
        for _ in range(2):
            for it in its:
                next(it)
        states = [dl.state_dict() for dl in ranks]
        assert states[0] == states[1]
        text = json.dumps(states[0])
        assert len(text) < 1024 and json.loads(text) == states[0]
    finally:
        for dl in ranks:
            dl.close()


@pytest.mark.parametrize('workers,resume_workers', [(0, 0), (0, 3), (3, 0), (1, 2)])
def test_interrupt_at_every_step_resumes_exactly(workers, resume_workers, reference):
    """torchdata's _run_and_checkpoint at every interrupt, on two epochs, and
    (which torchdata refuses: TestNumWorkersMismatch) on another worker count."""
    with make(workers) as dl, make(resume_workers) as resumed:
        starts = [dl.state_dict()]
        list(dl)
        starts.append(dl.state_dict())                # after the loop: epoch 1 is due
        for epoch in range(2):
            for interrupt in range(len(dl) + 1):
                dl.load_state_dict(starts[epoch])
                it = iter(dl)
                head = [digest(next(it)) for _ in range(interrupt)]
                state = json.loads(json.dumps(dl.state_dict()))
                rest = [digest(b) for b in it]
                assert head + rest == reference[epoch]
                resumed.load_state_dict(state)
                assert [digest(b) for b in resumed] == rest
                # ... and after it, the next epoch, as in the uninterrupted run.
                assert [digest(b) for b in resumed] == reference[epoch + 1]


def harness_epoch(dl):
    """One epoch for the shared harness, which wants the next epoch's batches after a
    state taken after an epoch's last batch: ours (torchdata's rule, tested below)
    first finishes that epoch, with no batch."""
    it = iter(dl)
    first = next(it, None)
    if first is None:
        it = iter(dl)
        first = next(it, None)
    if first is not None:
        yield first
        del first
        yield from it


def test_the_dataloader_passes_the_shared_save_load_harness():
    covered = run_save_load_state(Stateful(
        make=lambda workers: make(workers, batch=3, rank=1, world_size=2),
        epoch=harness_epoch, save=lambda dl: dl.state_dict(),
        load=lambda dl, state: dl.load_state_dict(state), digest=digest),
        worker_counts=(0, 1, 2), epochs=2)
    assert covered == {'batches': 8, 'resumed': 3 * 9}


def test_resume_in_a_new_dataloader_on_another_worker_count(reference):
    for workers, interrupt in ((3, 0), (3, 1), (0, 4)):
        with make(workers) as dl:
            it = iter(dl)
            for _ in range(interrupt):
                next(it)
            state = dl.state_dict()
        with make(3 - workers) as fresh:
            fresh.load_state_dict(json.loads(json.dumps(state)))
            assert [digest(b) for b in fresh] == reference[0][interrupt:]


def test_state_before_iteration(reference):
    """TestSnapshotZero and TestInitialState."""
    with make(2) as dl:
        state0 = dl.state_dict()                      # before any iter()
        assert [digest(b) for b in dl] == reference[0]
        it = iter(dl)
        next(it), next(it)
        dl.load_state_dict(state0)
        assert dl.state_dict() == state0              # a loaded state reads back as it was
        assert [digest(b) for b in dl] == reference[0]
        assert [digest(b) for b in dl] == reference[1]
    with make(2) as dl:
        it = iter(dl)
        state_iter = dl.state_dict()                  # after iter(), before next()
        assert [digest(b) for b in it] == reference[0]
        dl.load_state_dict(state_iter)
        assert [digest(b) for b in dl] == reference[0]
    with make(0) as dl:                               # load, then state (test_load_then_state)
        it = iter(dl)
        for _ in range(3):
            next(it)
        dl.load_state_dict(state0)
        assert dl.state_dict() == state0
        assert [digest(b) for b in dl] == reference[0]
    with make(1) as dl:                               # load {} changes nothing
        dl.load_state_dict({})
        assert [digest(b) for b in dl] == reference[0]


@pytest.mark.parametrize('workers', [0, 2])
def test_a_state_at_the_end_of_an_epoch_behaves_as_torchdata(workers, reference):
    """TestEndOfEpochBehavior: inside the loop after the last batch, the resumed
    run first finishes that (empty) epoch; after the loop, the next epoch is due.
    TestSnapshotEnd: after list(dl), the next list(dl) is the next epoch."""
    with make(workers) as dl:
        for _batch in dl:
            inside = dl.state_dict()
        outside = dl.state_dict()
        assert [digest(b) for b in dl] == reference[1]
    with make(workers) as dl:
        dl.load_state_dict(inside)
        assert list(dl) == []
        assert [digest(b) for b in dl] == reference[1]
    with make(workers) as dl:
        dl.load_state_dict(outside)
        assert [digest(b) for b in dl] == reference[1]
    with make(workers, drop_last=True) as dl:         # the same with a dropped tail
        for _batch in dl:
            inside = dl.state_dict()
        outside = dl.state_dict()
    with make(workers, drop_last=True) as dl:
        dl.load_state_dict(inside)
        assert list(dl) == []
        assert [digest(b) for b in dl] == reference[1][:5]
        dl.load_state_dict(outside)
        assert [digest(b) for b in dl] == reference[1][:5]


@pytest.mark.parametrize('workers', [0, 2])
def test_many_epochs_resume_where_they_stopped(workers, reference):
    """TestMultiEpochSDL and TestMultiEpochState: two epochs, a state, two more."""
    with make(workers) as dl:
        first = epochs(dl, 2)
        state = dl.state_dict()
        assert first == reference[:2]
    with make(2 - workers) as dl:
        it = iter(dl)
        next(it), next(it)
        dl.load_state_dict(state)
        assert epochs(dl, 1) == reference[2:3]


def test_a_failing_fn_raises_its_own_error_on_the_rank(reference):
    def bad(dp, seed):
        if dp['label'] == 5:
            raise ValueError('datapoint 5 is broken')
        return dp

    with DataLoader(trivial(N), batch_size=4, fns=[bad], seed=3, num_workers=2) as dl:
        with pytest.raises(ValueError, match='datapoint 5 is broken') as info:
            list(dl)
    assert isinstance(info.value.__cause__, WorkerError)


def test_bad_arguments_and_states():
    with pytest.raises(ConfigError, match='batch_size'):
        DataLoader(trivial(5), batch_size=2, batch=3)
    for bad in (0, 2.0, 10**400, None):             # named as the caller named them
        with pytest.raises(ConfigError, match='^batch_size must be'):
            DataLoader(trivial(5), batch_size=bad)
    for bad in (-1, 1.5, 10**9, 'many'):
        with pytest.raises(ConfigError, match='^num_workers must be'):
            DataLoader(trivial(5), batch_size=2, num_workers=bad)
    with pytest.raises(ConfigError, match='num_workers'):
        DataLoader(trivial(5), batch_size=2, workers=3)
    with make() as dl:
        for bad in ({'epoch': 0}, {'epoch': -1, 'loader': {}}, [1], {'epoch': True, 'loader': {}}):
            with pytest.raises(StateError):
                dl.load_state_dict(bad)
        with pytest.raises(StateError, match='newer'):
            dl.load_state_dict({**dl.state_dict(), 'version': 99})
        with pytest.raises(StateError, match='past the end'):
            dl.load_state_dict({'epoch': 0, 'loader': {**dl.state_dict()['loader'],
                                                       'step': 3 * N}})
    with pytest.raises(Exception, match='closed'):
        iter(dl)


def _malformed(good: dict, n: int) -> list:
    """(state, field the StateError must name): wrong types and values everywhere."""
    loader = good['loader']
    return [
        ({**good, 'version': '1'}, 'version'), ({**good, 'version': 1.5}, 'version'),
        ({**good, 'version': None}, 'version'), ({**good, 'version': 0}, 'version'),
        ({**good, 'epoch': 10**30}, 'epoch'), ({**good, 'epoch': 2.0}, 'epoch'),
        ({**good, 'epoch': '0'}, 'epoch'), ({**good, 'epoch': 5}, 'epoch'),
        ({**good, 'epoch': 2**62}, 'epoch'),
        ({'version': 1, 'epoch': 0, 'loader': {**loader, 'step': 2 * n}}, 'epoch'),
        ({**good, 'loader': {**loader, 'step': '4'}}, 'step'),
        ({**good, 'loader': {**loader, 'step': 2.0**70}}, 'step'),
        ({**good, 'loader': {**loader, 'seed': [3]}}, 'seed'),
        ({**good, 'loader': {**loader, 'n': 'x'}}, 'n must'),
        ({**good, 'loader': {**loader, 'shuffle': 1}}, 'shuffle'),
        ({**good, 'loader': {**loader, 'fns': 'abc'}}, 'fns'),
        ({**good, 'loader': {**loader, 'dataset': []}}, 'dataset'),
        ({**good, 'loader': {**loader, 'order': 'v2'}}, 'order'),
        ({**good, 'loader': {**loader, 'skipped': [0, -1, 2]}}, 'skipped'),
        ({**good, 'loader': None}, 'loader'),
    ]


def test_malformed_states_are_refused_at_load_naming_the_field(reference):
    # A non-integer version was a TypeError, a huge epoch a struct.error at the first
    # batch, an epoch ahead of its step was accepted (and skipped epochs).
    with make() as dl:
        it = iter(dl)
        head = [digest(next(it)) for _ in range(2)]
        good = json.loads(json.dumps(dl.state_dict()))
        for bad, field in _malformed(good, N):
            with pytest.raises(StateError, match=field):
                dl.load_state_dict(bad)
        dl.load_state_dict(good)                         # the good one still loads
        assert head + [digest(b) for b in it] == reference[0]


@pytest.mark.parametrize('workers', [0, 2])
def test_a_refused_load_changes_nothing(workers, reference):
    # A state refused at its epoch check had already moved the loader: the running
    # epoch lost its last batches.
    with make(workers) as dl:
        it = iter(dl)
        got = [digest(next(it)) for _ in range(2)]
        state = dl.state_dict()
        refused = [{'epoch': 0, 'loader': {**state['loader'], 'step': 2 * N}},
                   {'epoch': 1, 'loader': state['loader']},
                   {**state, 'version': 'x'},
                   {**state, 'loader': {**state['loader'], 'seed': 99}},
                   {**state, 'loader': {**state['loader'], 'n': N + 1}}]
        for bad in refused:
            with pytest.raises(StateError):
                dl.load_state_dict(bad)
            assert dl.state_dict() == state
        got += [digest(b) for b in it]
        assert got == reference[0]
        assert epochs(dl, 1) == reference[1:2]


@pytest.mark.parametrize('workers', [0, 2])
def test_a_raising_on_stats_loses_no_batch_of_the_epoch(workers, reference):
    # The exception ended the epoch's generator: the next next() ended the epoch
    # short, the due batch was never yielded, and a state saved then had it consumed.
    calls = []

    def on_stats(stats):
        calls.append(stats.batches)
        if len(calls) in (2, 4):
            raise RuntimeError('on_stats failed')

    with make(workers, stats_every=2, on_stats=on_stats) as dl:
        it, got, states = iter(dl), [], []
        while True:
            try:
                got.append(digest(next(it)))
            except RuntimeError:
                states.append((len(got), dl.state_dict()))
            except StopIteration:
                break
        assert got == reference[0]
        assert epochs(dl, 1) == reference[1:2]
    assert [k for k, _ in states] == [3, 5]
    for k, state in states:
        with make(workers) as fresh:
            fresh.load_state_dict(state)
            assert [digest(b) for b in fresh] == reference[0][k:]


# -- torch's other arguments ---------------------------------------------------

@pytest.mark.parametrize('name,value,way', [
    ('collate_fn', lambda batch: batch, 'fns='), ('sampler', [0, 1], 'shuffle='),
    ('batch_sampler', [[0, 1]], 'batch_size='), ('pin_memory_device', 'cuda', 'device='),
    ('in_order', False, 'in order'), ('snapshot_every_n_steps', 10, 'state_dict')])
def test_torch_arguments_without_a_meaning_here_say_the_loadr_way(name, value, way):
    # They used to fail with "Loader.__init__() got an unexpected keyword argument".
    with pytest.raises(TypeError, match=f'DataLoader does not take {name}=') as info:
        make(**{name: value})
    assert way in str(info.value)


def test_torch_defaults_pass_and_unknown_arguments_name_dataloader(reference):
    with make(collate_fn=None, sampler=None, batch_sampler=None, in_order=True,
              timeout=0) as dl:
        assert dl.loader.timeout is None            # torch's 0: no timeout
        assert [digest(b) for b in dl] == reference[0]
    with pytest.raises(TypeError, match=r"DataLoader\(\) got an unexpected keyword "
                                        r"argument 'shufle'.*shuffle"):
        make(shufle=False)


def test_generator_gives_the_seed_and_multiprocessing_context_the_start_method(reference):
    import multiprocess
    generator = torch.Generator().manual_seed(3)
    with DataLoader(trivial(N), batch_size=4, fns=[noisy], num_workers=0,
                    generator=generator) as dl:
        assert dl.loader.seed == 3 and [digest(b) for b in dl] == reference[0]
    with pytest.raises(ConfigError, match='not both'):
        make(generator=generator)                   # make() passes seed=3
    with pytest.raises(ConfigError, match='torch.Generator'):
        DataLoader(trivial(N), batch_size=4, generator=3)
    with make(2, multiprocessing_context='spawn') as dl:
        assert dl.loader.start_method == 'spawn'
    with make(2, multiprocessing_context=multiprocess.get_context('forkserver')) as dl:
        assert dl.loader.start_method == 'forkserver'
        assert [digest(b) for b in dl] == reference[0]
    with pytest.raises(ConfigError, match='not both'):
        make(2, multiprocessing_context='spawn', start_method='fork')


def test_prefetch_factor_is_per_worker(reference):
    with make(2, prefetch_factor=3) as dl:
        assert dl.loader.prefetch == 6 and [digest(b) for b in dl] == reference[0]
    for bad in (0, 2.5, True, 10**9):
        with pytest.raises(ConfigError, match='prefetch_factor'):
            make(2, prefetch_factor=bad)
    with pytest.raises(ConfigError, match='not both'):
        make(2, prefetch_factor=2, prefetch=4)


@pytest.mark.parametrize('persistent', [None, True, False])
def test_persistent_workers_false_stops_them_at_the_end_of_each_epoch(persistent, reference,
                                                                       tmp_path):
    def init(worker_id):
        (tmp_path / f'{worker_id}-{os.getpid()}').touch()

    with make(2, persistent_workers=persistent, worker_init_fn=init) as dl:
        got, pids = [], []
        for _ in range(2):
            got.append([digest(b) for b in dl])
            pids.append(set(dl.loader.worker_pids))
        assert got == reference[:2]
    started = sorted(p.name for p in tmp_path.iterdir())
    if persistent is False:
        assert pids == [set(), set()]               # stopped after each epoch
        assert len(started) == 4 and sorted(n.split('-')[0] for n in started) == \
            ['0', '0', '1', '1']                    # once per worker, per epoch
    else:
        assert len(pids[0]) == 2 and pids[0] == pids[1]
        assert sorted(n.split('-')[0] for n in started) == ['0', '1']   # once per worker
        assert {int(n.split('-')[1]) for n in started} == pids[0]       # in the workers


def test_worker_init_fn_runs_in_each_worker_only_and_its_error_reaches_the_caller(tmp_path):
    calls = []
    with make(0, worker_init_fn=calls.append) as dl:
        list(dl)
    assert calls == []                              # no workers, as in torch

    def broken(worker_id):
        raise ValueError(f'worker {worker_id} cannot start')

    with make(2, worker_init_fn=broken) as dl:
        with pytest.raises(ValueError, match='cannot start') as info:
            next(iter(dl))
        assert 'init_fn(' in str(info.value.__cause__)
    with pytest.raises(ConfigError, match='worker_init_fn'):
        make(2, worker_init_fn=3)
    with pytest.raises(ConfigError, match='persistent_workers'):
        make(2, persistent_workers='yes')


# -- CUDA options -------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the machine without CUDA')
def test_without_cuda_pin_memory_warns_and_device_cuda_refuses(reference):
    with pytest.warns(RuntimeWarning, match='CUDA is not available'):
        dl = make(2, pin_memory=True)
    with dl:
        assert [digest(b) for b in dl] == reference[0]      # the CPU path works
    with pytest.raises(ConfigError, match='CUDA is not available'):
        make(device='cuda')
    with make(device='cpu') as dl:
        assert [digest(b) for b in dl] == reference[0]


def test_each_slot_is_registered_once_and_other_batches_are_pinned_by_a_copy():
    """The pinning bookkeeping, with recording functions in place of CUDA's."""
    registered, unregistered = [], []
    pinner = SlotPinner(lambda address, nbytes: registered.append((address, nbytes)) or 0,
                         unregistered.append)
    with make(2, prefetch=2) as dl:
        slots = 2 + 2                       # prefetch + the lent ones
        for batch in dl.loader.epoch(0):
            pinner.follow(dl.loader._pool)
            assert pinner.pin(batch, to_torch(batch)) is not None
        for batch in dl.loader.epoch(1):
            pinner.follow(dl.loader._pool)
            pinner.pin(batch, to_torch(batch))
        assert 1 <= len(registered) <= slots
        assert len(set(registered)) == len(registered)      # once per slot
        pinner.release()
    assert sorted(unregistered) == sorted(a for a, _ in registered)
    # Arrays that are not in a slot (workers=0) would be pinned by a copy: no registration.
    registered.clear()
    with make(0) as dl, warnings.catch_warnings():
        batch = next(iter(dl.loader.epoch(0)))
        if not torch.cuda.is_available():
            with pytest.raises(RuntimeError):       # pin_memory() itself needs CUDA
                pinner.pin(batch, to_torch(batch))
        assert registered == []


def _mapping(address: int):
    """(start, end, inode) of the mapping of this process that holds ``address``, or None."""
    with open('/proc/self/maps') as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split('-'))
            if start <= address < end:
                return start, end, fields[4]
    return None


class _CudaLike:
    """cudaHostRegister / cudaHostUnregister / pin_memory() as CUDA keeps them, checked
    against the process's mappings: a range registered twice gets error 712, and
    unregistering memory that was unmapped (or mapped anew) since it was registered
    is an error."""

    def __init__(self):
        self.live: dict[int, tuple] = {}        # address -> (nbytes, mapping)
        self.calls = {'register': 0, 'unregister': 0, 'copy': 0}
        self.errors: list[str] = []

    def register(self, address, nbytes):
        self.calls['register'] += 1
        if address in self.live:
            return 712
        self.live[address] = (nbytes, _mapping(address))
        return 0

    def unregister(self, address):
        self.calls['unregister'] += 1
        nbytes, mapping = self.live.pop(address, (None, None))
        if mapping is None:
            self.errors.append(f'{address:#x} unregistered but not registered')
        elif _mapping(address) != mapping:
            self.errors.append(f'{address:#x} unmapped before it was unregistered')

    def copy(self, tensor):
        self.calls['copy'] += 1
        return tensor.clone()

    def pinned(self, tensor) -> bool:
        """Whether ``tensor``'s memory lies in a range registered in its mapping now."""
        ptr = tensor.data_ptr()
        return any(a <= ptr < a + n and _mapping(a) == m for a, (n, m) in self.live.items())


def test_pinned_slots_are_unregistered_before_a_new_pool_and_its_slots_registered(reference):
    # A load with another order version starts a new worker pool: its slots were
    # taken as registered (the old addresses) and the old registrations were undone
    # only at close, after their memory was unmapped.
    cuda = _CudaLike()

    class Recorded(DataLoader):
        _pin_functions = (cuda.register, cuda.unregister, cuda.copy)

    with warnings.catch_warnings():
        warnings.simplefilter('error')              # no "CUDA is not available"
        dl = Recorded(trivial(N), batch_size=4, fns=[noisy], seed=3, num_workers=2,
                      prefetch=2, pin_memory=True)
    with dl:
        it = iter(dl)
        for _ in range(3):
            batch = next(it)
            assert cuda.pinned(batch['vec'])
        del batch
        first = cuda.calls['register']
        assert 1 <= first <= 4 and len(cuda.live) == first
        state = dl.state_dict()
        other = 1 if state['loader']['order'] != 1 else 2
        dl.load_state_dict({**state, 'loader': {**state['loader'], 'order': other}})
        assert cuda.live == {} and cuda.calls['unregister'] == first
        for batch in it:
            assert cuda.pinned(batch['vec']), cuda.live
        del batch
        assert cuda.calls['register'] > first
    assert cuda.live == {} and cuda.errors == []
    assert cuda.calls['register'] == cuda.calls['unregister'] and cuda.calls['copy'] == 0


def test_pinned_slots_across_the_restart_of_workers_auto():
    # workers='auto' settling on fewer workers starts a new pool in the middle of the
    # hand-out of a batch: that batch (the old pool's last) is pinned by a copy (as
    # are the first batches, joined from pieces), the new pool's slots are
    # registered, and the old pool's registrations are undone while still mapped.
    cuda = _CudaLike()

    class Recorded(DataLoader):
        _pin_functions = (cuda.register, cuda.unregister, cuda.copy)

    with Recorded(trivial(400), batch_size=4, fns=[noisy], num_workers='auto',
                  pin_memory=True) as dl:
        started = dl.num_workers
        it = iter(dl)
        for _ in range(40):
            copies = cuda.calls['copy']
            batch = next(it)
            assert cuda.pinned(batch['vec']) or cuda.calls['copy'] > copies
            del batch
            time.sleep(0.02)                # a slow consumer: one worker is enough
        settled = dl.loader.settled
    assert settled is not None and cuda.errors == [] and cuda.live == {}
    assert cuda.calls['register'] == cuda.calls['unregister']
    if settled['workers'] == started:
        pytest.skip(f'auto kept {started} workers here: no restart to check')


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_on_cuda_batches_arrive_pinned_and_overlapped(reference):
    with make(2, pin_memory=True) as dl:
        for batch in dl:
            assert batch['vec'].is_pinned()
    with make(2, device='cuda') as dl:
        it = iter(dl)
        head = [next(it) for _ in range(2)]
        assert all(b['vec'].is_cuda for b in head)
        state = dl.state_dict()
        rest = [digest({k: v.cpu() for k, v in b.items()}) for b in it]
        assert [digest({k: v.cpu() for k, v in b.items()}) for b in head] + rest \
            == reference[0]
        dl.load_state_dict(state)
        assert [digest({k: v.cpu() for k, v in b.items()}) for b in dl] == rest


def test_exit_without_close_does_not_wait_on_workers_that_ignore_sigterm(tmp_path):
    # Lightning's Trainer installs a SIGTERM handler; workers forked after it
    # inherit it and survive the SIGTERM of multiprocess's exit hook, whose
    # join then waited forever.
    script = tmp_path / 'exit.py'
    script.write_text(
        'import signal\n'
        'from loadr.torch import DataLoader\n'
        'signal.signal(signal.SIGTERM, lambda *a: None)\n'
        'dl = DataLoader([{"x": i} for i in range(10)], batch_size=2, num_workers=1)\n'
        'print(next(iter(dl))["x"].tolist())\n')
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, cwd=pathlib.Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 2


def test_import_loadr_imports_no_torch():
    code = 'import loadr, sys; print("torch" in sys.modules, "jax" in sys.modules)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ['False', 'False']


# -- examples -------------------------------------------------------------------

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / 'examples'


def load_example(name: str):
    import importlib.util
    sys.path.insert(0, str(EXAMPLES))     # the examples import each other
    try:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f'{name}.py')
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


@pytest.fixture(scope='module')
def demo_images(tmp_path_factory):
    from loadr.demo import make_images
    path = tmp_path_factory.mktemp('demo') / 'images'
    make_images(str(path), n=64)          # 4 batches of 16 per epoch
    return path


@pytest.mark.slow                   # the example run as a script (CI: -m '')
def test_train_torch_example_killed_and_resumed_ends_with_the_same_weights(tmp_path,
                                                                           demo_images):
    example = load_example('train_torch')
    common = ['--data', str(demo_images), '--steps', '10', '--checkpoint-every', '3']
    straight = example.main(['--dir', str(tmp_path / 'straight'), '--workers', '0', *common])
    run = [sys.executable, str(EXAMPLES / 'train_torch.py'), '--dir', str(tmp_path / 'killed'),
           *common]
    killed = subprocess.run([*run, '--workers', '1', '--kill-at', '8'], capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr       # SIGKILLed after step 8, saved at 6
    resumed = subprocess.run([*run, '--workers', '2'], capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert 'resumed at step 6 (epoch 1)' in resumed.stdout
    assert resumed.stdout.split()[-1] == straight


@pytest.mark.slow                   # the example run as a script (CI: -m '')
def test_lightning_example_resumes_the_data_through_lightnings_checkpoint(tmp_path,
                                                                          demo_images):
    try:
        import lightning  # noqa: F401
    except ImportError:
        if in_ci():
            raise
        pytest.skip('lightning is not installed (pip install lightning)')
    example = load_example('train_lightning')
    log = tmp_path / 'steps.log'
    common = ['--dir', str(tmp_path), '--data', str(demo_images), '--workers', '1',
              '--log', str(log)]
    torch_example = load_example('train_torch')
    with DataLoader(torch_example.open_images(str(demo_images)), batch_size=16,
                    fns=torch_example.make_pipeline(), seed=0, num_workers=0) as dl:
        expected = [example.batch_digest(b) for _ in range(2) for b in dl]

    def trained(args) -> list[tuple]:
        log.write_text('')
        example.main([*common, *args])
        return [(int(step), digest) for step, digest in
                (line.split() for line in log.read_text().splitlines())]

    # 4 batches per epoch, a checkpoint every 2 steps: step 2 is inside epoch 0,
    # step 4 its end (Lightning stops at len(dl), before the epoch's StopIteration).
    assert trained(['--steps', '6', '--checkpoint-every', '2']) == \
        list(enumerate(expected[:6], start=1))
    for start in (2, 4):
        ckpt = tmp_path / 'checkpoints' / f'epoch=0-step={start}.ckpt'
        resumed = trained(['--steps', '6', '--resume', str(ckpt), '--checkpoint-every', '100'])
        assert resumed == list(enumerate(expected[start:6], start=start + 1))
