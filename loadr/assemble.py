"""Turning stream positions into a filled batch: read, transform, check, write.

The same code runs in worker processes and, with ``workers=0``, in the
calling process, which is why both give the very same bytes.

A datapoint becomes arrays key by key: a value that numpy sees as numbers or
booleans (an ndarray, a Python or numpy scalar, a list of equal-shape
frames) is an *array key*, stacked into a ``(batch, *shape)`` array; any
other value (str, bytes, dict, ragged lists) is a *list key*, handed over as
a Python list. The spec, ``{key: (dtype, shape)}``, says which is which
(``dtype == object`` for list keys) and every datapoint must match it.

Example::

    asm = Assembler(reader, fns, spec=infer_spec(first_datapoint))
    extras, replaced = asm.fill(order, start=0, count=64, arrays=views)
"""

from __future__ import annotations

import logging
import operator
import pickle
import time
import traceback

import numpy as np

from .decode import fuse
from .errors import LoadrError, SpecError
from .stats import MAX_STRIDE, STRIDE, TIMED_ROW_COST_US, TIMING_SHARE
from .storage import transient

__all__ = ['Assembler', 'infer_spec', 'value_spec', 'SampleFailure', 'Cancelled',
           'READ_RETRY_DELAYS_S']

log = logging.getLogger('loadr')

OBJECT = np.dtype(object)
# List-key values that always cross processes: checked by type alone, per sample.
_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})
# Transient read errors (EIO, a network filesystem hiccup) are retried after
# these pauses; an error that persists is raised with the index. Which errors
# are transient is the storage's call (loadr.storage.transient).
READ_RETRY_DELAYS_S = (0.05, 0.25)
# Array keys whose row takes at most this many bytes are gathered over a
# batch and written with one numpy call at its end (a row assignment costs
# ~0.4 us whatever its size); larger rows are copied as each sample comes,
# while their data is still in the cache and the sample can be freed.
COLUMN_ROW_BYTES = 4096


def value_spec(value) -> tuple[np.dtype, tuple]:
    """``(dtype, shape)`` of one value; dtype is object for a list key.

    >>> value_spec(3)
    (dtype('int64'), ())
    >>> value_spec('cat')
    (dtype('O'), ())
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, (bool, int, float, complex, np.generic)):
        arr = np.asarray(value)
    elif _array_like(value):
        try:
            arr = as_array(value)
        except Exception:           # e.g. a tensor on a GPU: a list key, as it always was
            return OBJECT, ()
    elif (isinstance(value, (list, tuple)) and value
          and (isinstance(value[0], (np.ndarray, np.generic, bool, int, float))
               or _array_like(value[0]))):
        try:
            arr = as_array(value)
        except (ValueError, TypeError):
            return OBJECT, ()
    else:
        return OBJECT, ()
    if arr.dtype.kind not in 'biufc':
        return OBJECT, ()
    return arr.dtype, arr.shape


def _array_like(value) -> bool:
    cls = type(value)
    return hasattr(cls, '__array__') or hasattr(cls, '__dlpack__')


def as_array(value) -> np.ndarray:
    """``value`` as a numpy array: a torch or jax array, or anything with ``__array__`` or
    DLPack (``__dlpack__``), is viewed, not copied, where numpy can.

    >>> as_array([1, 2]).tolist()
    [1, 2]
    """
    cls = type(value)
    if not hasattr(cls, '__array__') and hasattr(cls, '__dlpack__'):
        return np.from_dlpack(value)
    return np.asarray(value)


def infer_spec(datapoint: dict | tuple) -> dict:
    """The spec of one datapoint, keys in the datapoint's order.

    A tuple datapoint ``(x, y)`` has the keys ``0, 1``; a spec whose keys
    are ``0 .. k-1`` makes the Loader give tuple batches.

    >>> infer_spec((np.zeros(3, np.float32), 7))
    {0: (dtype('float32'), (3,)), 1: (dtype('int64'), ())}
    """
    if isinstance(datapoint, tuple):
        return {key: value_spec(value) for key, value in enumerate(datapoint)}
    if not isinstance(datapoint, dict):
        raise SpecError(f'a datapoint must be a dict or a tuple, got '
                        f'{type(datapoint).__name__}')
    return {key: value_spec(value) for key, value in datapoint.items()}


class SampleFailure(Exception):
    """Raised by :meth:`Assembler.fill` when one sample fails; carries where and why."""

    def __init__(self, exc: BaseException, index: int, position: int):
        super().__init__(f'sample at index {index}, position {position} failed: {exc!r}')
        self.exc, self.index, self.position = exc, index, position
        self.traceback = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))


class Cancelled(Exception):
    """Raised by :meth:`Assembler.fill` when its task was cancelled midway."""


def _transient(exc: BaseException) -> bool:
    return transient(exc)


class Assembler:
    """Reads, transforms and writes the datapoints of one batch.

    ``progress``, when given, is a writable int64 array of 2 entries that
    gets ``[position, index]`` of the sample in hand, so the main process can
    name the index that killed a worker.
    """

    def __init__(self, reader, fns, spec: dict | None, on_error: str = 'raise'):
        self.reader = reader
        # A decode_jpeg and the crops after it run as one fn that decodes only what they
        # need (loadr.decode); the list keeps its length, so the stage counters still match.
        self.fns = fuse(fns)
        self.read_fn = self.fns[0] if self.fns and getattr(self.fns[0], 'reads', False) else None
        self.after = self.fns[1:] if self.read_fn is not None else self.fns
        self.on_error = on_error
        self.spec = spec
        self._columns: list[tuple] = []            # (key, values, shape == ()), see _write
        self._bulk = False
        self._column_rows: list[int] = []          # the rows the columns' values go to
        if spec is not None:
            self.array_keys = [k for k, (d, _) in spec.items() if d != OBJECT]
            self.list_keys = [k for k, (d, _) in spec.items() if d == OBJECT]
            # Precomputed so the per-sample check is a set comparison and a
            # few identity tests (numpy's builtin dtypes are singletons).
            self._keys = set(spec)
            self._array_specs = [(k, _canonical(spec[k][0]), tuple(spec[k][1]))
                                 for k in self.array_keys]
            # _write's fast path: what it accepts without the full checks, and
            # for small rows the list that gathers the batch's values (a column).
            self._fast_specs = []
            for key, dtype, shape in self._array_specs:
                values = None
                if dtype.itemsize * int(np.prod(shape, dtype=np.int64)) <= COLUMN_ROW_BYTES:
                    values = []
                    self._columns.append((key, values, shape == ()))
                self._fast_specs.append(_fast_spec(key, dtype, shape) + (values,))
            self._width = len(spec)
            # Every array key small: the batch's datapoints are kept and written
            # at its end, key by key, in a few C-level passes (_write_bulk).
            self._bulk = len(self._columns) == len(self._array_specs)
            self._by_position = all(type(k) is int for k in spec) \
                and set(spec) == set(range(len(spec)))
        # The reader's own batch read, unless it is the base class's loop
        # (which would only read everything twice when a sample fails).
        read_batch = getattr(reader, 'read_batch', None)
        if read_batch is not None and _inherited_read_batch(reader):
            read_batch = None
        # A reader whose datapoints depend on the sample's seed (a Mix applies
        # its sources' own fns) is read through read_seeded, one by one.
        self._read_seeded = getattr(reader, 'read_seeded', None)
        # A reader made of sources (a Mix) names the source of an error the fns raise.
        self._name_error = getattr(reader, 'name_error', None)
        if self.read_fn is not None or self._read_seeded is not None:
            read_batch = None
        self._reader_batch = read_batch
        # The plain read (reader[index]) called straight from datapoint();
        # _read, with its retries, only once it has failed.
        self._get = None
        if self.read_fn is None and self._read_seeded is None:
            self._get = getattr(reader, '__getitem__', None)
        self._ahead: set[tuple] = set()     # tasks whose reads prefetch() started ahead
        # Reading ahead pays only where the reader's files are remote.
        self._prefetch = reader.prefetch if getattr(reader, 'prefetches', False) else None
        # ... and a remote reader's local cache learns the position of each batch.
        self._cache_clock = reader.cache_clock if getattr(reader, 'caches', False) else None
        # Stage accounting (loadr.stats): set by the worker or the loader. The
        # accumulator holds [read, write, fn 0, fn 1, ...] of the timed rows;
        # a reading fn's time is its own stage, not 'read'.
        self.clock = None
        self._acc = [0.0] * (2 + len(self.fns))
        self._read_slot = 2 if self.read_fn is not None else 0
        self._first_after = 3 if self.read_fn is not None else 2
        self._every = STRIDE
        self._countdown = 0             # rows until the next timed one, across batches
        self._split = [0.0] * len(self._acc)    # shares of a row's time, per stage

    def _read_once(self, index: int, seed: int) -> dict:
        if self.read_fn is not None:
            return self.read_fn.read(self.reader, index, seed=seed)
        if self._read_seeded is not None:
            return self._read_seeded(index, seed)
        return self.reader[index]

    def _read(self, index: int, seed: int, failed: Exception | None = None) -> dict:
        """The datapoint at ``index``, read again after transient errors; ``failed``: the
        error of a first read already made (by :meth:`datapoint`)."""
        retries = 0
        while True:
            if failed is None:
                try:
                    return self._read_once(index, seed)
                except Exception as exc:
                    failed = exc
            exc, failed = failed, None
            if retries == len(READ_RETRY_DELAYS_S) or not _transient(exc):
                raise exc
            log.warning('loadr: transient read error at index %d (%s); retrying', index, exc)
            time.sleep(READ_RETRY_DELAYS_S[retries])
            retries += 1

    def datapoint(self, index: int, seed: int, raw: dict | None = None) -> dict:
        """The datapoint at ``index`` after every fn, called with ``seed``.

        ``raw`` is the datapoint as already read (by a batch read), if it was.
        """
        if raw is not None:
            dp = raw
        elif self._get is not None:
            try:
                dp = self._get(index)
            except Exception as exc:
                dp = self._read(index, seed, exc)
        else:
            dp = self._read(index, seed)
        if type(dp) is not dict:
            _returned(dp, index)
        after = self.after
        if not after:
            return dp
        dp = _own(dp)
        try:
            for fn in after:
                dp = fn(dp, seed=seed)
                if type(dp) is not dict:
                    _returned(dp, index, fn)
        except Exception as exc:
            if self._name_error is not None:
                self._name_error(exc, index)
            raise
        return dp

    def _timed_row(self, index: int, seed: int, raw, row: int, arrays: dict,
                   extras: dict, dps: list | None) -> None:
        """:meth:`datapoint` then :meth:`_write` (or onto ``dps``, for :meth:`_write_bulk`),
        with each stage's time added to ``_acc``."""
        clock, acc = time.perf_counter, self._acc
        t0 = clock()
        dp = self._read(index, seed) if raw is None else raw
        t1 = clock()
        acc[self._read_slot] += t1 - t0
        if type(dp) is not dict:
            _returned(dp, index)
        if self.after:
            dp = _own(dp)
            try:
                for slot, fn in enumerate(self.after, self._first_after):
                    dp = fn(dp, seed=seed)
                    t2 = clock()
                    acc[slot] += t2 - t1
                    t1 = t2
                    if type(dp) is not dict:
                        _returned(dp, index, fn)
            except Exception as exc:
                if self._name_error is not None:
                    self._name_error(exc, index)
                raise
        if dps is not None:
            dps.append(dp)              # written with the batch, timed there
            return
        self._write(dp, row, index, arrays, extras)
        acc[1] += clock() - t1

    def _read_batch(self, indices: list) -> list:
        """The reader's own batch read where it has one, else Nones (read one by one)."""
        if self._reader_batch is not None:
            try:
                raws = self._reader_batch(indices)
                if len(raws) == len(indices):
                    return raws
            except Exception:
                # Read them one by one instead: that names the failing index and
                # applies the retry policy.
                pass
        return [None] * len(indices)

    def substitute(self, index: int, seed: int, order, write=None) -> dict:
        """The datapoint that replaces a failed ``index`` under ``on_error='skip'``.

        A pure function of the failed index (the order's ``alternative()``),
        so every run (any worker count, any resume) substitutes the same one.
        ``write(dp)``, when given, writes a candidate into the batch; one it
        refuses (a datapoint that does not fit the spec) is passed over too.
        """
        for k in range(1, 17):
            alt = order.alternative(index, k)
            try:
                dp = self.datapoint(alt, seed)
                if write is not None:
                    write(dp)
                return dp
            except Exception:
                continue
        raise LoadrError(f'no readable datapoint that fits the spec found to replace index '
                         f'{index}', index=index)

    def fill(self, order, start: int, count: int, arrays: dict, progress=None,
             batch_read: bool = True, cancel: tuple | None = None):
        """Fill rows ``0 .. count-1`` of ``arrays`` for positions ``start ..``.

        Returns ``(extras, replaced)``: the list keys' values, and the
        replacements under ``on_error='skip'`` as ``(index, position, reason)``.
        ``batch_read=False`` reads sample by sample even where the reader has a
        batch read.
        ``cancel``, ``(cell, task_id)``, stops the fill with :class:`Cancelled`
        before any sample once ``cell[0] >= task_id``.
        """
        if self._cache_clock is not None:
            self._cache_clock(order, start, count)
        indices = order.indices(start, count).tolist()
        self.prefetch(order, start, count, indices)
        seeds = order.seeds(start, count)
        extras = {k: [] for k in self.list_keys}
        replaced = []
        if progress is not None:
            # Index -1 at the batch's first position: "inside the batch read",
            # so a death here makes the pool ask for a one-by-one read.
            progress[0] = start
            progress[1] = -1
        clock = self.clock
        if clock is not None:
            t0 = time.perf_counter()
            cpu0 = time.process_time() if clock.inline else 0.0
        raws = self._read_batch(indices) if batch_read else [None] * len(indices)
        datapoint, write = self.datapoint, self._write
        cell, task_id = cancel if cancel is not None else ((-1,), 0)
        if clock is not None:
            # Every `every`-th row is timed stage by stage (see loadr.stats):
            # the others pay one test of a countdown.
            t1 = time.perf_counter()
            acc, every = self._acc, self._every
            acc[:] = [0.0] * len(acc)
            self._sampled = 0.0
            countdown = min(self._countdown, every - 1)
        else:
            every, countdown = 0, 1 << 62
        filled = False
        rows_end = None
        try:
            dps = [] if self._bulk else None
            self._countdown, dps = self._fill_rows(
                indices, seeds, raws, start, progress, cell, task_id, datapoint, write, order,
                arrays, extras, replaced, every, countdown, dps)
            if clock is not None:
                rows_end = time.perf_counter()
            if dps and not self._write_bulk(dps, arrays, extras):
                self._flush(dps, indices, seeds, start, order, arrays, extras, replaced)
            self._write_columns(arrays)
            filled = True
        finally:
            if not filled:                  # cut short: its gathered rows go nowhere
                for _, values, _ in self._columns:
                    values.clear()
                self._column_rows.clear()
            # A cancelled or failed batch's rows were work too (not a batch, though).
            if clock is not None:
                self._account(clock, count, t0, t1, cpu0, filled, rows_end)
        return extras, replaced

    def _fill_rows(self, indices, seeds, raws, start, progress, cell, task_id, datapoint,
                   write, order, arrays, extras, replaced, every, countdown,
                   dps: list | None) -> tuple[int, list | None]:
        """The rows of :meth:`fill`, each written, or kept on ``dps`` (from row 0 on) for
        :meth:`_write_bulk`. Returns the countdown to the next timed row and ``dps``, or
        None once a sample failed: the rows kept until then are written first, so errors
        and replacements come in the order of the rows."""
        sampled = 0.0
        # The common row, kept for _write_bulk: a dict from reader[index] (no batch
        # read) through the fns. datapoint() inlined for it: the call was 4% of a
        # trivial fill. Anything else goes through datapoint() itself.
        get, after = self._get, self.after
        plain = (dps is not None and get is not None and bool(after)
                 and (not raws or raws[0] is None))     # a batch read gives all or none
        for row, (index, seed, raw) in enumerate(zip(indices, seeds, raws)):
            if cell[0] >= task_id:
                raise Cancelled(task_id)
            if progress is not None:
                progress[0] = start + row
                progress[1] = index
            if countdown:
                countdown -= 1
                try:
                    if plain:
                        try:
                            dp = get(index)
                        except Exception as exc:
                            dp = self._read(index, seed, exc)
                        if type(dp) is dict:
                            dp = dp.copy()      # _own(dp), for an exact dict
                            for fn in after:
                                dp = fn(dp, seed=seed)
                                if type(dp) is not dict:
                                    _returned(dp, index, fn)
                            dps.append(dp)
                        else:
                            dps.append(datapoint(index, seed, _returned(dp, index)))
                    elif dps is not None:
                        dps.append(datapoint(index, seed, raw))
                    else:
                        write(datapoint(index, seed, raw), row, index, arrays, extras)
                except Exception as exc:
                    if dps is not None:
                        self._flush(dps, indices, seeds, start, order, arrays, extras, replaced)
                        dps, plain = None, False
                    self._failed(exc, index, start + row, seed, order, row, arrays, extras,
                                 replaced)
                continue
            countdown = every - 1
            ts = time.perf_counter()
            try:
                self._timed_row(index, seed, raw, row, arrays, extras, dps)
            except Exception as exc:
                if dps is not None:
                    self._flush(dps, indices, seeds, start, order, arrays, extras, replaced)
                    dps, plain = None, False
                self._failed(exc, index, start + row, seed, order, row, arrays, extras, replaced)
            sampled += time.perf_counter() - ts
            self._sampled = sampled
        return countdown, dps

    def _flush(self, dps: list, indices, seeds, start: int, order, arrays: dict, extras: dict,
               replaced: list) -> None:
        """Write the datapoints kept on ``dps`` (rows 0 ..) one by one, as any row is
        written; empties ``dps``."""
        for row, dp in enumerate(dps):
            try:
                self._write(dp, row, indices[row], arrays, extras)
            except Exception as exc:
                self._failed(exc, indices[row], start + row, seeds[row], order, row, arrays,
                             extras, replaced)
        dps.clear()

    def _write_bulk(self, dps: list, arrays: dict, extras: dict) -> bool:
        """Write rows ``0 .. len(dps) - 1`` key by key, if every datapoint is one that
        :meth:`_write` takes its fast path for; else write nothing and return False.

        The same checks as that fast path, made a key at a time over the batch
        with C-level passes (``map``, ``set``): a row costs a third as much.
        """
        kind = tuple if self._by_position else dict
        kinds = set(map(type, dps))
        if (kinds != {dict} and kinds != {kind}) or set(map(len, dps)) != {self._width}:
            return False
        found = []
        try:
            for key, dtype, shape, scalars, _ in self._fast_specs:
                values = [dp[key] for dp in dps]
                kinds = set(map(type, values))
                if np.ndarray in kinds:
                    arrays_ = values if len(kinds) == 1 else \
                        [v for v in values if type(v) is np.ndarray]
                    if (any(d is not dtype and d != dtype for d in set(map(_DTYPE, arrays_)))
                            or set(map(_SHAPE, arrays_)) != {shape}):
                        return False
                    kinds.discard(np.ndarray)
                if not kinds <= scalars:
                    return False
                if int in kinds:
                    ints = [v for v in values if type(v) is int]
                    if min(ints) < _INT_MIN or max(ints) > _INT_MAX:
                        return False
                found.append(values)
            lists = []
            for key in self.list_keys:
                values = [dp[key] for dp in dps]
                for kind in set(map(type, values)) - _PLAIN:
                    if not all(_crosses(v) for v in values if type(v) is kind):
                        return False
                lists.append(values)
        except KeyError:
            return False
        n = len(dps)
        for (key, _, shape, _, _), values in zip(self._fast_specs, found):
            target = arrays[key]
            if shape == ():
                target[:n] = values
            elif target.flags.c_contiguous:
                # One C loop: the rows as one flat run (np.stack loops in Python).
                flat = target[:n].view()
                flat.shape = (-1,) + flat.shape[2:]
                np.concatenate(values, out=flat)
            else:
                target[:n] = np.stack(values)
        for key, values in zip(self.list_keys, lists):
            extras[key].extend(values)
        dps.clear()
        return True

    def _failed(self, exc, index: int, position: int, seed: int, order, row: int, arrays: dict,
                extras: dict, replaced: list) -> None:
        """A sample failed: raise it, or under on_error='skip' write its replacement."""
        if self.on_error != 'skip':
            raise SampleFailure(exc, index, position) from exc
        # Not logged here: a worker's log is not the caller's, and a prefetched batch may
        # never be handed out. The Loader logs each replacement once, in the main
        # process, when its batch is handed out (with the reason carried from here).
        replaced.append((index, position, f'{type(exc).__name__}: {exc}'))
        # A candidate refused half-way may have written some of the row: the one
        # taken writes all of it (and list keys are added only once all pass).
        self.substitute(index, seed, order,
                        lambda dp: self._write(dp, row, index, arrays, extras))

    def _account(self, clock, count: int, t0: float, t1: float, cpu0: float,
                 filled: bool, rows_end: float | None = None) -> None:
        """Scale the timed rows' stages to the whole loop and add the batch to ``clock``.

        The loop's time is measured exactly; the timed rows say how it
        splits between the stages (what is outside their clocks, the loop
        itself, lands in 'other' via busy). A batch with no timed row (a
        small one between two) is split as the last timed rows were. The
        batch read is timed whole, and so is what is written at the batch's end
        (from ``rows_end``: the kept rows, the columns), as 'write'.
        """
        end = time.perf_counter()
        if rows_end is None:
            rows_end = end
        loop, sampled = rows_end - t1, self._sampled
        if sampled > 0:
            self._split = [t / sampled for t in self._acc]
            if count:
                # Time rows sparsely enough that a timed row's clock reads cost about
                # TIMING_SHARE of the work (every row once rows are that slow);
                # the row time is taken from batches with a timed row only.
                per_row_us = 1e6 * loop / count
                self._every = max(1, min(MAX_STRIDE, int(
                    TIMED_ROW_COST_US / (TIMING_SHARE * max(per_row_us, 1e-3)))))
        split = self._split
        clock.add_fill(t1 - t0 + split[0] * loop, split[1] * loop + end - rows_end,
                       [t * loop for t in split[2:]], count if filled else 0,
                       end - t0, time.process_time() - cpu0 if clock.inline else 0.0,
                       int(filled))

    def prefetch(self, order, start: int, count: int, indices: list | None = None) -> None:
        """Let a remote reader start reading positions ``start ..`` ahead; once per task.

        A worker calls it for the task it will do next; ``fill`` calls it for
        its own task unless that was done. A no-op for local files.
        """
        prefetch = self._prefetch
        if prefetch is None:
            return
        key = (id(order), start, count)
        if key in self._ahead:
            self._ahead.discard(key)        # fill's call: this task's reads are on their way
            return
        if indices is None:                 # a call ahead of fill: fill's call skips
            if len(self._ahead) > 16:       # tasks asked ahead but never filled (cancelled)
                self._ahead.clear()
            self._ahead.add(key)
            indices = order.indices(start, count).tolist()
        try:
            prefetch(indices)
        except Exception as exc:            # a hint: the reads themselves report any trouble
            log.debug('loadr: read-ahead of positions %d.. failed: %r', start, exc)

    def _write(self, dp: dict, row: int, index: int, arrays: dict, extras: dict) -> None:
        """Write ``dp`` into ``row`` of ``arrays`` (array keys) and onto ``extras`` (list keys).

        The common datapoint (a dict, or a tuple for a spec keyed ``0 .. k-1``,
        whose array values are exactly ``np.ndarray`` of the spec's dtype
        object and shape, or scalars that numpy makes the spec's dtype) is
        written here with a few identity tests a key (the full checks were a
        quarter of a worker's time on the trivial workload; measured 1.65 -> 1.0
        us a sample). Anything else, the errors included, goes to
        :meth:`_write_checked`, which writes the same bytes or raises the error
        that names the key and the index. On the fast path, keys whose row is
        small (:data:`COLUMN_ROW_BYTES`) are only gathered here: :meth:`fill`
        writes them at the end of the batch (:meth:`_write_columns`).
        """
        kind = type(dp)
        if (kind is dict or kind is tuple and self._by_position) and len(dp) == self._width:
            # Same length and every spec key found (else KeyError): the same keys.
            try:
                for key, dtype, shape, scalars, column in self._fast_specs:
                    value = dp[key]
                    kind = type(value)
                    if kind is np.ndarray:
                        # Equal dtypes need not be one object: arrays that crossed a
                        # pickle (a reader sent to a spawned worker) hold copies.
                        if (value.dtype is not dtype and value.dtype != dtype
                                or value.shape != shape):
                            break
                    elif kind not in scalars or kind is int and not _INT_MIN <= value <= _INT_MAX:
                        break
                    if column is None:
                        arrays[key][row] = value
                    else:
                        column.append(value)
                else:
                    list_keys = self.list_keys
                    if not list_keys:
                        if self._columns:
                            self._column_rows.append(row)
                        return
                    for key in list_keys:
                        value = dp[key]
                        if type(value) not in _PLAIN and not _crosses(value):
                            break
                    else:
                        for key in list_keys:
                            extras[key].append(dp[key])
                        if self._columns:
                            self._column_rows.append(row)
                        return
            except KeyError:
                pass
            # Left to the general path: take back what this datapoint put in the columns.
            rows = len(self._column_rows)
            for _, values, _ in self._columns:
                if len(values) > rows:
                    values.pop()
        self._write_checked(dp, row, index, arrays, extras)

    def _write_columns(self, arrays: dict) -> None:
        """Write the values gathered in the columns into their rows of ``arrays``; empty them.

        Rows come in increasing order, once each (a datapoint left to the
        general path takes its values back), so consecutive rows are one slice.
        """
        rows = self._column_rows
        if not rows:
            return
        first, last = rows[0], rows[-1]
        at = slice(first, last + 1) if last - first + 1 == len(rows) else rows
        for key, values, scalar in self._columns:
            target = arrays[key]
            if scalar:
                target[at] = np.asarray(values, dtype=target.dtype)
            elif type(at) is slice and target.flags.c_contiguous:
                # One C loop: the rows as one flat run (np.stack loops in Python).
                flat = target[at].view()
                flat.shape = (-1,) + flat.shape[2:]
                np.concatenate(values, out=flat)
            else:
                target[at] = np.stack(values)
            values.clear()
        rows.clear()

    def _write_checked(self, dp: dict, row: int, index: int, arrays: dict,
                       extras: dict) -> None:
        """:meth:`_write` for any datapoint: every check, and the error for the first that fails."""
        if type(dp) is not dict and isinstance(dp, tuple):
            dp = dict(enumerate(dp))
        if dp.keys() != self._keys:
            missing = sorted(set(self.spec) - set(dp), key=str)
            extra = sorted(set(dp) - set(self.spec), key=str)
            raise SpecError(f'keys differ from the spec: missing {missing}, unexpected {extra}',
                            index=index)
        for key, dtype, shape in self._array_specs:
            value = dp[key]
            if not isinstance(value, (np.ndarray, np.generic)):
                value = as_array(value)     # torch/jax arrays too: never pickled
            if (value.dtype is not dtype and value.dtype != dtype) or value.shape != shape:
                raise SpecError(f'key {key!r} is {value.dtype}{list(value.shape)}, the spec '
                                f'says {dtype}{list(shape)}{_shape_hint(key, value.shape, shape)}',
                                index=index)
            arrays[key][row] = value
        list_keys = self.list_keys
        for key in list_keys:
            value = dp[key]
            if type(value) not in _PLAIN and not _crosses(value):
                raise SpecError(f'key {key!r} holds a {type(value).__name__}, which cannot be '
                                'sent between processes (it does not pickle): return bytes, '
                                'a list or an array in its place', index=index)
        for key in list_keys:
            extras[key].append(dp[key])


# What _write_bulk maps over a batch's arrays.
_DTYPE, _SHAPE = operator.attrgetter('dtype'), operator.attrgetter('shape')
# The range of Python ints that numpy turns into its default int (int64) and not
# into a wider type: only these take _write's fast path as that int.
_INT_MIN, _INT_MAX = (int(x) for x in (np.iinfo(np.asarray(0).dtype).min,
                                      np.iinfo(np.asarray(0).dtype).max))


def _returned(dp, index: int, fn=None):
    """``dp`` if it is a datapoint (a dict or a tuple), else the SpecError that says
    what ``fn`` (or, with no fn, the reader) returned instead.

    >>> _returned((1, 2), 0)
    (1, 2)
    """
    if isinstance(dp, (dict, tuple)):
        return dp
    who = 'the reader' if fn is None else f'fn {fn!r}'
    raise SpecError(f'{who} returned {type(dp).__name__}, not a dict or a tuple', index=index)


def _own(dp):
    """The datapoint the fns get: fns may mutate theirs, so never the reader's own
    dict. A tuple is passed as it is; an exact dict copied with ``dict.copy()`` (a
    third faster than ``dict(dp)``); any other mapping as a new dict.

    >>> d = {'a': 1}; _own(d) == d and _own(d) is not d
    True
    """
    kind = type(dp)
    if kind is dict:
        return dp.copy()
    return dp if kind is tuple else dict(dp)


def _canonical(dtype) -> np.dtype:
    """numpy's own instance of ``dtype`` where it has one, else ``dtype``.

    _write's fast path tests a value's dtype by identity first, and a dtype
    that crossed a pickle (a spawned worker's spec) is an equal copy, not
    the instance that arrays made in the worker (by a fn) carry.

    >>> import pickle
    >>> _canonical(pickle.loads(pickle.dumps(np.dtype(np.float32)))) is np.dtype(np.float32)
    True
    """
    dtype = np.dtype(dtype)
    native = np.dtype(dtype.type)
    return native if native == dtype else dtype


def _fast_spec(key, dtype: np.dtype, shape: tuple) -> tuple:
    """``(key, dtype, shape, scalars)``: ``scalars`` are the exact types of the values
    that pass the spec's check as they are, with no conversion that could change them:
    numpy's scalar of ``dtype`` and the Python types numpy makes ``dtype``. Only for
    shape ``()`` and numbers; any other value takes the full checks.

    >>> _fast_spec('label', np.dtype(np.int64), ())[3] == {np.int64, int}
    True
    """
    scalars = set()
    if shape == () and dtype.kind in 'biufc':
        if np.dtype(dtype.type) == dtype:
            scalars.add(dtype.type)
        for python in (bool, int, float, complex):
            if np.asarray(python()).dtype == dtype:
                scalars.add(python)
    return key, dtype, shape, frozenset(scalars)


def _crosses(value) -> bool:
    """Whether a list key's value can travel from a worker to the main process."""
    if isinstance(value, np.generic) or type(value) is np.ndarray and value.dtype != OBJECT:
        return True
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False
    return True


def _shape_hint(key, got: tuple, spec: tuple) -> str:
    """How to fix a shape that differs from the spec's (images of different sizes, mostly)."""
    if got == spec:
        return ''
    return (f'. A batch stacks each array key into one array, so every datapoint needs the same '
            f'shape: give {key!r} one size with a fn (e.g. decode_jpeg(size=256) then '
            f'center_crop(size=224) or random_resized_crop(size=224), or resize(size=(224, '
            f'224))), or make it a list key (Loader(..., spec={{{key!r}: (object, ()), ...}}), '
            f'every key listed) to get a list of arrays')


def _inherited_read_batch(reader) -> bool:
    """True when ``reader.read_batch`` is the base class's plain loop."""
    from .readers.base import Reader

    method = getattr(type(reader), 'read_batch', None)
    return method is Reader.read_batch
