"""workers='auto' and prefetch='auto': a :class:`Calibration` measures the first batches,
and :func:`settle` picks the settings from what it measured (a :class:`loadr.stats.Stats`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ._accounting import IO_BOUND_SHARE, process_times

if TYPE_CHECKING:
    from ._snapshot import Stats

# The calibration measures this many batches after the first (start-up left out), or
# fewer if they take AUTO_MAX_S.
AUTO_BATCHES = 16
AUTO_MAX_S = 3.0
AUTO_HEADROOM = 1.25        # workers for 125% of the measured need: room for jitter
AUTO_IO_FACTOR = 4          # at most this many workers per core, for I/O-bound workers
AUTO_MAX_PREFETCH_PER_WORKER = 4


def settle(stats: Stats, batch: int, workers: int | None, prefetch: int | None,
           max_prefetch: int | None = None) -> tuple[int, int, str]:
    """``(workers, prefetch, why)`` for a loader, from what a calibration measured.

    ``stats`` covers the calibration (the first batches after the first, see
    :meth:`Stats.since`); ``workers``/``prefetch`` are the fixed settings, or
    None where they are ``'auto'``. The rule:

    - workers: the worker-seconds one batch takes (busy time per sample
      times ``batch``) over the caller's own time per batch (its step),
      times ``AUTO_HEADROOM``, rounded up: enough workers to keep up, no
      more. A caller that only waits needs as many as there may be. At most
      the cores the process may use, or up to ``AUTO_IO_FACTOR`` times that
      when the workers mostly wait on I/O (more than half their busy time
      blocked: neither on a CPU nor waiting for one, see
      :attr:`Stats.io_share`; more workers than cores then overlap the
      waits). At least 1.
    - prefetch: two batches per worker (one in hand, one queued: no idle
      gap between tasks), plus more for batches whose time varies (``cv``,
      the coefficient of variation of the per-task time):
      ``ceil(workers * (2 + 2 * cv))``, at most ``AUTO_MAX_PREFETCH_PER_WORKER``
      per worker, and at most ``max_prefetch`` (what the shared-memory budget
      holds).

    >>> from loadr.stats import Stats
    >>> w = dict(busy=8.0, wait=0.0, read=1.0, write=0.5, batches=100, samples=6400,
    ...          cpu=7.6, busy_sq=0.64, fns=[6.0])
    >>> s = Stats(['decode'], elapsed_s=5.0, main_wait_s=4.0, batches=50, samples=3200,
    ...           workers=[w], cores=8)
    >>> settle(s, batch=64, workers=None, prefetch=None)[:2]
    (5, 10)
    """
    cores = max(1, stats.cores)
    samples = stats._sum('samples')
    per_batch = stats.busy_s / samples * batch if samples else 0.0
    step = stats.step_s
    io = stats.io_share
    cap = cores
    why = [f'{1e3 * per_batch:.1f} ms of worker time per batch, the caller '
           f'{1e3 * step:.1f} ms per batch']
    if io > IO_BOUND_SHARE:
        cap = cores * min(AUTO_IO_FACTOR, math.ceil(1 / max(1 - io, 1 / AUTO_IO_FACTOR)))
        why.append(f'workers blocked on I/O {100 * io:.0f}% of their busy time: up to {cap} '
                   f'workers on {cores} cores')
    else:
        why.append(f'CPU-bound workers: up to the {cores} cores')
    if workers is None:
        if per_batch <= 0:
            workers = cap
        elif step <= 0:
            workers = cap
        else:
            workers = min(cap, max(1, math.ceil(AUTO_HEADROOM * per_batch / step)))
    if prefetch is None:
        cv = stats.variability
        prefetch = min(AUTO_MAX_PREFETCH_PER_WORKER * workers,
                       max(2, math.ceil(workers * (2 + 2 * cv))))
        why.append(f'batch time varies by {100 * cv:.0f}%')
        if max_prefetch is not None and prefetch > max_prefetch:
            prefetch = max(1, max_prefetch)
            why.append('prefetch as the shared-memory budget holds')
    return workers, prefetch, '; '.join(why)


class Calibration:
    """workers='auto' / prefetch='auto' under way: what it measured from the first batch
    on (start-up left out), until it has seen ``AUTO_BATCHES`` more (or two or more in
    ``AUTO_MAX_S`` seconds). ``workers`` and ``prefetch`` say which of them are 'auto'."""

    def __init__(self, workers: bool, prefetch: bool):
        self.workers, self.prefetch = workers, prefetch
        self.start: Stats | None = None
        self.start_cpu: dict = {}

    def measured(self, now: Stats, pids: list[int]) -> Stats | None:
        """What the calibration saw, once it has seen enough; None before. ``now`` is the
        loader's snapshot after a batch, ``pids`` its workers'."""
        if self.start is None:
            self.start = now
            # The workers' CPU time over the whole calibration, read at its start and
            # end: their own reads come every SCHED_EVERY_S at most, none at all in a
            # short calibration (whose CPU-bound workers then looked blocked on I/O).
            self.start_cpu = process_times(pids)
            return None
        seen = now.since(self.start)
        if seen.batches < AUTO_BATCHES and not (seen.batches >= 2
                                                and seen.elapsed_s >= AUTO_MAX_S):
            return None
        return seen.with_process_times(self.start_cpu, process_times(pids), pids)

    def settle(self, seen: Stats, batch: int, workers: int, prefetch: int,
               max_prefetch: int | None) -> tuple[int, int, str]:
        """:func:`settle` for the loader's current ``workers`` and ``prefetch``: those
        that are 'auto' are chosen, the others kept."""
        return settle(seen, batch, None if self.workers else workers,
                      None if self.prefetch else prefetch, max_prefetch)
