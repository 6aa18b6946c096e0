"""The :class:`DataLoader`: a :class:`loadr.Loader` in torch's shape (epochs, ranks, zero
copy, resume), as :mod:`loadr.torch`'s docstring tells; its arguments are checked in
:mod:`loadr.torch._args`, its batches made tensors in :mod:`loadr.torch._tensors`."""

from __future__ import annotations

import atexit
import warnings
import weakref

import multiprocess.util  # noqa: F401 - registers its exit hook before ours (see _close_live)
import numpy as np
import torch

from ..errors import ConfigError, LoadrError, StateError
from ..loader import MAX_PREFETCH, Loader
from ._args import OWN_ARGS, check_device, check_sizes, loader_args, rank_and_world_size, seed_of
from ._tensors import (
    CUDA_HOST_REGISTER_DEFAULT,
    SlotPinner,
    as_tensor,
    batch_values,
    to_device,
    to_torch,
)

__all__ = ['DataLoader', 'STATE_VERSION', 'WAIT_RANGE']

STATE_VERSION = 1
# The name of the training loop's waits for a batch in the PyTorch profiler's trace.
WAIT_RANGE = 'loadr: wait for batch'


def _release(pinner, loader) -> None:
    # Unregister before the loader unmaps the slots: memory freed while still
    # registered stays locked, and the next registration at that address fails.
    if pinner is not None:
        pinner.release()
    loader.close()


_live: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    # Exit hooks run last registered first. multiprocess's hook terminates its
    # daemon processes with SIGTERM and then waits for them without a limit; a
    # worker that inherited a SIGTERM handler from the main process (Lightning's
    # Trainer installs one) lives on, and the exit waits forever. This hook runs
    # first: every DataLoader still open is closed (STOP, then SIGKILL).
    for dl in list(_live):
        dl.close()


class _Epoch:
    """What ``iter(dl)`` returns: one epoch, claimed at its first ``next()``.

    A state loaded while it runs moves it: it goes on from the loaded state
    (as a :class:`loadr.Loader` does), so ``load_state_dict(state_dict())`` in
    the middle of an epoch changes nothing.
    """

    def __init__(self, dl: DataLoader, token: int):
        self.dl, self.token = dl, token
        self._gen = None
        self._loads: int | None = None      # dl._loads when the generator was made
        self._over = False
        self._cut = False                   # an exception ended the generator

    def __iter__(self):
        return self

    def __next__(self):
        if self._gen is None or self._loads != self.dl._loads or self._cut:
            if self._over:
                raise StopIteration
            if self._gen is not None:
                self._gen.close()
            cut, self._cut = self._cut and self._loads == self.dl._loads, False
            self._loads = self.dl._loads
            self._gen = self.dl._rerun(self) if cut else self.dl._claim(self)
            if self._gen is None:           # a newer iter() started first
                self._over = True
                raise StopIteration
        try:
            # A range of its own in the PyTorch profiler's trace: data stalls show beside
            # the model's kernels (next to nothing when no profiler runs).
            with torch.profiler.record_function(WAIT_RANGE):
                return next(self._gen)
        except StopIteration:
            raise
        except BaseException:
            # A worker's error, on_stats, Ctrl-C: the batch that was due stays due,
            # and the next next() yields it (a generator that raised is over).
            self._cut = True
            raise

    def close(self) -> None:
        self._over = True
        if self._gen is not None:
            self._gen.close()


class DataLoader:
    """Epochs of torch tensors from a loadr Loader; see the module docstring.

    Args:
      reader: a loadr reader, or anything with ``len()`` and ``[i] -> dict``.
      batch_size: datapoints per batch *per rank* (as in torch).
      fns, shuffle, seed: as for :class:`loadr.Loader`.
      num_workers: worker processes (0: in this process); None: loadr's default.
      drop_last: drop the last, short global batch of each epoch.
      pin_memory: page-lock the shared-memory slots once (CUDA only; a
        warning and the plain CPU path without CUDA).
      device: e.g. ``'cuda'``: batches arrive on the device; the copy of batch
        k+1 runs on a side stream while the step runs on batch k (it pins the
        slots too). ``'cuda'`` without CUDA is an error.
      rank, world_size: default: the initialised ``torch.distributed`` group,
        else ``RANK``/``WORLD_SIZE`` (torchrun), else 0 and 1.
      persistent_workers: False: the workers stop at the end of each epoch
        and start again for the next (torch's meaning); default: they live
        as long as the DataLoader.
      prefetch_factor: batches in flight per worker (``prefetch`` =
        ``prefetch_factor * num_workers``).
      multiprocessing_context: ``'fork'``, ``'spawn'``, ``'forkserver'`` or
        a context with that start method (the Loader's ``start_method``).
      generator: a ``torch.Generator``: its ``initial_seed()`` is the seed.
      worker_init_fn: called as ``worker_init_fn(worker_id)`` once in each
        worker process before its first batch (never with ``num_workers=0``).
      timeout: the Loader's (seconds a worker may spend on one batch); 0
        means none, as in torch.
      **loader_kwargs: any other :class:`loadr.Loader` argument (``prefetch``,
        ``on_error``, ``spec``, ``start_method``, ...). torch's
        ``collate_fn``, ``sampler``, ``batch_sampler`` and
        ``pin_memory_device`` have no meaning here: a TypeError says the
        loadr way.

    Example:

    >>> dl = DataLoader([{'x': i} for i in range(10)], batch_size=4, num_workers=0)
    >>> len(dl), [len(b['x']) for b in dl]
    (3, [4, 4, 2])
    >>> state = dl.state_dict()              # after the loop: the next epoch is due
    >>> dl.close()
    """

    # The test hook: (register, unregister, copy) in place of CUDA's (see SlotPinner),
    # for a build without CUDA to count what pin_memory=True does.
    _pin_functions: tuple | None = None

    def __init__(self, reader, batch_size: int, fns=(), shuffle: bool = True,
                 seed: int | None = None, num_workers: int | None = None,
                 drop_last: bool = False, pin_memory: bool = False, device=None,
                 rank: int | None = None, world_size: int | None = None, *,
                 persistent_workers: bool | None = None, prefetch_factor: int | None = None,
                 multiprocessing_context=None, generator=None, worker_init_fn=None,
                 **loader_kwargs):
        for name, ours in OWN_ARGS.items():
            if name in loader_kwargs:
                raise ConfigError(f'DataLoader sets {name!r} itself: pass {ours}= instead')
        check_sizes(batch_size, num_workers)
        loader_kwargs = loader_args(loader_kwargs)
        seed = seed_of(seed, generator)
        if multiprocessing_context is not None:
            if 'start_method' in loader_kwargs:
                raise ConfigError('pass multiprocessing_context= or start_method=, not both')
            method = multiprocessing_context
            if not isinstance(method, str):
                method = getattr(method, 'get_start_method', lambda: method)()
            loader_kwargs['start_method'] = method
        if prefetch_factor is not None:
            if 'prefetch' in loader_kwargs:
                raise ConfigError('pass prefetch_factor= or prefetch=, not both')
            if num_workers == 'auto':
                raise ConfigError("prefetch_factor needs a number of workers; with "
                                  "num_workers='auto' pass prefetch='auto' (or nothing)")
        if persistent_workers is not None and not isinstance(persistent_workers, bool):
            raise ConfigError(f'persistent_workers must be True or False, got '
                              f'{persistent_workers!r}')
        self.persistent_workers = persistent_workers is not False
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise ConfigError(f'worker_init_fn must be callable, got {worker_init_fn!r}')
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        self.device = check_device(device)
        cuda = self.device is not None and self.device.type == 'cuda'
        self.pin_memory = bool(pin_memory) or cuda
        if pin_memory and not torch.cuda.is_available() and self._pin_functions is None:
            warnings.warn('loadr: pin_memory=True but CUDA is not available: batches stay in '
                          'pageable shared memory', RuntimeWarning, stacklevel=2)
            self.pin_memory = False
        self.drop_last = bool(drop_last)
        self.batch_size = batch_size
        self.dataset = reader
        self.loader = Loader(reader, batch=batch_size, fns=fns, shuffle=shuffle, seed=seed,
                             workers=num_workers, shard_id=self.rank,
                             num_shards=self.world_size, **loader_kwargs)
        self.num_workers = self.loader.workers
        if prefetch_factor is not None:
            if isinstance(prefetch_factor, bool) or not isinstance(
                    prefetch_factor, (int, np.integer)) or not 1 <= prefetch_factor \
                    <= MAX_PREFETCH // max(1, self.num_workers):
                self.loader.close()
                raise ConfigError(f'prefetch_factor must be an int in [1, '
                                  f'{MAX_PREFETCH // max(1, self.num_workers)}], got '
                                  f'{prefetch_factor!r}')
            if self.num_workers:            # no workers: nothing is fetched ahead
                self.loader.prefetch = int(prefetch_factor) * self.num_workers
        self.loader._worker_init_fn = worker_init_fn
        self._pinner = None
        if self.pin_memory and self._pin_functions is not None:
            self._pinner = SlotPinner(*self._pin_functions)
        elif self.pin_memory:
            cudart = torch.cuda.cudart()

            def unregister(address):
                # A copy still running from the slot (the side stream's) must end first.
                torch.cuda.synchronize()
                return cudart.cudaHostUnregister(address)

            self._pinner = SlotPinner(
                lambda address, nbytes: cudart.cudaHostRegister(address, nbytes,
                                                                CUDA_HOST_REGISTER_DEFAULT),
                unregister)
        if self._pinner is not None:
            # Every registration is undone before a pool's slots can be unmapped.
            self.loader._before_pool_close.append(self._pinner.release)
        # Holds the loader, so the slots are unregistered before it can unmap them.
        self._finalizer = weakref.finalize(self, _release, self._pinner, self.loader)
        _live.add(self)
        # Where the stream is: the epoch of the current iteration, the loader
        # step after the last batch handed out, and whether the next iter()
        # goes on from there (a fresh loader, load_state_dict, a finished
        # epoch) or starts the next epoch (torch's rule for a new iter()).
        self._epoch, self._step, self._resume = 0, 0, True
        self._current: _Epoch | None = None   # the _Epoch being iterated
        self._latest = 0                  # the newest iter(): only it may start
        self._fetched = 0                 # batches taken from the Loader in this epoch
        self._unstarted = False           # it has not yielded yet
        self._loads = 0                   # load_state_dict() calls
        self.closed = False


    # -- epochs ------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        per_epoch = getattr(self.loader, 'batches_per_epoch', None)
        if per_epoch is not None:
            return per_epoch(self.drop_last)
        # Until the core Loader has batches_per_epoch: the same rule.
        n, gb = self.loader.n, self.loader.global_batch
        return n // gb if self.drop_last else -(-n // gb)

    def _done(self, epoch: int, step: int) -> int:
        """Batches of ``epoch`` handed out when the loader is at ``step``."""
        return max(0, -(-(step - epoch * self.loader.n) // self.loader.global_batch))

    def __iter__(self):
        """One epoch: the rest of the current one after a load (or at the start),
        else the next. It is claimed at its first ``next()``, so an iterator never
        advanced costs no epoch (Lightning calls ``iter()`` once just to check)."""
        if self.closed:
            raise LoadrError('this DataLoader is closed')
        self._latest += 1
        self._unstarted = True
        return _Epoch(self, self._latest)

    def _next_start(self) -> tuple[int, int]:
        if self._resume:
            return self._epoch, self._step
        return self._epoch + 1, (self._epoch + 1) * self.loader.n

    def _claim(self, it: _Epoch):
        """The generator of ``it``'s epoch; None if a newer iter() or a load came first."""
        if it.token != self._latest or self.closed:
            return None
        if self._current is not it:
            self._stop_current()
        self._epoch, self._step = self._next_start()
        # From here a new iter() starts the next epoch (torch's rule), until
        # this epoch runs to its end or a state is loaded.
        self._resume, self._unstarted, self._current = False, False, it
        return self._run(self._epoch, self._step)

    def _rerun(self, it: _Epoch):
        """The rest of ``it``'s epoch after an exception cut it short, from the batch after
        the last one handed out; None if a newer iter() came first."""
        if it is not self._current or self.closed:
            return None
        # The loader may have made a batch it never handed out (the one copied
        # ahead to the device): it goes on from ours.
        self.loader.step = self._step
        return self._run(self._epoch, self._step)

    def _stop_current(self) -> None:
        # Closing the abandoned epoch gives its prefetched slots back now.
        if self._current is not None:
            current, self._current = self._current, None
            current.close()

    def _run(self, epoch: int, step: int):
        due = len(self) - self._done(epoch, step)
        if due > 0:
            host = self.loader.epoch(epoch, self.drop_last)
            self._fetched = 0
            try:
                if self.device is not None and self.device.type == 'cuda':
                    yield from self._overlapped(host)
                else:
                    yield from self._on_host(host)
            finally:
                host.close()
            # Every rank yields len(dl) batches, or a DDP all-reduce would wait
            # forever on a rank that has finished: a shard of the core Loader
            # left without rows at the end of an epoch gets empty batches.
            for _ in range(due - self._fetched):
                # Only the last, partial global batch can leave a shard empty.
                self._step = (epoch + 1) * self.loader.n
                yield self._empty_batch()
        # The epoch ran to its end: the next iter() starts the next epoch
        # fresh, and so does a state taken now.
        self._epoch, self._step, self._resume = epoch + 1, (epoch + 1) * self.loader.n, True
        if not self.persistent_workers:
            # torch's persistent_workers=False: the next epoch starts them again.
            self.loader._close_window()

    def _empty_batch(self) -> dict:
        """A batch of zero rows with the keys, dtypes and shapes of every other batch."""
        out = {}
        for key, (dtype, shape) in self.loader.spec.items():
            dtype = np.dtype(dtype)
            out[key] = [] if dtype.kind == 'O' else as_tensor(np.empty((0, *shape), dtype))
        return out if self.device is None else to_device(out, self.device)

    def _host_batch(self, host):
        batch = next(host, None)
        if batch is None:
            return None, None, None
        self._fetched += 1
        out = to_torch(batch)
        if self._pinner is not None:
            self._pinner.follow(self.loader._pool)
            out = self._pinner.pin(batch, out)
        return batch, out, self.loader.step

    def _on_host(self, host):
        while True:
            batch, out, step = self._host_batch(host)
            if out is None:
                return
            del batch                   # only the caller keeps the lent slot
            if self.device is not None:
                out = to_device(out, self.device)
            self._step = step
            yield out
            out = None

    def _overlapped(self, host):
        """Batch k on the device while batch k+1 is copied on a side stream."""
        side = torch.cuda.Stream(self.device)
        try:
            yield from self._overlap_loop(host, side)
        finally:
            # A copy still running reads a slot the loader may reuse once we let go.
            side.synchronize()

    def _overlap_loop(self, host, side):
        pending = None                  # (host batch, device batch, copy done, step)
        while True:
            batch, out, step = self._host_batch(host)
            nxt = None
            if out is not None:
                with torch.cuda.stream(side):
                    moved = to_device(out, self.device)
                    done = torch.cuda.Event()
                    done.record(side)
                nxt = (batch, moved, done, step)
                del batch, out, moved
            if pending is not None:
                _, ready, done_k, step_k = pending
                current = torch.cuda.current_stream(self.device)
                current.wait_event(done_k)
                for t in batch_values(ready):
                    if isinstance(t, torch.Tensor):
                        t.record_stream(current)     # the caching allocator must know
                self._step = step_k
                yield ready
                ready = None
                # The host slot goes back only once its copy has run.
                done_k.synchronize()
            pending = nxt
            if pending is None:
                return

    # -- state -------------------------------------------------------------

    def state_dict(self) -> dict:
        """A small JSON-able dict: where the next ``iter(dl)`` goes on from.

        Inside an epoch: the batch after the last one handed out. The same on
        every rank; load it on any number of ranks with the same global batch.
        """
        # After iter() and before its first batch: the start of that epoch.
        epoch, step = self._next_start() if self._unstarted else (self._epoch, self._step)
        loader = self.loader.save()
        loader['step'] = step
        return {'version': STATE_VERSION, 'epoch': epoch, 'loader': loader}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Go on from ``state``: the next batch is the one that was due.

        It comes from the iteration in progress, if there is one, else from
        the next ``iter(dl)`` (which then continues the state's epoch).

        ``{}`` changes nothing (as in torchdata). ``strict=False`` is passed
        to :meth:`loadr.Loader.load`.
        """
        if isinstance(state, dict) and not state:
            return
        epoch, checked = self._check_state(state, strict)
        # Only now, with every field checked, does anything move.
        self._loads += 1                  # the iterator in progress goes on from here
        self._unstarted = False
        self.loader._apply_state(*checked)
        self._epoch, self._step, self._resume = epoch, self.loader.step, True

    def _check_state(self, state, strict: bool) -> tuple[int, tuple]:
        """``(epoch, the loader's checked state)``, or a StateError naming the field;
        changes nothing."""
        if not isinstance(state, dict) or not isinstance(state.get('loader'), dict):
            raise StateError(f"a DataLoader state is a dict with 'version', 'epoch' and "
                             f"'loader' (from DataLoader.state_dict()), got {state!r}"[:300])
        version = state.get('version', STATE_VERSION)
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) \
                or version < 1:
            raise StateError(f'DataLoader state version must be an int >= 1, got {version!r}')
        if version > STATE_VERSION:
            raise StateError(f'DataLoader state version {version} is newer than this loadr '
                             f'understands ({STATE_VERSION}); upgrade loadr')
        epoch = state.get('epoch')
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise StateError(f'DataLoader state epoch must be an int >= 0, got {epoch!r}')
        epoch = int(epoch)
        checked = self.loader._check_state(state['loader'], strict)
        step, n = checked[0]['step'], self.loader.n
        # The step of epoch e lies in [e*N, (e+1)*N] (at (e+1)*N: the epoch's batches
        # are all out). Anything else contradicts the epoch; a huge epoch is one.
        if not epoch * n <= step <= (epoch + 1) * n:
            where = 'past the end of' if step > (epoch + 1) * n else 'before the start of'
            raise StateError(f"DataLoader state epoch {epoch} contradicts its step: the "
                             f"loader's step {step} lies {where} epoch {epoch} (positions "
                             f'[{epoch * n}, {(epoch + 1) * n}]; the dataset has {n} '
                             f'datapoints)')
        return epoch, checked

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Stop the workers and free (and unpin) the shared memory; safe to call twice."""
        self.closed = True
        self._stop_current()
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f'DataLoader(batch_size={self.batch_size}, num_workers={self.num_workers}, '
                f'rank={self.rank}/{self.world_size}, drop_last={self.drop_last}, '
                f'epoch={self._epoch}, step={self._step})')
