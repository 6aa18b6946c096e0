"""The bag reader, and its read-ahead of remote records on one thread per process."""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Sequence

from ...errors import ConfigError, FormatError
from ...sources import Warming
from ...storage import netstats, storage_for
from ..base import Reader, check_index, known_options, open_each
from ..records import Source
from .file import ENTRY_BYTES, REFS_KEY, SPEC_NAME
from .layout import Dataset, list_shards, read_headers, read_tables

_ahead_executor = None
_ahead_pid = None


def _read_ahead_thread():
    """This process's thread for the second step of reading ahead (one, made on first use)."""
    global _ahead_executor, _ahead_pid
    if _ahead_executor is None or _ahead_pid != os.getpid():
        import concurrent.futures
        _ahead_executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix='loadr-bag-ahead', initializer=netstats.reading_ahead)
        _ahead_pid = os.getpid()
    return _ahead_executor


class BagReader(Reader, Warming):     # warm(): the index tables, ahead of the reads
    """A granular dataset directory, or a sharded directory of them, as a Reader.

    ``verify`` checks every record read against the digests that ``loadr
    check --write-digests`` recorded (:mod:`loadr.digests`).
    ``cache_index`` keeps every bag's index table in memory (8 bytes per
    record), ``cache_keys`` keeps the named bags (``'refs'`` included)
    whole in memory; both fill lazily, once per process, and are never
    pickled. ``decode_images=False`` leaves ``jpg``/``png`` values (and
    their sequence elements) as their encoded bytes. ``size`` is the bytes
    of every bag and spec.json. Subclasses may set ``files_class`` to a
    storage class (for example a :class:`~loadr.storage.LocalStorage`
    subclass that counts reads); by default the path's storage is used.

    Example::

        r = BagReader('../shared/fixtures/bag', cache_keys=('refs', 'idx'))
        r.available(1)                               # {'feat': True, 'frames': range(4), …}
        r[1, {'frames': [0, 3], 'idx': True}]        # frames 0..3 in one read, picks 0 and 3
    """

    files_class: type | None = None
    format_name = 'bag'

    def __init__(self, path: str | os.PathLike, cache_index: bool = True,
                 cache_keys: Sequence[str] = (), decode_images: bool = True,
                 storage_options: dict | None = None, verify: bool = False):
        self.path = os.fspath(path)
        if isinstance(cache_keys, str) or not all(isinstance(k, str) for k in cache_keys):
            raise ConfigError(f'cache_keys must be a list of key names, not {cache_keys!r}')
        self.cache_index = bool(cache_index)
        self.cache_keys = tuple(cache_keys)
        self.decode_images = bool(decode_images)
        self._files = (storage_for(self.path, storage_options) if self.files_class is None
                       else self.files_class())
        dirs, fatal, _ = list_shards(self._files, self.path)
        if fatal:
            raise FormatError(fatal[0].message, fatal[0].path)
        self._shards: list[Dataset] = []
        start = 0
        # Behind a URL the shards open concurrently (their round trips wait together).
        opened = open_each(self._files, lambda d: Dataset.open(
            d, self._files, self.cache_index, self.cache_keys, 0), dirs)
        for directory, shard in zip(dirs, opened):
            shard.start = start
            if self._shards and shard.spec_dict != self._shards[0].spec_dict:
                raise FormatError(f'spec differs from the first shard\'s '
                                  f'{self._shards[0].spec_dict}', os.path.join(directory,
                                                                               SPEC_NAME))
            self._shards.append(shard)
            start += len(shard)
        self._length = start
        self._stops = [s.start + len(s) for s in self._shards]
        unknown = [k for k in self.cache_keys if k != REFS_KEY and k not in self.spec]
        if unknown:
            raise ConfigError(f'cache_keys names {unknown[0]!r}, which is not in the spec '
                              f'{sorted(self.spec)} (or "refs")')
        self.size = sum(self._identity_files().values())
        self.verify = bool(verify)
        if self.verify:
            # The digests of each bag travel with it to workers (8 bytes a record).
            from ...digests import load
            recorded = load(self.path, storage_options, required=True)
            for shard in self._shards:
                for bag in shard.bags.values():
                    bag.digests = recorded.for_file(bag.path)

    def _identity_files(self) -> dict[str, int]:
        out = {}
        for s in self._shards:
            out[os.path.join(s.path, SPEC_NAME)] = s.spec_size
            out.update((b.path, b.size) for b in s.bags.values())
        return out

    @property
    def spec(self) -> dict:
        """``{key: type}`` with sorted keys, as spec.json."""
        return self._shards[0].spec_dict

    def details(self) -> dict:
        return {'shards': self.shards}

    @classmethod
    def source(cls, path: str, **options) -> Source:
        """The dataset with images as their encoded bytes, typed by its spec."""
        reader = cls(path, **dict(known_options(cls, options), decode_images=False))
        return Source(path, cls.format_name, reader, dict(reader.spec))

    @property
    def shards(self) -> int:
        """How many dataset directories this reader spans (1 when not sharded)."""
        return len(self._shards)

    def __len__(self) -> int:
        return self._length

    def _locate(self, index: int) -> tuple[Dataset, int]:
        shard = self._shards[bisect.bisect_right(self._stops, index)]
        return shard, index - shard.start

    def where(self, index: int) -> str | None:
        """The dataset directory (the shard) that holds datapoint ``index``."""
        return self._locate(check_index(index, self._length))[0].path

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop('_ahead', None)       # read-ahead jobs of this process
        return state

    def _get(self, index: int, mask: dict | None) -> dict:
        ahead = self.__dict__.get('_ahead')
        if ahead:
            job = ahead.pop(index, None)
            if job is not None:
                # Its value ranges are being asked for: wait until they are (the
                # refs came first anyway), or this read would fetch them again.
                # That wait is on the network (its refs' round trip): counted.
                t0 = None if job.done() else time.perf_counter()
                try:
                    job.result(getattr(getattr(self._files, 'settings', None), 'timeout_s',
                                       60.0) + 5)
                except Exception:
                    pass            # a hint: the read below reports what is wrong
                if t0 is not None:
                    netstats.waited(time.perf_counter() - t0)
        shard, local = self._locate(index)
        if not ahead and self._files.remote and any(
                b is not None and '_len' not in b.__dict__ for b in shard.bags.values()):
            # A first read of a shard not read ahead (the loader's spec probe): its
            # bags in one concurrent round trip, not a header and a record each in turn.
            self._open_bags(list(shard.bags.values()))
        return shard.read(local, mask, self.decode_images)

    def prefetch(self, indices) -> None:
        """Start reading the records of ``indices``; returns at once (see Reader.prefetch).

        Two steps: the refs records, then the value records they name. The
        second waits a round trip for the first, so it runs on a thread of
        its own (one per process); a read of a datapoint whose second step is
        under way waits for it, so no range is fetched twice.
        """
        storage = self._files
        if not storage.remote:
            return
        try:
            located = self._refs_ahead([check_index(i, len(self)) for i in indices])
        except Exception:
            return
        job = _read_ahead_thread().submit(self._values_ahead, located)
        ahead = self.__dict__.setdefault('_ahead', {})
        if len(ahead) > 4 * len(located) + 4096:      # left by tasks never read (cancelled)
            for key in [k for k, j in ahead.items() if j.done()]:
                del ahead[key]
        for _, _, index in located:
            ahead[index] = job

    def warm(self, first: Sequence[int] = ()) -> None:
        """Read the index tables a process keeps, all at once: for a dataset behind
        a URL one round trip instead of one per bag, before the first batch; a
        small bag (``small_file_bytes``) is read whole with them.

        ``first``: the datapoints of the first batches, whose records are read
        too, and waited for: the loader warms before it forks its workers, which
        then find their first records in memory (a round trip less before the
        first batch). Example: ``reader.warm(first=[5, 2, 9])``.
        """
        storage = self._files
        if not storage.remote:
            return
        first = first if not getattr(getattr(storage, 'settings', None), 'cache_dir', None) \
            else ()
        if first:
            # Under a local cache the workers' reads go through it, range by range: not
            # here. Else what is read stays, for the workers, when this process reads
            # it too (the spec probe, the refs records read for the values' ranges).
            storage.hold()
        self._open_bags([b for shard in self._shards for b in shard.bags.values()])
        bags = [b for shard in self._shards for b in shard.bags.values()
                if b is not None and b.cache_index and not b.cache_data
                and b._table is None and b._len]
        storage.prefetch([(b.path, b._ends_at, ENTRY_BYTES * b._len) for b in bags])
        for bag in bags:
            bag._load_table(None)
        if first:
            try:
                located = self._refs_ahead([check_index(i, len(self)) for i in first])
                self._values_ahead(located)
            finally:
                storage.settle()

    def forked(self) -> None:
        """The workers are forked: the first batches' records that :meth:`warm` kept for
        them go (this process does not read them). Example: ``reader.forked()``."""
        if self._files.remote:
            self._files.release()

    def _open_bags(self, bags: list) -> None:
        """Behind a URL, the small ``bags`` whole (one request each, kept by the storage
        for the process: header, table and records together) and the others'
        headers (tables with them), all at once."""
        storage = self._files
        bags = [b for b in bags if b is not None]
        settings = getattr(storage, 'settings', None)       # a URL's StorageSettings
        small, budget = (settings.small_file_bytes, settings.small_files_bytes) \
            if settings is not None else (0, 0)
        if small and settings is not None and not settings.cache_dir:
            whole = []
            for bag in bags:
                if 0 < bag.size <= small and bag.size <= budget:
                    whole.append((bag.path, 0, bag.size))
                    budget -= bag.size
            storage.prefetch(whole)
        read_headers(storage, bags)

    def _values_ahead(self, located: list) -> None:
        shards = {id(shard): shard for shard, _, _ in located}.values()
        read_headers(self._files, [b for shard in shards for b in shard.bags.values()])
        self._files.prefetch(self._value_ranges(located), cache_root=self.path)

    def _refs_ahead(self, indices: list[int]) -> list[tuple]:
        """Ask for the refs records of ``indices``; ``(shard, local, index)`` each."""
        located = [(*self._locate(index), index) for index in indices]
        # The refs tables of shards not read yet in this process, all at once.
        shards = {id(shard): shard for shard, _, _ in located}.values()
        read_tables(self._files, [shard.bags[REFS_KEY] for shard in shards])
        refs = []
        for shard, local, index in located:
            bag = shard.bags[REFS_KEY]
            a, b = bag._bounds(local, local + 1, index)
            refs.append((bag.path, a, b - a, index))
        self._files.prefetch(refs)
        return located

    def _ranges(self, indices: list[int]) -> list[tuple]:
        return self._value_ranges(self._refs_ahead(indices))

    def _value_ranges(self, located: list) -> list[tuple]:
        """``(path, offset, length, index)`` of the value records the refs name."""
        out = []
        for shard, local, index in located:
            # Read here, kept for the datapoint's read: each range asked ahead is
            # read once (loadr.storage.remote counts on it to free what it holds).
            for (key, _), ref in zip(shard.spec, shard.refs_ahead(local)):
                bag = shard.bags[key]
                lo, hi = (ref, ref + 1) if not shard._types[key][1] else \
                    (ref[0], ref[0] + ref[1]) if ref else (0, 0)
                if bag.cache_data or hi <= lo:
                    continue
                bounds = bag._bounds(lo, hi, index)
                out.append((bag.path, bounds[0], bounds[-1] - bounds[0], index))
        return out

    def available(self, index: int) -> dict:
        """``{key: True | range(n)}`` for datapoint ``index``, from refs.bag alone."""
        shard, local = self._locate(check_index(index, self._length))
        return shard.available(local)
