"""A snapshot of where a loader's time went (:class:`Stats`), its verdict and its table;
:mod:`loadr.stats` describes the stages."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..storage import netstats
from ._accounting import CONTENDED_SHARE, IO_BOUND_SHARE, WORKER_FIELDS, cores, worker_dict

# Below this fraction of the elapsed time spent waiting for batches the
# loader is called "not the bottleneck".
NOT_BOTTLENECK_FRACTION = 0.02


@dataclass
class Stats:
    """A snapshot of a loader's accounting; :mod:`loadr.stats` describes the stages.

    ``elapsed_s`` runs from the first request for a batch; ``main_wait_s`` is
    the time the caller spent blocked waiting for batches, of which
    ``first_batch_s`` for the first one (starting the workers). The share of
    time waited (:attr:`wait_fraction`, the verdict) leaves that start out:
    it describes the steady state. ``workers`` holds one dict per worker
    with the keys of :data:`WORKER_FIELDS` and ``fns`` (seconds per fn, in
    order); ``other`` is derived when missing. ``inline``: ``workers=0``, the
    one row is the pipeline run in the calling process. ``cores`` is how
    many cores the process may use.
    """

    fn_names: list
    elapsed_s: float
    main_wait_s: float
    batches: int
    samples: int
    workers: list = field(default_factory=list)
    cores: int = 0
    first_batch_s: float = 0.0
    inline: bool = False
    # Remote agents (Loader(remote=...)): one dict each, 'agent', 'host', 'rows', 'bytes',
    # 'in_flight', 'round_trip_s', 'deaths' (of that agent's place, this run).
    agents: list = field(default_factory=list)

    def __post_init__(self):
        for w in self.workers:
            w.setdefault('fns', [0.0] * len(self.fn_names))
            if 'other' not in w:
                staged = w.get('read', 0.0) + w.get('write', 0.0) + sum(w['fns'])
                w['other'] = max(0.0, w.get('busy', 0.0) - staged)
        if not self.cores:
            self.cores = cores()

    @classmethod
    def from_rows(cls, rows, fn_names: list, **fields) -> Stats:
        """Stats from the workers' raw counter rows (see :class:`StageClock`)."""
        return cls(fn_names=list(fn_names),
                   workers=[worker_dict(r, len(fn_names)) for r in rows], **fields)

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

    def _sum(self, key: str) -> float:
        return sum(w.get(key, 0.0) for w in self.workers)

    @property
    def busy_s(self) -> float:
        return self._sum('busy')

    @property
    def wait_fraction(self) -> float:
        """The share of the time after the first batch the caller spent waiting for batches."""
        span = self.elapsed_s - self.first_batch_s
        waited = self.main_wait_s - self.first_batch_s
        return min(1.0, max(0.0, waited / span)) if span > 0 else 0.0

    @property
    def step_s(self) -> float:
        """The caller's own time per batch (elapsed minus waiting): its training step."""
        if not self.batches:
            return 0.0
        return max(0.0, self.elapsed_s - self.main_wait_s) / self.batches

    @property
    def worker_s_per_batch(self) -> float:
        """Worker-seconds of busy time per batch made (all stages)."""
        done = self._sum('batches')
        return self.busy_s / done if done else 0.0

    def _sampled_s(self) -> float:
        # The busy time the cpu and runq counters cover (all of it in a row without
        # 'sampled', as an older snapshot's).
        return sum(w.get('sampled', w.get('busy', 0.0)) for w in self.workers)

    @property
    def cpu_share(self) -> float:
        """CPU time over busy time of the workers (the busy time it was read for)."""
        busy = self._sampled_s()
        return self._sum('cpu') / busy if busy > 0 else 1.0

    @property
    def io_share(self) -> float:
        """The share of the workers' busy time blocked in the kernel: neither on a CPU
        nor waiting for one (0: CPU-bound, or short of cores, or not read yet; near 1:
        waiting on I/O). Only the busy time whose CPU time was read counts."""
        busy = self._sampled_s()
        if busy <= 0:
            return 0.0
        return min(1.0, max(0.0, busy - self._sum('cpu') - self._sum('runq')) / busy)

    @property
    def runq_share(self) -> float:
        """The share of the time the workers were ready to run that they waited for a
        core (other processes' load, or more workers than cores): runq / (cpu + runq)."""
        ready = self._sum('cpu') + self._sum('runq')
        return self._sum('runq') / ready if ready > 0 else 0.0

    def with_process_times(self, before: dict, after: dict, pids: list) -> Stats:
        """These stats with each worker's ``cpu`` and ``runq`` replaced by what its
        process's clocks (:func:`process_times`, ``before`` and ``after``) counted, the
        whole of its busy time sampled; unchanged unless every one of ``pids`` (the
        workers' pids, in the rows' order) was read both times.

        >>> s = Stats(['f'], 1.0, 0.9, 10, 640, [dict(busy=0.5, cpu=0.0, sampled=0.0)])
        >>> timed = s.with_process_times({7: (1.0, 0.0)}, {7: (1.3, 0.0)}, [7])
        >>> s.io_share, round(timed.io_share, 3)      # 0.2 s of 0.5 neither on a CPU nor queued
        (0.0, 0.4)
        """
        if len(pids) != len(self.workers) or not all(p in before and p in after
                                                     for p in pids):
            return self
        workers = []
        for w, pid in zip(self.workers, pids):
            w = dict(w, cpu=after[pid][0] - before[pid][0], runq=after[pid][1] - before[pid][1])
            w['sampled'] = w.get('busy', 0.0)
            workers.append(w)
        return Stats(self.fn_names, self.elapsed_s, self.main_wait_s, self.batches,
                     self.samples, workers, self.cores, self.first_batch_s, self.inline)

    @property
    def variability(self) -> float:
        """Coefficient of variation of the per-task busy time (0: every batch alike)."""
        n = self._sum('batches')
        if n < 2:
            return 0.0
        mean = self.busy_s / n
        var = max(0.0, self._sum('busy_sq') / n - mean * mean)
        return math.sqrt(var) / mean if mean > 0 else 0.0

    def since(self, earlier: Stats) -> Stats:
        """What happened between ``earlier`` and this snapshot (same loader).

        >>> a = Stats(['f'], 1.0, 0.5, 10, 640)
        >>> b = Stats(['f'], 3.0, 0.6, 30, 1920)
        >>> d = b.since(a); (d.elapsed_s, d.batches, round(d.main_wait_s, 3))
        (2.0, 20, 0.1)
        """
        workers = []
        for i, w in enumerate(self.workers):
            e = earlier.workers[i] if i < len(earlier.workers) else {}
            d = {k: w.get(k, 0.0) - e.get(k, 0.0) for k in WORKER_FIELDS}
            d.update({k: w.get(k, 0.0) for k in netstats.LEVELS})
            d['fns'] = [a - b for a, b in zip(w['fns'], e.get('fns', [0.0] * len(w['fns'])))]
            if 'uss_bytes' in w:
                d['uss_bytes'] = w['uss_bytes']     # memory is a level, not a count
            workers.append(d)
        return Stats(self.fn_names, self.elapsed_s - earlier.elapsed_s,
                     self.main_wait_s - earlier.main_wait_s, self.batches - earlier.batches,
                     self.samples - earlier.samples, workers, self.cores, 0.0, self.inline)

    def as_dict(self) -> dict:
        """Plain numbers for a JSON line, a logger or a dashboard.

        >>> d = Stats(['f'], 2.0, 0.5, 10, 640).as_dict()
        >>> d['samples_per_s'], sorted(d['stages_s'])
        (320.0, ['f', 'other', 'read', 'wait', 'write'])
        """
        rate = (lambda v: v / self.elapsed_s) if self.elapsed_s > 0 else (lambda v: 0.0)
        workers = []
        for w in self.workers:
            w = dict(w)
            w['fns'] = dict(zip(self.fn_names, w['fns']))
            w['samples_per_s'] = rate(w.get('samples', 0.0))
            w['batches_per_s'] = rate(w.get('batches', 0.0))
            workers.append(w)
        return {
            'time': time.time(), 'elapsed_s': self.elapsed_s, 'batches': self.batches,
            'samples': self.samples, 'samples_per_s': rate(self.samples),
            'batches_per_s': rate(self.batches), 'main_wait_s': self.main_wait_s,
            'first_batch_s': self.first_batch_s, 'main_wait_fraction': self.wait_fraction,
            'worker_busy_s': self.busy_s, 'worker_cpu_share': self.cpu_share,
            'worker_io_share': self.io_share,
            'stages_s': self.stages(), 'workers': workers, 'inline': self.inline,
            'cores': self.cores, 'verdict': self.verdict(),
            'remote': netstats.summary(self.workers, self.samples),
            'agents': [{**a, 'rows_per_s': rate(a['rows']), 'bytes_per_s': rate(a['bytes'])}
                       for a in self.agents],
        }

    # -- the verdict -----------------------------------------------------

    def workers_needed(self) -> int:
        """Workers that would keep up with the caller: worker-seconds per batch over the
        caller's own time per batch (its step), rounded up; 0 if unknown."""
        per_batch, step = self.worker_s_per_batch, self.step_s
        if per_batch <= 0:
            return 0
        if step <= 0:
            return 1 << 16          # a caller that does nothing: as many as there are
        return max(1, math.ceil(per_batch / step))

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
            return (f'input-bound: the training step waited {100 * waited:.0f}% of the time')
        top, top_s = max(stages.items(), key=lambda kv: kv[1])
        where = 'of the time in the training process' if self.inline else 'of worker time'
        head = (f'input-bound: the training step waited {100 * waited:.0f}% of the time; '
                f'{top} is {_pct(top_s, busy):.0f}% {where}')
        no_range = netstats.no_range_advice(netstats.summary(self.workers, self.samples))
        if no_range:
            return f'{head}; {no_range}'
        if self.inline:
            return f'{head}; workers={max(1, min(self.cores, self.workers_needed()))} would help'
        have = len(self.workers)
        needed = self.workers_needed()
        more = max(1, min(needed, 1 << 10) - have)
        if self.io_share > IO_BOUND_SHARE:
            return (f'{head}; the workers wait on I/O ({100 * self.io_share:.0f}% of their busy '
                    f'time): {more} more worker{"s" if more > 1 else ""} would help, '
                    f'even beyond the {self.cores} cores')
        # The training process needs a core too, for the share of the time it works
        # (it waited the rest): a caller that only waits leaves a core to a worker.
        spare = math.floor(self.cores - have - (1.0 - waited) + 0.5)
        # Cores that are free by count but busy with other processes' work: the
        # workers waited for one (a second worker then only makes both slower).
        queued = self.runq_share
        if spare >= 1 and queued <= CONTENDED_SHARE:
            more = min(more, spare)
            return f'{head}; {more} more worker{"s" if more > 1 else ""} would help'
        why = (f' (the workers waited for one {100 * queued:.0f}% of the time they were '
               f'ready to run)' if queued > CONTENDED_SHARE else '')
        return (f'{head}; the {self.cores} cores are all in use{why}: make {top} cheaper '
                f'or add cores')


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def format_table(stats: Stats) -> str:
    """A plain-text table of the stages (seconds, share of worker time, per sample)
    and the verdict."""
    stages = stats.stages()
    busy_and_wait = sum(stages.values())
    lines = [f"{'stage':<24}{'seconds':>10}{'share':>8}{'us/sample':>12}"]
    for name, t in stages.items():
        per = 1e6 * t / stats.samples if stats.samples else 0.0
        lines.append(f'{name:<24}{t:>10.3f}{_pct(t, busy_and_wait):>7.1f}%{per:>12.1f}')
    rate = stats.samples / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
    who = 'workers=0 (in the training process)' if stats.inline else \
        f'{len(stats.workers)} workers'
    lines.append(f'{who}, {stats.batches} batches, {stats.samples} '
                 f'samples in {stats.elapsed_s:.2f} s ({rate:,.0f} samples/s); the caller '
                 f'waited {stats.main_wait_s:.2f} s ({100 * stats.wait_fraction:.1f}% after '
                 f'the first batch, which took {stats.first_batch_s:.2f} s)')
    uss = [w['uss_bytes'] for w in stats.workers if w.get('uss_bytes') is not None]
    if uss:
        lines.append('worker private memory (USS): '
                     + ', '.join(f'{b / 2**20:.1f}' for b in uss) + ' MiB')
    per_s = 1 / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
    for a in stats.agents:
        rtt = '-' if a['round_trip_s'] is None else f"{1e3 * a['round_trip_s']:.1f} ms"
        lines.append(f"agent {a['agent']} on {a['host']}: {a['rows'] * per_s:,.0f} rows/s, "
                     f"{a['bytes'] * per_s / 2**20:.1f} MiB/s, {a['in_flight']} tasks in "
                     f"flight, round trip {rtt}, {a['deaths']} deaths")
    if stats.agents and stats.wait_fraction >= NOT_BOTTLENECK_FRACTION and stats.samples:
        share = sum(a['rows'] for a in stats.agents) / stats.samples
        lines.append(f'{100 * share:.0f}% of the rows came from {len(stats.agents)} remote '
                     f'agent{"s" if len(stats.agents) > 1 else ""} while the training step '
                     f'waited: more agents (nodes=) or processes (cpus=) would help, or a '
                     f'faster network where their round trips are long')
    remote = netstats.summary(stats.workers, stats.samples)
    lines.extend(netstats.lines(remote))
    lines.append(stats.verdict())
    network = netstats.verdict(remote) if stats.wait_fraction >= NOT_BOTTLENECK_FRACTION \
        else None
    if network:
        lines.append(network)
    return '\n'.join(lines)
