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
10^6 (0.8 is 4/5), and weights are normalised by their sum. A weight
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
import functools
import hashlib
import math
import sys
from fractions import Fraction

import numpy as np

from .errors import ConfigError, LoadrError
from .order import ORDER_VERSION, Order, check_seed, check_version, indices_many

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


@functools.lru_cache(maxsize=256)
def _block_table(quotas: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Source and rank of each position of a block with these quotas (sum: BLOCK).

    Source ``s``'s ``i``-th datapoint in the block is due at time
    ``(2i + 1) / (2 q_s)``. Positions follow the times, ties going to the lower
    source. Equal fractions give equal floats, and distinct ones with
    denominators up to 2048 are far apart next to a float's precision, so the
    order is exact. ``rank[j]`` counts the earlier positions of the same source.
    """
    sources = np.repeat(np.arange(len(quotas), dtype=np.int64), quotas)
    ranks = np.concatenate([np.arange(q, dtype=np.int64) for q in quotas])
    due = (2 * ranks + 1) / (2 * np.asarray(quotas, dtype=np.float64)[sources])
    order = np.lexsort((sources, due))
    return sources[order], ranks[order]


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

    Counts run from position 0, as if this weight set held from the start.
    :class:`MixOrder` shifts them so that each change point carries the
    counts over.
    """

    def __init__(self, weights: list[Fraction]):
        self.weights = weights
        scaled = [w * BLOCK for w in weights]
        self.base = [int(math.floor(x)) for x in scaled]
        fracs = [x - b for x, b in zip(scaled, self.base)]
        self.q = math.lcm(*(f.denominator for f in fracs))
        self.f = [int(f * self.q) for f in fracs]                 # f_s * Q, integers
        self.r = sum(self.f) // self.q                             # extras per block
        assert sum(self.f) == self.r * self.q and sum(self.base) + self.r == BLOCK
        self.arc = [sum(self.f[:s]) for s in range(len(weights))]  # arc starts, * Q
        self.g = _rotation(self.q)
        self.base_np = np.asarray(self.base, dtype=np.int64)

    def quotas(self, k: int) -> tuple:
        """Positions of each source in block ``k``."""
        turn = k * self.g % self.q
        return tuple(b + (f > 0 and (turn - a) % self.q < f)
                     for b, f, a in zip(self.base, self.f, self.arc))

    def counts_at_block(self, k: int) -> np.ndarray:
        """Each source's count before block ``k`` (int64 array)."""
        q, g, shift = self.q, self.g, (self.r + 1) * self.q
        extras = [0 if f == 0 else
                  _floor_sum(k, q, g, shift - a) - _floor_sum(k, q, g, shift - a - f)
                  for f, a in zip(self.f, self.arc)]
        return self.base_np * k + np.asarray(extras, dtype=np.int64)

    def counts_at(self, p: int) -> np.ndarray:
        """Each source's count before position ``p``."""
        k, j = divmod(p, BLOCK)
        sources, _ = _block_table(self.quotas(k))
        inside = np.bincount(sources[:j], minlength=len(self.weights))
        return self.counts_at_block(k) + inside


def _weight(value, name: str, where: str) -> Fraction:
    """One weight as a fraction (denominator at most 10^6); ConfigError naming it if it is
    not a number in ``[0, 1.8e308]`` (a float's range: the identity keeps it as a float)."""
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
    return Fraction(value).limit_denominator(WEIGHT_DENOMINATOR)


def _fractions(weights: dict, names: list, where: str) -> list[Fraction]:
    if not isinstance(weights, dict) or not weights:
        raise ConfigError(f'{where}: weights must be a non-empty mapping '
                          f'{{source name: weight}}, got {weights!r}')
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ConfigError(f'{where}: weights name unknown sources {unknown}; the sources are '
                          f'{names}')
    raw = []
    for name in names:
        raw.append(_weight(weights.get(name, 0), name, where))
    total = sum(raw)
    if total <= 0:
        raise ConfigError(f'{where}: the weights are all 0')
    weights = [w / total for w in raw]
    if math.lcm(*(w.denominator for w in weights)) > _MAX_DENOMINATOR:
        weights = _apportion(weights, _MAX_DENOMINATOR)
    return weights


def _apportion(weights: list[Fraction], d: int) -> list[Fraction]:
    """Weights as multiples of ``1/d`` summing to 1, each within ``1/d`` of its value.

    The largest remainders get the units left over (Hamilton's method).
    """
    scaled = [w * d for w in weights]
    units = [math.floor(x) for x in scaled]
    left = d - sum(units)
    for s in sorted(range(len(weights)), key=lambda s: scaled[s] - units[s], reverse=True)[:left]:
        units[s] += 1
    return [Fraction(u, d) for u in units]


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
                 shuffle: bool = True, version: int = ORDER_VERSION):
        self.names, self.sizes = list(names), [int(s) for s in sizes]
        self.schedule = [(int(p), dict(w)) for p, w in schedule]
        self.seed = check_seed(seed)
        self.shuffle = bool(shuffle)
        self.version = check_version(version)
        self.n = sum(self.sizes)
        self.offsets = np.cumsum([0] + self.sizes)[:-1].astype(np.int64)
        self._sizes_np = np.asarray(self.sizes, dtype=np.int64)
        self._starts = [p for p, _ in self.schedule]
        self._plans = [_Schedule(_fractions(w, self.names, f'weights at position {p}'))
                       for p, w in self.schedule]
        # Each segment's shift: the true counts at its change point minus its
        # own notional counts there.
        self._shift = []
        counts = np.zeros(len(self.names), dtype=np.int64)
        for i, (start, plan) in enumerate(zip(self._starts, self._plans)):
            if i:
                prev = self._plans[i - 1]
                counts = counts + prev.counts_at(start) - prev.counts_at(self._starts[i - 1])
            self._shift.append(counts - plan.counts_at(start))
        self._orders = [Order(n, _source_seed(self.seed, name), self.shuffle, self.version)
                        for name, n in zip(self.names, self.sizes)]
        self._seeder = Order(1, self.seed)
        self._block_counts: dict = {}

    def __getstate__(self):
        return (self.names, self.sizes, self.schedule, self.seed, self.shuffle, self.version)

    def __setstate__(self, state):
        self.__init__(*state)

    # -- the schedule ----------------------------------------------------------

    def _segment(self, p: int) -> int:
        return bisect.bisect_right(self._starts, p) - 1

    def _counts_at_block(self, seg: int, k: int) -> np.ndarray:
        key = (seg, k)
        counts = self._block_counts.get(key)
        if counts is None:
            plan = self._plans[seg]
            before = self._block_counts.get((seg, k - 1))
            if before is not None:
                # Reading on from the block before (the common case): no floor sums.
                counts = before + np.asarray(plan.quotas(k - 1), dtype=np.int64)
            else:
                counts = plan.counts_at_block(k) + self._shift[seg]
            if len(self._block_counts) >= 64:
                self._block_counts.clear()
            self._block_counts[key] = counts
        return counts

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
            sources, ranks = _block_table(self._plans[seg].quotas(k))
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
        return [(s, self._orders[s], first, int(sizes[s]))
                for s, first in zip(present.tolist(), firsts.tolist())]

    def locate(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, source index)`` of each position: int64 arrays."""
        src, by_source, present, firsts, sizes = self._source_runs(start, count)
        found = indices_many([(self._orders[s], first, int(sizes[s]))
                              for s, first in zip(present.tolist(), firsts.tolist())])
        index = np.empty(count, dtype=np.int64)
        if found:
            index[by_source] = np.concatenate(found)
        return src, index

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


def _identity(reader) -> dict:
    identity = getattr(reader, 'identity', None)
    if identity is not None:
        return identity()
    return {'type': type(reader).__name__, 'n': len(reader)}


class Mix:
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
            _fractions(w, self.names, f'weights at position {position}')   # checks them
        if schedule[0][0] != 0:
            raise ConfigError(f'a weight schedule starts at position 0, got {schedule[0][0]}')
        # Plain, JSON-able numbers from here on (they go into identity()).
        return [(int(p), {name: float(v) for name, v in w.items()}) for p, w in schedule]

    def __len__(self) -> int:
        return sum(self.sizes)

    def weights_at(self, position: int = 0) -> dict:
        """The normalised weights in force at ``position`` (floats)."""
        i = bisect.bisect_right([p for p, _ in self.schedule], position) - 1
        fractions = _fractions(self.schedule[i][1], self.names, 'weights')
        return {name: float(w) for name, w in zip(self.names, fractions)}

    def make_order(self, seed: int, shuffle: bool = True, version: int = ORDER_VERSION):
        """The :class:`MixOrder` for ``seed`` (what :func:`loadr.order.order_for` calls)."""
        return MixOrder(self.names, self.sizes, self.schedule, seed, shuffle, version)

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
            chain = self.fns[name]
            if chain and getattr(chain[0], 'reads', False):
                dp, chain = chain[0].read(source, i, seed=seed), chain[1:]
            else:
                read = getattr(source, 'read_seeded', None)
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
        for name, reader in self.sources.items():
            out[name] = list(self.fns[name])
            inner = getattr(reader, 'source_fns', None)
            if callable(inner):
                out.update({f'{name}/{k}': v for k, v in inner().items()})
        return out

    @property
    def prefetches(self) -> bool:
        """True when some source reads ahead (its files are remote; see loadr.remote)."""
        return any(getattr(r, 'prefetches', False) for r in self.sources.values())

    def prefetch(self, indices) -> None:
        """Start reading composite ``indices`` ahead, each in its source (a hint)."""
        wanted: dict[str, list[int]] = {}
        for index in indices:
            name, i = self.decode(index)
            wanted.setdefault(name, []).append(i)
        for name, local in wanted.items():
            if getattr(self.sources[name], 'prefetches', False):
                self.sources[name].prefetch(local)

    @property
    def caches(self) -> bool:
        """True when some source keeps a local cache of remote records (``cache_dir``)."""
        return any(getattr(r, 'caches', False) for r in self.sources.values())

    def cache_clock(self, order, start: int, count: int) -> None:
        """Tell each caching source which positions of its own stream the reads that follow
        serve (the Loader calls it once per batch; see ``loadr.remote``).

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
            source = self.sources[self.names[s]]
            if getattr(source, 'caches', False) and not isinstance(source, Mix):
                source.cache_clock(source_order, first, n)

    def cache_flush(self) -> None:
        """Offer each source's cache what was fetched since its last clock (at the end)."""
        for source in self.sources.values():
            if getattr(source, 'caches', False):
                source.cache_flush()

    def __getitem__(self, index: int) -> dict:
        """Composite ``index``, its source's fns called with seed 0 (the Loader
        gives every position its own seed through :meth:`read_seeded`)."""
        return self.read_seeded(index, 0)

    def identity(self) -> dict:
        """The sources' identities and the weights: what a saved state is checked against."""
        return {'type': 'Mix',
                'sources': [{'name': name, 'n': n, 'identity': _identity(reader)}
                            for (name, reader), n in zip(self.sources.items(), self.sizes)],
                'weights': [[p, w] for p, w in self.schedule],
                'source_key': self.source_key}

    def __repr__(self) -> str:
        return f'Mix({dict(zip(self.names, self.sizes))}, weights={self.schedule})'
