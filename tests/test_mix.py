"""loadr.Mix: exact proportions, once per source epoch, schedules, resume, workers, YAML."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import loadr
from loadr.errors import ConfigError, DecodeError, LoadrError
from loadr.mix import BLOCK, Mix, MixOrder
from loadr.mix._order import source_seed
from loadr.order import Order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SEVEN = {f's{i}': w for i, w in enumerate([0.31, 0.22, 0.17, 0.13, 0.09, 0.05, 0.03])}
WEIGHT_SETS = {
    '0.8/0.2': {'web': 0.8, 'curated': 0.2},
    '0.999/0.001': {'big': 0.999, 'tiny': 0.001},
    'seven': SEVEN,
    'thirds': {'a': 1, 'b': 1, 'c': 1},
    'odd': {'a': 0.314159, 'b': 0.271828, 'c': 0.141421, 'd': 0.0008, 'e': 0.2725},
}


def counts_table(order: MixOrder, start: int, count: int) -> np.ndarray:
    """Running counts per source: row ``i`` counts positions ``[start, start + i)``."""
    src = order.sources(start, count)
    table = np.zeros((count + 1, len(order.names)), dtype=np.int64)
    for s in range(len(order.names)):
        table[1:, s] = np.cumsum(src == s)
    return table


def normalised(weights: dict) -> np.ndarray:
    total = sum(weights.values())
    return np.array([weights[k] / total for k in weights])


@pytest.mark.parametrize('name', list(WEIGHT_SETS))
def test_proportions_window_by_window(name):
    weights = WEIGHT_SETS[name]
    order = MixOrder(list(weights), [1000] * len(weights), [(0, weights)], seed=5)
    n = 10**6
    cum = counts_table(order, 0, n)
    w = normalised(weights)
    want = w * BLOCK
    aligned = cum[BLOCK::BLOCK] - cum[:-BLOCK:BLOCK]            # [k*1024, (k+1)*1024)
    assert np.abs(aligned - want).max() <= 1, np.abs(aligned - want).max(axis=0)
    sliding = cum[BLOCK:] - cum[:-BLOCK]                         # every window of 1024
    assert np.abs(sliding - want).max() <= 2, np.abs(sliding - want).max(axis=0)
    drift = np.abs(cum - np.arange(n + 1)[:, None] * w).max()
    assert drift <= 4, drift
    # Far out in the stream too (counts there come from the floor sums).
    far = 10**12 - 12345
    cum = counts_table(order, far, 20 * BLOCK) + order.counts(far)
    drift = np.abs(cum - (far + np.arange(20 * BLOCK + 1))[:, None] * w).max()
    assert drift <= 4, drift


def test_counts_match_the_schedule_from_anywhere():
    order = MixOrder(list(SEVEN), [10] * 7, [(0, SEVEN)], seed=0)
    src = order.sources(0, 50_000)
    for p in [0, 1, 1023, 1024, 1025, 4097, 33_333, 50_000]:
        assert order.counts(p).tolist() == np.bincount(src[:p], minlength=7).tolist(), p
    fresh = MixOrder(list(SEVEN), [10] * 7, [(0, SEVEN)], seed=0)
    # A cold order (no block cache) at a far position agrees with a walk to it.
    assert fresh.counts(10**6 + 77).tolist() == (
        order.counts(10**6) + np.bincount(order.sources(10**6, 77), minlength=7)).tolist()


def test_once_per_source_epoch_for_each_source():
    sizes = {'a': 7, 'b': 50, 'c': 1000, 'd': 70_001}
    weights = {'a': 0.1, 'b': 0.2, 'c': 0.3, 'd': 0.4}
    order = MixOrder(list(sizes), list(sizes.values()), [(0, weights)], seed=9)
    src, index = order.locate(0, 200_000)
    for s, (name, n) in enumerate(sizes.items()):
        stream = index[src == s]
        epochs = len(stream) // n
        assert epochs >= 1 or name == 'd'
        for e in range(epochs):
            assert sorted(stream[e * n:(e + 1) * n].tolist()) == list(range(n)), (name, e)
        # Keyed by (seed, source name, source epoch): the source's own Order.
        ref = Order(n, source_seed(9, name)).indices(0, len(stream))
        assert np.array_equal(stream, ref), name
    # Composite indices are the sources laid end to end.
    composite = order.indices(0, 1000)
    s, i = order.locate(0, 1000)
    assert np.array_equal(composite, order.offsets[s] + i)


def test_a_source_stream_does_not_depend_on_the_other_sources():
    one = MixOrder(['a', 'b'], [30, 100], [(0, {'a': 0.5, 'b': 0.5})], seed=2)
    two = MixOrder(['x', 'a', 'y'], [5, 30, 9], [(0, {'x': 1, 'a': 3, 'y': 2})], seed=2)
    s1, i1 = one.locate(0, 5000)
    s2, i2 = two.locate(0, 5000)
    a1, a2 = i1[s1 == 0], i2[s2 == 1]
    k = min(len(a1), len(a2))
    assert np.array_equal(a1[:k], a2[:k])
    # Another seed gives another stream.
    s3, i3 = MixOrder(['a', 'b'], [30, 100], [(0, {'a': 0.5, 'b': 0.5})], seed=3).locate(0, 5000)
    assert not np.array_equal(i3[s3 == 0][:60], a1[:60])


def test_a_weight_schedule_leaves_the_stream_before_each_change_untouched():
    names, sizes = ['web', 'curated', 'code'], [10_000, 300, 2000]
    first = {'web': 0.8, 'curated': 0.2}
    change, later = 1_000_000, {'web': 0.5, 'curated': 0.1, 'code': 0.4}
    plain = MixOrder(names, sizes, [(0, first)], seed=4)
    sched = MixOrder(names, sizes, [(0, first), (change, later)], seed=4)
    for start in (0, change - 3000):
        assert np.array_equal(plain.indices(start, 3000), sched.indices(start, 3000))
    # The counts at the change point carry over: each source's stream goes on
    # where it was (no index repeats early, none is skipped).
    before = plain.counts(change)
    assert sched.counts(change).tolist() == before.tolist()
    src, index = sched.locate(change, 50_000)
    for s, (name, n) in enumerate(zip(names, sizes)):
        ref = Order(n, source_seed(4, name)).indices(int(before[s]), int((src == s).sum()))
        assert np.array_equal(index[src == s], ref), name
    # After the change the new weights hold, window by window from the change point.
    cum = counts_table(sched, change, 200 * BLOCK)
    w = normalised(later)
    drift = np.abs(cum - np.arange(200 * BLOCK + 1)[:, None] * w).max()
    assert drift <= 4, drift
    aligned_start = -(-change // BLOCK) * BLOCK - change      # first aligned window after it
    windows = cum[aligned_start + BLOCK::BLOCK] - cum[aligned_start:-BLOCK:BLOCK]
    assert np.abs(windows - w * BLOCK).max() <= 1
    # A source left out has weight 0 and does not appear.
    off = MixOrder(names, sizes, [(0, first)], seed=4)
    assert (off.sources(0, 100_000) != 2).all()


def test_seeds_are_per_mixed_position_and_unique_across_sources():
    order = MixOrder(['a', 'b'], [3, 4], [(0, {'a': 1, 'b': 1})], seed=6)
    seeds = order.seeds(0, 10_000)
    assert len(set(seeds)) == 10_000
    assert seeds == Order(7, 6).seeds(0, 10_000)


def test_the_order_is_small_picklable_and_instant_far_away():
    sizes = [10**9, 10**3]
    order = MixOrder(['web', 'curated'], sizes, [(0, {'web': 0.8, 'curated': 0.2})], seed=1)
    assert len(pickle.dumps(order)) < 400
    copy = pickle.loads(pickle.dumps(order))
    far = 10**12
    idx = copy.indices(far, 4096)
    assert np.array_equal(idx, order.indices(far, 4096))
    s, i = order.locate(far, 4096)
    assert ((0 <= i) & (i < np.array(sizes)[s])).all()
    assert abs(int(order.counts(far)[1]) - 0.2 * far) <= 4


def test_alternative_stays_in_the_source():
    order = MixOrder(['a', 'b', 'c'], [5, 1000, 3], [(0, {'a': 1, 'b': 1, 'c': 1})], seed=0)
    for index in [0, 4, 5, 500, 1004, 1005, 1007]:
        s, _ = order.decode(index)
        for k in range(1, 17):
            assert order.decode(order.alternative(index, k))[0] == s


# -- the Mix reader and the Loader -----------------------------------------------


def two_sources(web=40, curated=6):
    return ({'web': [{'x': i} for i in range(web)],
             'curated': [{'x': 1000 + i} for i in range(curated)]})


def test_mix_reads_the_composite_index_with_per_source_fns():
    seen = []

    def tag(dp, seed=None):
        seen.append(seed)
        return {**dp, 'x': dp['x'] + 1}

    mix = Mix(two_sources(), weights={'web': 0.75, 'curated': 0.25}, fns={'curated': [tag]})
    assert len(mix) == 46
    assert mix[3] == {'x': 3, 'source': 'web'}
    assert mix.read_seeded(40, seed=77) == {'x': 1001, 'source': 'curated'}
    assert seen == [77]
    assert Mix(two_sources(), source_key=None)[0] == {'x': 0}
    sources = two_sources()
    Mix(sources)[0]
    assert sources['web'][0] == {'x': 0}            # the reader's own dict is untouched
    with pytest.raises(IndexError):
        mix[46]


def test_identity_names_sources_and_weights():
    a = Mix(two_sources(), weights={'web': 0.8, 'curated': 0.2})
    b = Mix(two_sources(), weights={'web': 0.7, 'curated': 0.3})
    ident = a.identity()
    json.dumps(ident)
    assert [s['name'] for s in ident['sources']] == ['web', 'curated']
    assert ident['sources'][0]['identity'] == {'type': 'list', 'n': 40}
    assert ident != b.identity()


@pytest.mark.parametrize('bad, message', [
    ({'weights': {'web': 1, 'nope': 1}}, 'unknown sources'),
    ({'weights': {'web': -1, 'curated': 1}}, 'finite number >= 0'),
    ({'weights': {'web': 0, 'curated': 0}}, 'all 0'),
    ({'weights': [(5, {'web': 1})]}, 'starts at position 0'),
    ({'weights': [(0, {'web': 1}), (0, {'curated': 1})]}, 'increasing'),
    ({'fns': {'nope': []}}, 'unknown sources'),
    ({'source_key': 3}, 'source_key'),
    ({'weights': {'web': 10**400, 'curated': 1}}, "weight of 'web' must be a finite number"),
    ({'weights': {'web': float('inf'), 'curated': 1}}, "weight of 'web' must be a finite"),
    ({'weights': {'web': 1, 'curated': float('nan')}}, "weight of 'curated' must be a finite"),
    ({'weights': {'web': 1, 'curated': np.float64('-inf')}}, "weight of 'curated'"),
    ({'weights': {'web': 1, 'curated': -0.5}}, "weight of 'curated' must be a finite"),
    ({'weights': [(0, {'web': 1}), (2**63, {'curated': 1})]}, 'below 2\\*\\*63'),
])
def test_bad_arguments_are_config_errors(bad, message):
    with pytest.raises(ConfigError, match=message):
        Mix(two_sources(), **bad)
    with pytest.raises(ConfigError, match='empty'):
        Mix({'web': []})


def batches(loader, count):
    it = iter(loader)
    out = [next(it) for _ in range(count)]
    return [(b['x'].tolist(), list(b['source'])) for b in out]


def test_the_loader_follows_the_mix_order():
    mix = Mix(two_sources(), weights={'web': 0.75, 'curated': 0.25})
    with loadr.Loader(mix, batch=8, seed=3, workers=0) as loader:
        got = batches(loader, 10)
    order = mix.make_order(3)
    want = [mix[i]['x'] for i in order.indices(0, 80).tolist()]
    assert [x for xs, _ in got for x in xs] == want
    sources = [s for _, ss in got for s in ss]
    assert sources.count('curated') == 20


@pytest.mark.parametrize('workers', [0, 2])
def test_resume_at_random_steps(workers):
    mix = Mix(two_sources(), weights=[(0, {'web': 0.75, 'curated': 0.25}),
                                      (100, {'web': 0.5, 'curated': 0.5})])
    with loadr.Loader(mix, batch=4, seed=11, workers=0) as loader:
        it = iter(loader)
        states, reference = [], []
        for _ in range(60):
            states.append(loader.save())
            b = next(it)
            reference.append((b['x'].tolist(), list(b['source'])))
    rng = np.random.default_rng(0)
    for at in sorted(rng.choice(55, size=4, replace=False).tolist()):
        with loadr.Loader(mix, batch=4, seed=11, workers=workers) as loader:
            loader.load(states[at])
            assert batches(loader, 5) == reference[at:at + 5], at


def test_a_state_from_another_mixture_is_refused():
    from loadr.errors import StateError

    states = []
    for weights in ({'web': 0.8, 'curated': 0.2}, {'web': 0.7, 'curated': 0.3}):
        with loadr.Loader(Mix(two_sources(), weights=weights), batch=4, seed=0,
                          workers=0) as loader:
            next(iter(loader))
            states.append(loader.save())
    with loadr.Loader(Mix(two_sources(), weights={'web': 0.8, 'curated': 0.2}), batch=4,
                      seed=0, workers=0) as loader:
        loader.load(states[0])
        with pytest.raises(StateError):
            loader.load(states[1])


def _plus(k):
    def plus(dp, seed=None):
        return {**dp, 'x': dp['x'] + k}
    return plus


# A lambda at module level, imported by another process too.
_LAMBDAS = [lambda dp, seed=None: dp]


def _scale(dp, seed=None, by=1):
    return {**dp, 'x': dp['x'] * by}


def test_a_state_saved_with_other_source_fns_is_refused_naming_the_source_and_the_fn():
    import functools

    from loadr.errors import StateError

    def loader_with(fns):
        return loadr.Loader(Mix(two_sources(), weights={'web': 0.5, 'curated': 0.5}, fns=fns),
                            batch=4, seed=0, workers=0)

    same = [{'curated': [lambda dp, seed=None: {**dp, 'x': dp['x'] + 1}]},
            {'curated': [lambda dp, seed=None: {**dp, 'x': dp['x'] + 1}]}]
    others = [
        ({}, "fns of source 'curated': the state was saved with 1 fns, this loader has 0"),
        ({'curated': [lambda dp, seed=None: {**dp, 'x': dp['x'] + 2}]},
         "fns of source 'curated': fn 0 differs"),
        ({'web': same[0]['curated']}, "fns of source 'web'"),
        ({'curated': [_plus(1)]}, "fns of source 'curated': fn 0 differs"),
    ]
    with loader_with(same[0]) as loader:
        next(iter(loader))
        state = loader.save()
    with loader_with(same[1]) as loader:            # another lambda, the same code
        loader.load(state)
    for fns, message in others:
        with loader_with(fns) as loader:
            with pytest.raises(StateError) as info:
                loader.load(state)
            assert message in str(info.value), str(info.value)
            assert loader.step == 0
    # Closures and partials of other values are other fns too.
    for a, b in ((_plus(1), _plus(2)), (functools.partial(_scale, by=2),
                                        functools.partial(_scale, by=3))):
        with loader_with({'curated': [a]}) as loader:
            state = loader.save()
        with loader_with({'curated': [b]}) as loader:
            with pytest.raises(StateError, match="fns of source 'curated': fn 0 differs"):
                loader.load(state)
        with loader_with({'curated': [a]}) as loader:
            loader.load(state)
    # The key of a fn's code does not change once the interpreter has run (and
    # specialised) it many times.
    from loadr.state import fn_key
    fn = _plus(1)
    key = fn_key(fn)
    for i in range(5000):
        fn({'x': i})
    assert fn_key(fn) == key and fn_key(_plus(1)) == key != fn_key(_plus(2))
    # The same holds for the Loader's own fns.
    with loadr.Loader(two_sources()['web'], batch=2, fns=[_plus(1)], workers=0) as loader:
        state = loader.save()
    with loadr.Loader(two_sources()['web'], batch=2, fns=[_plus(5)], workers=0) as loader:
        with pytest.raises(StateError, match='fns: fn 0 differs'):
            loader.load(state)


def test_source_fns_fingerprint_is_the_same_in_another_process():
    code = ('import json, loadr; from tests.test_mix import _LAMBDAS, _plus, two_sources; '
            "mix = loadr.Mix(two_sources(), fns={'curated': [_plus(3), _LAMBDAS[0]]}); "
            'print(json.dumps(loadr.Loader(mix, batch=2, workers=0).save()))')
    runs = [subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                           cwd=ROOT, env={**os.environ, 'PYTHONHASHSEED': str(seed)})
            for seed in (1, 2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    states = [json.loads(r.stdout) for r in runs]
    assert states[0] == states[1] and len(states[0]['source_fns']['curated']) == 2
    mix = Mix(two_sources(), fns={'curated': [_plus(3), _LAMBDAS[0]]})
    with loadr.Loader(mix, batch=2, workers=0) as loader:
        loader.load(states[0])                  # a resume in a new process is accepted


def test_load_at_step_10_to_the_12_with_huge_and_tiny_sources():
    class Huge:
        def __len__(self):
            return 10**9

        def __getitem__(self, i):
            return {'x': i}

    mix = Mix({'web': Huge(), 'curated': [{'x': -i} for i in range(1000)]},
              weights={'web': 0.8, 'curated': 0.2})
    with loadr.Loader(mix, batch=8, seed=1, workers=0) as loader:
        state = loader.save()
        state['step'] = 10**12
        loader.load(state)
        xs, sources = batches(loader, 1)[0]
    order = mix.make_order(1)
    assert xs == [mix[i]['x'] for i in order.indices(10**12, 8).tolist()]
    assert set(sources) <= {'web', 'curated'}


def test_worker_and_shard_invariance():
    mix = Mix(two_sources(), weights={'web': 0.6, 'curated': 0.4})
    with loadr.Loader(mix, batch=6, seed=2, workers=0) as loader:
        reference = batches(loader, 12)
    with loadr.Loader(mix, batch=6, seed=2, workers=2, prefetch=3) as loader:
        assert batches(loader, 12) == reference
    halves = []
    for shard in (0, 1):
        with loadr.Loader(mix, batch=3, seed=2, workers=shard * 2, shard_id=shard,
                          num_shards=2) as loader:
            halves.append(batches(loader, 12))
    for g in range(12):
        xs = halves[0][g][0] + halves[1][g][0]
        ss = halves[0][g][1] + halves[1][g][1]
        assert (xs, ss) == reference[g]


def test_per_source_fns_get_each_positions_seed_under_any_worker_count():
    def stamp(dp, seed=None):
        return {**dp, 'seed': seed % 1000}

    mix = Mix(two_sources(), weights={'web': 0.5, 'curated': 0.5},
              fns={'web': [stamp], 'curated': [stamp]})
    runs = []
    for workers in (0, 2):
        with loadr.Loader(mix, batch=5, seed=8, workers=workers) as loader:
            it = iter(loader)
            runs.append([next(it)['seed'].tolist() for _ in range(4)])
    assert runs[0] == runs[1]
    seeds = mix.make_order(8).seeds(0, 20)
    assert sum(runs[0], []) == [s % 1000 for s in seeds]


class Broken:
    """A source whose datapoint 3 is corrupt, as a reader reports it."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        if i == 3:
            raise DecodeError('not a JPEG file', path='curated/part-0.bag', index=i)
        return {'x': i}


@pytest.mark.parametrize('workers', [0, 2])
def test_errors_name_the_source_the_file_and_the_index(workers):
    mix = Mix({'web': [{'x': 10 + i} for i in range(5)], 'curated': Broken()},
              weights={'web': 0.5, 'curated': 0.5})
    with pytest.raises(DecodeError) as info:
        mix[5 + 3]
    assert str(info.value) == "curated/part-0.bag [index 3]: source 'curated': not a JPEG file"
    assert (info.value.path, info.value.index) == ('curated/part-0.bag', 3)
    with loadr.Loader(mix, batch=10, seed=0, workers=workers) as loader:
        with pytest.raises(DecodeError) as info:
            for _ in zip(range(3), loader):
                pass
    assert "source 'curated': not a JPEG file" in str(info.value)
    assert (info.value.path, info.value.index) == ('curated/part-0.bag', 3)
    # Other errors say the source in a note.
    bad = Mix({'web': [{'x': 1}], 'odd': [{'x': 1}]},
              fns={'odd': [lambda dp, seed=None: dp['missing']]})
    with pytest.raises(KeyError) as info:
        bad[1]
    assert "source 'odd'" in ''.join(getattr(info.value, '__notes__', []))


@pytest.mark.parametrize('workers', [0, 2])
def test_an_error_of_a_fn_common_to_all_sources_names_the_source(workers):
    def common(dp, seed=None):
        if dp['x'] == 1003:
            raise ValueError('boom')
        if dp['x'] == 1004:
            raise DecodeError('not a JPEG file', path='curated/part-0.bag')
        return dp

    for bad, kind in ((1003, ValueError), (1004, DecodeError)):
        def only(dp, seed=None, bad=bad):
            return common(dp) if dp['x'] == bad else dp

        mix = Mix(two_sources(curated=6), weights={'web': 0.5, 'curated': 0.5})
        with loadr.Loader(mix, batch=46, seed=0, fns=[only], workers=workers) as loader:
            with pytest.raises(kind) as info:
                next(iter(loader))
        if kind is DecodeError:
            assert str(info.value).startswith("curated/part-0.bag [index 4]: source 'curated': "
                                              "not a JPEG file; Loader(on_error='skip')")
        else:
            assert ("loadr: in source 'curated', index 3 of that source"
                    in info.value.__notes__)
        assert info.value.source == 'curated'


@pytest.mark.parametrize('workers', [0, 2])
def test_a_datapoint_that_has_the_source_key_already_is_an_error(workers):
    sources = {'web': [{'x': i} for i in range(5)],
               'tagged': [{'x': 100 + i, 'source': f'crawl-{i}'} for i in range(3)]}
    with loadr.Loader(Mix(sources), batch=8, seed=0, workers=workers) as loader:
        with pytest.raises(ConfigError) as info:
            next(iter(loader))
    assert "source 'tagged': the datapoint already has a key 'source'" in str(info.value)
    assert 'source_key=' in str(info.value) and info.value.index in range(3)
    mix = Mix(sources, weights={'web': 0.5, 'tagged': 0.5})
    with pytest.raises(ConfigError, match=r"\[index 1\]: source 'tagged'"):
        mix[5 + 1]
    # A per-source fn that adds the key is caught the same way.
    adds = Mix({'web': [{'x': 0}]}, fns={'web': [lambda dp, seed=None: {**dp, 'source': 1}]})
    with pytest.raises(ConfigError, match="already has a key 'source'"):
        adds[0]
    # Another key keeps the datapoint's own value; None keeps it without a source name.
    assert Mix(sources, source_key='mix_source')[6] == {'x': 101, 'source': 'crawl-1',
                                                        'mix_source': 'tagged'}
    assert Mix(sources, source_key=None)[6] == {'x': 101, 'source': 'crawl-1'}


def test_skip_replaces_a_bad_datapoint_from_the_same_source():
    mix = Mix({'web': [{'x': 10 + i} for i in range(5)], 'curated': Broken()},
              weights={'web': 0.5, 'curated': 0.5})
    with loadr.Loader(mix, batch=10, seed=0, workers=0, on_error='skip',
                      max_error_fraction=0.5) as loader:
        got = batches(loader, 3)
    for xs, sources in got:
        for x, s in zip(xs, sources):
            assert (s == 'web') == (x >= 10)


# -- YAML and the command line ------------------------------------------------------


def write_sources(tmp_path):
    from loadr.writers import BagWriter

    with BagWriter(tmp_path / 'web', {'idx': 'int', 'name': 'utf8'}) as w:
        for i in range(30):
            w.append({'idx': i, 'name': f'web-{i}'})
    with BagWriter(tmp_path / 'curated', {'num': 'int', 'name': 'utf8'}) as w:
        for i in range(5):
            w.append({'num': 100 + i, 'name': f'cur-{i}'})


MIX_YAML = """
reader:
  mix:
    web: {path: web, weight: 0.8}
    curated: {path: curated, weight: 0.2, fns: [rename: {mapping: {num: idx}}]}
loader: {batch: 10, seed: 3, workers: 0}
"""


def test_yaml_mix(tmp_path):
    write_sources(tmp_path)
    (tmp_path / 'mix.yaml').write_text(MIX_YAML)
    with loadr.pipeline(tmp_path / 'mix.yaml') as loader:
        assert isinstance(loader.reader, Mix)
        it = iter(loader)
        got = [next(it) for _ in range(10)]
    sources = [s for b in got for s in b['source']]
    assert sources.count('curated') == 20
    for b in got:
        for idx, name, s in zip(b['idx'].tolist(), b['name'], b['source']):
            assert name == (f'web-{idx}' if s == 'web' else f'cur-{idx - 100}')
    mix = loadr.pipeline(tmp_path / 'mix.yaml').reader
    assert mix.weights_at(0) == {'web': 0.8, 'curated': 0.2}
    # A schedule, and no source key.
    text = MIX_YAML.replace(', weight: 0.8', '').replace(', weight: 0.2', '').replace(
        'reader:\n', 'reader:\n  source_key: null\n  weights: [[0, {web: 1}], '
        '[10, {web: 1, curated: 1}]]\n')
    (tmp_path / 'sched.yaml').write_text(text)
    with loadr.pipeline(tmp_path / 'sched.yaml') as loader:
        it = iter(loader)
        first, second = next(it), next(it)
    assert 'source' not in first and (first['idx'] < 100).all()
    assert ((second['idx'] >= 100).sum()) == 5


@pytest.mark.parametrize('edit, message', [
    (('weight: 0.2, ', ''), "every source of the mix needs a weight; missing: ['curated']"),
    (('path: web,', 'path: nowhere,'), "reader.mix.web.path 'nowhere' does not exist"),
    (('web: {', 'web: {colour: red, '), "unknown key 'colour' in reader.mix.web"),
    (('rename: {mapping', 'renam: {mapping'), "unknown fn 'renam'"),
    (('  mix:', '  bogus: 1\n  mix:'), "unknown key 'bogus' in reader"),
])
def test_yaml_mix_mistakes_name_the_line(tmp_path, edit, message):
    write_sources(tmp_path)
    (tmp_path / 'mix.yaml').write_text(MIX_YAML.replace(*edit))
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(tmp_path / 'mix.yaml')
    assert message in str(info.value)
    assert info.value.line is not None


def test_inspect_a_mix_yaml(tmp_path):
    write_sources(tmp_path)
    (tmp_path / 'mix.yaml').write_text(MIX_YAML)
    done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'inspect',
                           str(tmp_path / 'mix.yaml')], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert 'a mix of 2 sources, 35 datapoints' in lines[0]
    web = next(line for line in lines if line.split()[:1] == ['web'])
    curated = next(line for line in lines if line.split()[:1] == ['curated'])
    assert web.split()[1:] == ['30', '0.8', '2.667e+04']       # 0.8 * 10^6 / 30
    assert curated.split()[1:] == ['5', '0.2', '4e+04']
    done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'inspect', '--json',
                           str(tmp_path / 'mix.yaml')], capture_output=True, text=True,
                          timeout=120)
    info = json.loads(done.stdout)
    assert info['schedule'][0]['sources'][1]['epochs_per_million'] == pytest.approx(40_000)


def test_mix_is_exported_and_light():
    assert 'Mix' in loadr.__all__ and loadr.Mix is Mix
    assert issubclass(ConfigError, LoadrError)


# -- many sources ---------------------------------------------------------------------


def _random_weights(count, seed):
    import random

    rng = random.Random(seed)
    return {f's{i}': rng.random() for i in range(count)}


def test_ten_thousand_sources_with_unrelated_weights_are_exact_window_by_window():
    weights = _random_weights(10_000, 0)
    sources = {name: [{'x': i}] * (3 + i % 4) for i, name in enumerate(weights)}
    mix = Mix(sources, weights=weights)
    order = mix.make_order(7)
    total = sum(weights.values())
    want = np.array([w / total for w in weights.values()]) * BLOCK
    for start in (0, 10**12):
        rows = order.sources(start, 20 * BLOCK).reshape(-1, BLOCK)
        for row in rows:
            assert np.abs(np.bincount(row, minlength=10_000) - want).max() <= 1
    assert abs(sum(mix.weights_at(0).values()) - 1) < 1e-9
    # A worker receives the built schedule (arrays, as bytes), not the weights to build it.
    copy = pickle.loads(pickle.dumps(order))
    assert not copy._plans[0].f.flags.writeable              # read from the pickled bytes
    assert np.array_equal(copy.sources(10**12, 4096), order.sources(10**12, 4096))
    assert np.array_equal(copy.indices(0, 512), order.indices(0, 512))
    # So does a Mix sent to a worker: its schedule and shifts, as built here.
    sent = pickle.loads(pickle.dumps(mix))
    assert not sent._plans[0].f.flags.writeable and sent._shifts is not None
    assert np.array_equal(sent.make_order(7).indices(0, 512), order.indices(0, 512))


def test_the_stream_of_unrelated_weights_is_the_one_of_exact_fractions():
    import hashlib

    # Digest of this mix's stream as the former construction (Fractions all the way,
    # which took seconds for a few hundred sources) gave it: the faster one keeps it.
    weights = _random_weights(300, 20)
    order = MixOrder(list(weights), [7 + i % 5 for i in range(300)],
                     [(0, weights), (50_000, dict(list(weights.items())[:40]))], seed=1)
    data = order.indices(0, 100_000).tobytes() + order.indices(10**12, 4096).tobytes()
    assert hashlib.sha256(data).hexdigest()[:16] == '886d7d3f17b43e68'
    assert order.counts(10**12)[:3].tolist() == [47642753191, 36101595687, 40323555029]


@pytest.mark.parametrize('bits', [1, 2, 5, 64])
def test_rounding_to_2_62_is_exact_where_the_first_bits_leave_doubt(bits):
    import random

    from loadr.mix._weights import fraction_sum, hamilton, round_large

    rng = random.Random(bits)
    checked = 0
    for _ in range(12):
        pool = [rng.random() for _ in range(rng.choice([1, 3, 40]))]
        values = [rng.choice(pool) if rng.random() < 0.8 else rng.random() * 10**rng.randint(-5, 5)
                  for _ in range(rng.choice([30, 200]))]
        raw = [(f.numerator, f.denominator) for f in
               (Fraction(v).limit_denominator(10**6) for v in values)]
        a_sum, b = fraction_sum(raw, 0, len(raw))
        if b.bit_length() <= 128:
            continue                    # exact integer arithmetic anyway (normalise)
        checked += 1
        units, rests = zip(*(divmod((n * (b // d)) << 62, a_sum) for n, d in raw))
        exact = hamilton(list(units), rests.__getitem__, 2**62, len(raw))
        assert round_large(raw, a_sum, b, bits=bits) == exact
    assert checked >= 6


def test_weights_are_read_as_fractions_limit_denominator_reads_them():
    import random

    from loadr.mix._weights import limit_denominator, rotation

    rng = random.Random(0)
    for value in [rng.random() * 10**rng.randint(-9, 9) for _ in range(20_000)] + [0.8, 1 / 3]:
        f = Fraction(value).limit_denominator(10**6)
        assert limit_denominator(*value.as_integer_ratio()) == (f.numerator, f.denominator)
    assert rotation.__wrapped__(2**62 + 0) == rotation(2**62)      # the written-out one


def test_reading_on_from_a_block_before_agrees_with_the_floor_sums():
    weights = _random_weights(100, 3)
    names, sizes = list(weights), [11] * 100
    walked = MixOrder(names, sizes, [(0, weights)], seed=0)
    far = 10**9 * BLOCK + 5
    walked.indices(far, 10)                                 # warms block far // BLOCK
    for step in (1, 7, 40, 63, 64, 65, 200):
        at = far + step * BLOCK
        cold = MixOrder(names, sizes, [(0, weights)], seed=0)
        assert np.array_equal(walked.indices(at, 300), cold.indices(at, 300)), step
        assert walked.counts(at).tolist() == cold.counts(at).tolist()


def test_many_sources_read_their_epoch_tables_as_their_orders_give_them():
    # Above 16 sources a MixOrder keeps the sources' epoch tables itself; the indices
    # are still each source's Order's, across epochs and far away.
    weights = _random_weights(40, 5)
    sizes = [[3, 50, 1000, 70_000, 2 * 10**6][i % 5] for i in range(40)]
    order = MixOrder(list(weights), sizes, [(0, weights)], seed=4)
    for start in (0, 777, 10**9 + 1, 10**12):
        for _ in range(2):                  # the second time from the kept tables
            src, index = order.locate(start, 2000)
            for s, source_order, first, count in order.source_positions(start, 2000):
                assert np.array_equal(index[src == s], source_order.indices(first, count))
                assert source_order.seed == source_seed(4, f's{s}')


def test_a_sources_decode_and_crop_are_fused_as_the_loaders_own_are(monkeypatch):
    """A source's decode_jpeg → random_resized_crop runs fused (loadr.decode), as the same
    fns given to the Loader do: the crop box is the same, the pixels within the quality
    contract of the unfused chain, and LOADR_FUSE=0 turns it off here too."""
    import io
    import math

    from PIL import Image

    import loadr.fns as F
    from loadr.decode import Fused

    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    pictures = []
    for i in range(4):
        arr = np.asarray(Image.fromarray(np.roll(small, i, 1)).resize((400, 300),
                                                                      Image.Resampling.BICUBIC))
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, 'JPEG', quality=90)
        pictures.append({'image': buf.getvalue(), 'label': i})

    def mix():
        return Mix({'a': pictures, 'b': pictures}, weights={'a': 1, 'b': 1}, source_key=None,
                   fns={'a': [F.decode_jpeg(), F.random_resized_crop(size=64)]})

    fused = mix()
    assert isinstance(fused._chain('a')[0], Fused) and fused._chain('b') == []
    assert fused.fns['a'][0].__class__ is F.decode_jpeg          # what the fingerprint names
    monkeypatch.setenv('LOADR_FUSE', '0')
    plain = mix()
    assert not isinstance(plain._chain('a')[0], Fused)
    for index in range(len(fused)):
        if fused.decode(index)[0] != 'a':
            continue
        for seed in range(3):
            got, want = fused.read_seeded(index, seed), plain.read_seeded(index, seed)
            assert got['image'].shape == want['image'].shape == (64, 64, 3)
            mse = np.mean((got['image'].astype(float) - want['image'].astype(float)) ** 2)
            assert mse == 0 or 10 * math.log10(255 ** 2 / mse) >= 35
