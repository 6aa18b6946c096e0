"""The :class:`Mix`: named sources read as one dataset in exact proportions; the
method is in :mod:`loadr.mix`'s docstring, the order in :mod:`loadr.mix._order`
and the weights' schedule in :mod:`loadr.mix._weights`."""

from __future__ import annotations

import bisect
import copy

import numpy as np

from ..errors import ConfigError, LoadrError
from ..order import ORDER_VERSION
from ..sources import (
    Caching,
    Composite,
    ErrorNaming,
    Identified,
    Locating,
    Ordering,
    Prefetching,
    SeededSource,
    Sharing,
    hooks_of,
)
from ._order import MixOrder
from ._weights import build_schedule, check_weight, normalise, weight_fractions

__all__ = ['Mix']


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
        exc.source = name  # type: ignore[attr-defined]  # any exception: an attribute of ours
    except AttributeError:          # an exception type with __slots__: the message says it
        pass


class Mix(SeededSource, ErrorNaming, Prefetching, Caching, Ordering, Identified, Composite,
          Sharing, Locating):
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
        self._plans = [build_schedule(w, self.names, f'weights at position {p}')
                       for p, w in self.schedule]
        self._shifts: list | None = None
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
        self._hooks_cache: dict | None = None

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
                check_weight(value, name, where)
        if schedule[0][0] != 0:
            raise ConfigError(f'a weight schedule starts at position 0, got {schedule[0][0]}')
        # Plain, JSON-able numbers from here on (they go into identity()).
        return [(int(p), {name: float(v) for name, v in w.items()}) for p, w in schedule]

    def __len__(self) -> int:
        return sum(self.sizes)

    def weights_at(self, position: int = 0) -> dict:
        """The normalised weights in force at ``position`` (floats)."""
        i = bisect.bisect_right([p for p, _ in self.schedule], position) - 1
        numerators, d = normalise(weight_fractions(self.schedule[i][1], self.names,
                                                   'weights'))
        return {name: m / d for name, m in zip(self.names, numerators)}

    def make_order(self, seed: int, shuffle: bool = True, version: int = ORDER_VERSION):
        """The :class:`MixOrder` for ``seed`` (what :func:`loadr.order.order_for` calls)."""
        order = MixOrder(self.names, self.sizes, self.schedule, seed, shuffle, version,
                         plans=self._plans, shifts=self._shifts)
        self._shifts = order.shifts     # kept (and pickled with the Mix, for the workers)
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
            from ..decode import fuse
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

    def where(self, index: int) -> str | None:
        """The file (or URL) that holds composite ``index``, as its source names it (None
        for a source that cannot: a list)."""
        name, i = self.decode(index)
        source = self.sources[name]
        return source.where(i) if isinstance(source, Locating) else None

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
        from ..shared import share

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
        from ..shared import release

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
