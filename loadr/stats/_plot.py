"""A picture of :class:`~loadr.stats.Stats`: samples/s over time and each worker's stage
shares, the verdict as its title. matplotlib (the ``plot`` extra) is imported here only,
when a plot is drawn."""

from __future__ import annotations

import os
import textwrap

from ._snapshot import Stats

__all__ = ['plot', 'PLOT_SIZE']

PLOT_SIZE = (1200, 800)         # pixels
_DPI = 100


def plot(stats, path, size: tuple[int, int] = PLOT_SIZE) -> str:
    """Draw ``stats`` into the PNG ``path`` of ``size`` pixels (width, height); the path.

    ``stats``: one :class:`Stats` snapshot, or a list of snapshots of one loader in
    the order they were taken (``loader.stats()`` every few batches, e.g. through
    ``on_stats``). The top panel is samples/s over time (over a tenth of the
    snapshots at a time; one point, the average, for a single one), the bottom one each
    worker's time as a stacked bar of its stages (read, each fn, write, other, wait)
    in shares of that worker's time; the title is the last snapshot's verdict.
    Needs matplotlib (``pip install matplotlib``; the ``plot`` extra).
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError('loadr.stats.plot needs matplotlib, which is not installed: '
                          'pip install matplotlib') from None
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    snapshots = [stats] if isinstance(stats, Stats) else list(stats)
    if not snapshots:
        raise ValueError('plot needs at least one Stats snapshot')
    last = snapshots[-1]
    width, height = (int(v) for v in size)
    fig, (rate_ax, bar_ax) = plt.subplots(2, 1, figsize=(width / _DPI, height / _DPI),
                                          dpi=_DPI, gridspec_kw={'height_ratios': [1, 1.3]})
    try:
        times, rates = _rates(snapshots)
        rate_ax.plot(times, rates, marker='o' if len(times) < 50 else None)
        rate_ax.set_xlabel('seconds')
        rate_ax.set_ylabel('samples/s')
        rate_ax.set_ylim(bottom=0)
        rate_ax.grid(True, alpha=0.3)

        stages = ['read', *last.fn_names, 'write', 'other', 'wait']
        names = ['in process' if last.inline else f'worker {i}'
                 for i in range(len(last.workers))]
        bottoms = [0.0] * len(last.workers)
        cmap = plt.get_cmap('tab20')
        for k, stage in enumerate(stages):
            shares = []
            for w in last.workers:
                seconds = _stage_seconds(w, last.fn_names)
                total = sum(seconds.values())
                shares.append(100.0 * seconds[stage] / total if total > 0 else 0.0)
            color = '#dddddd' if stage == 'wait' else cmap(k % 20)
            bar_ax.barh(names, shares, left=bottoms, label=stage, color=color)
            bottoms = [b + s for b, s in zip(bottoms, shares)]
        bar_ax.set_xlim(0, 100)
        bar_ax.set_xlabel("share of the worker's time (%)")
        bar_ax.invert_yaxis()
        bar_ax.legend(loc='upper center', bbox_to_anchor=(0.5, -0.18),
                      ncol=min(len(stages), 6), fontsize='small', frameon=False)
        fig.suptitle('\n'.join(textwrap.wrap(last.verdict(), 110)), fontsize='medium')
        fig.tight_layout()
        path = os.fspath(path)
        fig.savefig(path, dpi=_DPI, format='png')
    finally:
        plt.close(fig)
    return path


def _rates(snapshots: list) -> tuple[list, list]:
    """(seconds, samples/s) over a sliding span of snapshots (a tenth of them: batches come
    in bursts, one apart is mostly noise); the average for one snapshot."""
    if len(snapshots) == 1:
        s = snapshots[0]
        return [s.elapsed_s], [s.samples / s.elapsed_s if s.elapsed_s > 0 else 0.0]
    span = max(1, len(snapshots) // 10)
    times, rates = [], []
    for a, b in zip(snapshots, snapshots[span:]):
        dt = b.elapsed_s - a.elapsed_s
        if dt > 0:
            times.append(b.elapsed_s)
            rates.append((b.samples - a.samples) / dt)
    return times, rates


def _stage_seconds(worker: dict, fn_names: list) -> dict:
    out = {'read': worker.get('read', 0.0)}
    out.update(zip(fn_names, worker.get('fns', [])))
    for key in ('write', 'other', 'wait'):
        out[key] = worker.get(key, 0.0)
    return out
