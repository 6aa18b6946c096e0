"""Turning stream positions into a filled batch: read, transform, check, write.

The same code runs in worker processes and, with ``workers=0``, in the
calling process, which is why both give the very same bytes.

Every datapoint must match the batch's spec (:mod:`loadr.spec`: which keys are
arrays, which lists); a row is written with the checks that say where one does not.

Example::

    asm = Assembler(reader, fns, spec=infer_spec(first_datapoint))
    extras, replaced = asm.fill(order, start=0, count=64, arrays=views)
"""

from __future__ import annotations

import logging
import operator
import pickle
import time

import numpy as np

from .decode import fuse
from .errors import LoadrError, SampleFailure, SpecError
from .sources import hooks_of
from .spec import OBJECT, as_array
from .stats import FillTimer, StageClock
from .storage import transient

__all__ = ['Assembler', 'Cancelled', 'READ_RETRY_DELAYS_S']

log = logging.getLogger('loadr')

# List-key values that always cross processes: checked by type alone, per sample.
_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})
# Transient read errors (EIO, a network filesystem hiccup) are retried after
# these pauses; an error that persists is raised with the index. Which errors
# are transient is the storage's call (loadr.storage.transient).
READ_RETRY_DELAYS_S = (0.05, 0.25)
# Rows are read this many bytes of array data at a time (at least one row) and
# then written together, key by key (a row assignment costs ~0.4 us whatever its
# size): a batch of small rows in a few numpy calls at its end, a large row
# (an image) as it comes, while its data is still in the cache and the sample
# can be freed.
ROW_GROUP_BYTES = 1 << 20


class Cancelled(Exception):
    """Raised by :meth:`Assembler.fill` when its task was cancelled midway."""


def _transient(exc: BaseException) -> bool:
    return transient(exc)


class _Fill:
    """One :meth:`Assembler.fill` in hand: where its rows come from and go to.

    ``pending`` holds the datapoints read but not yet written, for rows
    ``next_row ..``; ``write_s`` the seconds its writes took; ``countdown`` the
    rows until the next timed one.
    """

    __slots__ = ('order', 'start', 'indices', 'seeds', 'raws', 'arrays', 'extras', 'replaced',
                 'progress', 'cancel', 'pending', 'next_row', 'write_s', 'countdown')

    def __init__(self, order, start: int, indices: list, seeds, raws: list, arrays: dict,
                 extras: dict, progress, cancel: tuple):
        self.order, self.start, self.indices, self.seeds = order, start, indices, seeds
        self.raws, self.arrays, self.extras, self.progress = raws, arrays, extras, progress
        self.cancel = cancel
        self.replaced: list = []
        self.pending: list = []
        self.next_row = 0
        self.write_s = 0.0
        self.countdown = 0


# A fill that is never cancelled: (cell, task id) with cell[0] < task id.
_NEVER = ((-1,), 0)


class Assembler:
    """Reads, transforms and writes the datapoints of one batch.

    One reader of a row, :meth:`_read_rows` (:meth:`datapoint` is one row of
    it; a timed row goes through it too, its fns wrapped in laps:
    :class:`loadr.stats.FillTimer`), and two writers: :meth:`_write_rows`,
    the fast one, writes a run of rows key by key when every datapoint is
    the common kind (tests/test_assemble.py compares it with the checked
    one, row by row), and :meth:`_write_checked`
    writes one datapoint with every check, or raises the error that names the
    key and the index. Rows are kept until :attr:`_group` of them are read
    (about :data:`ROW_GROUP_BYTES` of array data: a whole batch of small rows,
    one large image at a time) and then written.

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
        self._group = 1 << 62
        if spec is not None:
            self.array_keys = [k for k, (d, _) in spec.items() if d != OBJECT]
            self.list_keys = [k for k, (d, _) in spec.items() if d == OBJECT]
            # Precomputed so the per-sample check is a set comparison and a
            # few identity tests (numpy's builtin dtypes are singletons).
            self._keys = set(spec)
            self._array_specs = [(k, _canonical(spec[k][0]), tuple(spec[k][1]))
                                 for k in self.array_keys]
            # _write_rows: what it accepts without the full checks.
            self._fast_specs = [_fast_spec(key, dtype, shape)
                                for key, dtype, shape in self._array_specs]
            self._width = len(spec)
            self._by_position = all(type(k) is int for k in spec) \
                and set(spec) == set(range(len(spec)))
            row_bytes = sum(dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                            for _, dtype, shape in self._array_specs)
            if row_bytes:
                self._group = max(1, ROW_GROUP_BYTES // row_bytes)
        # The reader's optional hooks (loadr.sources), chosen here once; the worker
        # asks the same (warm, prefetch, cache_flush) of `hooks`.
        hooks = self.hooks = hooks_of(reader)
        # The reader's own batch read, unless it is the base class's loop
        # (which would only read everything twice when a sample fails).
        read_batch = hooks.read_batch
        # A reader whose datapoints depend on the sample's seed (a Mix applies
        # its sources' own fns) is read through read_seeded, one by one.
        self._read_seeded = hooks.read_seeded
        # A reader made of sources (a Mix) names the source of an error the fns raise.
        self._name_error = hooks.name_error
        if self.read_fn is not None or self._read_seeded is not None:
            read_batch = None
        self._reader_batch = read_batch
        # The plain read (reader[index]) called straight from _read_rows;
        # _read, with its retries, only once it has failed.
        self._get = None
        if self.read_fn is None and self._read_seeded is None:
            self._get = getattr(reader, '__getitem__', None)
        self._ahead: set[tuple] = set()     # tasks whose reads prefetch() started ahead
        # Reading ahead pays only where the reader's files are remote ...
        self._prefetch = hooks.prefetch
        # ... and a remote reader's local cache learns the position of each batch.
        self._cache_clock = hooks.cache_clock
        # Stage accounting (loadr.stats): set by the worker or the loader.
        self.clock: StageClock | None = None
        self.timer = FillTimer(self.fns)

    def _read_once(self, index: int, seed: int) -> dict:
        if self.read_fn is not None:
            return self.read_fn.read(self.reader, index, seed=seed)
        if self._read_seeded is not None:
            return self._read_seeded(index, seed)
        return self.reader[index]

    def _read(self, index: int, seed: int, failed: Exception | None = None) -> dict:
        """The datapoint at ``index``, read again after transient errors; ``failed``: the
        error of a first read already made (by :meth:`_read_rows`)."""
        retries = 0
        while True:
            if failed is None:
                try:
                    return self._read_once(index, seed)
                except Exception as exc:
                    failed = exc
            err, failed = failed, None
            if retries == len(READ_RETRY_DELAYS_S) or not _transient(err):
                raise err
            log.warning('loadr: transient read error at index %d (%s); retrying', index, err)
            time.sleep(READ_RETRY_DELAYS_S[retries])
            retries += 1

    def datapoint(self, index: int, seed: int, raw: dict | None = None) -> dict:
        """The datapoint at ``index`` after every fn, called with ``seed``.

        ``raw`` is the datapoint as already read (by a batch read), if it was.
        The one row of :meth:`_read_rows`, which reads every row.
        """
        job = _Fill(None, 0, [index], [seed], [raw], {}, {}, None, _NEVER)     # (no rows written)
        job.countdown = 1 << 62
        self._read_rows(job, 0, 1)
        return job.pending[0]

    def _read_rows(self, job: _Fill, first: int, stop: int) -> None:
        """Read rows ``first .. stop - 1`` of ``job`` onto ``job.pending``, each through the
        fns: the one reader of a row (:meth:`datapoint` is one row of it).

        Raises the first failure (its row is the first not on ``pending``), or
        :class:`Cancelled`. Every ``every``-th row is timed (``job.countdown``):
        its fns are the timer's laps, the same fns wrapped to time them
        (:class:`loadr.stats.FillTimer`). A loop over rows, not a call per row:
        the call was 6% of a trivial fill.
        """
        get, read, after, name_error = self._get, self._read, self.after, self._name_error
        timer = self.timer
        laps, every = timer.laps, timer.every
        keep = job.pending.append
        cell, task_id = job.cancel
        progress, start = job.progress, job.start
        countdown = job.countdown
        try:
            for row, (index, seed, raw) in enumerate(
                    zip(job.indices[first:stop], job.seeds[first:stop], job.raws[first:stop]),
                    first):
                if cell[0] >= task_id:
                    raise Cancelled(task_id)
                if progress is not None:
                    progress[0] = start + row
                    progress[1] = index
                if countdown:
                    countdown -= 1
                    fns = after
                else:
                    countdown = every - 1
                    fns = laps
                    timer.row()
                if raw is not None:
                    dp = raw
                elif get is not None:
                    try:
                        dp = get(index)
                    except Exception as exc:
                        dp = read(index, seed, exc)
                else:
                    dp = read(index, seed)
                if fns:
                    # Fns may mutate theirs: never the reader's own dict (_own, inlined
                    # for an exact dict).
                    dp = dp.copy() if type(dp) is dict else _own(_returned(dp, index))
                    try:
                        for fn in fns:
                            dp = fn(dp, seed=seed)
                            if type(dp) is not dict:
                                _returned(dp, index, fn)
                    except Exception as exc:
                        if name_error is not None:
                            name_error(exc, index)
                        raise
                elif type(dp) is not dict:
                    _returned(dp, index)
                keep(dp)
        finally:
            job.countdown = countdown

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
        before any sample once ``cell[0] >= task_id``. A sample that fails (and is
        not replaced) raises :class:`~loadr.errors.SampleFailure`, naming it.
        """
        if self._cache_clock is not None:
            self._cache_clock(order, start, count)
        indices = order.indices(start, count).tolist()
        self.prefetch(order, start, count, indices)
        seeds = order.seeds(start, count)
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
        job = _Fill(order, start, indices, seeds, raws, arrays,
                    {k: [] for k in self.list_keys}, progress,
                    cancel if cancel is not None else _NEVER)
        if clock is None:
            job.countdown = 1 << 62
            self._fill_rows(job)
            return job.extras, job.replaced
        # Every `every`-th row is timed stage by stage (loadr.stats.FillTimer):
        # the others pay one test of a countdown.
        timer = self.timer
        job.countdown = timer.start()
        t1 = time.perf_counter()
        filled = False
        try:
            self._fill_rows(job)
            filled = True
        finally:
            timer.countdown = job.countdown
            # A cancelled or failed batch's rows were work too (not a batch, though).
            timer.account(clock, count, t0, t1, cpu0, filled, job.write_s)
        return job.extras, job.replaced

    def _fill_rows(self, job: _Fill) -> None:
        """Read the rows of ``job`` and write them, :attr:`_group` at a time, so that errors
        and replacements come in the order of the rows."""
        pending, group, n = job.pending, self._group, len(job.indices)
        row = 0
        while row < n:
            stop = min(n, job.next_row + group)
            try:
                self._read_rows(job, row, stop)
            except Cancelled:
                raise
            except Exception as exc:
                failed = job.next_row + len(pending)
                self._write_pending(job)        # the rows before it first
                self._failed(exc, job, failed)
                job.next_row = row = failed + 1
                continue
            self._write_pending(job)
            row = stop

    def _write_pending(self, job: _Fill) -> None:
        """Write the datapoints on ``job.pending`` into their rows: all at once with
        :meth:`_write_rows`, or where it refuses them, one by one, checked."""
        dps = job.pending
        if not dps:
            return
        t0 = time.perf_counter()
        first = job.next_row
        if not self._write_rows(dps, first, job.arrays, job.extras):
            progress, indices = job.progress, job.indices
            for row, dp in enumerate(dps, first):
                if progress is not None:        # the write may be what kills a worker
                    progress[0] = job.start + row
                    progress[1] = indices[row]
                try:
                    self._write_checked(dp, row, indices[row], job.arrays, job.extras)
                except Exception as exc:
                    self._failed(exc, job, row)
        job.next_row = first + len(dps)
        dps.clear()
        job.write_s += time.perf_counter() - t0

    def _failed(self, exc, job: _Fill, row: int) -> None:
        """Row ``row``'s sample failed: raise it, or under on_error='skip' write its
        replacement."""
        index, position = job.indices[row], job.start + row
        if self.on_error != 'skip':
            raise SampleFailure(exc, index, position) from exc
        # Not logged here: a worker's log is not the caller's, and a prefetched batch may
        # never be handed out. The Loader logs each replacement once, in the main
        # process, when its batch is handed out (with the reason carried from here).
        job.replaced.append((index, position, f'{type(exc).__name__}: {exc}'))
        # A candidate refused half-way may have written some of the row: the one
        # taken writes all of it (and list keys are added only once all pass).
        arrays, extras = job.arrays, job.extras
        self.substitute(index, job.seeds[row], job.order,
                        lambda dp: self._write(dp, row, index, arrays, extras))

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
            # Its reads are on their way. Fill's call ends the mark; another call ahead
            # (the task still queued behind a new one) leaves it: asked again, every
            # range would be planned again and claimed twice, read once.
            if indices is not None:
                self._ahead.discard(key)
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

    def prefetch_tasks(self, tasks: list) -> None:
        """:meth:`prefetch` of several tasks ``(order, start, count)`` (a worker's next
        and those queued behind it) with one call of the reader's: their ranges are
        planned together, so that a file's ranges of every batch go in one request."""
        prefetch = self._prefetch
        if prefetch is None:
            return
        if len(self._ahead) > 16 + len(tasks):     # tasks asked ahead, never filled
            self._ahead.clear()
        indices: list = []
        for order, start, count in tasks:
            key = (id(order), start, count)
            if key in self._ahead:          # asked already: its reads are on their way
                continue
            self._ahead.add(key)
            indices.extend(order.indices(start, count).tolist())
        if not indices:
            return
        try:
            prefetch(indices)
        except Exception as exc:            # a hint: the reads themselves report any trouble
            log.debug('loadr: read-ahead of %d positions failed: %r', len(indices), exc)

    def _write(self, dp: dict, row: int, index: int, arrays: dict, extras: dict) -> None:
        """Write one datapoint into ``row``: :meth:`_write_rows`, or where it refuses it,
        :meth:`_write_checked` (which raises the error)."""
        if not self._write_rows([dp], row, arrays, extras):
            self._write_checked(dp, row, index, arrays, extras)

    def _write_rows(self, dps: list, first: int, arrays: dict, extras: dict) -> bool:
        """The fast writer: rows ``first ..`` from ``dps``, key by key, if every datapoint
        is the common kind; else write nothing and return False.

        The common datapoint is a dict (or a tuple for a spec keyed ``0 ..
        k-1``) with the spec's keys, whose array values are exactly
        ``np.ndarray`` of the spec's dtype and shape, or scalars that numpy makes
        the spec's dtype with no conversion, and whose list values cross
        processes. These checks are made a key at a time over the rows with
        C-level passes (``map``, ``set``): the full checks per datapoint were a
        quarter of a worker's time on the trivial workload. Whatever it
        accepts, :meth:`_write_checked` writes the very same bytes
        (tests/test_assemble.py compares the two).
        """
        kind = tuple if self._by_position else dict
        kinds = set(map(type, dps))
        if (kinds != {dict} and kinds != {kind}) or set(map(len, dps)) != {self._width}:
            return False
        found = []
        try:
            for key, dtype, shape, scalars in self._fast_specs:
                values = [dp[key] for dp in dps]
                kinds = set(map(type, values))
                if np.ndarray in kinds:
                    arrays_ = values if len(kinds) == 1 else \
                        [v for v in values if type(v) is np.ndarray]
                    # Equal dtypes need not be one object: arrays that crossed a
                    # pickle (a reader sent to a spawned worker) hold copies.
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
                for other in set(map(type, values)) - _PLAIN:
                    if not all(_crosses(v) for v in values if type(v) is other):
                        return False
                lists.append(values)
        except KeyError:
            return False
        n = len(dps)
        at = slice(first, first + n)
        for (key, _, shape, _), values in zip(self._fast_specs, found):
            target = arrays[key]
            if n == 1:
                target[first] = values[0]
            elif shape == ():
                target[at] = values
            elif target.flags.c_contiguous:
                # One C loop: the rows as one flat run (np.stack loops in Python).
                flat = target[at].view()
                flat.shape = (-1,) + flat.shape[2:]
                np.concatenate(values, out=flat)
            else:
                target[at] = np.stack(values)
        for key, values in zip(self.list_keys, lists):
            extras[key].extend(values)
        return True

    def _write_checked(self, dp: dict, row: int, index: int, arrays: dict,
                       extras: dict) -> None:
        """The checked writer: ``dp`` into ``row``, any datapoint, with every check, and
        the error (naming the key and ``index``) for the first that fails."""
        if type(dp) is not dict and isinstance(dp, tuple):
            dp = dict(enumerate(dp))
        if dp.keys() != self._keys:
            spec = self.spec or {}      # (this writer runs with a spec)
            missing = sorted(set(spec) - set(dp), key=str)
            extra = sorted(set(dp) - set(spec), key=str)
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


# What _write_rows maps over a batch's arrays.
_DTYPE, _SHAPE = operator.attrgetter('dtype'), operator.attrgetter('shape')
# The range of Python ints that numpy turns into its default int (int64) and not
# into a wider type: only these take _write_rows as that int.
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

    _write_rows tests a value's dtype by identity first, and a dtype
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
