"""What a Loader counts as batches go to the caller, and workers='auto' /
prefetch='auto' calibrating and settling (the rule is :func:`loadr.stats.settle`)."""

from __future__ import annotations

import logging
import time

import numpy as np

from .stats import process_times, row_width, settle
from .workers.window import LEASED_SLOTS

log = logging.getLogger('loadr')

# workers='auto' / prefetch='auto': the calibration measures this many batches
# after the first (start-up left out), or fewer if they take AUTO_MAX_S.
AUTO_BATCHES = 16
AUTO_MAX_S = 3.0


class LoaderStats:
    """The accounting half of :class:`loadr.Loader` (a mixin: it reads the loader's
    counters; ``stats()`` is the Loader's)."""

    def _handed(self, waited: float) -> None:
        """A batch goes to the caller, who waited ``waited`` for it: count, call back, size."""
        self._main_wait += waited
        self._batches_out += 1
        if self._batches_out == 1:
            self._first_batch_s = waited
        if self._auto is not None:
            self._calibrate()
        if self.on_stats is not None and self.stats_every \
                and self._batches_out % self.stats_every == 0:
            self.on_stats(self.stats())

    def _worker_rows(self) -> np.ndarray:
        parts = [r for r in (self._stats_base, self._inline_row) if r is not None]
        if self._pool is not None and not self._pool.closed:
            parts.append(self._pool.stats_rows())
        rows = np.zeros((max([len(p) for p in parts], default=0), row_width(len(self.fns))))
        for part in parts:
            rows[:len(part)] += part
        return rows

    def _calibrate(self) -> None:
        """workers='auto' / prefetch='auto': measure, then settle (see the class docstring)."""
        now = self.stats()
        pids = self._pool.pids if self._pool is not None else []
        if self._auto_from is None:
            self._auto_from = now           # from the first batch on: start-up left out
            # The workers' CPU time over the whole calibration, read at its start and
            # end: their own reads come every SCHED_EVERY_S at most, none at all in a
            # short calibration (whose CPU-bound workers then looked blocked on I/O).
            self._auto_cpu = process_times(pids)
            return
        seen = now.since(self._auto_from)
        if seen.batches < AUTO_BATCHES and not (seen.batches >= 2
                                                and seen.elapsed_s >= AUTO_MAX_S):
            return
        seen = seen.with_process_times(self._auto_cpu, process_times(pids), pids)
        auto_workers, auto_prefetch = self._auto
        self._auto = None
        max_prefetch = None
        if self._pool is not None:
            from .workers.shm import StatusCells, shm_budget, use_memfd
            budget = shm_budget(None, use_memfd())[0] - StatusCells.nbytes(self.workers)
            held = 1 if self.ring else LEASED_SLOTS
            max_prefetch = max(1, budget // max(1, self._pool.layout.nbytes) - held)
        workers, prefetch, why = settle(seen, self.batch,
                                        None if auto_workers else self.workers,
                                        None if auto_prefetch else self.prefetch, max_prefetch)
        self.settled = {'workers': workers, 'prefetch': prefetch, 'why': why,
                        'after_batches': self._batches_out,
                        'after_s': time.perf_counter() - self._t_start}
        log.info('loadr: settled on workers=%d prefetch=%d after %d batches: %s',
                 workers, prefetch, self._batches_out, why)
        if (workers, prefetch) != (self.workers, self.prefetch):
            # The next batch starts the new pool from self.step: the same stream.
            self._close_window()
            self.workers, self.prefetch = workers, prefetch
