"""Draw a loadr trace (Trace Event JSON) as a timeline PNG, the way a trace viewer lays it out.

``python -m benchmarks.trace_picture run.trace.json trace.png [--window-ms 400]``

One row per track (the training process's iterating thread, then each worker
process), a bar per span: the caller's waits for a batch, each task of a worker
with its stages drawn inside it (read, each fn, write), a tick per batch handed
out; below, the window's tasks in flight. Only the last ``--window-ms`` of the
trace are drawn, so that the spans are wide enough to see. It needs no browser;
README's picture in "Where the time goes" is the trace opened in a real viewer,
by ``benchmarks/trace_screenshot.py``. Open a trace yourself in ui.perfetto.dev
(Open trace file) or chrome://tracing.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ['main', 'draw']


def draw(events: list[dict], out: str, window_ms: float = 400.0,
         size: tuple[int, int] = (1400, 560)) -> None:
    """Draw ``events`` (a trace's ``traceEvents``) into the PNG ``out``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    names = {}
    for e in events:
        if e['ph'] == 'M' and e['name'] == 'process_name':
            names[e['pid']] = e['args']['name']
    timed = [e for e in events if e['ph'] in ('X', 'i', 'C')]
    end = max(e['ts'] + e.get('dur', 0) for e in timed)
    start = end - 1000 * window_ms
    t0 = max(start, min(e['ts'] for e in timed))

    def ms(ts):
        return (ts - t0) / 1000

    tracks = []                       # (pid, tid), the training process first
    for e in timed:
        key = (e['pid'], e['tid'])
        if e['ph'] != 'C' and key not in tracks:
            tracks.append(key)
    tracks.sort(key=lambda k: (not names.get(k[0], '').startswith('loadr: training'),
                               names.get(k[0], ''), k[0]))
    row = {k: i for i, k in enumerate(tracks)}
    stages = sorted({e['name'] for e in events if e.get('cat') == 'stage'},
                    key=lambda n: (n != 'read', n == 'write', n))
    cmap = plt.get_cmap('tab10')
    colour = {name: cmap(i % 10) for i, name in enumerate(stages)}

    fig, (ax, cax) = plt.subplots(2, 1, figsize=(size[0] / 100, size[1] / 100), dpi=100,
                                  sharex=True, gridspec_kw={'height_ratios': [4, 1]})
    for e in timed:
        if e['ts'] + e.get('dur', 0) < t0:
            continue
        y = row.get((e['pid'], e['tid']))
        if e['ph'] == 'X' and y is not None:
            x, w = ms(e['ts']), e['dur'] / 1000
            if e['name'] == 'task':
                ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolor='#eeeeee',
                               edgecolor='#888888', linewidth=0.5)
            elif e.get('cat') == 'stage':
                ax.broken_barh([(x, w)], (y - 0.3, 0.6), facecolor=colour[e['name']])
            else:                     # the caller's wait for a batch
                ax.broken_barh([(x, w)], (y - 0.3, 0.6), facecolor='#7f7f7f', alpha=0.6)
        elif e['ph'] == 'i' and y is not None:
            ax.plot([ms(e['ts'])] * 2, [y - 0.45, y + 0.45], color='black', linewidth=0.6)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"{names.get(pid, pid)}" if pid != tid or 'worker' not in
                        names.get(pid, '') else f'{names[pid]} (pid {pid})'
                        for pid, tid in tracks])
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color='#7f7f7f', alpha=0.6)] + \
        [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in stages]
    ax.legend(handles, ['wait for batch'] + stages, loc='upper center', ncol=len(handles),
              bbox_to_anchor=(0.5, 1.12), fontsize='small', frameon=False)
    window = [(ms(e['ts']), e['args']['tasks in flight']) for e in timed
              if e['ph'] == 'C' and e['name'] == 'window' and e['ts'] >= t0]
    if window:
        cax.step([x for x, _ in window], [v for _, v in window], where='post')
    cax.set_ylabel('tasks\nin flight', fontsize='small')
    cax.set_xlabel('ms')
    cax.set_xlim(0, ms(end))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m benchmarks.trace_picture', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('trace', help="a trace written by loadr (Loader(trace=...), --trace)")
    p.add_argument('out', help='the PNG to write')
    p.add_argument('--window-ms', type=float, default=400.0,
                   help='draw the last this many milliseconds (default 400)')
    args = p.parse_args(argv)
    with open(args.trace, encoding='utf-8') as f:
        events = json.load(f)['traceEvents']
    draw(events, args.out, args.window_ms)
    print(f'{args.out}: the last {args.window_ms:g} ms of {args.trace}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
