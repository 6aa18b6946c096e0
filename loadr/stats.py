"""Where a loader's time goes: per-stage totals, rates, a table and a verdict.

Each worker keeps a small row of float64 counters (:data:`WORKER_FIELDS`
followed by one counter per fn) that it adds to once per batch; the main
process adds its own time spent waiting for batches. :class:`Stats` is a
snapshot of all of them, taken by ``loader.stats()``: plain numbers, cheap to
take, JSON-able with :meth:`Stats.as_dict`.

Worker stages, in seconds of that worker's time:

- ``read``: the reader (bytes from storage and the reader's own decoding);
- one stage per fn, named after the fn (``decode_jpeg``, ``my_aug``);
- ``write``: checking a datapoint against the spec and copying it into the
  batch slot;
- ``other``: the rest of the time a batch was in hand (the task's messages,
  the loop);
- ``wait``: idle, waiting for work.

The per-stage split is timed on a sample of the rows of each batch (every
``STRIDE``-th row, and every row once a sample costs more than
``TIME_EVERY_ROW_US``) and scaled to the batch's measured time, so the
clock costs well under 1% of a trivial pipeline; ``busy`` (a batch in hand)
is measured exactly per batch.

Example::

    >>> s = Stats(fn_names=['decode', 'crop'], elapsed_s=10.0, main_wait_s=0.05,
    ...           batches=100, samples=6400,
    ...           workers=[dict(busy=9.0, wait=1.0, read=1.0, write=0.5, other=0.5,
    ...                         fns=[6.0, 1.0], batches=100, samples=6400)])
    >>> s.verdict()
    'not the bottleneck: the training step waited 0.5% of the time'
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

__all__ = ['Stats', 'WORKER_FIELDS', 'STRIDE', 'TIME_EVERY_ROW_US', 'format_table',
           'StageClock', 'NOT_BOTTLENECK_FRACTION']

# The fixed counters of a worker's row; one counter per fn follows them.
WORKER_FIELDS = ('busy', 'wait', 'read', 'write', 'batches', 'samples')
STRIDE = 8
TIME_EVERY_ROW_US = 200.0
# Below this fraction of the elapsed time spent waiting for batches the
# loader is called "not the bottleneck".
NOT_BOTTLENECK_FRACTION = 0.02


def _fn_name(fn) -> str:
    name = getattr(fn, 'stats_name', None) or getattr(fn, '__name__', None)
    if name is None or name == '<lambda>':
        name = type(fn).__name__ if name is None else 'lambda'
    return str(name)


def fn_names(fns) -> list[str]:
    """Stage names for ``fns``: their names, made unique with ``#2``, ``#3``.

    >>> def crop(dp, seed): return dp
    >>> fn_names([crop, crop])
    ['crop', 'crop#2']
    """
    seen: dict[str, int] = {}
    out = []
    for fn in fns:
        name = _fn_name(fn)
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f'{name}#{seen[name]}')
    return out


class StageClock:
    """A worker's counters, filled per batch by the assembler and the worker loop.

    ``row`` is the worker's float64 array (a view into shared memory, or a
    plain array): ``WORKER_FIELDS`` then one counter per fn.

    >>> import numpy as np
    >>> clock = StageClock(np.zeros(len(WORKER_FIELDS) + 1), fns=1)
    >>> clock.add_batch(read=0.2, write=0.1, fns=[0.6], busy=1.0, samples=64)
    >>> clock.totals()['busy'], clock.totals()['fns']
    (1.0, [0.6])
    """

    def __init__(self, row, fns: int):
        self.row = row
        self.nfns = fns
        self._idle_since = None

    def idle(self) -> None:
        """The worker starts waiting for work."""
        self._idle_since = time.perf_counter()

    def working(self) -> None:
        """Work arrived: what was waited since :meth:`idle` is counted."""
        if self._idle_since is not None:
            self.row[1] += time.perf_counter() - self._idle_since
            self._idle_since = None

    def add_batch(self, read: float, write: float, fns, busy: float, samples: int) -> None:
        row = self.row
        row[0] += busy
        row[2] += read
        row[3] += write
        row[4] += 1
        row[5] += samples
        base = len(WORKER_FIELDS)
        for i, t in enumerate(fns):
            row[base + i] += t

    def totals(self) -> dict:
        row = [float(v) for v in self.row]
        out = dict(zip(WORKER_FIELDS, row))
        out['fns'] = row[len(WORKER_FIELDS):len(WORKER_FIELDS) + self.nfns]
        return out


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


@dataclass
class Stats:
    """A snapshot of a loader's accounting; see the module docstring.

    ``workers`` holds one dict per worker with the keys of
    :data:`WORKER_FIELDS` and ``fns`` (seconds per fn, in order); ``other``
    is derived when missing. ``cores`` is how many cores the process may use.
    """

    fn_names: list
    elapsed_s: float
    main_wait_s: float
    batches: int
    samples: int
    workers: list = field(default_factory=list)
    cores: int = 0

    def __post_init__(self):
        for w in self.workers:
            w.setdefault('fns', [0.0] * len(self.fn_names))
            if 'other' not in w:
                staged = w.get('read', 0.0) + w.get('write', 0.0) + sum(w['fns'])
                w['other'] = max(0.0, w.get('busy', 0.0) - staged)
        if not self.cores:
            try:
                import os
                self.cores = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                import os
                self.cores = os.cpu_count() or 1

    # -- sums ------------------------------------------------------------

    def stages(self) -> dict:
        """Seconds per stage summed over the workers, in pipeline order."""
        out = {'read': 0.0}
        for name in self.fn_names:
            out[name] = 0.0
        out['write'] = out['other'] = out['wait'] = 0.0
        for w in self.workers:
            out['read'] += w.get('read', 0.0)
            for name, t in zip(self.fn_names, w['fns']):
                out[name] += t
            out['write'] += w.get('write', 0.0)
            out['other'] += w.get('other', 0.0)
            out['wait'] += w.get('wait', 0.0)
        return out

    @property
    def busy_s(self) -> float:
        return sum(w.get('busy', 0.0) for w in self.workers)

    @property
    def wait_fraction(self) -> float:
        """The share of the elapsed time the caller spent waiting for batches."""
        return self.main_wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict:
        """Plain numbers for a JSON line, a logger or a dashboard."""
        rate = (lambda v: v / self.elapsed_s) if self.elapsed_s > 0 else (lambda v: 0.0)
        return {
            'time': time.time(), 'elapsed_s': self.elapsed_s, 'batches': self.batches,
            'samples': self.samples, 'samples_per_s': rate(self.samples),
            'batches_per_s': rate(self.batches), 'main_wait_s': self.main_wait_s,
            'main_wait_fraction': self.wait_fraction, 'worker_busy_s': self.busy_s,
            'stages_s': self.stages(),
            'workers': [dict(w) for w in self.workers],
            'verdict': self.verdict(),
        }

    # -- the verdict -----------------------------------------------------

    def verdict(self) -> str:
        """One line: is the loader the bottleneck, and if so, where and what would help."""
        if self.batches == 0 or self.elapsed_s <= 0:
            return 'no batches yet'
        waited = self.wait_fraction
        if waited < NOT_BOTTLENECK_FRACTION:
            return f'not the bottleneck: the training step waited {100 * waited:.1f}% of the time'
        stages = {k: v for k, v in self.stages().items() if k != 'wait'}
        busy = sum(stages.values())
        if not self.workers or busy <= 0:
            return (f'input-bound: the training step waited {100 * waited:.0f}% of the time '
                    f'(workers=0: the pipeline runs in the training process; use workers)')
        top, top_s = max(stages.items(), key=lambda kv: kv[1])
        head = (f'input-bound: the training step waited {100 * waited:.0f}% of the time; '
                f'{top} is {_pct(top_s, busy):.0f}% of worker time')
        # Workers needed to keep up: worker-seconds per batch over the time the
        # step itself takes per batch (elapsed minus waiting).
        step_s = (self.elapsed_s - self.main_wait_s) / self.batches
        per_batch = busy / self.batches
        needed = math.ceil(per_batch / step_s) if step_s > 0 else len(self.workers) + 1
        more = max(1, needed - len(self.workers))
        spare = self.cores - len(self.workers) - 1
        if spare >= more:
            return f'{head}; {more} more worker{"s" if more > 1 else ""} would help'
        return (f'{head}; the {self.cores} cores are all in use: make {top} cheaper '
                f'or add cores')


def format_table(stats: Stats) -> str:
    """A plain-text table of the stages (seconds, share of worker time, per sample)."""
    stages = stats.stages()
    busy_and_wait = sum(stages.values())
    lines = [f"{'stage':<24}{'seconds':>10}{'share':>8}{'us/sample':>12}"]
    for name, t in stages.items():
        per = 1e6 * t / stats.samples if stats.samples else 0.0
        lines.append(f'{name:<24}{t:>10.3f}{_pct(t, busy_and_wait):>7.1f}%{per:>12.1f}')
    rate = stats.samples / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
    lines.append(f'{len(stats.workers)} workers, {stats.batches} batches, {stats.samples} '
                 f'samples in {stats.elapsed_s:.2f} s ({rate:,.0f} samples/s); the caller '
                 f'waited {stats.main_wait_s:.2f} s ({100 * stats.wait_fraction:.1f}%)')
    lines.append(stats.verdict())
    return '\n'.join(lines)
