"""A tiny progress bar for the ``loadr`` command, on stderr.

On a terminal it redraws one line in place (at most ``TTY_REDRAW_S`` apart);
anywhere else (a log file, a pipe, CI) it prints a plain line every
``LOADR_PROGRESS_S`` seconds (default ``LOG_EVERY_S``) so logs do not fill
with carriage returns.

Example::

    with Progress(total=100, unit='batches') as bar:
        for batch in batches:
            bar.update(1, samples=len(batch['label']))
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ['Progress', 'format_count', 'format_seconds']

TTY_REDRAW_S = 0.1
LOG_EVERY_S = 5.0
BAR_WIDTH = 24


def format_count(n: float) -> str:
    """``1234567 -> '1.23M'``, ``999 -> '999'``, ``7.058 -> '7.06'``: short, for rates."""
    for limit, suffix in ((1e9, 'G'), (1e6, 'M'), (1e4, 'k')):
        if abs(n) >= limit:
            return f'{n / limit:.3g}{suffix}'
    if isinstance(n, int):
        return str(n)
    return f'{n:.0f}' if abs(n) >= 100 else f'{n:.1f}' if abs(n) >= 10 else f'{n:.2f}'


def format_seconds(s: float) -> str:
    """``75.2 -> '1:15'``, ``3725 -> '1:02:05'``."""
    s = int(round(s))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f'{h}:{m:02}:{sec:02}' if h else f'{m}:{sec:02}'


class Progress:
    """Counts work and shows it: done/total, items/s, samples/s, elapsed and ETA.

    ``unit`` names what ``update`` counts (``'batches'``, ``'datapoints'``);
    ``samples`` passed to ``update`` adds a column of those (named
    ``sample_unit``, e.g. ``'frames'``) per second.
    """

    def __init__(self, total: int | None = None, unit: str = 'items', label: str = '',
                 stream=None, every_s: float | None = None, sample_unit: str = 'samples'):
        self.total, self.unit, self.label = total, unit, label
        self.sample_unit = sample_unit
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        if every_s is None:
            every_s = TTY_REDRAW_S if self.tty else float(
                os.environ.get('LOADR_PROGRESS_S', LOG_EVERY_S))
        self.every_s = every_s
        self.done = 0
        self.samples = 0
        self.start = time.perf_counter()
        self._last_shown = self.start
        self._end: float | None = None
        self.closed = False

    @property
    def elapsed(self) -> float:
        """Seconds from the start to now, or to :meth:`close`."""
        end = self._end if self._end is not None else time.perf_counter()
        return end - self.start

    def rates(self) -> tuple[float, float]:
        """(items per second, samples per second) since the start."""
        elapsed = max(self.elapsed, 1e-9)
        return self.done / elapsed, self.samples / elapsed

    def line(self) -> str:
        """The status line as it would be shown now."""
        rate, sample_rate = self.rates()
        parts = [self.label] if self.label else []
        if self.total:
            filled = min(BAR_WIDTH, int(BAR_WIDTH * self.done / self.total))
            parts.append('[' + '#' * filled + '-' * (BAR_WIDTH - filled) + ']')
            parts.append(f'{self.done}/{self.total} {self.unit}')
        else:
            parts.append(f'{self.done} {self.unit}')
        if self.samples:
            parts.append(f'{self.samples} {self.sample_unit}')
            parts.append(f'{format_count(sample_rate)} {self.sample_unit}/s')
        parts.append(f'{format_count(rate)} {self.unit}/s')
        parts.append(format_seconds(self.elapsed))
        if self.total and 0 < self.done < self.total and rate > 0:
            parts.append(f'ETA {format_seconds((self.total - self.done) / rate)}')
        return '  '.join(parts)

    def update(self, n: int = 1, samples: int = 0) -> None:
        """Count ``n`` more items (and ``samples`` samples); redraw when it is time."""
        self.done += n
        self.samples += samples
        now = time.perf_counter()
        if now - self._last_shown >= self.every_s:
            self._show()
            self._last_shown = now

    def _show(self, final: bool = False) -> None:
        try:
            if self.tty:
                self.stream.write('\r' + self.line() + '\x1b[K' + ('\n' if final else ''))
            else:
                self.stream.write(self.line() + '\n')
            self.stream.flush()
        except (OSError, ValueError):
            pass      # a closed or broken stderr must not stop the work

    def close(self) -> None:
        """Show the final line (once)."""
        if not self.closed:
            self.closed = True
            self._end = time.perf_counter()
            self._show(final=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
