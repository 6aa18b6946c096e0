"""The exact order of a :class:`~loadr.mix.Mix`: :class:`MixOrder` maps stream
positions to composite indices, from the weights' schedule
(:mod:`loadr.mix._weights`) and each source's own epochs."""

from __future__ import annotations

import bisect
import collections
import hashlib

import numpy as np

from ..order import (
    ORDER_VERSION,
    SORT_MAX,
    Order,
    check_seed,
    check_version,
    indices_many,
    permutation,
)
from ._weights import BLOCK, block_table, build_schedule

_ALT_STRIDE = 0x9E3779B1
# How many blocks back a MixOrder reads on from a block whose counts it has (see
# _counts_at_block); with few sources, one (floor sums are cheap then).
_WALK_BLOCKS = 64
# Above this many sources a MixOrder keeps its sources' epoch tables itself, up to
# _TABLE_BYTES (the order module keeps 16: fewer than the sources of one batch).
_MANY_SOURCES = 16
_TABLE_BYTES = 32 << 20


def source_seed(seed: int, name: str) -> int:
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
    ``shifts`` holds what each weight segment adds to its own counts to carry
    the counts over its change point; the Mix keeps them for its next orders.

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
            build_schedule(w, self.names, f'weights at position {p}') for p, w in schedule]
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
        self.shifts = shifts
        self.n = sum(self.sizes)
        self.offsets = np.cumsum([0] + self.sizes)[:-1].astype(np.int64)
        self._sizes_np = np.asarray(self.sizes, dtype=np.int64)
        self._orders: list = [None] * len(self.names)       # each source's Order, when used
        self._seeder = Order(1, self.seed)
        self._block_counts: dict = {}
        # (seg, k) -> the block's table
        self._table: tuple[tuple | None, tuple | None] = (None, None)
        self._tables: collections.OrderedDict = collections.OrderedDict()   # _epoch_table
        self._table_bytes = 0

    def __getstate__(self):
        # The built schedule goes as it is (arrays as bytes), never built again; a
        # mix of two sources pickles in some 300 bytes.
        return (self.names, self.sizes, self.seed, self.shuffle, self.version, self._starts,
                self._plans, [s.tobytes() for s in self.shifts])

    def __setstate__(self, state):
        self.names, self.sizes, self.seed, self.shuffle, self.version, self._starts, \
            self._plans, shifts = state
        self._setup([np.frombuffer(s, dtype=np.int64) for s in shifts])

    def _order(self, s: int) -> Order:
        order = self._orders[s]
        if order is None:
            order = self._orders[s] = Order(self.sizes[s], source_seed(self.seed, self.names[s]),
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
                counts = plan.counts_at_block(k) + self.shifts[seg]
            if len(self._block_counts) >= 64:
                self._block_counts.clear()
            self._block_counts[key] = counts
        return counts

    def _block(self, seg: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The source and rank of each position of block ``k`` (kept for the last block)."""
        key, table = self._table
        if key != (seg, k) or table is None:
            table = block_table(self._plans[seg].quotas(k))
            self._table = ((seg, k), table)
        return table

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
        return self._plans[seg].counts_at(p) + self.shifts[seg]

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
            table = permutation(self.sizes[s], source_seed(self.seed, self.names[s]), epoch,
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
