"""The Loader: a deterministic, resumable stream of batches.

The stream is the one of docs/FORMATS.md §6: stream position
``p`` holds dataset index ``order(seed, p // N)[p % N]``; it runs forever and
a batch may span an epoch boundary. Global batch ``g`` covers positions
``[g*B*S, (g+1)*B*S)`` for batch ``B`` and ``S = num_shards``; shard ``s``
takes ``[g*B*S + s*B, g*B*S + (s+1)*B)``. ``save()`` holds the global
position of the next batch, the same on every shard, so a run can resume on
another number of shards as long as ``B*S`` stays the same.

Iteration is that endless stream; ``len(loader)`` is a TypeError.
``epoch(e)`` yields the batches of positions ``[e*N, (e+1)*N)`` alone. Its
last global batch, of ``left < B*S`` positions, is split evenly between the
shards: shard ``s`` takes positions ``[left*s//S, left*(s+1)//S)`` of it. So
every shard yields ``batches_per_epoch() = ceil(N / (B*S))`` batches per
epoch, and a data-parallel job never waits on a shard that has finished;
a shard's last batch may be short, and is empty (0 rows, still yielded)
when ``left < S`` leaves it no position. With ``drop_last`` the partial
global batch is dropped on every shard: ``N // (B*S)`` batches.

Every byte of every batch is a pure function of (dataset, fns, seed,
shuffle, batch, shard) and the position: worker count, prefetch, a killed
worker or a ``load()`` never change one.

One batch's way, file by file (each read once; the reply comes back through
the same files)::

    loader.py           for batch in loader: the iterator asks _stream, which begins
                        a generation of the window from the loader's step and asks
                        it for the next batch in order
    workers/window.py   Window.next: plans the batches (Schedule.plan), splits each
                        into tasks (protocol.Task headers) over free slots, submits
                        them and polls events until the batch due is Finished
    workers/pool.py     WorkerPool.submit: sends a TASK to a worker with room; poll
                        turns replies into Done / Failed / Lost / Fatal events
    workers/protocol.py the messages and events as records; a Failure, and how it
                        is raised here (raise_failure)
    workers/worker.py   the worker loop: receive, read, decode, run the fns, fill
                        the slot's rows, reply DONE (or FAIL)
    assemble.py         Assembler.fill: positions -> indices -> records -> fns ->
                        rows written into the slot's arrays

Back in loader.py the slot's arrays (lent, held or copied by the window) become
the batch; the step moves past it, the error budget and ``stats()`` count it.
With ``workers=0`` the window is an InlineWindow that calls assemble.py itself;
with ``remote=`` a HybridPool (workers/remote.py) stands where the pool is.

Example::

    with Loader(reader, batch=64, fns=[preproc], seed=0, workers=4) as loader:
        for batch in loader:
            train_step(batch)
            if time_to_checkpoint():
                save_checkpoint(loader.save())
"""

from __future__ import annotations

import functools
import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import state as state_fields
from .assemble import Assembler
from .budget import ErrorBudget, log_replaced
from .decode import fuse
from .errors import ConfigError, LoadrError
from .order import ORDER_VERSION, check_seed, check_version, order_for
from .sources import hooks_of
from .spec import OBJECT, infer_spec
from .state import STATE_VERSION
from .stats import (
    TRACE_EVENTS,
    WORKER_RECORDS,
    Calibration,
    StageClock,
    Stats,
    Tally,
    Tracer,
    cores,
    fn_names,
)
from .workers import protocol
from .workers.starting import default_start_method, first_indices, start_methods, warm_before_fork
from .workers.window import LEASED_SLOTS, BatchFailed, InlineWindow, Schedule, Window
from .workers.worker import most_tasks_held, tasks_held

if TYPE_CHECKING:
    from .workers.pools import Pool
    from .workers.remote import HybridPool

__all__ = ['Loader', 'STATE_VERSION', 'LEASED_SLOTS', 'MAX_BATCH', 'MAX_WORKERS', 'MAX_PREFETCH',
           'check_whole', 'check_real']

log = logging.getLogger('loadr')

DEFAULT_TASK_TIMEOUT_S = 300.0


# -- settings ---------------------------------------------------------------

# The largest values the Loader's whole-number settings may take: past these a
# setting is a typo, not a plan (a slot is a batch of shared memory, a worker
# a process), and each is far below where a count would overflow.
MAX_BATCH = 2**31 - 1
MAX_WORKERS = 4096
MAX_PREFETCH = 65536


def check_whole(name: str, value, lo: int, hi: int | None = None, also: str = '') -> int:
    """``value`` as an int in ``[lo, hi]``, else a ConfigError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ConfigError(f'{name} must be an int >= {lo}{also}, got {value!r}')
    if hi is not None and value > hi:
        raise ConfigError(f'{name} must be at most {hi}, got {value!r}')
    return int(value)


def check_real(name: str, value, lo: float, hi: float | None = None, above: bool = False,
               none: str = '') -> float:
    """``value`` as a finite float in its range (``> lo`` if ``above``), else a ConfigError
    naming the setting: NaN and infinity pass no comparison, so they are refused first."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer,
                                                             np.floating))
    if ok:
        try:
            value = float(value)
        except OverflowError:               # an int past float's range
            ok = False
    if ok and np.isfinite(value) and (value > lo if above else value >= lo) \
            and (hi is None or value <= hi):
        return value
    where = f'> {lo:g}' if above else f'>= {lo:g}'
    if hi is not None:
        where = f'in [{lo:g}, {hi:g}]'
    raise ConfigError(f'{name} must be a finite number {where}{none}, got {value!r}')


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
        works), or a loadr reader. A datapoint may also be a tuple ``(x, y)``
        (torchvision's datasets): its batches are tuples then. A value that
        is a numpy array, a number, a ``torch.Tensor`` or anything with
        ``__array__`` or ``__dlpack__`` is stacked into an array in shared
        memory (never pickled); any other value is handed over as a list.
        A list or tuple whose objects take 64 MiB or more (a Mix's source too)
        is serialised once into shared memory, read by the workers without
        copying it (:mod:`loadr.shared`; ``LOADR_SHARE=0`` or ``1`` to say
        otherwise).
      batch: datapoints per batch (per shard).
      fns: transforms, each called as ``fn(datapoint, seed=s)`` with ``s``
        derived from (seed, stream position); returns a new datapoint.
      shuffle: a fresh permutation each epoch (False: dataset order).
      seed: any int in [0, 2**64).
      workers: processes; 0 runs everything in this process, same output.
        ``'auto'``: sized by itself (see below).
      prefetch: batches in flight (default ``2 * workers``; for a reader that reads
        ahead, room for up to ``8 * workers``, each worker holding as many tasks as its
        round trips need); ``'auto'``: sized by itself.
      shard_id, num_shards: split each global batch between hosts.
      spec: ``{key: (dtype, shape)}``; default: from the first datapoint.
      ring: yield views into shared memory, valid only until the next batch;
        default False: every batch is the caller's to keep (the first
        ``LEASED_SLOTS`` batches the caller holds at once are still not
        copied: their slots are reused only once the caller drops them).
      on_error: ``'raise'`` (default) or ``'skip'``: a failing datapoint is
        replaced by another one chosen deterministically and logged. The
        loader raises once at least 4 of the datapoints of this shard's
        batches that start in the current error window (an epoch, or
        ``loadr.budget.ERROR_WINDOW_POSITIONS`` positions if more) failed, and more than
        ``max_error_fraction`` of them: a pure function of the position (the
        state carries the count), so a resumed run raises where the
        uninterrupted one would have.
      timeout: seconds a worker may spend on one batch before it is killed
        and the batch redone (None: no deadline).
      start_method: ``'fork'`` (default where there is one, unless JAX is
        imported: then ``'forkserver'``), ``'forkserver'`` or ``'spawn'`` (safe
        in processes that run threads; they need the ``__main__`` guard).
      order_version: which permutation the shuffle uses (default
        :data:`loadr.order.ORDER_VERSION`; 1 is loadr 0.1's). A state records it.
      remote: an engine that starts agents on other hosts (``loadr.ray.Workers(...)``) or
        here (``loadr.remote.Subprocesses(...)``): they make batches beside the
        ``workers`` (with ``workers=0``, all of them), the same to the byte. See
        README, "More machines".
      stats_every, on_stats: call ``on_stats(loader.stats())`` every
        ``stats_every`` batches (in the iterating thread, just before the
        batch is handed out; what it costs counts as the caller's time). Both
        are plain attributes too, to set or change later. If ``on_stats``
        raises, its exception reaches the caller and the batch is not handed
        out: the step stays before it (so does a state saved now), and the
        iterator's next ``next()`` yields it, calling ``on_stats`` again.
      trace: a path: record a timeline of the loader (:meth:`trace`) from the first
        batch, written there by :meth:`close`. None (default): no trace.

    ``loader.stats()`` says where the time goes (:class:`loadr.stats.Stats`:
    per-stage seconds of every worker, the caller's waiting, rates, a
    verdict). ``workers='auto'`` and ``prefetch='auto'`` start with one worker
    per core the process may use (``os.sched_getaffinity``) and ``2 *
    workers`` batches in flight, measure the stages over the first
    :data:`~loadr.stats.AUTO_BATCHES` batches after the first (or ``AUTO_MAX_S`` s), and
    settle on a setting by the rule of :func:`loadr.stats.settle`: enough
    workers for the caller's pace, capped by the cores (or a few times that
    when the workers mostly wait on I/O); prefetch from how much batch times
    vary, within the shared-memory budget. If that differs, the workers are
    started again with it at the next batch; the stream is the same to the
    byte (it never depends on the worker count). ``loader.settled`` then holds
    ``{'workers', 'prefetch', 'why', 'after_batches', 'after_s'}``.

    Example::

        loader = Loader([{'x': i} for i in range(10)], batch=4, seed=1, workers=0)
        first = next(iter(loader))['x']        # e.g. array([3, 9, 0, 6])
    """

    # Set by loadr.config on a YAML pipeline's loader with remote workers: the agents
    # rebuild its reader and fns with rebuild(*recipe) instead of unpickling the user's.
    recipe: tuple | None = None
    rebuild: Callable[..., Any] | None = None

    def __init__(self, reader, batch: int, fns=(), shuffle: bool = True, seed: int = 0,
                 workers: int | None = None, prefetch: int | None = None, shard_id: int = 0,
                 num_shards: int = 1, spec: dict | None = None, ring: bool = False,
                 on_error: str = 'raise', max_error_fraction: float = 0.01,
                 timeout: float | None = DEFAULT_TASK_TIMEOUT_S, start_method: str | None = None,
                 order_version: int | None = None, stats_every: int | None = None,
                 on_stats=None, trace=None, remote=None):
        # Every numeric setting is checked here, once: finite and in range.
        check_whole('batch', batch, 1, MAX_BATCH)
        auto_workers, auto_prefetch = workers == 'auto', prefetch == 'auto'
        if workers is None:
            workers = min(8, os.cpu_count() or 1)
        elif auto_workers:
            workers = cores()
        check_whole('workers', workers, 0, MAX_WORKERS,
                    " or 'auto'" if isinstance(workers, str) else '')
        if auto_prefetch or prefetch is None:
            prefetch = None
        else:
            check_whole('prefetch', prefetch, 1, MAX_PREFETCH, " or 'auto'")
        if stats_every is not None:
            check_whole('stats_every', stats_every, 1)
        if remote is not None and not all(hasattr(remote, name)
                                          for name in ('open', 'launch', 'stop_all')):
            raise ConfigError(f'remote must be an engine such as loadr.ray.Workers(...) or '
                              f'loadr.remote.Subprocesses(...), got {remote!r}')
        if on_stats is not None and not callable(on_stats):
            raise ConfigError(f'on_stats must be callable, got {on_stats!r}')
        check_whole('num_shards', num_shards, 1, MAX_BATCH)
        if isinstance(shard_id, bool) or not isinstance(shard_id, (int, np.integer)) \
                or not 0 <= shard_id < num_shards:
            raise ConfigError(f'shard_id must be in [0, {num_shards}), got {shard_id!r}')
        max_error_fraction = check_real('max_error_fraction', max_error_fraction, 0, 1)
        if timeout is not None:
            timeout = check_real('timeout', timeout, 0, above=True, none=' (None: no deadline)')
        if on_error not in ('raise', 'skip'):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if start_method is None:
            start_method = default_start_method()
        if start_method not in start_methods():
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
            self.order_version = check_version(
                ORDER_VERSION if order_version is None else order_version)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.reader = reader
        self.batch = int(batch)
        self.fns = list(fns)
        self.shuffle = bool(shuffle)
        self.workers = int(workers)
        # As many batches in flight as the workers may hold tasks (a remote reader's
        # workers hold more where their round trips last longer than a task: see
        # netstats.tasks_ahead; their slots, past the first tasks_held, are made
        # where the shared-memory budget holds them, with no warning).
        self.prefetch = (int(prefetch) if prefetch is not None
                         else max(2, most_tasks_held(reader) * self.workers))
        self._default_prefetch = (self.prefetch, max(2, tasks_held(reader) * self.workers)) \
            if prefetch is None else None
        self.shard_id, self.num_shards = int(shard_id), int(num_shards)
        self._remote, self._prefetch_given = remote, prefetch
        self.ring = bool(ring)
        self.on_error = on_error
        self.max_error_fraction = max_error_fraction
        self.timeout = timeout
        self.start_method = start_method
        self.step = 0
        self._orders: dict = {}
        self._fingerprint_cache: dict | None = None
        self._order_switch_logged = False
        self.n = self._order().n        # positions per epoch (a Mix may differ from len)
        self._spec = _normalize_spec(spec) if spec is not None else None
        self._tuple_batches: bool | None = None
        self._pool: Pool | None = None
        self._window: Window | InlineWindow | None = None
        self._warming = None            # the reader warming before the fork (a thread)
        self._finalizer: weakref.finalize | None = None
        # Called with no argument just before a worker pool is closed (a restart:
        # workers='auto' settling, a load with another order version; close()):
        # what refers to its slots' memory (page-locked registrations) lets go first.
        self._before_pool_close: list = []
        # Called as fn(worker id) once in each worker process before its first task
        # (loadr.torch's worker_init_fn); None: nothing.
        self._worker_init_fn = None
        # What the workers read: the reader, or for a list or tuple a SharedList
        # of it, for a Mix a copy with its lists shared (loadr.shared.share), made
        # when the first workers start.
        self._source = None
        self.errors = 0                 # datapoints replaced under on_error='skip' (all told)
        self.samples = 0                # datapoints made (all told)
        self._budget = ErrorBudget()    # under on_error='skip' (loadr.budget)
        self.closed = False
        self.stats_every, self.on_stats = stats_every, on_stats
        # What stats() reads besides the live pool: the caller's waits, the rows of
        # pools closed before, the inline row (workers=0).
        self._tally = Tally(len(self.fns))
        self._calibration: Calibration | None = None    # workers='auto' / prefetch='auto'
        self.settled: dict | None = None
        if (auto_workers or auto_prefetch) and self.workers > 0 and remote is None:
            self._calibration = Calibration(auto_workers, auto_prefetch)
        self._tracer: Tracer | None = None
        if trace is not None:
            self.trace(trace)

    # -- spec ----------------------------------------------------------------

    @property
    def spec(self) -> dict:
        """``{key: (dtype, shape)}`` of one datapoint after the fns (object dtype: a list key).

        Inferred from the datapoint at stream position 0, or under
        ``on_error='skip'``, if that one fails, from the datapoint that
        replaces it in the first batch.
        """
        if self._spec is None:
            order = self._order()
            asm = Assembler(self.reader, self.fns, None)
            index, seed = order.index_at(0), order.seeds(0, 1)[0]
            try:
                dp = asm.datapoint(index, seed)
            except Exception as exc:
                if self.on_error != 'skip':
                    protocol.raise_failure(protocol.Failure.capture(exc, index, 0, None), exc,
                                   self.reader)
                dp = asm.substitute(index, seed, order)
            self._spec = infer_spec(dp)
        return self._spec

    @property
    def _tuples(self) -> bool:
        """Whether batches are tuples: the spec's keys are 0 .. k-1 (tuple datapoints)."""
        if self._tuple_batches is None:
            keys = list(self.spec)
            self._tuple_batches = bool(keys) and keys == list(range(len(keys)))
        return self._tuple_batches

    def _order(self):
        """The order of the stream (:func:`loadr.order.order_for`), kept per seed and version."""
        key = (self.seed, self.order_version)
        order = self._orders.get(key)
        if order is None:
            self._orders.clear()
            order = self._orders[key] = order_for(self.reader, self.seed, self.shuffle,
                                                  self.order_version)
        return order

    # -- state ---------------------------------------------------------------

    @property
    def global_batch(self) -> int:
        return self.batch * self.num_shards

    def save(self) -> dict:
        """A small JSON state (well under 1 KB): where the stream goes on from, and what
        makes it (see :mod:`loadr.state`); the same on every shard.

        >>> state = Loader([{'x': 1}], batch=1, workers=0).save()
        >>> state['step'], state['version']
        (0, 2)
        """
        state = {'version': state_fields.STATE_VERSION, 'step': self.step, 'seed': self.seed,
                 **self._fingerprint()}
        state['fns'] = list(state['fns'])
        state['dataset'] = dict(state['dataset'])
        skipped = self._budget.as_state()
        if self.on_error == 'skip' and skipped is not None:
            state['skipped'] = skipped
        return state

    def load(self, state: dict, strict: bool = True) -> None:
        """Go on from ``state`` (from ``save()``): the next batch is the one that was due.

        The state must belong to this loader: same dataset, fns, shuffle, seed
        and global batch (the number of shards and workers may differ). A
        state that does not is refused with a :class:`~loadr.errors.StateError`
        that lists what differs; ``strict=False`` goes on from it anyway, with
        the state's step, seed and order, and logs what differs.

        States of loadr 0.1 (version 1) still load. Their stream was made with
        order version 1 (0.1's shuffle), so a version 1 state of a shuffled
        stream switches this loader to order version 1, and says so once in
        the log: the batches go on exactly as they would have in 0.1. A dict
        without a version (``{'step': 640, 'seed': 0}``) is checked for the
        fields it has and keeps this loader's order.

        >>> loader = Loader([{'x': i} for i in range(10)], batch=2, seed=1, workers=0)
        >>> loader.load({'step': 4, 'seed': 1})
        >>> next(iter(loader))['x'].tolist() == order_for(loader.reader, 1).indices(4, 2).tolist()
        True
        """
        self._apply_state(*self._check_state(state, strict))

    def _fingerprint(self) -> dict:
        # Kept: the reader's identity and the fns do not change under a loader,
        # and save() stays a dict copy (a few microseconds) at any step.
        if self._fingerprint_cache is None or self._fingerprint_cache['order'] != \
                self.order_version:
            self._fingerprint_cache = state_fields.fingerprint(
                self.reader, self.fns, self.n, self.shuffle, self.global_batch,
                self.order_version)
        return self._fingerprint_cache

    def _check_state(self, state: dict, strict: bool = True) -> tuple[dict, list]:
        """``(parsed state, what differs)``, or a StateError (:func:`loadr.state.check`)."""
        return state_fields.check(state, {'seed': self.seed, **self._fingerprint()}, self.fns,
                                  self.reader, strict)

    def _apply_state(self, parsed: dict, diffs: list) -> None:
        """Go on from a state :meth:`_check_state` accepted (nothing here can refuse it)."""
        for line in diffs:
            log.warning('loadr: load(strict=False) of a state that differs: %s', line)
        order = parsed.get('order', self.order_version)
        if order != self.order_version and (self.shuffle or self._hooks.make_order is not None):
            if not self._order_switch_logged:
                log.warning('loadr: the state was saved with order version %d (this loader: '
                            '%d); going on with order version %d, as its stream was made',
                            order, self.order_version, order)
                self._order_switch_logged = True
            self._set_order_version(order)
        self.step, self.seed = parsed['step'], parsed['seed']
        self._budget = ErrorBudget(*parsed.get('skipped', (-1, 0, 0)))
        if self._window is not None:
            self._window.reset()        # every iterator goes on from the new step

    def _set_order_version(self, version: int) -> None:
        self.order_version = version
        self._orders.clear()
        # The workers and the inline window build their orders with the
        # version they were made with: make them again, lazily.
        self._close_window()

    # -- iteration -----------------------------------------------------------

    def __iter__(self):
        return _Batches(self, None, False)

    def epoch(self, epoch: int, drop_last: bool = False):
        """The batches of one epoch only (positions ``[epoch*N, (epoch+1)*N)``).

        If the loader's step lies inside that epoch (after ``load()``), it
        starts there. The last batch is smaller (split evenly between the
        shards: see the module docstring) unless ``drop_last``.

        >>> loader = Loader([{'x': i} for i in range(5)], batch=2, workers=0)
        >>> [len(b['x']) for b in loader.epoch(0)]
        [2, 2, 1]
        """
        # Positions stay below 2**63 (loadr.order): past the last whole epoch there,
        # a clear error now, not a ValueError at the first batch.
        check_whole('epoch', epoch, 0, state_fields.MAX_STEP // self.n - 1)
        return _Batches(self, int(epoch), bool(drop_last))

    def _schedule(self, epoch: int | None, drop_last: bool) -> Schedule:
        """What an iteration makes from the loader's step.

        The endless stream goes on from the step. An epoch goes on from the
        step if it lies inside the epoch with a batch still to make there
        (with ``drop_last``, a whole global batch); otherwise the epoch
        starts from its beginning, so running one twice gives it twice.
        """
        step = self.step
        end = None
        if epoch is not None:
            first, end = epoch * self.n, (epoch + 1) * self.n
            if not first <= step < end or (drop_last and end - step < self.global_batch):
                step = first
        return Schedule(step, self.batch, self.seed, self.shard_id, self.num_shards, end,
                        drop_last)

    def _stream(self, epoch, drop_last):
        if self.closed:
            raise LoadrError('this loader is closed')
        self._warming = self._warm_before_fork(epoch, drop_last)    # joined before the fork
        spec = self.spec
        _ = self._tuples                # known before the first batch: _batch_from reads it
        window: Window | InlineWindow | None = None
        gen: int | None = None
        try:
            while True:
                if self.closed:
                    raise LoadrError('this loader is closed')
                asked = time.perf_counter()     # the caller waits from here
                self._tally.asked(asked)
                if window is None or gen is None or not window.live(gen) \
                        or window is not self._window:
                    # The first batch, or another iterator or load() moved the
                    # stream: go on from the loader's step, in a generation of our own.
                    window = self._ensure_window(spec)
                    gen = window.begin(self._schedule(epoch, drop_last))
                try:
                    done = window.next(gen)
                except BatchFailed as f:
                    protocol.raise_failure(f.failure, f.exc, self.reader, self.on_error)
                if done is None:
                    if epoch is not None:
                        # The epoch is over, dropped tail included: the stream
                        # goes on at the next epoch.
                        self.step = max(self.step, (epoch + 1) * self.n)
                    return
                batch = self._batch_from(done.arrays or {}, done.extras)   # (next() set arrays)
                plan, replaced = done.plan, done.replaced
                del done
                mark = (self.step, self._budget, self.samples, self.errors, self._tally.batches)
                try:
                    self._count_errors(plan, replaced)
                    self.step = plan.next_step
                    handed = time.perf_counter()
                    self._handed(handed - asked)
                    if self._tracer is not None:
                        self._traced(asked, handed, mark[0], plan)
                except BaseException:
                    # The batch is not handed out (on_stats or the error budget raised):
                    # it stays due, counted nowhere; the iterator's next next() (or a
                    # new iterator, or a saved state) goes on from it.
                    self.step, self._budget, self.samples, self.errors, \
                        self._tally.batches = mark
                    raise
                yield batch
                # Only the caller may keep a lent batch alive.
                del batch
        finally:
            if window is not None and gen is not None:
                window.end(gen)

    # -- trace ---------------------------------------------------------------

    def trace(self, path, batches: int | None = None, events: int = TRACE_EVENTS) -> None:
        """Record a timeline of this loader into ``path`` (Trace Event JSON: open it in
        ui.perfetto.dev, Open trace file, or chrome://tracing).

        From the next batch asked for: each worker's tasks (a track per worker process,
        a span per task with its stages inside: read, each fn by name, write), the
        caller's waits for batches and each batch handed out (with its step), the
        window's depth, and a remote reader's bytes read ahead and requests in flight.
        With ``batches=N`` the file is written once N batches have been handed out and
        tracing stops; with None (default) it is written by :meth:`close`. Only the
        last ``events`` events of each process
        are kept. Workers already running without a trace are started again at the next
        batch (the stream is the same): call it before iterating to avoid that. Batches
        are the same with tracing on or off. A trace begun earlier is written first.

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), 'run.trace.json')
        >>> loader = Loader([{'x': i} for i in range(8)], batch=4, workers=0)
        >>> loader.trace(path, batches=1)
        >>> _ = next(iter(loader)); os.path.exists(path)
        True
        """
        if self.closed:
            raise LoadrError('this loader is closed')
        if batches is not None:
            check_whole('batches', batches, 1)
        if self._tracer is not None:
            self._tracer.write()
        tracer = self._tracer = Tracer(path, fn_names(fuse(self.fns)), batches,
                                       check_whole('events', events, 1))
        if self._pool is not None and getattr(self._pool, 'trace_rings', None) is None:
            self._close_window()        # its workers have no ring: they start again
        elif self._pool is not None:
            tracer.attach(self._pool)
        elif isinstance(self._window, InlineWindow):    # (no pool: the window is inline)
            self._window.asm.clock.trace = tracer.inline_ring()

    def _traced(self, asked: float, handed: float, step: int, plan) -> None:
        """A batch went out while tracing: record it; write the file after the last one."""
        tracer, window = self._tracer, self._window
        if tracer is None:
            return
        if self._pool is None and tracer.inline is not None:
            tracer.inline.label_last(self._tally.batches - 1, plan.start, plan.count)
        # (A pool drives a Window; without one the window is inline.)
        tracer.handed(asked, handed, step, self.step, plan.count,
                      *((len(window.tasks), len(window.finished)) if isinstance(window, Window)
                        else (None, None)))
        if tracer.done:
            self._tracer = None
            if isinstance(window, InlineWindow):
                window.asm.clock.trace = None
            tracer.write()

    # -- stats ---------------------------------------------------------------

    def stats(self) -> Stats:
        """Where the time went so far (a :class:`loadr.stats.Stats` snapshot; cheap).

        Totals since the first batch was asked for: each worker's seconds per
        stage (read, each fn by name, write into shared memory, other, waiting
        for work) and its private memory (``'uss_bytes'``, its USS, read at most a
        second ago: a worker that grows shows), the caller's time waiting for
        batches, batches, samples; ``.as_dict()`` for a JSON line, ``.verdict()``
        for one line of advice, :func:`loadr.stats.format_table` for a table.

        >>> loader = Loader([{'x': i} for i in range(8)], batch=4, workers=0)
        >>> _ = next(iter(loader)); loader.stats().batches
        1
        """
        pool = self._pool if self._pool is not None and not self._pool.closed else None
        stats = self._tally.stats(pool.stats_rows() if pool is not None else None,
                                  fn_names(fuse(self.fns)), self.samples,
                                  inline=self.workers == 0 and self._remote is None)
        if pool is not None:
            # Each live worker's private memory (USS), at most a second old: growth shows.
            for wid, uss in pool.private_memory().items():
                if wid < len(stats.workers):
                    stats.workers[wid]['uss_bytes'] = uss
            if self._remote is not None:
                stats.agents = cast('HybridPool', pool).agent_rows()   # (remote: a HybridPool)
        return stats

    def _handed(self, waited: float) -> None:
        """A batch goes to the caller, who waited ``waited`` for it: count, call back, size."""
        self._tally.handed(waited)
        if self._calibration is not None:
            self._calibrate()
        if self.on_stats is not None and self.stats_every \
                and self._tally.batches % self.stats_every == 0:
            self.on_stats(self.stats())

    def _calibrate(self) -> None:
        """workers='auto' / prefetch='auto': measure, then settle (see the class docstring)."""
        calibration = self._calibration
        if calibration is None:
            return
        seen = calibration.measured(self.stats(), self.worker_pids)
        if seen is None:
            return
        self._calibration = None
        max_prefetch = None
        if self._pool is not None:
            from .workers.shm import StatusCells, shm_budget, use_memfd
            budget = shm_budget(None, use_memfd())[0] - StatusCells.nbytes(self.workers)
            max_prefetch = max(1, budget // max(1, self._pool.layout.nbytes) - self._held_slots)
        workers, prefetch, why = calibration.settle(seen, self.batch, self.workers,
                                                    self.prefetch, max_prefetch)
        self.settled = {'workers': workers, 'prefetch': prefetch, 'why': why,
                        'after_batches': self._tally.batches,
                        'after_s': time.perf_counter() - (self._tally.t_start or 0.0)}
        log.info('loadr: settled on workers=%d prefetch=%d after %d batches: %s',
                 workers, prefetch, self._tally.batches, why)
        if (workers, prefetch) != (self.workers, self.prefetch):
            # The next batch starts the new pool from self.step: the same stream.
            self._close_window()
            self.workers, self.prefetch = workers, prefetch

    def _batch_from(self, arrays: dict, extras: dict) -> dict | tuple:
        spec = self._spec
        if spec is None:        # (never: _stream reads self.spec before the first batch)
            raise LoadrError('no spec to make a batch with')
        batch = {key: arrays[key] if key in arrays else extras[key] for key in spec}
        return tuple(batch.values()) if self._tuple_batches else batch

    def _count_errors(self, plan, replaced: list) -> None:
        """Count a batch's replaced datapoints; raise if the error budget is spent
        (:mod:`loadr.budget`)."""
        self.samples += plan.count
        if self.on_error != 'skip':
            return
        self.errors += len(replaced)
        log_replaced(self.reader, replaced)
        self._budget = self._budget.counted(plan.start, plan.count, replaced, self.n,
                                            self.max_error_fraction, self.reader)

    # -- the window ----------------------------------------------------------

    def _warm_before_fork(self, epoch, drop_last):
        """Before the first fork of a reader that warms (a remote dataset's index tables),
        warm it here, on a thread beside the spec probe: forked workers inherit what it
        read and start their tasks at once, instead of each spending round trips on the
        same reads after the probe. It reads the records of the first batches too (one
        per worker, and the first): each worker finds its first in memory. A thread
        (to join), or None where workers do not fork or nothing warms. Warming is a
        hint: what fails is left to the reads to report.
        """
        if self._window is not None or self.workers == 0 or self.start_method != 'fork':
            return None
        if self._warming is not None and self._warming.is_alive():
            return self._warming    # a first try's (its probe failed): joined before the fork
        warm = hooks_of(self.reader).warm
        if warm is None:
            return None
        return warm_before_fork(warm, first_indices(self._schedule(epoch, drop_last),
                                                    self._order(), self.workers))

    @property
    def _held_slots(self) -> int:
        """Slots the caller may hold besides the prefetch: its view (ring), or lent batches."""
        return 1 if self.ring else LEASED_SLOTS

    def _ensure_window(self, spec: dict) -> Window | InlineWindow:
        """The window that makes the batches, made at the first one (and after a restart):
        in this process (``workers=0``), or over this host's worker processes, with
        agents on other hosts beside them (``remote``)."""
        if self._window is not None:
            return self._window
        fields = {k: (d, s) for k, (d, s) in spec.items() if d != OBJECT}
        if self.workers == 0 and self._remote is None:
            asm = Assembler(self.reader, self.fns, spec, self.on_error)
            asm.clock = StageClock(self._tally.inline(), len(self.fns), inline=True)
            if self._tracer is not None:
                asm.clock.trace = self._tracer.inline_ring()
            self._window = InlineWindow(asm, fields, functools.partial(
                order_for, self.reader, shuffle=self.shuffle, version=self.order_version))
            return self._window
        if self._remote is None:
            pool, processes = self._local_pool(spec, fields), self.workers
        else:
            pool, processes = self._remote_pool(spec, fields)
        self._pool = pool
        self._finalizer = weakref.finalize(self, pool.close)
        if self._tracer is not None:
            self._tracer.attach(pool)
        list_keys = [k for k, (d, _) in spec.items() if d == OBJECT]
        self._window = Window(pool, self.prefetch, processes, list_keys, self.ring)
        return self._window

    def _local_pool(self, spec: dict, fields: dict):
        """This host's worker processes, forked once a reader warming for them is warm."""
        from .workers.pool import WorkerPool
        from .workers.shm import Layout
        warming, self._warming = self._warming, None
        if self._source is None:
            from .shared import share
            self._source = share(self.reader)
        slots = needed = self.prefetch + self._held_slots
        if self._default_prefetch is not None and self._default_prefetch[0] == self.prefetch:
            needed = self._default_prefetch[1] + self._held_slots
        try:
            return WorkerPool(
                self._source, self.fns, spec, Layout(fields, self.batch), self.workers, slots,
                self.n, self.shuffle, self.on_error, self.start_method, self.timeout,
                self.order_version, init_fn=self._worker_init_fn, needed_slots=needed,
                # No fork while the warm-up's reads are under way; it goes on while the
                # pool makes its shared memory.
                before_fork=None if warming is None else warming.join,
                trace_records=WORKER_RECORDS if self._tracer is not None else 0)
        except BaseException:
            self._warming = warming         # a next try joins it (if it still runs)
            raise
        finally:
            if warming is not None:
                # Forked (or failed to): what the warm-up kept for the workers goes here.
                forked = hooks_of(self.reader).forked
                if forked is not None:
                    forked()

    def _remote_pool(self, spec: dict, fields: dict):
        """``(pool, processes)``: agents that the engine ``remote`` starts on other hosts
        (:class:`~loadr.workers.remote.RemotePool`) beside this host's workers (a
        :class:`~loadr.workers.pool.WorkerPool` of ``workers`` processes, 0 too, which
        owns the slots the agents write their rows into), under one
        :class:`~loadr.workers.remote.HybridPool`. Nothing of the placement reaches the
        saved state."""
        from .workers.agent import AgentConfig
        from .workers.pool import WorkerPool
        from .workers.remote import with_agents
        from .workers.shm import Layout

        engine = self._remote
        engine.open()
        processes = self.workers + engine.agents * engine.cpus
        if self._prefetch_given is None:
            self.prefetch = max(2, 2 * processes)
        warming, self._warming = self._warming, None
        if warming is not None:         # a reader warming before a fork: done first
            warming.join()
        if self._source is None:
            from .shared import share
            self._source = share(self.reader)
        # Traced: every worker, local or an agent's, keeps a ring of task records.
        traced = WORKER_RECORDS if self._tracer is not None else 0
        local = WorkerPool(self._source, self.fns, spec, Layout(fields, self.batch), self.workers,
                           self.prefetch + self._held_slots, self.n, self.shuffle,
                           self.on_error, self.start_method, self.timeout, self.order_version,
                           init_fn=self._worker_init_fn, trace_records=traced)
        try:
            # A YAML pipeline's loader has a recipe: the agents rebuild it (loadr.config).
            # Every agent digests the first and the last datapoint of the first epoch at
            # start; they must be these.
            recipe = self.recipe
            config = AgentConfig(
                spec=spec, fields=fields, batch=self.batch, n=self.n, shuffle=self.shuffle,
                on_error=self.on_error, order_version=self.order_version,
                processes=engine.cpus, server_secret=b'', allowed=[],
                reader=None if recipe else self.reader, fns=[] if recipe else list(self.fns),
                recipe=recipe, rebuild=self.rebuild, seed=self.seed,
                canaries=sorted({0, self.n - 1}), timeout=self.timeout, trace_records=traced)
            pool = with_agents(local, engine, config, Assembler(self.reader, self.fns, spec),
                               self._order())
        except BaseException:
            local.close()
            raise
        return pool, processes

    # -- lifecycle -----------------------------------------------------------

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the live worker processes (empty before the first batch)."""
        return [] if self._pool is None else self._pool.pids

    def _close_window(self) -> None:
        pool = self._pool
        if self._tracer is not None:
            self._tracer.drain()        # the workers' last records, while they are mapped
            self._tracer.detach()
        if self._window is not None:
            self._window.reset()
        if pool is not None:
            for hook in self._before_pool_close:
                hook()
        if self._finalizer is not None:
            self._finalizer()
        self._pool = self._window = self._finalizer = None
        if pool is not None:
            self._tally.keep(pool.stats_rows())     # its workers' counters outlive it

    def close(self) -> None:
        """Stop the workers and free the shared memory; safe to call twice.

        Every iterator of a closed loader raises LoadrError('this loader is closed').
        """
        self.closed = True
        self._tally.end()
        self._close_window()
        if self._tracer is not None:
            tracer, self._tracer = self._tracer, None
            tracer.write()
        if self._source is not None:
            from .shared import release
            release(self._source, self.reader)
            self._source = None
        if self._hooks.cache_flush is not None:
            self._hooks.cache_flush()   # inline reads' last ranges (workers flush their own)

    @functools.cached_property
    def _hooks(self):
        """The reader's optional hooks (loadr.sources), looked up once."""
        return hooks_of(self.reader)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self):
        raise TypeError('a Loader is an endless stream of batches and has no len(): '
                        'loader.batches_per_epoch() gives the batches of one epoch, and '
                        'loader.epoch(e) iterates epoch e alone')

    def __bool__(self) -> bool:
        return True     # not len(): a loader is never "empty"

    def batches_per_epoch(self, drop_last: bool = False) -> int:
        """The batches ``epoch(e, drop_last)`` yields from the start of an epoch, on every shard.

        >>> Loader([{'x': i} for i in range(41)], batch=3, num_shards=4,
        ...        workers=0).batches_per_epoch()
        4
        """
        if drop_last:
            return self.n // self.global_batch
        return -(-self.n // self.global_batch)

    def __repr__(self) -> str:
        return (f'Loader(n={self.n}, batch={self.batch}, shuffle={self.shuffle}, '
                f'seed={self.seed}, workers={self.workers}, '
                f'shard={self.shard_id}/{self.num_shards}, step={self.step})')


class _Batches:
    """A Loader's iterator (``iter(loader)``, ``loader.epoch(e)``): its batches in order.

    An exception from ``next()`` (a worker's error, ``on_stats``, Ctrl-C) leaves
    the batch that was due due: the loader's step has not moved past it, and
    the next ``next()`` goes on from the step, so that batch comes next. A
    generator that raised would be over, and its batch lost to the caller.
    """

    __slots__ = ('_loader', '_epoch', '_drop_last', '_gen', '_over')

    def __init__(self, loader: Loader, epoch: int | None, drop_last: bool):
        self._loader, self._epoch, self._drop_last = loader, epoch, drop_last
        self._gen, self._over = None, False

    def __iter__(self):
        return self

    def __next__(self):
        gen = self._gen
        if gen is None:
            if self._over:
                raise StopIteration
            gen = self._gen = self._loader._stream(self._epoch, self._drop_last)
        try:
            return next(gen)
        except StopIteration:
            self._gen, self._over = None, True
            raise
        except BaseException:
            self._gen = None            # that generator is over; the next next() resumes
            raise

    def close(self) -> None:
        """End the iteration now: its batches in flight are given back."""
        self._over = True
        if self._gen is not None:
            gen, self._gen = self._gen, None
            gen.close()
