"""What a pool offers the batch window and the Loader, written down as a Protocol.

The window (:mod:`loadr.workers.window`) never asks who makes a task: it
hands task headers to a pool and takes back its events. Any object with the
members below can stand under it: :class:`~loadr.workers.pool.WorkerPool`
(local processes), :class:`~loadr.workers.remote.HybridPool` (agents on other
hosts beside local workers, 0 or more, whose slots they write into), and the
scripted pool of ``tests/workers/test_window.py``. (Checked with mypy: each is
assignable to the Protocol it offers.)

The contract:

- ``slot_count`` batch slots, each a dict of arrays (``views[slot]``) laid
  out by ``layout`` (a :class:`~loadr.workers.shm.Layout`); ``fresh_views``
  gives new arrays over a slot that all hang from one owner array (a lent
  batch), ``slot_buffers`` the buffers behind them (what ``loadr.torch``
  pins).
- ``submit(header)`` sends a task (False: nobody can take it now; the window
  keeps it and tries again once ``can_submit()``). ``poll(timeout_ms)``
  returns events of :mod:`~loadr.workers.protocol`: ``Done``, ``Failed``,
  ``Lost`` (send those rows again, to anyone) and ``Fatal``. A task's rows
  are in its slot when its ``Done`` comes, not before.
- ``cancel(upto)``: every task with an id up to ``upto`` is stale; each is
  still answered (``Done``, no data), so its slot comes back.
- ``close()`` frees everything (``closed`` says so); ``pids``,
  ``stats_rows()`` and ``private_memory()`` are what ``loader.stats()`` reads.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from . import protocol
from .shm import Layout

__all__ = ['Pool', 'SlotPool', 'Event']

# What ``poll`` returns a list of: the pool's events (see the module docstring).
Event = protocol.Done | protocol.Failed | protocol.Lost | protocol.Fatal


@runtime_checkable
class SlotPool(Protocol):
    """The part of a pool the window drives: slots and their views, tasks and events."""

    slot_count: int
    views: list[dict[str, np.ndarray]]
    layout: Layout

    def fresh_views(self, slot: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """New arrays over ``slot`` and the one array they all hang from."""

    def submit(self, task: protocol.Task) -> bool:
        """Send ``task``; False if no one can take it now."""

    def can_submit(self) -> bool:
        """Whether a task sent now would be taken."""

    def poll(self, timeout_ms: int) -> list[Event]:
        """Wait up to ``timeout_ms`` for events; return them."""

    def cancel(self, upto: int) -> None:
        """Every task with an id up to ``upto`` is stale."""


@runtime_checkable
class Pool(SlotPool, Protocol):
    """A pool as the Loader keeps it: the window's part, and its life and accounting."""

    closed: bool

    @property
    def pids(self) -> list[int]:
        """The pids of the live processes of this host that make tasks."""

    def stats_rows(self) -> np.ndarray:
        """A copy of the workers' stage counters, one row per worker (loadr.stats)."""

    def private_memory(self, max_age_s: float = ...) -> dict[int, int]:
        """Worker id -> its USS in bytes, for the workers of this host."""

    def slot_buffers(self) -> list:
        """The buffers the slots are mapped in; none once closed."""

    def close(self) -> None:
        """Stop everything and free everything; safe to call twice."""
