"""When each record is read next, from the order: what the cache's eviction asks.

Because loadr's order is a pure function of the position, the cache knows
when each record will be read next (:class:`NextUse`), and when it is full it
drops the range whose next use lies furthest in the future (Belady's
optimal policy, which needs the future: here we have it). ``'lru'`` (least
recently used) is there to compare against. See :mod:`loadr.storage.cache`.
"""

from __future__ import annotations

import collections
import os

import numpy as np

__all__ = ['NextUse', 'NEVER', 'POLICIES', 'EPOCHS_KEPT']

POLICIES = ('furthest', 'lru')
# The next use of an index that the stream never reads (outside [0, n)).
NEVER = np.iinfo(np.int64).max
# Epochs whose inverse permutation NextUse keeps: the current one, the next,
# and one more so that workers a little apart in the stream do not thrash.
EPOCHS_KEPT = 3


class NextUse:
    """Maps dataset indices to the next stream position at which each is read.

    ``next_use(indices, now)`` is, for each index ``i``, the smallest position
    ``q >= now`` of the stream that holds ``i`` (``order.indices(q, 1)[0] ==
    i``); :data:`NEVER` for an index outside ``[0, n)``. For ``now`` in epoch
    ``e = now // n`` that is ``e * n + inv_e[i]`` if not before ``now``, else
    ``(e + 1) * n + inv_{e+1}[i]``, where ``inv_e`` is the inverse of the
    epoch's permutation.

    ``order`` is a :class:`loadr.order.Order` (each epoch of ``n`` positions a
    permutation of ``[0, n)``); a Mix's source has its own Order at the
    source's own stream position. Memory: ``inv_e`` is computed once per
    epoch (from ``order.indices(e * n, n)``, which is briefly another 8 bytes
    per index) and kept for the last :data:`EPOCHS_KEPT` epochs used, 4 bytes
    per index each (8 above 2**31 indices): 15 MB for 1.28M records. Without
    shuffling the inverse is the identity and nothing is kept. Pickles as its
    order alone.

    >>> from loadr.order import Order
    >>> order = Order(5, seed=0, shuffle=False)
    >>> NextUse(order)([0, 3, 4], now=4)         # 0 and 3 were read before position 4
    array([5, 8, 4])
    """

    def __init__(self, order):
        self.order = order
        self.n = int(order.n)
        self._dtype = np.int32 if self.n < 2**31 else np.int64
        self._inverses: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

    def __getstate__(self):
        return {'order': self.order}

    def __setstate__(self, state):
        NextUse.__init__(self, state['order'])

    def __repr__(self) -> str:
        return f'NextUse({self.order!r})'

    def _inverse(self, epoch: int) -> np.ndarray:
        inv = self._inverses.get(epoch)
        if inv is not None:
            self._inverses.move_to_end(epoch)
            return inv
        n = self.n
        perm = self.order.indices(epoch * n, n)
        inv = np.full(n, -1, dtype=self._dtype)
        inv[perm] = np.arange(n, dtype=self._dtype)
        if inv.min() < 0:
            raise ValueError(f'{self.order!r}: epoch {epoch} is not a permutation of [0, {n}); '
                             f'NextUse needs an Order whose epochs are permutations')
        self._inverses[epoch] = inv
        while len(self._inverses) > EPOCHS_KEPT:
            self._inverses.popitem(last=False)
        return inv

    def __call__(self, indices, now: int) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        now = int(now)
        if now < 0:
            raise ValueError(f'now must be a stream position >= 0, not {now}')
        n = self.n
        epoch = now // n
        out = np.full(len(idx), NEVER, dtype=np.int64)
        valid = (idx >= 0) & (idx < n)
        if not valid.all():
            idx = idx[valid]
        if self.order.shuffle:
            q = epoch * n + self._inverse(epoch)[idx].astype(np.int64)
        else:
            q = epoch * n + idx
        past = q < now
        if past.any():
            if self.order.shuffle:
                q[past] = (epoch + 1) * n + self._inverse(epoch + 1)[idx[past]].astype(np.int64)
            else:
                q[past] += n
        out[valid] = q
        return out


def furthest(view, slots, new, new_length, excess: int, next_use):
    """Whom to evict for ``excess`` bytes: the entries at ``slots`` of ``view`` and the
    ``new`` ranges (``(key, index, length, data)``) whose next use lies furthest ahead.

    Returns ``(slots to evict, a bool per newcomer: admitted)``.
    """
    new_index = np.array([item[1] for item in new], dtype=np.int64)
    uses = np.asarray(next_use(np.concatenate([view.index[slots], new_index])),
                      dtype=np.int64)
    lengths = np.concatenate([view.length[slots], new_length])
    # Ties (several ranges of one record) go against the newcomers, so
    # equal entries are not churned. Furthest first: the order to evict in.
    is_new = np.r_[np.zeros(len(slots), bool), np.ones(len(new), bool)]
    order = np.lexsort((is_new, uses))[::-1]
    cut = int(np.searchsorted(np.cumsum(lengths[order]), excess)) + 1
    out = order[:cut]
    evict_slots = slots[out[out < len(slots)]]
    admit = np.ones(len(new), dtype=bool)
    admit[out[out >= len(slots)] - len(slots)] = False
    return evict_slots, admit


def lru(view, slots, new_length, max_bytes: int, path_of):
    """Whom to evict, least recently used first (recency: the mtime of the entry's file
    ``path_of(name)``); as :func:`furthest` returns."""
    # Newcomers are the most recent: admitted while they fit by themselves.
    admit = np.cumsum(new_length) <= max_bytes
    excess = view.bytes + int(new_length[admit].sum()) - max_bytes
    if excess <= 0:
        return slots[:0], admit
    mtimes = np.empty(len(slots), dtype=np.int64)
    for i, slot in enumerate(slots.tolist()):
        try:
            mtimes[i] = os.stat(path_of(view.names[slot])).st_mtime_ns
        except OSError:
            mtimes[i] = -1      # gone: evicting it costs nothing
    order = np.argsort(mtimes, kind='stable')
    cut = int(np.searchsorted(np.cumsum(view.length[slots][order]), excess)) + 1
    return slots[order[:cut]], admit
