"""The order of the stream: which datapoint sits at each position.

Position ``p`` of the stream holds dataset index ``perm(seed, p // N)[p % N]``
(the contract of ../shared/reference/FORMATS.md). ``perm(seed, epoch)`` is a
keyed bijection of ``[0, N)``: a Feistel network over the smallest even
number of bits that covers ``N``, with cycle walking to stay inside
``[0, N)``. It is computed per index, so it takes O(1) memory and O(1) work
per lookup for any ``N`` (10^10 included), and ``load()`` at any step is
instant.

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

__all__ = ['Order', 'order_for', 'permutation', 'MAX_SEED', 'ORDER_VERSION', 'ORDER_VERSIONS']

ROUNDS = 8
# The permutation's version. A saved state records it so a stream is replayed
# with the order it was made with: 1 is loadr 0.1's Feistel order, kept bit for
# bit.
ORDER_VERSION = 1
ORDER_VERSIONS = (1,)
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


@functools.lru_cache(maxsize=64)
def permutation(n: int, seed: int, epoch: int) -> _Permutation:
    """The permutation of epoch ``epoch`` for ``seed``.

    >>> sorted(permutation(5, 0, 0)(np.arange(5, dtype=np.uint64)).tolist())
    [0, 1, 2, 3, 4]
    """
    return _Permutation(n, _keys(b'loadr.order', seed, epoch))


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
        self.__init__(*state)

    def positions(self, start: int, count: int) -> np.ndarray:
        if start < 0 or count < 0 or start + count > 2**63:
            raise ValueError(f'positions {start}..{start + count} out of range')
        return np.arange(start, start + count, dtype=np.uint64)

    def indices(self, start: int, count: int) -> np.ndarray:
        """Dataset indices at stream positions ``start .. start + count - 1`` (int64)."""
        pos = self.positions(start, count)
        n = np.uint64(self.n)
        local = pos % n
        if not self.shuffle:
            return local.astype(np.int64)
        epochs = pos // n
        first, last = int(epochs[0]) if count else 0, int(epochs[-1]) if count else -1
        out = np.empty(count, dtype=np.uint64)
        for epoch in range(first, last + 1):
            # Positions are consecutive, so each epoch is one contiguous run.
            lo = max(0, epoch * self.n - start)
            hi = min(count, (epoch + 1) * self.n - start)
            out[lo:hi] = permutation(self.n, self.seed, epoch)(local[lo:hi])
        return out.astype(np.int64)

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
    make_order = getattr(reader, 'make_order', None)
    if make_order is not None:
        return make_order(seed, shuffle, version)
    return Order(len(reader), seed, shuffle, version)
