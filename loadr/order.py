"""The order of the stream: which datapoint sits at each position.

Position ``p`` of the stream holds dataset index ``perm(seed, p // N)[p % N]``
(the contract of docs/FORMATS.md §6). ``perm(seed, epoch)`` is a
keyed bijection of ``[0, N)``; which one depends on the order's *version*
(a saved state records it, so a stream replays with the order it was made
with):

- version 2 (the default): up to :data:`SORT_MAX` indices, the indices sorted
  by a keyed 64-bit bijection of each (uniform over all ``N!`` orders; one
  table of ``4 N`` bytes per epoch, kept in a small cache). Above it, the
  Feistel network below followed by a keyed transposition applied with
  probability 1/2, so even and odd permutations are equally likely.
- version 1 (loadr 0.1): a Feistel network over the smallest even number of
  bits that covers ``N``, with cycle walking to stay inside ``[0, N)``. Every
  balanced Feistel round is an even permutation, so this one is always even
  for ``N`` a power of 4 and biased otherwise; kept bit for bit for old states.

The Feistel network is computed per index: O(1) memory and O(1) work per
lookup for any ``N`` (10^10 included), and ``load()`` at any step is instant.

Each (seed, epoch) gets its own round keys from BLAKE2b over both numbers,
so no two pairs share a permutation (``seed + epoch`` would make seed 1
epoch 0 equal seed 0 epoch 1). Per-sample seeds are a separate keyed hash of
(seed, position).

Example::

    order = Order(n=10, seed=0, shuffle=True)
    order.indices(0, 10)          # a permutation of 0..9: epoch 0
    order.indices(10, 10)         # another one: epoch 1
    order.seeds(0, 3)             # per-sample seeds for positions 0, 1, 2
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from .sources import Ordering

__all__ = ['Order', 'order_for', 'indices_many', 'permutation', 'MAX_SEED', 'ORDER_VERSION',
           'ORDER_VERSIONS']

ROUNDS = 8
# The permutation's version (see the module's docstring): 1 is loadr 0.1's
# order, kept bit for bit; 2 is uniform over permutations.
ORDER_VERSION = 2
ORDER_VERSIONS = (1, 2)
# Version 2: up to this many indices the permutation is a keyed sort (uniform
# over all n! orders, O(n) memory); above it, the O(1) Feistel network with a
# keyed transposition that makes its parity even or odd with equal odds.
SORT_MAX = 1 << 16
# The stride of the replacement candidates under on_error='skip' (2**32 / phi):
# a pure function of the failed index, so every run substitutes the same one.
_ALT_STRIDE = 0x9E3779B1
MAX_SEED = 2**64 - 1
_U64 = 2**64 - 1


def _u64(value: int) -> np.ndarray:
    # 0-d arrays, not numpy scalars: as a ufunc operand a scalar is converted
    # on every call, which made the Feistel rounds half again as slow.
    return np.array(value, dtype=np.uint64)


_M1_INT, _M2_INT = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_M1, _M2 = _u64(_M1_INT), _u64(_M2_INT)
_S30, _S27, _S31 = _u64(30), _u64(27), _u64(31)
_SEED_MASK = _u64(2**63 - 1)
# Below this many positions left outside [0, n), cycle walking goes on in
# Python ints: a numpy pass costs its ~100 ufunc calls whatever the size.
_PYTHON_WALK = 8


def _mix(x: np.ndarray) -> np.ndarray:
    # SplitMix64's finaliser: a cheap bijective 64-bit mixer with full avalanche.
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def _mix_int(x: int) -> int:
    """:func:`_mix` on one Python int (the same function, bit for bit)."""
    x = ((x ^ (x >> 30)) * _M1_INT) & _U64
    x = ((x ^ (x >> 27)) * _M2_INT) & _U64
    return x ^ (x >> 31)


def _keys(purpose: bytes, *numbers: int) -> np.ndarray:
    data = b''.join(int(v).to_bytes(16, 'little', signed=True) for v in numbers)
    digest = hashlib.blake2b(data, digest_size=8 * ROUNDS, person=purpose).digest()
    return np.frombuffer(digest, dtype='<u8').astype(np.uint64)


def check_seed(seed) -> int:
    """Return ``seed`` as an int in ``[0, 2**64)`` or raise ValueError."""
    if isinstance(seed, bool) or not hasattr(seed, '__index__'):
        raise ValueError(f'seed must be an integer, not {type(seed).__name__}')
    seed = seed.__index__()
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f'seed must be in [0, 2**64), got {seed}')
    return seed


class _Permutation:
    """A keyed bijection of ``[0, n)``; call it on a uint64 array of positions."""

    def __init__(self, n: int, keys: np.ndarray):
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self.n_int, self.half_int, self.mask_int = n, bits // 2, (1 << (bits // 2)) - 1
        self.keys_int = [int(k) for k in keys]
        self.n = _u64(n)
        self.half = _u64(bits // 2)
        self.mask = _u64(self.mask_int)
        self.keys = [_u64(k) for k in self.keys_int]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << self.half) | right

    def _feistel_int(self, x: int) -> int:
        half, mask = self.half_int, self.mask_int
        left, right = x >> half, x & mask
        for key in self.keys_int:
            left, right = right, left ^ (_mix_int(right ^ key) & mask)
        return (left << half) | right

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self._feistel(x)
        # Cycle walking: the domain is at most 4n, so on average < 4 passes.
        outside = np.flatnonzero(y >= self.n)
        while len(outside) > _PYTHON_WALK:
            walked = self._feistel(y[outside])
            y[outside] = walked
            outside = outside[walked >= self.n]
        n = self.n_int
        for i in outside.tolist():
            v = int(y[i])
            while v >= n:
                v = self._feistel_int(v)
            y[i] = v
        return y


class _SwappedPermutation(_Permutation):
    """Version 2 for large ``n``: the Feistel network, then a keyed transposition.

    Every balanced Feistel round is an even permutation of its domain, so for
    ``n`` a power of 4 the network alone is always even, and cycle walking
    leaves the parity biased for other ``n``. Swapping two keyed values when a
    key bit says so makes the parity a fair coin independent of the network
    (parity = network's parity XOR that bit), for every ``n``; the swap costs
    two comparisons per lookup and no memory.
    """

    def __init__(self, n: int, keys: np.ndarray, extra: np.ndarray):
        super().__init__(n, keys)
        w0, w1, w2 = (int(v) for v in extra[:3])
        self.swap = None
        if n > 1 and w2 >> 63:
            a = w0 % n
            self.swap = (_u64(a), _u64((a + 1 + w1 % (n - 1)) % n))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = super().__call__(x)
        if self.swap is not None:
            a, b = self.swap
            at_a, at_b = y == a, y == b
            y[at_a] = b
            y[at_b] = a
        return y


class _SortedPermutation:
    """Version 2 for small ``n``: the indices sorted by a keyed 64-bit bijection.

    The ranks of ``n`` distinct outputs of a random permutation of 64-bit
    words are uniform over all ``n!`` orders, so this is as uniform as the
    keyed mixer is random (the Feistel network is measurably not: see
    CHANGELOG.md). The mixer is a bijection, so there are no ties and the
    result does not depend on numpy's sort algorithm. Takes 4 bytes per index,
    which is why it is used only up to :data:`SORT_MAX`.
    """

    def __init__(self, n: int, extra: np.ndarray):
        self.table = _sorted_tables(n, extra[None, 3:6])[0]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.table[x].astype(np.uint64)


def _sorted_tables(n: int, keys: np.ndarray) -> np.ndarray:
    """One :class:`_SortedPermutation` table per row of ``keys`` (3 words each)."""
    k0, k1, k2 = (keys[:, j, None] for j in range(3))
    words = _mix(_mix(_mix(np.arange(n, dtype=np.uint64) ^ k0) + k1) ^ k2)
    # The words are distinct (a bijection of distinct inputs), so every sort
    # gives the same order: numpy's default one, four times as fast as its
    # stable one on 64-bit keys (1.1 vs 4.4 ms for 50,000; each worker builds
    # the table of each epoch it reads).
    return np.argsort(words, axis=1).astype(np.uint32)


def _many_sorted(n: int, seed: int, first: int, last: int) -> np.ndarray:
    """The tables of epochs ``first .. last`` at once (rows), for ``n`` below a batch:
    one numpy pass instead of one per epoch."""
    keys = np.stack([_keys(b'loadr.order.v2x', seed, e)[3:6] for e in range(first, last + 1)])
    return _sorted_tables(n, keys)


@functools.lru_cache(maxsize=64)
def _feistel_permutation(n: int, seed: int, epoch: int, version: int) -> _Permutation:
    if version == 1:
        return _Permutation(n, _keys(b'loadr.order', seed, epoch))
    return _SwappedPermutation(n, _keys(b'loadr.order.v2', seed, epoch),
                               _keys(b'loadr.order.v2x', seed, epoch))


# Few entries: each holds up to SORT_MAX * 4 bytes (256 KiB).
@functools.lru_cache(maxsize=16)
def _sorted_permutation(n: int, seed: int, epoch: int) -> _SortedPermutation:
    return _SortedPermutation(n, _keys(b'loadr.order.v2x', seed, epoch))


def permutation(n: int, seed: int, epoch: int, version: int = ORDER_VERSION):
    """The permutation of epoch ``epoch`` for ``seed``: call it on a uint64 array.

    >>> sorted(permutation(5, 0, 0)(np.arange(5, dtype=np.uint64)).tolist())
    [0, 1, 2, 3, 4]
    """
    if version >= 2 and n <= SORT_MAX:
        return _sorted_permutation(n, seed, epoch)
    return _feistel_permutation(n, seed, epoch, version)


class Order:
    """Stream positions -> dataset indices and per-sample seeds; picklable and tiny.

    Example::

        order = Order(n=1000, seed=3, shuffle=True)
        idx = order.indices(start=2048, count=256)   # int64 array of 256 dataset indices
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True, version: int = ORDER_VERSION):
        if n <= 0:
            raise ValueError(f'the dataset is empty (n={n}); nothing to load')
        self.n = int(n)
        self.seed = check_seed(seed)
        self.shuffle = bool(shuffle)
        self.version = check_version(version)
        self._seed_key = _keys(b'loadr.sample', self.seed)[:2]

    def __getstate__(self):
        return (self.n, self.seed, self.shuffle, self.version)

    def __setstate__(self, state):
        Order.__init__(self, *state)

    def positions(self, start: int, count: int) -> np.ndarray:
        if start < 0 or count < 0 or start + count > 2**63:
            raise ValueError(f'positions {start}..{start + count} out of range')
        return np.arange(start, start + count, dtype=np.uint64)

    def indices(self, start: int, count: int) -> np.ndarray:
        """Dataset indices at stream positions ``start .. start + count - 1`` (int64)."""
        if self.shuffle and self.version >= 2 and self.n <= SORT_MAX and 0 <= start:
            epoch, first = divmod(start, self.n)
            if 0 < count <= self.n - first:
                # Within one epoch of a sorted table: its positions are one slice of it
                # (a batch's worth in 1/6 of the time of the general path's gather).
                table = _sorted_permutation(self.n, self.seed, epoch).table
                return table[first:first + count].astype(np.int64)
        out, runs = self._runs(start, count)
        for perm, lo, hi, local in runs:
            out[lo:hi] = perm(local)
        return out.astype(np.int64)

    def _runs(self, start: int, count: int) -> tuple[np.ndarray, list]:
        """``(out, runs)``: ``out`` (uint64) is final except where a run
        ``(permutation, lo, hi, local positions)`` says to fill ``out[lo:hi]``."""
        pos = self.positions(start, count)
        n = np.uint64(self.n)
        local = pos % n
        if not self.shuffle:
            return local, []
        epochs = pos // n
        first, last = int(epochs[0]) if count else 0, int(epochs[-1]) if count else -1
        if last - first >= 2 and self.version >= 2 and self.n <= SORT_MAX:
            # A tiny dataset: many epochs per call.
            tables = _many_sorted(self.n, self.seed, first, last)
            return tables[(epochs - np.uint64(first)).astype(np.intp), local.astype(np.intp)
                          ].astype(np.uint64), []
        if first == last:
            return local, [(permutation(self.n, self.seed, first, self.version), 0, count, local)]
        runs = []
        for epoch in range(first, last + 1):
            # Positions are consecutive, so each epoch is one contiguous run.
            lo = max(0, epoch * self.n - start)
            hi = min(count, (epoch + 1) * self.n - start)
            runs.append((permutation(self.n, self.seed, epoch, self.version), lo, hi,
                         local[lo:hi]))
        return local, runs

    def index_at(self, position: int) -> int:
        """The dataset index at one stream position. ``Order(5, 0).index_at(7)``."""
        return int(self.indices(position, 1)[0])

    def seeds(self, start: int, count: int) -> list[int]:
        """Per-sample seeds (ints in [0, 2**63)) for positions ``start .. start + count - 1``."""
        pos = self.positions(start, count)
        k0, k1 = self._seed_key
        return (_mix(_mix(pos ^ k0) + k1) & _SEED_MASK).tolist()

    def alternative(self, index: int, k: int) -> int:
        """The ``k``-th replacement candidate (k >= 1) for a failed ``index``.

        >>> Order(10, 0).alternative(3, 1)
        4
        """
        return (index + k * _ALT_STRIDE) % self.n

    def __repr__(self) -> str:
        return (f'Order(n={self.n}, seed={self.seed}, shuffle={self.shuffle}, '
                f'version={self.version})')


def indices_many(requests: list) -> list[np.ndarray]:
    """``[order.indices(start, count) for order, start, count in requests]``, faster.

    The Feistel rounds of all the orders run as one numpy pass with per-element
    keys (a Mix asks for a few indices from each of its sources per batch),
    giving the very same values.

    >>> a, b = Order(10**6, 1), Order(10**7, 2)
    >>> [x.tolist() for x in indices_many([(a, 5, 3), (b, 0, 2)])] == [
    ...     a.indices(5, 3).tolist(), b.indices(0, 2).tolist()]
    True
    """
    outs, feistel = [], []
    for order, start, count in requests:
        out, runs = order._runs(start, count)
        outs.append(out)
        for perm, lo, hi, local in runs:
            if type(perm) is _SortedPermutation:
                out[lo:hi] = perm(local)
            else:
                feistel.append((perm, out, lo, hi, local))
    if len(feistel) == 1:
        perm, out, lo, hi, local = feistel[0]
        out[lo:hi] = perm(local)
    elif feistel:
        results = _feistel_many([f[0] for f in feistel], [f[4] for f in feistel])
        for (_, out, lo, hi, _), result in zip(feistel, results):
            out[lo:hi] = result
    return [out.astype(np.int64) for out in outs]


_NO_SWAP = np.array(2**64 - 1, dtype=np.uint64)       # matches no index


def _feistel_many(perms: list, xs: list) -> list[np.ndarray]:
    """``[perm(x) for perm, x in zip(perms, xs)]`` for Feistel permutations, in one pass."""
    sizes = [len(x) for x in xs]
    which = np.repeat(np.arange(len(perms)), sizes)
    keys = np.array([p.keys_int for p in perms], dtype=np.uint64)[which]   # (count, ROUNDS)
    half = np.array([p.half_int for p in perms], dtype=np.uint64)[which]
    mask = np.array([p.mask_int for p in perms], dtype=np.uint64)[which]
    n = np.array([p.n_int for p in perms], dtype=np.uint64)[which]

    def feistel(x, at):
        h, m = half[at], mask[at]
        left, right = x >> h, x & m
        for r in range(ROUNDS):
            left, right = right, left ^ (_mix(right ^ keys[at, r]) & m)
        return (left << h) | right

    everything = np.arange(len(which))
    y = feistel(np.concatenate(xs), everything)
    outside = np.flatnonzero(y >= n)
    while len(outside) > _PYTHON_WALK:
        walked = feistel(y[outside], outside)
        y[outside] = walked
        outside = outside[walked >= n[outside]]
    for i in outside.tolist():
        perm, v = perms[which[i]], int(y[i])
        while v >= perm.n_int:
            v = perm._feistel_int(v)
        y[i] = v
    swaps = [getattr(p, 'swap', None) for p in perms]
    if any(s is not None for s in swaps):
        a = np.array([_NO_SWAP if s is None else s[0] for s in swaps], dtype=np.uint64)[which]
        b = np.array([_NO_SWAP if s is None else s[1] for s in swaps], dtype=np.uint64)[which]
        at_a, at_b = y == a, y == b
        y[at_a] = b[at_a]
        y[at_b] = a[at_b]
    return np.split(y, np.cumsum(sizes)[:-1])


def check_version(version) -> int:
    """Return ``version`` if it is a known order version, else raise ValueError."""
    if isinstance(version, bool) or not isinstance(version, int) or version not in ORDER_VERSIONS:
        raise ValueError(f'unknown order version {version!r}; this loadr knows '
                         f'{list(ORDER_VERSIONS)}')
    return version


def order_for(reader, seed: int, shuffle: bool = True, version: int = ORDER_VERSION):
    """The order of ``reader``'s stream: its own ``make_order`` if it has one (a Mix).

    Every order has ``n``, ``indices``, ``seeds``, ``index_at`` and
    ``alternative``, and pickles small.

    >>> order_for(list(range(4)), seed=0).n
    4
    """
    if isinstance(reader, Ordering):
        return reader.make_order(seed, shuffle, version)
    return Order(len(reader), seed, shuffle, version)
