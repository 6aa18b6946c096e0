"""A :class:`~loadr.mix.Mix`'s weights made exact and laid out in blocks: each
weight as a fraction, their rounding to one common denominator, and the
schedule (:class:`Schedule`) that gives each source its count at any
position. The module docstring of :mod:`loadr.mix` describes the method."""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import sys
from fractions import Fraction

import numpy as np

from ..errors import ConfigError

BLOCK = 1024
# Weights are read as fractions with denominators up to this (0.8 -> 4/5).
WEIGHT_DENOMINATOR = 10**6
# Normalised weights whose common denominator is larger (many unrelated
# fractions) are rounded to multiples of 2**-62: that adds at most one sample of
# drift per 4.6e18 positions, and the floor sums stay cheap.
_MAX_DENOMINATOR = 2**62
_GOLDEN = (math.sqrt(5) - 1) / 2
# rotation(2**62), the search's answer (0.1 s), written out: tests/test_mix.py checks it.
_ROTATION_2_62 = 2850178704830800257


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


def block_table(quotas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
def rotation(q: int) -> int:
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
    if best is None:    # no g coprime to q near the centre (never seen): 1 always is
        return 1
    return best[2]


class Schedule:
    """One weight set: the notional counts of each source at any position.

    Built from the normalised weights ``m_s / D`` (:func:`normalise`), with
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
        self.g = rotation(q)
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
        sources, _ = block_table(self.quotas(k))
        inside = np.bincount(sources[:j], minlength=len(self.base))
        return self.counts_at_block(k) + inside


def _restore_schedule(q: int, r: int, g: int, base: bytes, f: bytes, arc: bytes) -> Schedule:
    schedule = Schedule.__new__(Schedule)
    schedule.q, schedule.r, schedule.g = q, r, g
    schedule.base, schedule.f, schedule.arc = (np.frombuffer(b, dtype=np.int64)
                                               for b in (base, f, arc))
    schedule._extra = np.flatnonzero(schedule.f)
    return schedule


def _weight(value, name: str, where: str) -> tuple[int, int]:
    """One weight as ``(numerator, denominator)``, the nearest fraction with a denominator
    of at most 10^6; ConfigError naming it if it is not a number in ``[0, 1.8e308]`` (a
    float's range: the identity keeps it as a float)."""
    check_weight(value, name, where)
    if isinstance(value, float):
        return limit_denominator(*value.as_integer_ratio())
    fraction = Fraction(value).limit_denominator(WEIGHT_DENOMINATOR)
    return fraction.numerator, fraction.denominator


def limit_denominator(n: int, d: int) -> tuple[int, int]:
    """``Fraction(n, d).limit_denominator(10**6)`` (``n >= 0``, ``d > 0``, coprime) as a
    pair, without making Fractions: the same continued fraction, the same choice.

    >>> limit_denominator(*(0.8).as_integer_ratio())
    (4, 5)
    >>> limit_denominator(*math.pi.as_integer_ratio())
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


def check_weight(value, name: str, where: str) -> None:
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


def weight_fractions(weights: dict, names: list, where: str) -> list[tuple[int, int]]:
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


def fraction_sum(fractions: list[tuple[int, int]], lo: int, hi: int) -> tuple[int, int]:
    """``(numerator, lcm of the denominators)`` of the sum of ``fractions[lo:hi]``, halves
    first: the big numbers meet only near the top (a running sum grows them at every step)."""
    if hi - lo == 1:
        return fractions[lo]
    mid = (lo + hi) // 2
    a1, b1 = fraction_sum(fractions, lo, mid)
    a2, b2 = fraction_sum(fractions, mid, hi)
    b = b1 // math.gcd(b1, b2) * b2
    return a1 * (b // b1) + a2 * (b // b2), b


def normalise(raw: list[tuple[int, int]]) -> tuple[list[int], int]:
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

    >>> normalise([(4, 5), (1, 5)])
    ([4, 1], 5)
    """
    a_sum, b = fraction_sum(raw, 0, len(raw))
    if b.bit_length() <= 128:
        nums = [n * (b // d) for n, d in raw]
        g = math.gcd(*nums)
        nums, d = [x // g for x in nums], a_sum // g
        if d <= _MAX_DENOMINATOR:
            return nums, d
        # Hamilton's method, exactly: 2**62 * w_s = (x << 62) / d.
        units, rests = zip(*(divmod(x << 62, d) for x in nums))
        return hamilton(list(units), lambda s: rests[s], _MAX_DENOMINATOR, len(raw)), \
            _MAX_DENOMINATOR
    return round_large(raw, a_sum, b), _MAX_DENOMINATOR


def hamilton(units: list[int], rest, d: int, n: int, order=None) -> list[int]:
    """``units`` plus one for the ``d - sum(units)`` sources of the largest ``rest(s)``
    (ties: the earlier source). ``order``: the sources to consider, if not all."""
    left = d - sum(units)
    ranked = sorted(range(n) if order is None else order, key=lambda s: (-rest(s), s))
    for s in ranked[:left]:
        units[s] += 1
    return units


_FRACTION_BITS = 64


def round_large(raw: list[tuple[int, int]], a_sum: int, b: int,
                 bits: int = _FRACTION_BITS) -> list[int]:
    """Hamilton's rounding of ``raw / sum(raw)`` to multiples of 2**-62 (see
    :func:`normalise`) where the sum's denominator ``b`` is large.

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


def build_schedule(weights: dict, names: list, where: str) -> Schedule:
    """The schedule of one weight set (checked: ConfigError naming what is wrong)."""
    return Schedule(*normalise(weight_fractions(weights, names, where)))
