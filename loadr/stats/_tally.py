"""What a Loader counts for ``loader.stats()`` besides its live pool: the caller's side
(waits, batches handed out, the clock since the first batch was asked for) and the
stage counters that outlive a pool (:class:`Tally`)."""

from __future__ import annotations

import time

import numpy as np

from ._accounting import row_width
from ._snapshot import Stats


class Tally:
    """A loader's running totals, turned into a :class:`Stats` snapshot by :meth:`stats`.

    The workers' stage counters live in their pool's shared memory while it runs
    (``pool.stats_rows()``); a pool closed (workers='auto' settling, a trace begun,
    ``load()`` of another order version) leaves its rows here, summed by worker id,
    so a restart loses no time. ``inline_row`` is the counter row of the work done
    in the caller's process (``workers=0``), made by the first inline window.

    >>> tally = Tally(fns=0)
    >>> tally.asked(10.0); tally.handed(0.5); tally.handed(0.25)
    >>> tally.batches, tally.main_wait_s, tally.first_batch_s
    (2, 0.75, 0.5)
    """

    def __init__(self, fns: int):
        self.width = row_width(fns)
        self.t_start: float | None = None   # the first batch asked for
        self.t_end: float | None = None     # the loader closed
        self.main_wait_s = 0.0              # the caller's time waiting for batches
        self.first_batch_s = 0.0
        self.batches = 0                    # batches handed out
        self.kept: np.ndarray | None = None         # rows of the pools closed before
        self.inline_row: np.ndarray | None = None

    def asked(self, now: float) -> None:
        """The caller asks for a batch at ``now``: the clock starts at the first."""
        if self.t_start is None:
            self.t_start = now

    def handed(self, waited: float) -> None:
        """A batch goes to the caller, who waited ``waited`` seconds for it."""
        self.main_wait_s += waited
        self.batches += 1
        if self.batches == 1:
            self.first_batch_s = waited

    def end(self) -> None:
        """The loader closes: the clock stops (if it ever started)."""
        if self.t_start is not None and self.t_end is None:
            self.t_end = time.perf_counter()

    def inline(self) -> np.ndarray:
        """The counter row of the caller's own process (made once, then added to)."""
        if self.inline_row is None:
            self.inline_row = np.zeros((1, self.width))
        return self.inline_row[0]

    def keep(self, rows: np.ndarray) -> None:
        """A pool closed: its workers' counters, as they were when they stopped."""
        if self.kept is None or len(self.kept) < len(rows):
            grown = np.zeros_like(rows)
            if self.kept is not None:
                grown[:len(self.kept)] = self.kept
            self.kept = grown
        self.kept[:len(rows)] += rows

    def rows(self, live: np.ndarray | None = None) -> np.ndarray:
        """Every worker's counters: the pools closed, the inline row, and ``live`` (the
        running pool's), summed by worker id."""
        parts = [r for r in (self.kept, self.inline_row, live) if r is not None]
        rows = np.zeros((max([len(p) for p in parts], default=0), self.width))
        for part in parts:
            rows[:len(part)] += part
        return rows

    def stats(self, live: np.ndarray | None, fn_names: list, samples: int,
              inline: bool) -> Stats:
        """The snapshot: these totals with ``live`` rows (see :meth:`rows`)."""
        end = self.t_end if self.t_end is not None else time.perf_counter()
        elapsed = end - self.t_start if self.t_start is not None else 0.0
        return Stats.from_rows(self.rows(live), fn_names, elapsed_s=elapsed,
                               main_wait_s=self.main_wait_s, batches=self.batches,
                               samples=samples, first_batch_s=self.first_batch_s,
                               inline=inline)
