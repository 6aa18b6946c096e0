import numpy as np
import pytest

from loadr.order import Order, permutation


@pytest.mark.parametrize('n', [1, 2, 3, 5, 7, 16, 17, 100, 1000, 4097])
def test_each_epoch_is_a_permutation(n):
    order = Order(n, seed=11)
    for epoch in range(3):
        idx = order.indices(epoch * n, n)
        assert sorted(idx.tolist()) == list(range(n))


def test_no_shuffle_is_the_identity():
    order = Order(7, seed=5, shuffle=False)
    assert order.indices(0, 21).tolist() == list(range(7)) * 3


def test_stream_positions_follow_the_contract():
    n = 13
    order = Order(n, seed=4)
    stream = order.indices(5, 40)                      # spans four epochs
    for k, p in enumerate(range(5, 45)):
        perm = permutation(n, 4, p // n)(np.array([p % n], dtype=np.uint64))
        assert stream[k] == perm[0] == order.index_at(p)


def test_key_derivation_separates_seed_and_epoch():
    n = 1000
    a = Order(n, seed=1).indices(0, n)          # seed 1, epoch 0
    b = Order(n, seed=0).indices(n, n)          # seed 0, epoch 1
    assert (a != b).mean() > 0.9


def test_ten_billion_items_in_constant_memory():
    n = 10**10
    order = Order(n, seed=3)
    idx = order.indices(10**12, 4096)
    assert ((0 <= idx) & (idx < n)).all()
    assert len(np.unique(idx)) == 4096
    assert order.index_at(10**12 + 7) == idx[7]


def test_positions_spread_uniformly_over_seeds():
    n, seeds = 8, 4000
    counts = np.zeros((n, n))
    for seed in range(seeds):
        counts[np.arange(n), Order(n, seed).indices(0, n)] += 1
    expected = seeds / n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 49 degrees of freedom; the 99.9% quantile is about 85.
    assert chi2 < 85, chi2


def test_consecutive_epochs_are_uncorrelated():
    n = 500
    order = Order(n, seed=9)
    corrs = []
    for epoch in range(20):
        a = order.indices(epoch * n, n).astype(float)
        b = order.indices((epoch + 1) * n, n).astype(float)
        corrs.append(np.corrcoef(a, b)[0, 1])
    assert abs(np.mean(corrs)) < 0.03
    assert max(abs(c) for c in corrs) < 0.2


def test_no_bias_to_fixed_points():
    n = 50
    fixed = [int((Order(n, seed).indices(0, n) == np.arange(n)).sum()) for seed in range(2000)]
    # A uniform random permutation has one fixed point on average.
    assert 0.85 < np.mean(fixed) < 1.15


def test_sample_seeds_are_stable_distinct_and_usable():
    order = Order(100, seed=2)
    seeds = order.seeds(0, 1000)
    assert seeds == Order(100, seed=2).seeds(0, 1000)
    assert len(set(seeds)) == 1000
    assert seeds[10:20] == order.seeds(10, 10)
    assert seeds != Order(100, seed=3).seeds(0, 1000)
    np.random.default_rng(seeds[0]).random()


def test_bad_arguments():
    with pytest.raises(ValueError):
        Order(0, 0)
    with pytest.raises(ValueError):
        Order(5, -1)
    with pytest.raises(ValueError):
        Order(5, 2**64)


def test_version_1_is_0_1s_order_bit_for_bit():
    # Values computed with loadr 0.1's order.py (/work/base): a state saved by
    # 0.1 must replay the very same stream.
    assert Order(5, 0, version=1).indices(0, 15).tolist() == [
        2, 3, 0, 4, 1, 3, 2, 1, 4, 0, 1, 4, 2, 0, 3]
    assert Order(1000, 7, version=1).indices(12345, 8).tolist() == [
        181, 312, 407, 171, 401, 654, 553, 350]
    assert Order(10**10, 3, version=1).indices(10**12, 5).tolist() == [
        908248026, 161789210, 9598814164, 867578907, 6009709959]
    assert Order(16, 2**64 - 1, version=1).indices(0, 16).tolist() == [
        11, 6, 14, 13, 1, 15, 8, 0, 9, 12, 5, 2, 7, 10, 4, 3]
    assert Order(100, 2, version=1).seeds(0, 3) == [
        8399754288231643387, 3821006539869131008, 4869167293577090851]


def test_order_for_and_alternative():
    import pickle

    from loadr.order import ORDER_VERSION, order_for

    order = order_for(list(range(10)), seed=4, shuffle=True)
    assert (order.n, order.seed, order.version) == (10, 4, ORDER_VERSION)
    copy = pickle.loads(pickle.dumps(order))
    assert copy.indices(0, 30).tolist() == order.indices(0, 30).tolist()
    assert copy.version == order.version
    # Today's substitution rule under on_error='skip'.
    assert [order.alternative(3, k) for k in (1, 2)] == [
        (3 + k * 0x9E3779B1) % 10 for k in (1, 2)]

    class Own:
        def __len__(self):
            return 3

        def make_order(self, seed, shuffle, version):
            return ('own', seed, shuffle, version)

    assert order_for(Own(), 5, False, 1) == ('own', 5, False, 1)
    with pytest.raises(ValueError, match='order version'):
        Order(5, 0, version=99)
