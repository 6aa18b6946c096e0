"""The Loader: a deterministic, resumable stream of batches.

The stream is the one of ../shared/reference/FORMATS.md: stream position
``p`` holds dataset index ``order(seed, p // N)[p % N]``; it runs forever and
a batch may span an epoch boundary. Global batch ``g`` covers positions
``[g*B*S, (g+1)*B*S)`` for batch ``B`` and ``S = num_shards``; shard ``s``
takes ``[g*B*S + s*B, g*B*S + (s+1)*B)``. ``save()`` holds the global
position of the next batch, the same on every shard, so a run can resume on
another number of shards as long as ``B*S`` stays the same.

Every byte of every batch is a pure function of (dataset, fns, seed,
shuffle, batch, shard) and the position: worker count, prefetch, a killed
worker or a ``load()`` never change one.

Example::

    with Loader(reader, batch=64, fns=[preproc], seed=0, workers=4) as loader:
        for batch in loader:
            train_step(batch)
            if time_to_checkpoint():
                save_checkpoint(loader.save())
"""

from __future__ import annotations

import logging
import os
import weakref

import numpy as np

from .assemble import OBJECT, Assembler, SampleFailure, infer_spec
from .errors import ConfigError, LoadrError, StateError, WorkerError
from .order import Order, check_seed
from .workers import protocol

__all__ = ['Loader', 'STATE_VERSION']

log = logging.getLogger('loadr')

STATE_VERSION = 1
POLL_MS = 50
# Batches the caller may hold at once that are lent from shared memory, not
# copied; a training loop holds one (the last) while asking for the next.
LEASED_SLOTS = 2
DEFAULT_TASK_TIMEOUT_S = 300.0
MIN_ERRORS_BEFORE_RAISE = 4


class _Parts:
    """One batch being made by one task, or (split) by several: what has come back."""

    def __init__(self, slot: int, count: int, next_step: int, pieces: int):
        self.slot, self.count, self.next_step, self.left = slot, count, next_step, pieces
        self.pieces: dict[int, tuple] = {}  # first row -> (extras, replaced)
        self.failure = None

    def merged(self, list_keys: list) -> tuple[dict, list]:
        """The list keys' values and the replaced indices, in row order."""
        if len(self.pieces) == 1:
            return next(iter(self.pieces.values()))
        extras = {k: [] for k in list_keys}
        replaced = []
        for row in sorted(self.pieces):
            piece_extras, piece_replaced = self.pieces[row]
            for k in list_keys:
                extras[k].extend(piece_extras.get(k, ()))
            replaced.extend(piece_replaced)
        return extras, replaced


def _raise_failure(failure: protocol.Failure, exc: BaseException | None = None):
    """Raise the original exception, chained to a WorkerError that says where."""
    where = []
    if failure.index is not None:
        where.append(f'dataset index {failure.index}')
    if failure.position is not None:
        where.append(f'stream position {failure.position}')
    who = 'the main process' if failure.worker is None else f'loadr worker {failure.worker}'
    at = f" at {', '.join(where)}" if where else ''
    text = f'{failure.type_name} in {who}{at}: {failure.message}'
    if failure.traceback:
        text += f'\n\nWorker traceback:\n{failure.traceback}'
    cause = WorkerError(text, index=failure.index)
    cause.position = failure.position
    cause.worker_traceback = failure.traceback
    original = exc if exc is not None else failure.exception()
    if original is None:
        raise cause
    original.__dict__.setdefault('loadr_index', failure.index)
    original.__dict__.setdefault('loadr_position', failure.position)
    raise original from cause


def _start_methods() -> list[str]:
    import multiprocess
    return multiprocess.get_all_start_methods()


def _normalize_spec(spec: dict) -> dict:
    out = {}
    for key, value in spec.items():
        try:
            dtype, shape = value
            out[key] = (np.dtype(dtype), tuple(int(s) for s in shape))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f'spec[{key!r}] must be (dtype, shape), got {value!r}') from exc
    return out


class Loader:
    """Batches from ``reader``, shuffled globally, in worker processes.

    Args:
      reader: anything with ``len()`` and ``[i] -> dict`` (a list of dicts
        works), or a loadr reader.
      batch: datapoints per batch (per shard).
      fns: transforms, each called as ``fn(datapoint, seed=s)`` with ``s``
        derived from (seed, stream position); returns a new dict.
      shuffle: a fresh permutation each epoch (False: dataset order).
      seed: any int in [0, 2**64).
      workers: processes; 0 runs everything in this process, same output.
      prefetch: batches in flight (default ``2 * workers``).
      shard_id, num_shards: split each global batch between hosts.
      spec: ``{key: (dtype, shape)}``; default: from the first datapoint.
      ring: yield views into shared memory, valid only until the next batch;
        default False: every batch is the caller's to keep (the first
        ``LEASED_SLOTS`` batches the caller holds at once are still not
        copied: their slots are reused only once the caller drops them).
      on_error: ``'raise'`` (default) or ``'skip'``: a failing datapoint is
        replaced by another one chosen deterministically and logged; more
        than ``max_error_fraction`` of samples failing raises.
      timeout: seconds a worker may spend on one batch before it is killed
        and the batch redone (None: no deadline).
      start_method: ``'fork'`` (default where there is one) or ``'spawn'`` (safe
        in processes that run threads; needs the ``__main__`` guard).

    Example::

        loader = Loader([{'x': i} for i in range(10)], batch=4, seed=1, workers=0)
        first = next(iter(loader))['x']        # e.g. array([3, 9, 0, 6])
    """

    def __init__(self, reader, batch: int, fns=(), shuffle: bool = True, seed: int = 0,
                 workers: int | None = None, prefetch: int | None = None, shard_id: int = 0,
                 num_shards: int = 1, spec: dict | None = None, ring: bool = False,
                 on_error: str = 'raise', max_error_fraction: float = 0.01,
                 timeout: float | None = DEFAULT_TASK_TIMEOUT_S, start_method: str | None = None):
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ConfigError(f'batch must be a positive int, got {batch!r}')
        if workers is None:
            workers = min(8, os.cpu_count() or 1)
        if not isinstance(workers, (int, np.integer)) or workers < 0:
            raise ConfigError(f'workers must be an int >= 0, got {workers!r}')
        if not isinstance(num_shards, (int, np.integer)) or num_shards < 1:
            raise ConfigError(f'num_shards must be an int >= 1, got {num_shards!r}')
        if not isinstance(shard_id, (int, np.integer)) or not 0 <= shard_id < num_shards:
            raise ConfigError(f'shard_id must be in [0, {num_shards}), got {shard_id!r}')
        if on_error not in ('raise', 'skip'):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if start_method is None:
            # Like torch's DataLoader on Linux: fork starts workers in milliseconds and
            # needs no __main__ guard; spawn is there for processes that hold threads.
            start_method = 'fork' if 'fork' in _start_methods() else 'spawn'
        if start_method not in _start_methods():
            raise ConfigError(f'unknown start_method {start_method!r}')
        for fn in fns:
            if not callable(fn):
                raise ConfigError(f'every fn must be callable, got {fn!r}')
        try:
            n = len(reader)
        except TypeError as exc:
            raise ConfigError(f'reader must have len(), got {type(reader).__name__}') from exc
        if n == 0:
            raise ConfigError('the reader is empty: nothing to load')
        try:
            self.seed = check_seed(seed)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.reader = reader
        self.batch = int(batch)
        self.fns = list(fns)
        self.shuffle = bool(shuffle)
        self.workers = int(workers)
        self.prefetch = max(1, int(prefetch)) if prefetch is not None else max(2, 2 * self.workers)
        self.shard_id, self.num_shards = int(shard_id), int(num_shards)
        self.ring = bool(ring)
        self.on_error = on_error
        self.max_error_fraction = float(max_error_fraction)
        self.timeout = timeout
        self.start_method = start_method
        self.n = n
        self.step = 0
        self._spec = _normalize_spec(spec) if spec is not None else None
        self._pool = None
        self._finalizer = None
        self._gen = 0                   # bumped by load() and each new iteration
        self._slots_free: list[int] = []
        self._inflight: dict[int, tuple] = {}   # task id -> (gen, j, slot, start, count, row)
        self._writers: dict[int, int] = {}      # slot -> tasks in flight writing into it
        self._let_go: set[int] = set()          # slots to free once their writers end
        self._next_task_id = 0
        self._held_slot = None          # ring mode: the slot the caller is looking at
        # Slots lent to the caller -> a weak reference to the array every view
        # of that batch hangs from. Polled, not called back: a finaliser could
        # swallow a Ctrl-C that lands in it, and run in any thread.
        self._leases: dict[int, weakref.ref] = {}
        self.errors = 0                 # datapoints replaced under on_error='skip'
        self.samples = 0
        self.closed = False

    # -- spec ----------------------------------------------------------------

    @property
    def spec(self) -> dict:
        """``{key: (dtype, shape)}`` of one datapoint after the fns (object dtype: a list key)."""
        if self._spec is None:
            order = self._order()
            asm = Assembler(self.reader, self.fns, None)
            index, seed = order.index_at(0), order.seeds(0, 1)[0]
            try:
                dp = asm.datapoint(index, seed)
            except Exception as exc:
                _raise_failure(protocol.Failure.capture(exc, index, 0, None), exc)
            self._spec = infer_spec(dp)
        return self._spec

    def _order(self) -> Order:
        return Order(self.n, self.seed, self.shuffle)

    # -- state ---------------------------------------------------------------

    @property
    def global_batch(self) -> int:
        return self.batch * self.num_shards

    def save(self) -> dict:
        """A small JSON-serialisable state: where the stream goes on from.

        >>> Loader([{'x': 1}], batch=1, workers=0).save()['step']
        0
        """
        return {'version': STATE_VERSION, 'step': self.step, 'seed': self.seed,
                'n': self.n, 'shuffle': self.shuffle, 'global_batch': self.global_batch}

    def load(self, state: dict) -> None:
        """Go on from ``state`` (from ``save()``); the next batch is the one that was due."""
        if not isinstance(state, dict) or 'step' not in state or 'seed' not in state:
            raise StateError(f"a loader state is a dict with 'step' and 'seed', got {state!r}")
        version = state.get('version', STATE_VERSION)
        if version > STATE_VERSION:
            raise StateError(f'state version {version} is newer than this loadr '
                             f'understands ({STATE_VERSION}); upgrade loadr')
        if 'n' in state and state['n'] != self.n:
            raise StateError(f"the state was saved for a dataset of {state['n']} datapoints, this "
                             f'reader has {self.n}: load it with the same dataset')
        if 'shuffle' in state and bool(state['shuffle']) != self.shuffle:
            raise StateError(f"the state was saved with shuffle={state['shuffle']}; create the "
                             f'Loader with the same shuffle to resume')
        step = state['step']
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise StateError(f'step must be an int >= 0, got {step!r}')
        try:
            seed = check_seed(state['seed'])
        except ValueError as exc:
            raise StateError(str(exc)) from exc
        gb = state.get('global_batch', self.global_batch)
        if gb != self.global_batch:
            log.warning('loadr: state saved with global batch %s, resuming with %s: the '
                        'batches from here on are grouped differently', gb, self.global_batch)
        self.step, self.seed = int(step), seed
        self._gen += 1
        self._cancel_inflight()

    # -- iteration -----------------------------------------------------------

    def __iter__(self):
        return self._stream(None, False)

    def epoch(self, epoch: int, drop_last: bool = False):
        """The batches of one epoch only (positions ``[epoch*N, (epoch+1)*N)``).

        If the loader's step lies inside that epoch (after ``load()``), it
        starts there. The last batch is smaller unless ``drop_last``.

        >>> loader = Loader([{'x': i} for i in range(5)], batch=2, workers=0)
        >>> [len(b['x']) for b in loader.epoch(0)]
        [2, 2, 1]
        """
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f'epoch must be an int >= 0, got {epoch!r}')
        return self._stream(int(epoch), bool(drop_last))

    def _plan(self, step0: int, j: int, end: int | None, drop_last: bool):
        """Task j from step0: (start, count, next step) or None when the epoch is over."""
        g = step0 + j * self.global_batch
        if end is None:
            return g + self.shard_id * self.batch, self.batch, g + self.global_batch
        if g >= end or (drop_last and g + self.global_batch > end):
            return None
        start = g + self.shard_id * self.batch
        count = max(0, min(start + self.batch, end) - start)
        return start, count, min(g + self.global_batch, end)

    def _stream(self, epoch, drop_last):
        if self.closed:
            raise LoadrError('this loader is closed')
        self._gen += 1
        spec = self.spec
        end = None if epoch is None else (epoch + 1) * self.n

        def start_step():
            if epoch is None or not epoch * self.n <= self.step < end:
                return self.step if epoch is None else epoch * self.n
            return self.step

        if self.workers == 0:
            yield from self._inline(spec, start_step, end, drop_last)
        else:
            yield from self._parallel(spec, start_step, end, drop_last)

    def _batch_from(self, arrays: dict, extras: dict, count: int, copy: bool) -> dict:
        out = {}
        for key in self.spec:
            if key in arrays:
                view = arrays[key][:count]
                out[key] = view.copy() if copy else view
            else:
                out[key] = extras[key]
        return out

    def _count_errors(self, replaced: list, count: int) -> None:
        self.samples += count
        if not replaced:
            return
        self.errors += len(replaced)
        for index in replaced:
            log.warning('loadr: datapoint %d failed and was replaced (on_error=skip)', index)
        if (self.errors >= MIN_ERRORS_BEFORE_RAISE
                and self.errors > self.max_error_fraction * self.samples):
            raise LoadrError(f'{self.errors} of {self.samples} datapoints failed, more than '
                             f'max_error_fraction={self.max_error_fraction}; last: index '
                             f'{replaced[-1]}', index=replaced[-1])

    def _inline(self, spec, start_step, end, drop_last):
        asm = Assembler(self.reader, self.fns, spec, self.on_error)
        gen, j, step0 = self._gen, 0, start_step()
        while True:
            if gen != self._gen:
                gen, j, step0 = self._gen, 0, start_step()
            plan = self._plan(step0, j, end, drop_last)
            if plan is None:
                return
            start, count, next_step = plan
            j += 1
            if count == 0:
                self.step = next_step
                continue
            arrays = {k: np.empty((count, *s), d) for k, (d, s) in spec.items() if d != OBJECT}
            try:
                extras, replaced = asm.fill(self._order(), start, count, arrays)
            except SampleFailure as f:
                _raise_failure(protocol.Failure.capture(f.exc, f.index, f.position, None,
                                                        f.traceback), f.exc)
            self._count_errors(replaced, count)
            self.step = next_step
            yield self._batch_from(arrays, extras, count, copy=False)

    # -- workers -------------------------------------------------------------

    def _ensure_pool(self, spec):
        if self._pool is not None:
            return self._pool
        from .workers.pool import WorkerPool
        from .workers.shm import Layout
        fields = {k: (d, s) for k, (d, s) in spec.items() if d != OBJECT}
        layout = Layout(fields, self.batch)
        slots = self.prefetch + (1 if self.ring else LEASED_SLOTS)
        self._pool = WorkerPool(self.reader, self.fns, spec, layout, self.workers, slots,
                                self.n, self.shuffle, self.on_error, self.start_method,
                                self.timeout)
        self._slots_free = list(range(slots))
        self._leases = {}
        self._inflight, self._writers, self._let_go = {}, {}, set()
        self._list_keys = [k for k, (d, _) in spec.items() if d == OBJECT]
        self._finalizer = weakref.finalize(self, self._pool.close)
        return self._pool

    def _parallel(self, spec, start_step, end, drop_last):
        results: dict[int, tuple] = {}      # j -> (slot, count, next_step, extras, replaced)
        parts: dict[int, _Parts] = {}       # j -> the batch being made, part by part
        resend: list[int] = []              # task ids whose worker died, to send again
        try:
            yield from self._parallel_loop(spec, start_step, end, drop_last, results, parts,
                                           resend)
        finally:
            # Batches done but never handed out, or still being made (the caller
            # broke out of an epoch, dropped the iterator, or hit Ctrl-C):
            # without this, every such stop would lose their slots for good and
            # shrink the prefetch window.
            self._abandon(results, parts, resend)

    def _collect_leases(self) -> None:
        for slot, owner in list(self._leases.items()):
            if owner() is None:
                del self._leases[slot]
                self._slots_free.append(slot)

    def _cancel_inflight(self) -> None:
        # Batches being made for a generation the stream has left would only
        # delay the next one: the workers drop them (see WorkerPool.cancel).
        # Task ids grow with generations, so every id up to the newest stale
        # one is stale; the current generation's tasks are never touched.
        stale = [tid for tid, entry in self._inflight.items() if entry[0] != self._gen]
        if self._pool is not None and stale:
            self._pool.cancel(max(stale))

    # A slot is written by the tasks in flight for it (one, or the parts of a
    # split batch); it goes back to the free list only when it is let go (the
    # batch failed, or its generation was left) and no task writes into it.

    def _new_task(self, gen: int, j: int, slot: int, start: int, count: int, row: int) -> int:
        tid = self._next_task_id
        self._next_task_id += 1
        self._inflight[tid] = (gen, j, slot, start, count, row)
        self._writers[slot] = self._writers.get(slot, 0) + 1
        return tid

    def _end_task(self, tid: int) -> tuple:
        entry = self._inflight.pop(tid)
        slot = entry[2]
        self._writers[slot] -= 1
        if not self._writers[slot]:
            del self._writers[slot]
            if slot in self._let_go:
                self._let_go.discard(slot)
                self._slots_free.append(slot)
        return entry

    def _let_go_of(self, slot: int) -> None:
        if slot in self._writers:
            self._let_go.add(slot)          # freed by the last of its tasks to end
        else:
            self._slots_free.append(slot)

    def _abandon(self, results: dict, parts: dict, resend: list) -> None:
        for slot, *_ in results.values():
            if slot is not None:            # None: an empty shard batch, no slot
                self._slots_free.append(slot)
        results.clear()
        for tid in resend:                  # in no worker's hands: they end here
            self._end_task(tid)
        resend.clear()
        for p in parts.values():
            self._let_go_of(p.slot)
        parts.clear()

    def _submit_batch(self, pool, gen: int, j: int, start: int, count: int, next_step: int,
                      parts: dict, resend: list) -> None:
        # The first batch after a (re)start is split between the workers, so
        # it takes the time of 1/workers of a batch; later ones overlap anyway.
        pieces = min(self.workers, count) if j == 0 else 1
        slot = self._slots_free.pop()
        parts[j] = _Parts(slot, count, next_step, pieces)
        for k in range(pieces):
            row = count * k // pieces
            rows = count * (k + 1) // pieces - row
            tid = self._new_task(gen, j, slot, start + row, rows, row)
            if not pool.submit(tid, slot, self.seed, start + row, rows, row):
                resend.append(tid)

    def _parallel_loop(self, spec, start_step, end, drop_last, results, parts, resend):
        pool = self._ensure_pool(spec)
        gen = None
        failures: dict[int, object] = {}     # j -> Failure, raised when batch j is due
        while True:
            if self._held_slot is not None:
                self._slots_free.append(self._held_slot)
                self._held_slot = None
            self._collect_leases()
            if gen != self._gen:
                # (Re)start: whatever is in flight for an older generation is
                # abandoned; its slot comes back when its tasks have ended.
                gen, j_yield, j_send, step0 = self._gen, 0, 0, start_step()
                self._abandon(results, parts, resend)
                failures.clear()
                self._cancel_inflight()
            # Fill the window.
            while resend and pool.can_submit():
                tid = resend[0]
                _, _, slot, start, count, row = self._inflight[tid]
                if not pool.submit(tid, slot, self.seed, start, count, row):
                    break
                resend.pop(0)
            while self._slots_free and j_send < j_yield + self.prefetch and pool.can_submit():
                plan = self._plan(step0, j_send, end, drop_last)
                if plan is None:
                    break
                start, count, next_step = plan
                if count == 0:
                    results[j_send] = (None, 0, next_step, {}, [])
                else:
                    self._submit_batch(pool, gen, j_send, start, count, next_step, parts,
                                       resend)
                j_send += 1
            # Hand out the next batch if it is there; a batch that failed raises
            # only now, so the batches before it are all handed out first.
            if j_yield in failures:
                self._gen += 1              # the window is abandoned with the error
                _raise_failure(failures.pop(j_yield))
            if j_yield in results:
                slot, count, next_step, extras, replaced = results.pop(j_yield)
                j_yield += 1
                self._count_errors(replaced, count)
                self.step = next_step
                if slot is None:
                    continue
                if self.ring:
                    self._held_slot = slot
                    yield self._batch_from(pool.views[slot], extras, count, copy=False)
                elif len(self._leases) < LEASED_SLOTS:
                    # Lent, not copied: the slot comes back to the free list
                    # once the caller has dropped every array of this batch.
                    owner, arrays = pool.fresh_views(slot)
                    self._leases[slot] = weakref.ref(owner)
                    del owner
                    yield self._batch_from(arrays, extras, count, copy=False)
                    arrays = None       # only the caller may keep the lease alive
                else:
                    # The caller keeps LEASED_SLOTS batches already: copy, so
                    # the prefetch window never shrinks under them.
                    batch = self._batch_from(pool.views[slot], extras, count, copy=True)
                    self._slots_free.append(slot)
                    yield batch
                continue
            if self._plan(step0, j_yield, end, drop_last) is None:
                return
            for event in pool.poll(POLL_MS):
                kind, tid = event[0], event[1]
                if kind == 'fatal':
                    self._gen += 1
                    _raise_failure(event[2])
                if tid not in self._inflight:
                    continue
                if kind == 'lost' and self._inflight[tid][0] == gen:
                    resend.append(tid)      # the same part again, to another worker
                    continue
                tgen, j, slot, _, _, row = self._end_task(tid)
                if tgen != gen:
                    continue                # its slot was let go at the restart
                p = parts[j]
                if kind == 'done':
                    p.pieces[row] = (event[2], event[3])
                elif p.failure is None:
                    p.failure = event[2]
                p.left -= 1
                if p.left:
                    continue
                del parts[j]
                if p.failure is not None:
                    self._slots_free.append(slot)   # every part has ended
                    failures[j] = p.failure
                else:
                    results[j] = (slot, p.count, p.next_step, *p.merged(self._list_keys))

    # -- lifecycle -----------------------------------------------------------

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the live worker processes (empty before the first batch)."""
        return [] if self._pool is None else self._pool.pids

    def close(self) -> None:
        """Stop the workers and free the shared memory; safe to call twice."""
        self.closed = True
        if self._finalizer is not None:
            self._finalizer()
        self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self) -> int:
        """Batches per epoch for this shard (the last one may be partial)."""
        return -(-self.n // self.global_batch)

    def __repr__(self) -> str:
        return (f'Loader(n={self.n}, batch={self.batch}, shuffle={self.shuffle}, '
                f'seed={self.seed}, workers={self.workers}, '
                f'shard={self.shard_id}/{self.num_shards}, step={self.step})')
