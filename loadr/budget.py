"""The error budget under ``on_error='skip'``: how many replaced datapoints a run bears.

A datapoint that fails is replaced by another one (:meth:`loadr.assemble.Assembler.
substitute`) and logged; the loader raises once at least ``MIN_ERRORS_BEFORE_RAISE``
of the datapoints of this shard's batches that start in the current *error window*
failed, and more than ``max_error_fraction`` of them. The error window is the
positions ``[k*W, (k+1)*W)`` of the stream, ``W`` the larger of an epoch and
``ERROR_WINDOW_POSITIONS``, so a small dataset's few bad datapoints still add up
over several epochs. The budget is a pure function of the position, and the state
carries it (``'skipped': [window, errors, samples]``, :mod:`loadr.state`), so a
resumed run raises exactly where the uninterrupted one would have.

Example::

    budget = ErrorBudget()
    budget = budget.counted(start=0, count=64, replaced=[], n=1000, max_fraction=0.01,
                            reader=reader)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .errors import LoadrError
from .sources import file_of

__all__ = ['ErrorBudget', 'log_replaced', 'MIN_ERRORS_BEFORE_RAISE', 'ERROR_WINDOW_POSITIONS']

log = logging.getLogger('loadr')

MIN_ERRORS_BEFORE_RAISE = 4
# The budget is counted over windows of at least this many stream positions (an
# epoch, if longer).
ERROR_WINDOW_POSITIONS = 100_000


@dataclass(frozen=True)
class ErrorBudget:
    """The current error window (-1: none yet), and its failed and made datapoints."""

    window: int = -1
    errors: int = 0
    samples: int = 0

    def counted(self, start: int, count: int, replaced: list, n: int, max_fraction: float,
                reader) -> ErrorBudget:
        """The budget after a batch of ``count`` positions from ``start`` whose
        ``replaced`` (``(index, position, reason)``) failed, in a stream of ``n``
        positions an epoch; a LoadrError naming the last one's file and index if that
        spends it."""
        size = max(n, ERROR_WINDOW_POSITIONS)
        window = start // size
        errors, samples = (self.errors, self.samples) if window == self.window else (0, 0)
        errors, samples = errors + len(replaced), samples + count
        if replaced and errors >= MIN_ERRORS_BEFORE_RAISE and errors > max_fraction * samples:
            raise LoadrError(f'{errors} of {samples} datapoints failed since stream position '
                             f'{window * size}, more than max_error_fraction='
                             f'{max_fraction}; the last, this one: '
                             f'{replaced[-1][2]}', file_of(reader, replaced[-1][0]),
                             replaced[-1][0])
        return ErrorBudget(window, errors, samples)

    def as_state(self) -> list[int] | None:
        """``[window, errors, samples]`` for a saved state; None before the first count."""
        return [self.window, self.errors, self.samples] if self.window >= 0 else None


def log_replaced(reader, replaced: list) -> None:
    """Log each replaced datapoint ``(index, position, reason)`` of ``reader``, with its
    file too, unless the error's own text names it already."""
    for index, position, reason in replaced:
        path = file_of(reader, index)
        log.warning('loadr: datapoint %d%s failed and was replaced (on_error=skip): '
                    'position %d, %s', index,
                    f' of {path}' if path and path not in reason else '', position, reason)
