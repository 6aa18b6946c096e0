"""Mixing datasets: exact proportions, every sample once per source epoch, resumable anywhere.

A :class:`Mix` is a reader made of named sources. Position ``p`` of the
stream goes to a source chosen by a fixed schedule of the weights. It holds
that source's datapoint at the source's own stream position: how many
earlier positions went to the same source. Each source runs its own epochs.
Source epoch ``e`` is a permutation keyed by (seed, source name, e), made by
:class:`loadr.order.Order`. A small source simply cycles more epochs than a
large one. Everything is a pure function of (seed, p), so ``load()`` at
step 10^12 costs what step 0 does.

The schedule works in blocks of :data:`BLOCK` = 1,024 positions (aligned to
multiples of 1,024). Write ``1024 * w_s = b_s + f_s`` with ``b_s`` an integer
and ``0 <= f_s < 1``. Every block gives source ``s`` either ``b_s`` or
``b_s + 1`` positions. The ``R = sum(f_s)`` extra positions of a block go to
``R`` distinct sources by McNaughton's wrap-around rule:

- lay the ``f_s`` end to end on a circle of length ``R``;
- put ``R`` points one apart, turned by ``frac(k * g / Q)`` for block ``k``;
- a source gets an extra where a point falls on its arc.

Here ``Q`` is the common denominator of the ``f_s``. ``g`` lies near
``Q / phi`` and is chosen so that ``g / Q`` has small partial quotients,
which spreads the turns evenly (see :func:`_rotation`). How many extras a source had
before block ``k`` is a floor sum, computed in O(log Q). Inside a block, the
quotas are interleaved by the Sainte-Laguë rule (the ``i``-th datapoint of
source ``s`` sits at time ``(i + 1/2) / q_s``; positions follow the times).

So every aligned window of 1,024 positions holds ``floor(1024 w)`` or
``ceil(1024 w)`` samples of each source (by construction). The other bounds
were measured, not proved (tests/test_mix.py checks them). A window of 1,024
consecutive positions was off by less than 2. The running count stayed within
about 3 samples of ``w * p`` over the first 10^6 positions. Out to 10^13
positions it stayed within about 5 for unrelated weights, and within 2 for
simple ones (0.8/0.2, 0.999/0.001), whose schedule repeats exactly.

Each weight is read as the nearest fraction with a denominator of at most
10^6 (0.8 is 4/5), and weights are normalised by their sum (exactly: see
:func:`_normalise`). The schedule is built once, when the Mix is made
(10,000 sources with unrelated weights: about 0.15 s, ``python -m
benchmarks.mix_build``); its orders, and the workers, which get it with the
Mix, use it as built. A weight
schedule ``[(0, {...}), (position, {...}), ...]`` starts a new schedule at
each change point. Each source's count at the change point carries over, so
the stream before a change point does not depend on what comes after it.

Composite indices: the mix's datapoint ``i`` is datapoint ``i - offset[s]``
of source ``s``, with the sources laid end to end in the order given, so
``len(mix)`` is the sum of the sources' sizes (the Loader's nominal epoch).

Example::

    mix = loadr.Mix({'web': loadr.open('web/'), 'curated': loadr.open('curated.ffr')},
                    weights={'web': 0.8, 'curated': 0.2})
    loader = loadr.Loader(mix, batch=64, seed=0, workers=8)
"""

from __future__ import annotations

import bisect
import collections
import copy
import functools
import hashlib
import itertools
import math
import sys
from fractions import Fraction

import numpy as np

from .errors import ConfigError, LoadrError
from .order import (ORDER_VERSION, SORT_MAX, Order, check_seed, check_version, indices_many,
                    permutation)
from .sources import (Caching, Composite, ErrorNaming, Identified, Ordering, Prefetching,
                      SeededSource, Sharing, hooks_of)

__all__ = ['Mix', 'MixOrder', 'BLOCK']

BLOCK = 1024
# Weights are read as fractions with denominators up to this (0.8 -> 4/5).
WEIGHT_DENOMINATOR = 10**6
# Normalised weights whose common denominator is larger (many unrelated
# fractions) are rounded to multiples of 2**-62: that adds at most one sample of
# drift per 4.6e18 positions, and the floor sums stay cheap.
_MAX_DENOMINATOR = 2**62
_ALT_STRIDE = 0x9E3779B1
_GOLDEN = (math.sqrt(5) - 1) / 2
# How many blocks back a MixOrder reads on from a block whose counts it has (see
# _counts_at_block); with few sources, one (floor sums are cheap then).
_WALK_BLOCKS = 64
# _rotation(2**62), the search's answer (0.1 s), written out: tests/test_mix.py checks it.
_ROTATION_2_62 = 2850178704830800257
# Above this many sources a MixOrder keeps its sources' epoch tables itself, up to
# _TABLE_BYTES (the order module keeps 16: fewer than the sources of one batch).
_MANY_SOURCES = 16
_TABLE_BYTES = 32 << 20


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a*i + b) / m) for i in range(n))`` for ``a, b >= 0``, in O(log m).

    >>> _floor_sum(10, 7, 3, 2) == sum((3 * i + 2) // 7 for i in range(10))
    True
    """
    total = 0
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = divmod(y_max, m)
        m, a = a, m


def _block_table(quotas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Source and rank of each position of a block with these quotas (int64, sum: BLOCK).

    Source ``s``'s ``i``-th datapoint in the block is due at time
    ``(2i + 1) / (2 q_s)``. Positions follow the times, ties going to the lower
    source. Equal fractions give equal floats, and distinct ones with
    denominators up to 2048 are far apart next to a float's precision, so the
    order is exact. ``rank[j]`` counts the earlier positions of the same source.
    """
    return _block_table_of(np.ascontiguousarray(quotas, dtype=np.int64).tobytes())


@functools.lru_cache(maxsize=256)
def _block_table_of(key: bytes) -> tuple[np.ndarray, np.ndarray]:
    quotas = np.frombuffer(key, dtype=np.int64)
    present = np.flatnonzero(quotas)            # of 10,000 sources, 1,024 at most
    quotas = quotas[present]
    local = np.repeat(np.arange(len(present), dtype=np.int64), quotas)
    ranks = np.arange(len(local), dtype=np.int64) - np.repeat(np.cumsum(quotas) - quotas, quotas)
    due = (2 * ranks + 1) / (2 * quotas.astype(np.float64)[local])
    order = np.lexsort((local, due))
    return present[local[order]], ranks[order]


def _partial_quotients(g: int, q: int) -> list[int]:
    """The continued fraction of ``g / q`` after its leading 0."""
    out = []
    while q:
        a, r = divmod(g, q)
        out.append(a)
        g, q = q, r
    return out[1:]


@functools.lru_cache(maxsize=64)
def _rotation(q: int) -> int:
    """The step ``g`` (coprime to ``q``) of the turns ``k * g / q`` of the extras' points.

    The points spread evenly when ``g / q`` has small partial quotients (the
    golden ratio's are all 1), so this takes the ``g`` near ``q / phi`` whose
    largest partial quotient is smallest. Without that search, an unlucky
    ``g`` let the running counts drift by 16 samples at 10^12 positions; with
    it the worst drift measured was about 5 (tests/test_mix.py).
    """
    if q <= 2:
        return 1
    if q == 2**62:
        return _ROTATION_2_62           # the common denominator of unrelated weights
    centre = round(q * _GOLDEN)
    best = None
    for d in range(2000):
        for g in {centre + d, centre - d}:
            if 0 < g < q and math.gcd(g, q) == 1:
                terms = _partial_quotients(g, q)
                score = (max(terms), sum(terms), g)
                if best is None or score < best:
                    best = score
        if best is not None and best[0] <= 3 and d >= 64:
            break
    return best[2]


class _Schedule:
    """One weight set: the notional counts of each source at any position.

    Built from the normalised weights ``m_s / D`` (:func:`_normalise`), with
    the per-source figures in int64 arrays (what a worker receives: nothing is
    recomputed there). Counts run from position 0, as if this weight set held
    from the start. :class:`MixOrder` shifts them so that each change point
    carries the counts over.
    """

    def __init__(self, numerators: list[int], d: int):
        scaled = [BLOCK * m for m in numerators]
        base = [x // d for x in scaled]
        rest = [x - b * d for x, b in zip(scaled, base)]            # frac(1024 w_s) * D
        # Q: the common denominator of the fractional parts (1 if there are none).
        q = d // math.gcd(d, *rest)
        step = d // q
        f = [x // step for x in rest]                               # f_s * Q, integers
        total = sum(f)
        self.q, self.r = q, total // q                              # extras per block
        assert total == self.r * q and sum(base) + self.r == BLOCK
        # Where each arc starts on the circle of the extras, modulo Q: a point falls
        # on an arc shorter than Q at most once, so its turn modulo Q is all it takes.
        arc = list(itertools.accumulate(f, initial=0))[:-1]
        self.base = np.asarray(base, dtype=np.int64)
        self.f = np.asarray(f, dtype=np.int64)
        self.arc = np.asarray([a % q for a in arc], dtype=np.int64)
        self.g = _rotation(q)
        self._extra = np.flatnonzero(self.f)                        # the sources with arcs

    def __reduce__(self):
        # Pickled as its arrays' bytes (a worker gets the built schedule, small).
        return _restore_schedule, (self.q, self.r, self.g, self.base.tobytes(),
                                   self.f.tobytes(), self.arc.tobytes())

    def quotas(self, k: int) -> np.ndarray:
        """Positions of each source in block ``k`` (int64 array)."""
        if not len(self._extra):
            return self.base
        turn = k * self.g % self.q
        return self.base + ((self.f > 0) & ((turn - self.arc) % self.q < self.f))

    def counts_at_block(self, k: int) -> np.ndarray:
        """Each source's count before block ``k`` (int64 array)."""
        q, g, counts = self.q, self.g, self.base * k
        if k == 0:
            return counts
        for s, f, a in zip(self._extra.tolist(), self.f[self._extra].tolist(),
                           self.arc[self._extra].tolist()):
            # How many of the turns j * g (j < k) fall on [a, a + f) modulo Q.
            counts[s] += _floor_sum(k, q, g, 2 * q - a) - _floor_sum(k, q, g, 2 * q - a - f)
        return counts

    def counts_at(self, p: int) -> np.ndarray:
        """Each source's count before position ``p``."""
        k, j = divmod(p, BLOCK)
        sources, _ = _block_table(self.quotas(k))
        inside = np.bincount(sources[:j], minlength=len(self.base))
        return self.counts_at_block(k) + inside


def _restore_schedule(q: int, r: int, g: int, base: bytes, f: bytes, arc: bytes) -> _Schedule:
    plan = _Schedule.__new__(_Schedule)
    plan.q, plan.r, plan.g = q, r, g
    plan.base, plan.f, plan.arc = (np.frombuffer(b, dtype=np.int64) for b in (base, f, arc))
    plan._extra = np.flatnonzero(plan.f)
    return plan


def _weight(value, name: str, where: str) -> tuple[int, int]:
    """One weight as ``(numerator, denominator)``, the nearest fraction with a denominator
    of at most 10^6; ConfigError naming it if it is not a number in ``[0, 1.8e308]`` (a
    float's range: the identity keeps it as a float)."""
    _check_weight(value, name, where)
    if isinstance(value, float):
        return _limit_denominator(*value.as_integer_ratio())
    fraction = Fraction(value).limit_denominator(WEIGHT_DENOMINATOR)
    return fraction.numerator, fraction.denominator


def _limit_denominator(n: int, d: int) -> tuple[int, int]:
    """``Fraction(n, d).limit_denominator(10**6)`` (``n >= 0``, ``d > 0``, coprime) as a
    pair, without making Fractions: the same continued fraction, the same choice.

    >>> _limit_denominator(*(0.8).as_integer_ratio())
    (4, 5)
    >>> _limit_denominator(*math.pi.as_integer_ratio())
    (3126535, 995207)
    """
    if d <= WEIGHT_DENOMINATOR:
        return n, d
    p0, q0, p1, q1 = 0, 1, 1, 0
    num, den = n, d
    while True:
        a = num // den
        q2 = q0 + a * q1
        if q2 > WEIGHT_DENOMINATOR:
            break
        p0, q0, p1, q1 = p1, q1, p0 + a * p1, q2
        num, den = den, num - a * den
    k = (WEIGHT_DENOMINATOR - q0) // q1
    # p1/q1 unless the semiconvergent is strictly closer (as fractions.py decides).
    if 2 * den * (q0 + k * q1) <= d:
        return p1, q1
    return p0 + k * p1, q0 + k * q1


def _check_weight(value, name: str, where: str) -> None:
    if type(value) is float and 0.0 <= value <= sys.float_info.max:
        return                          # the common case, at once (nan fails the test)
    ok = not isinstance(value, bool) and isinstance(value, (int, float, Fraction, np.number))
    if ok:
        try:
            # float() of an int or Fraction past a float's range raises OverflowError.
            ok = math.isfinite(float(value)) and value >= 0
        except (OverflowError, TypeError, ValueError):
            ok = False
    if not ok:
        text = repr(value)
        text = text if len(text) <= 40 else f'{text[:20]}...{text[-8:]} ({len(text)} chars)'
        raise ConfigError(f'{where}: the weight of {name!r} must be a finite number >= 0 '
                          f'(at most {sys.float_info.max:.3g}), got {text}')


def _fractions(weights: dict, names: list, where: str) -> list[tuple[int, int]]:
    """The weights of ``names`` checked, each as a fraction ``(numerator, denominator)``
    with a denominator of at most 10^6 (a source left out: 0); ConfigError naming what is
    wrong."""
    if not isinstance(weights, dict) or not weights:
        raise ConfigError(f'{where}: weights must be a non-empty mapping '
                          f'{{source name: weight}}, got {weights!r}'[:300])
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ConfigError(f'{where}: weights name unknown sources {unknown}; the sources are '
                          f'{names}'[:300])
    raw = [_weight(weights.get(name, 0), name, where) for name in names]
    if not any(n for n, _ in raw):
        raise ConfigError(f'{where}: the weights are all 0')
    return raw


def _sum(fractions: list[tuple[int, int]], lo: int, hi: int) -> tuple[int, int]:
    """``(numerator, lcm of the denominators)`` of the sum of ``fractions[lo:hi]``, halves
    first: the big numbers meet only near the top (a running sum grows them at every step)."""
    if hi - lo == 1:
        return fractions[lo]
    mid = (lo + hi) // 2
    a1, b1 = _sum(fractions, lo, mid)
    a2, b2 = _sum(fractions, mid, hi)
    b = b1 // math.gcd(b1, b2) * b2
    return a1 * (b // b1) + a2 * (b // b2), b


def _normalise(raw: list[tuple[int, int]]) -> tuple[list[int], int]:
    """The weights ``raw`` normalised by their sum, as numerators over one denominator ``D``.

    Exact where the common denominator is at most 2**62. Above, each weight is
    rounded to a multiple of 2**-62, the largest remainders getting the units
    left over (Hamilton's method; ties to the earlier source): every weight
    within 2**-62 of its value, summing to 1.

    The sum ``A / B`` is exact (``B`` the lcm of the denominators). With a small
    ``B`` everything is plain integer arithmetic. A large ``B`` (unrelated
    weights: 10,000 of them make a number of some 80,000 bits) means ``D`` is
    large too, as a ``D`` up to 2**62 keeps ``B`` under 2**82 (every weight is
    then a multiple of the first one by a ratio of numbers up to 2**62). There,
    the rounding is found with ``2**P * B // A`` (one big division) and
    numbers of a few hundred bits, and only a weight whose floor or remainder
    those leave in doubt is worked out exactly.

    >>> _normalise([(4, 5), (1, 5)])
    ([4, 1], 5)
    """
    a_sum, b = _sum(raw, 0, len(raw))
    if b.bit_length() <= 128:
        nums = [n * (b // d) for n, d in raw]
        g = math.gcd(*nums)
        nums, d = [x // g for x in nums], a_sum // g
        if d <= _MAX_DENOMINATOR:
            return nums, d
        # Hamilton's method, exactly: 2**62 * w_s = (x << 62) / d.
        units, rests = zip(*(divmod(x << 62, d) for x in nums))
        return _hamilton(list(units), lambda s: rests[s], _MAX_DENOMINATOR, len(raw)), \
            _MAX_DENOMINATOR
    return _round_large(raw, a_sum, b), _MAX_DENOMINATOR


def _hamilton(units: list[int], rest, d: int, n: int, order=None) -> list[int]:
    """``units`` plus one for the ``d - sum(units)`` sources of the largest ``rest(s)``
    (ties: the earlier source). ``order``: the sources to consider, if not all."""
    left = d - sum(units)
    ranked = sorted(range(n) if order is None else order, key=lambda s: (-rest(s), s))
    for s in ranked[:left]:
        units[s] += 1
    return units


_FRACTION_BITS = 64


def _round_large(raw: list[tuple[int, int]], a_sum: int, b: int,
                 bits: int = _FRACTION_BITS) -> list[int]:
    """Hamilton's rounding of ``raw / sum(raw)`` to multiples of 2**-62 (see
    :func:`_normalise`) where the sum's denominator ``b`` is large.

    ``y_s = 2**(62 + 64) * w_s`` is computed as ``a_s * R // (b_s * 2**extra)``
    with ``R = 2**P * b // a_sum``: low by less than 1, so the floor is ``y_s``'s
    or one less. Its high bits are the units, its low ``bits`` bits the remainder's
    first bits. A source whose low bits are all ones (the units in doubt), and
    the sources whose remainders come within one of the cut between the last
    unit given and the first not, are worked out exactly.
    """
    mask = (1 << bits) - 1
    shift = 62 + bits
    extra = 2 + max(max(n.bit_length() - d.bit_length() + 1, 0) for n, d in raw)
    big = (b << (shift + extra)) // a_sum
    n = len(raw)
    units = [0] * n
    keys = [0] * n
    exact: dict[int, tuple[int, int]] = {}      # source -> (units, remainder over a_sum)
    by_value: dict[tuple[int, int], tuple[int, int]] = {}

    def exactly(s: int) -> tuple[int, int]:
        pair = raw[s]
        got = by_value.get(pair)
        if got is None:
            got = by_value[pair] = divmod((pair[0] * (b // pair[1])) << 62, a_sum)
        exact[s] = got
        return got

    approx: dict[tuple[int, int], int] = {}
    for s, pair in enumerate(raw):
        y = approx.get(pair)
        if y is None:
            y = approx[pair] = pair[0] * big // (pair[1] << extra)
        units[s], keys[s] = y >> bits, y & mask
        if keys[s] == mask:
            u, rem = exactly(s)
            units[s], keys[s] = u, (rem << bits) // a_sum
    left = _MAX_DENOMINATOR - sum(units)
    if left == 0:
        return units
    # A key is its remainder's first 64 bits, or one less: a source whose key is 2 or
    # more above another's has the larger remainder. The band of keys within 1 of each
    # other around the cut is ranked by the exact remainders.
    ranked = sorted(range(n), key=lambda s: (-keys[s], s))
    cut = keys[ranked[left - 1]]
    distinct = sorted(set(keys))
    at = bisect.bisect_left(distinct, cut)
    lo = hi = at
    while lo > 0 and distinct[lo - 1] >= distinct[lo] - 1:
        lo -= 1
    while hi + 1 < len(distinct) and distinct[hi + 1] <= distinct[hi] + 1:
        hi += 1
    low, high = distinct[lo], distinct[hi]
    above = [s for s in ranked if keys[s] > high]
    band = [s for s in ranked if low <= keys[s] <= high]
    for s in above:
        units[s] += 1
    rests = {s: (exact.get(s) or exactly(s))[1] for s in band}
    for s in sorted(band, key=lambda s: (-rests[s], s))[:left - len(above)]:
        units[s] += 1
    return units


def _plan(weights: dict, names: list, where: str) -> _Schedule:
    """The schedule of one weight set (checked: ConfigError naming what is wrong)."""
    return _Schedule(*_normalise(_fractions(weights, names, where)))


def _source_seed(seed: int, name: str) -> int:
    # A source's own stream is keyed by (seed, name): renaming nothing else,
    # adding a source leaves the other sources' orders as they were.
    data = seed.to_bytes(8, 'little') + name.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b'loadr.mix').digest(),
                          'little')


class MixOrder:
    """The order of a :class:`Mix`: positions -> composite indices; picklable and tiny.

    It has the Order protocol: ``n``, ``indices``, ``seeds``, ``index_at`` and
    ``alternative``. ``sources(start, count)`` gives the source of each
    position, and ``counts(p)`` how many of each source come before ``p``.

    >>> order = MixOrder(['a', 'b'], [3, 5], [(0, {'a': 1, 'b': 3})], seed=0)
    >>> order.sources(0, 8).tolist()
    [1, 0, 1, 1, 1, 0, 1, 1]
    """

    def __init__(self, names: list, sizes: list, schedule: list, seed: int,
                 shuffle: bool = True, version: int = ORDER_VERSION, plans: list | None = None,
                 shifts: list | None = None):
        self.names, self.sizes = list(names), [int(s) for s in sizes]
        self.seed = check_seed(seed)
        self.shuffle = bool(shuffle)
        self.version = check_version(version)
        self._starts = [int(p) for p, _ in schedule]
        # The built schedules: given by the Mix (built once, in the main process), or
        # built here from the weights.
        self._plans = plans if plans is not None else [
            _plan(w, self.names, f'weights at position {p}') for p, w in schedule]
        if shifts is not None:          # the Mix's, made by its first order
            self._setup(shifts)
            return
        # Each segment's shift: the true counts at its change point minus its
        # own notional counts there (floor sums: the seed plays no part).
        shifts = []
        counts = np.zeros(len(self.names), dtype=np.int64)
        for i, (start, plan) in enumerate(zip(self._starts, self._plans)):
            if i:
                prev = self._plans[i - 1]
                counts = counts + prev.counts_at(start) - prev.counts_at(self._starts[i - 1])
            shifts.append(counts - plan.counts_at(start))
        self._setup(shifts)

    def _setup(self, shifts: list) -> None:
        self._shift = shifts
        self.n = sum(self.sizes)
        self.offsets = np.cumsum([0] + self.sizes)[:-1].astype(np.int64)
        self._sizes_np = np.asarray(self.sizes, dtype=np.int64)
        self._orders: list = [None] * len(self.names)       # each source's Order, when used
        self._seeder = Order(1, self.seed)
        self._block_counts: dict = {}
        self._table = (None, None)                          # (seg, k) -> the block's table
        self._tables: collections.OrderedDict = collections.OrderedDict()   # _epoch_table
        self._table_bytes = 0

    def __getstate__(self):
        # The built schedule goes as it is (arrays as bytes), never built again; a
        # mix of two sources pickles in some 300 bytes.
        return (self.names, self.sizes, self.seed, self.shuffle, self.version, self._starts,
                self._plans, [s.tobytes() for s in self._shift])

    def __setstate__(self, state):
        self.names, self.sizes, self.seed, self.shuffle, self.version, self._starts, \
            self._plans, shifts = state
        self._setup([np.frombuffer(s, dtype=np.int64) for s in shifts])

    def _order(self, s: int) -> Order:
        order = self._orders[s]
        if order is None:
            order = self._orders[s] = Order(self.sizes[s], _source_seed(self.seed, self.names[s]),
                                            self.shuffle, self.version)
        return order

    # -- the schedule ----------------------------------------------------------

    def _segment(self, p: int) -> int:
        return bisect.bisect_right(self._starts, p) - 1

    def _counts_at_block(self, seg: int, k: int) -> np.ndarray:
        key = (seg, k)
        counts = self._block_counts.get(key)
        if counts is None:
            plan = self._plans[seg]
            # Reading on from a block a little before (the common case: a worker's
            # tasks are a few blocks apart) costs no floor sums, which with
            # thousands of sources cost far more than a few blocks' quotas.
            walk = 1 if len(plan.base) < 64 else _WALK_BLOCKS
            back = next((j for j in range(k - 1, max(k - 1 - walk, -1), -1)
                         if (seg, j) in self._block_counts), None)
            if back is not None:
                counts = self._block_counts[(seg, back)].copy()
                for j in range(back, k):
                    counts += plan.quotas(j)
            else:
                counts = plan.counts_at_block(k) + self._shift[seg]
            if len(self._block_counts) >= 64:
                self._block_counts.clear()
            self._block_counts[key] = counts
        return counts

    def _block(self, seg: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The source and rank of each position of block ``k`` (kept for the last block)."""
        if self._table[0] != (seg, k):
            self._table = ((seg, k), _block_table(self._plans[seg].quotas(k)))
        return self._table[1]

    def _pieces(self, start: int, count: int):
        """``(lo, hi, sources, local)`` for runs of positions inside one block and segment."""
        if start < 0 or count < 0 or start + count > 2**63:
            raise ValueError(f'positions {start}..{start + count} out of range')
        p, end = start, start + count
        while p < end:
            seg = self._segment(p)
            k, j = divmod(p, BLOCK)
            stop = min(end, (k + 1) * BLOCK)
            if seg + 1 < len(self._starts):
                stop = min(stop, self._starts[seg + 1])
            sources, ranks = self._block(seg, k)
            jj = j + stop - p
            src = sources[j:jj]
            local = self._counts_at_block(seg, k)[src] + ranks[j:jj]
            yield p - start, stop - start, src, local
            p = stop

    def sources(self, start: int, count: int) -> np.ndarray:
        """The source number (into ``names``) of positions ``start .. start + count - 1``."""
        out = np.empty(count, dtype=np.int64)
        for lo, hi, src, _ in self._pieces(start, count):
            out[lo:hi] = src
        return out

    def counts(self, p: int) -> np.ndarray:
        """How many positions before ``p`` went to each source (int64 array).

        >>> MixOrder(['a', 'b'], [3, 5], [(0, {'a': 1, 'b': 3})], seed=0).counts(1000).tolist()
        [250, 750]
        """
        seg = self._segment(p)
        return self._plans[seg].counts_at(p) + self._shift[seg]

    # -- the Order protocol ----------------------------------------------------

    def _source_runs(self, start: int, count: int):
        """``(src, by_source, present, firsts, sizes)``: each position's source, the
        positions grouped by source, and for each source present its first stream
        position in the source and how many it has (consecutive: a source's positions
        in one call are consecutive positions of its own stream)."""
        src = np.empty(count, dtype=np.int64)
        local = np.empty(count, dtype=np.int64)
        for lo, hi, s, loc in self._pieces(start, count):
            src[lo:hi] = s
            local[lo:hi] = loc
        # Group the positions by source (stable: each source's positions stay in stream order).
        by_source = np.argsort(src, kind='stable')
        sizes = np.bincount(src, minlength=len(self.sizes))
        present = np.flatnonzero(sizes)
        firsts = local[by_source[(np.cumsum(sizes) - sizes)[present]]]
        return src, by_source, present, firsts, sizes

    def source_positions(self, start: int, count: int) -> list[tuple[int, object, int, int]]:
        """``(source number, its Order, first position, count)`` in each source's own
        stream for positions ``start .. start + count - 1``, for the sources present.

        >>> order = MixOrder(['a', 'b'], [3, 5], [(0, {'a': 1, 'b': 3})], seed=0)
        >>> [(s, first, n) for s, _, first, n in order.source_positions(4, 4)]
        [(0, 1, 1), (1, 3, 3)]
        """
        _, _, present, firsts, sizes = self._source_runs(start, count)
        return [(s, self._order(s), first, int(sizes[s]))
                for s, first in zip(present.tolist(), firsts.tolist())]

    def locate(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, source index)`` of each position: int64 arrays."""
        src, by_source, present, firsts, sizes = self._source_runs(start, count)
        found: list = []
        rest: list = []                 # (slot in found, order, first, count)
        tables = self.shuffle and self.version >= 2 and len(self.sizes) > _MANY_SOURCES
        for s, first in zip(present.tolist(), firsts.tolist()):
            n, c = self.sizes[s], int(sizes[s])
            if tables and n <= SORT_MAX and first % n + c <= n:
                # What Order.indices gives there: a slice of the epoch's sorted table.
                epoch = first // n
                found.append(self._epoch_table(s, epoch)[first - epoch * n:first - epoch * n + c]
                             .astype(np.int64))
            else:
                rest.append((len(found), self._order(s), first, c))
                found.append(None)
        for (slot, *_), got in zip(rest, indices_many([r[1:] for r in rest])):
            found[slot] = got
        index = np.empty(count, dtype=np.int64)
        if found:
            index[by_source] = np.concatenate(found)
        return src, index

    def _epoch_table(self, s: int, epoch: int) -> np.ndarray:
        """Source ``s``'s sorted table of ``epoch`` (see :func:`loadr.order.permutation`),
        kept: with many sources the order module's few kept tables would be made again
        for nearly every sample. The newest are kept, up to :data:`_TABLE_BYTES`."""
        key = (s, epoch)
        table = self._tables.get(key)
        if table is None:
            table = permutation(self.sizes[s], _source_seed(self.seed, self.names[s]), epoch,
                                self.version).table
            self._tables[key] = table
            self._table_bytes += table.nbytes
            while self._table_bytes > _TABLE_BYTES:
                _, old = self._tables.popitem(last=False)
                self._table_bytes -= old.nbytes
        else:
            self._tables.move_to_end(key)
        return table

    def indices(self, start: int, count: int) -> np.ndarray:
        """Composite indices (``offset[source] + source index``) of the positions (int64)."""
        src, index = self.locate(start, count)
        return self.offsets[src] + index

    def index_at(self, position: int) -> int:
        """The composite index at one position."""
        return int(self.indices(position, 1)[0])

    def seeds(self, start: int, count: int) -> list[int]:
        """Per-sample seeds: one per mixed position, so unique across sources."""
        return self._seeder.seeds(start, count)

    def decode(self, index: int) -> tuple[int, int]:
        """``(source number, index in that source)`` of a composite index."""
        s = int(np.searchsorted(self.offsets, index, side='right')) - 1
        return s, int(index - self.offsets[s])

    def alternative(self, index: int, k: int) -> int:
        """The ``k``-th replacement candidate for a failed index: same source, another datapoint.

        >>> MixOrder(['a', 'b'], [3, 5], [(0, {'a': 1})], seed=0).alternative(4, 1) >= 3
        True
        """
        s, i = self.decode(index)
        return int(self.offsets[s]) + (i + k * _ALT_STRIDE) % self.sizes[s]

    def __repr__(self) -> str:
        return (f'MixOrder({dict(zip(self.names, self.sizes))}, seed={self.seed}, '
                f'shuffle={self.shuffle}, version={self.version})')


def _name_source(exc: BaseException, name: str, i: int) -> None:
    """Name source ``name`` (and index ``i`` in it) in ``exc``: a loadr error's message starts
    with ``source 'name': `` and keeps its type, file and index; any other gets a note."""
    if isinstance(exc, LoadrError):
        exc.message = f'source {name!r}: {exc.message}'
        exc.args = (exc.message,)
        if exc.index is None:
            exc.index = i
    else:
        exc.add_note(f'loadr: in source {name!r}, index {i} of that source')
    try:
        exc.source = name
    except AttributeError:          # an exception type with __slots__: the message says it
        pass


class Mix(SeededSource, ErrorNaming, Prefetching, Caching, Ordering, Identified, Composite,
          Sharing):
    """Named sources read as one dataset, in fixed proportions (see the module docstring).

    Args:
      sources: ``{name: reader}``; a reader is anything with ``len()`` and
        ``[i] -> dict`` (another Mix too).
      weights: ``{name: weight}`` (normalised; a source left out gets 0), or a
        schedule ``[(0, {...}), (position, {...}), ...]`` of such mappings with
        positions in samples. Default: proportional to the sources' sizes.
      fns: ``{name: [fn, ...]}``: transforms applied to that source's
        datapoints only, each called as ``fn(datapoint, seed=s)`` with the
        sample's seed, before the Loader's own fns.
      source_key: the key that carries the source's name in every datapoint
        (None: none). A datapoint that has this key already is a
        :class:`~loadr.errors.ConfigError` naming the source and the index: its
        own value is never overwritten.

    >>> mix = Mix({'a': [{'x': 0}], 'b': [{'x': 1}, {'x': 2}]}, weights={'a': 1, 'b': 1})
    >>> len(mix), mix[1]
    (3, {'x': 1, 'source': 'b'})
    """

    def __init__(self, sources: dict, weights=None, fns: dict | None = None,
                 source_key: str | None = 'source'):
        if not isinstance(sources, dict) or not sources:
            raise ConfigError(f'Mix needs a non-empty mapping {{name: reader}}, got {sources!r}')
        self.sources = dict(sources)
        self.names = list(self.sources)
        for name in self.names:
            if not isinstance(name, str) or not name:
                raise ConfigError(f'source names must be non-empty strings, got {name!r}')
        self.sizes = []
        for name, reader in self.sources.items():
            try:
                size = len(reader)
            except TypeError as exc:
                raise ConfigError(f'source {name!r} must have len(), got '
                                  f'{type(reader).__name__}') from exc
            if size <= 0:
                raise ConfigError(f'source {name!r} is empty')
            self.sizes.append(size)
        if weights is None:
            weights = dict(zip(self.names, self.sizes))
        self.schedule = self._check_schedule(weights)
        # Built once, here: every order of this Mix (and every worker, which gets the
        # Mix with them) uses these.
        self._plans = [_plan(w, self.names, f'weights at position {p}')
                       for p, w in self.schedule]
        self._shifts = None
        fns = {} if fns is None else fns
        if not isinstance(fns, dict):
            raise ConfigError(f'fns must map source names to lists of fns, got {fns!r}')
        if set(fns) - set(self.names):
            raise ConfigError(f'fns name unknown sources {sorted(set(fns) - set(self.names))}; '
                              f'the sources are {self.names}')
        self.fns = {name: list(fns.get(name, ())) for name in self.names}
        for name, chain in self.fns.items():
            for fn in chain:
                if not callable(fn):
                    raise ConfigError(f'fns of source {name!r}: {fn!r} is not callable')
        if source_key is not None and not isinstance(source_key, str):
            raise ConfigError(f'source_key must be a string or None, got {source_key!r}')
        self.source_key = source_key
        self.offsets = np.cumsum([0] + self.sizes)[:-1].astype(np.int64)
        self._offsets_list = self.offsets.tolist()
        self._hooks_cache = None

    @property
    def _hooks(self) -> dict:
        """``{name: loadr.sources.hooks_of(source)}``, looked up once per process."""
        hooks = self._hooks_cache
        if hooks is None:
            hooks = self._hooks_cache = {name: hooks_of(r) for name, r in self.sources.items()}
        return hooks

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state['_hooks_cache'] = None        # bound methods: looked up again where it lands
        return state

    def _check_schedule(self, weights) -> list:
        if isinstance(weights, dict):
            schedule = [(0, weights)]
        elif isinstance(weights, (list, tuple)) and weights:
            schedule = []
            for entry in weights:
                if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
                    raise ConfigError(f'a weight schedule is a list of (position, {{name: '
                                      f'weight}}), got the entry {entry!r}')
                schedule.append((entry[0], entry[1]))
        else:
            raise ConfigError(f'weights must be {{name: weight}} or a schedule '
                              f'[(position, {{...}}), ...], got {weights!r}')
        last = -1
        for position, w in schedule:
            if isinstance(position, bool) or not isinstance(position, (int, np.integer)) \
                    or position <= last or position >= 2**63:
                raise ConfigError(f'the positions of a weight schedule must be increasing ints '
                                  f'from 0, below 2**63, got {[p for p, _ in schedule]}'[:300])
            last = int(position)
            where = f'weights at position {position}'
            if not isinstance(w, dict) or not w:
                raise ConfigError(f'{where}: weights must be a non-empty mapping '
                                  f'{{source name: weight}}, got {w!r}'[:300])
            for name, value in w.items():
                _check_weight(value, name, where)
        if schedule[0][0] != 0:
            raise ConfigError(f'a weight schedule starts at position 0, got {schedule[0][0]}')
        # Plain, JSON-able numbers from here on (they go into identity()).
        return [(int(p), {name: float(v) for name, v in w.items()}) for p, w in schedule]

    def __len__(self) -> int:
        return sum(self.sizes)

    def weights_at(self, position: int = 0) -> dict:
        """The normalised weights in force at ``position`` (floats)."""
        i = bisect.bisect_right([p for p, _ in self.schedule], position) - 1
        numerators, d = _normalise(_fractions(self.schedule[i][1], self.names, 'weights'))
        return {name: m / d for name, m in zip(self.names, numerators)}

    def make_order(self, seed: int, shuffle: bool = True, version: int = ORDER_VERSION):
        """The :class:`MixOrder` for ``seed`` (what :func:`loadr.order.order_for` calls)."""
        order = MixOrder(self.names, self.sizes, self.schedule, seed, shuffle, version,
                         plans=self._plans, shifts=self._shifts)
        self._shifts = order._shift     # kept (and pickled with the Mix, for the workers)
        return order

    def decode(self, index: int) -> tuple[str, int]:
        """``(source name, index in the source)`` of a composite index."""
        if isinstance(index, bool) or not hasattr(index, '__index__'):
            raise TypeError(f'datapoint index must be an integer, not {type(index).__name__}')
        index = index.__index__()
        if not 0 <= index < len(self):
            raise IndexError(f'index {index} out of range for {len(self)} datapoints')
        s = bisect.bisect_right(self._offsets_list, index) - 1
        return self.names[s], index - self._offsets_list[s]

    def read_seeded(self, index: int, seed: int) -> dict:
        """The datapoint at composite ``index`` after its source's fns, called with ``seed``.

        An error names the source: its message starts with ``source 'name': ``
        and keeps its type, file and index (the index in the source).
        """
        name, i = self.decode(index)
        source = self.sources[name]
        try:
            chain = self._chain(name)
            if chain and getattr(chain[0], 'reads', False):
                dp, chain = chain[0].read(source, i, seed=seed), chain[1:]
            else:
                read = self._hooks[name].read_seeded
                dp = read(i, seed) if read is not None else source[i]
            if chain:
                dp = dict(dp)
                for fn in chain:
                    dp = fn(dp, seed=seed)
        except Exception as exc:
            _name_source(exc, name, i)
            raise
        key = self.source_key
        if key is not None:
            if not isinstance(dp, dict):
                return dp           # the Assembler says what is wrong, naming the index
            if key in dp:
                # Never overwrite the datapoint's own value: that would be silent data loss.
                raise ConfigError(f'source {name!r}: the datapoint already has a key {key!r}, '
                                  f"which the Mix sets to the source's name; give the Mix "
                                  f"another source_key= (or source_key=None for none)",
                                  index=i)
            if dp is source or not chain:
                dp = dict(dp)       # never write into the reader's own dict
            dp[key] = name
        return dp

    def _chain(self, name: str) -> list:
        """Source ``name``'s fns as they run: a decode followed by its crop fused into one
        (loadr.decode), as the Loader's own fns are; ``self.fns`` keeps what the user gave
        (the fingerprint names those)."""
        chains = self.__dict__.get('_chains')
        if chains is None:
            from .decode import fuse
            chains = self._chains = {n: fuse(c) if c else c for n, c in self.fns.items()}
        return chains[name]

    def name_error(self, exc: BaseException, index: int) -> None:
        """Say in ``exc`` which source composite ``index`` belongs to, as :meth:`read_seeded`
        does for a source's own errors; the Assembler calls it for an error of the Loader's
        own fns (common to every source). An error that names its source already is left."""
        if getattr(exc, 'source', None) is None:
            try:
                name, i = self.decode(index)
            except (TypeError, IndexError):
                return
            _name_source(exc, name, i)

    def source_fns(self) -> dict:
        """``{source name: [fn, ...]}``: each source's own fns, a nested Mix's as
        ``'outer/inner'`` (what a saved state's fingerprint digests)."""
        out = {}
        for name in self.sources:
            out[name] = list(self.fns[name])
            inner = self._hooks[name].source_fns
            if inner is not None:
                out.update({f'{name}/{k}': v for k, v in inner().items()})
        return out

    @property
    def prefetches(self) -> bool:
        """True when some source reads ahead (its files are remote; see loadr.storage.remote)."""
        return any(h.prefetch is not None for h in self._hooks.values())

    def prefetch(self, indices) -> None:
        """Start reading composite ``indices`` ahead, each in its source (a hint)."""
        wanted: dict[str, list[int]] = {}
        for index in indices:
            name, i = self.decode(index)
            wanted.setdefault(name, []).append(i)
        for name, local in wanted.items():
            prefetch = self._hooks[name].prefetch
            if prefetch is not None:
                prefetch(local)

    @property
    def caches(self) -> bool:
        """True when some source keeps a local cache of remote records (``cache_dir``)."""
        return any(h.cache_clock is not None for h in self._hooks.values())

    def cache_clock(self, order, start: int, count: int) -> None:
        """Tell each caching source which positions of its own stream the reads that follow
        serve (the Loader calls it once per batch; see ``loadr.storage.caching``).

        Positions ``start ..`` of the mix hold, for source ``s``, positions
        ``first .. first + n - 1`` of the source's own order: that order and those
        positions are what its cache needs to know when each record is read next.
        A source with no position in the batch is not told (its last batch's reads
        are offered at its next one, or at the end). A Mix inside a Mix reads its
        sources in another order than its own: it is not told either.
        """
        if not isinstance(order, MixOrder) or order.names != self.names:
            return
        for s, source_order, first, n in order.source_positions(start, count):
            name = self.names[s]
            clock = self._hooks[name].cache_clock
            if clock is not None and not isinstance(self.sources[name], Mix):
                clock(source_order, first, n)

    def cache_flush(self) -> None:
        """Offer each source's cache what was fetched since its last clock (at the end)."""
        for hooks in self._hooks.values():
            if hooks.cache_flush is not None:
                hooks.cache_flush()

    def shared(self) -> Mix:
        """This Mix as its workers read it: each ``list`` or ``tuple`` source (a nested
        Mix's too) in shared memory, as the Loader shares a list of its own
        (:func:`loadr.shared.share`: by size, ``LOADR_SHARE``, within the budget). The
        same datapoints, order and identity (a SharedList's is its list's); the Mix
        itself when no source is shared. The Loader calls it when its first workers
        start, and :meth:`release_shared` when it closes."""
        from .shared import share

        sources: dict = {}
        try:
            for name, source in self.sources.items():
                sources[name] = share(source)
        except BaseException:
            self._release(sources)
            raise
        if all(sources[name] is self.sources[name] for name in self.names):
            return self
        # A copy, so the user's Mix keeps its own sources (another Loader may read it);
        # it pickles with the SharedLists (where their memory is), not the lists.
        twin = copy.copy(self)
        twin.sources = sources
        return twin

    def release_shared(self, shared) -> None:
        """Give back the shared memory that :meth:`shared` took for ``shared``."""
        if shared is not self:
            self._release(shared.sources)

    def _release(self, sources: dict) -> None:
        from .shared import release

        for name, source in sources.items():
            release(source, self.sources[name])

    def __getitem__(self, index: int) -> dict:
        """Composite ``index``, its source's fns called with seed 0 (the Loader
        gives every position its own seed through :meth:`read_seeded`)."""
        return self.read_seeded(index, 0)

    def identity(self) -> dict:
        """The sources' identities and the weights: what a saved state is checked against."""
        return {'type': 'Mix',
                'sources': [{'name': name, 'n': n, 'identity': _identity(reader, hooks)}
                            for (name, reader), hooks, n in zip(self.sources.items(),
                                                                self._hooks.values(), self.sizes)],
                'weights': [[p, w] for p, w in self.schedule],
                'source_key': self.source_key}

    def __repr__(self) -> str:
        return f'Mix({dict(zip(self.names, self.sizes))}, weights={self.schedule})'


def _identity(reader, hooks) -> dict:
    """A source's identity: its own, or its type and length."""
    if hooks.identity is not None:
        return hooks.identity()
    return {'type': type(reader).__name__, 'n': len(reader)}
