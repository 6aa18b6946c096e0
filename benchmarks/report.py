"""Turning a run's results into the markdown table, the target check, the plot and BENCHMARKS.md.

Example::

    results['targets'] = targets(results)
    print(markdown(results))
    plot_scaling(results, 'benchmarks/out/scaling.png')
"""

from __future__ import annotations

import os

__all__ = ['targets', 'markdown', 'plot_scaling', 'write_benchmarks_md', 'RUN_START', 'RUN_END']

# BENCHMARKS.md is written by hand; a run replaces only what lies between these two
# lines (the full side-by-side run's section), and nothing when they are missing.
RUN_START = '<!-- python -m benchmarks writes from here ... -->'
RUN_END = '<!-- ... to here; the rest of this file is written by hand. -->'

TITLES = {
    'trivial': ("trivial datapoints {'label': int, 'vec': float32[16]}, batch 256 "
                "(dispatch overhead)"),
    'images': 'images: bag of 375×500 JPEGs q90; Pillow decode + random crop 224 + flip; batch 64',
    'video': 'video: gulp, 30–60 frames at 128×170; 8 frames sampled (TSN), decoded; batch 16',
    'raw': 'raw reads through the loaders: FFRecord 4 KiB records, CRC checked; batch 256',
}


def _median(loaders: dict, name: str, key: str = 'samples_per_s'):
    row = loaders.get(name)
    if not row:
        return None
    return row['summary'].get(key, {}).get('median')


def _fmt(x, spec: str = ',.0f', none: str = '—') -> str:
    return none if x is None else format(x, spec)


def _ratio(a, b):
    return None if a is None or not b else a / b


def targets(res: dict) -> list[dict]:
    """Each target of the side-by-side run with the figure measured and whether it is met
    (None: not run)."""
    out = []
    wl = res.get('workloads', {})

    def add(name, figure, met, detail=''):
        out.append({'target': name, 'figure': figure, 'met': met, 'detail': detail})

    if 'trivial' in wl:
        lo = wl['trivial']['loaders']
        for peer, want in (('granular', 10), ('torch', 3)):
            r = _ratio(_median(lo, 'loadr'), _median(lo, peer))
            add(f'trivial: loadr ≥ {want}× {peer}', None if r is None else f'{r:.1f}×',
                None if r is None else r >= want)
        for peer, want in (('granular', 10), ('torch', 3)):
            c = _ratio(_median(lo, peer, 'cpu_ms_per_sample'),
                       _median(lo, 'loadr', 'cpu_ms_per_sample'))
            if c is not None:
                add(f'trivial, by CPU time: {peer} spends ≥ {want}× loadr\'s CPU per sample',
                    f'{c:.1f}×', c >= want)
    if 'images' in wl:
        lo = wl['images']['loaders']
        r = _ratio(_median(lo, 'loadr'), _median(lo, 'limit'))
        add('images: loadr ≥ 90% of the decode-bound limit',
            None if r is None else f'{100 * r:.0f}%', None if r is None else r >= 0.9)
        c = _ratio(_median(lo, 'limit', 'cpu_ms_per_sample'),
                   _median(lo, 'loadr', 'cpu_ms_per_sample'))
        if c is not None:
            add('images, by CPU time (steadier on a shared machine): the plain loop\'s CPU per '
                'sample ÷ loadr\'s (whole process tree) ≥ 90%', f'{100 * c:.0f}%', c >= 0.9)
        others = [n for n in lo if n not in ('loadr', 'limit') and _median(lo, n)]
        if others and _median(lo, 'loadr'):
            best = max(others, key=lambda n: _median(lo, n))
            r = _median(lo, 'loadr') / _median(lo, best)
            add('images: loadr ahead of every peer', f'{r:.2f}× the best peer ({best})', r > 1)
            cpu = {n: _median(lo, n, 'cpu_ms_per_sample') for n in others + ['loadr']}
            if all(cpu.values()):
                leanest = min(others, key=cpu.get)
                add('images, by CPU time: loadr uses less CPU per sample than every peer',
                    f"{cpu['loadr']:.2f} ms vs {cpu[leanest]:.2f} ms ({leanest}, the leanest peer)",
                    cpu['loadr'] < cpu[leanest])
    if 'video' in wl:
        lo = wl['video']['loaders']
        for peer in [n for n in lo if n.startswith('torch+gulpio2')]:
            r = _ratio(_median(lo, 'loadr'), _median(lo, peer))
            add(f'video: loadr ahead of {peer}', None if r is None else f'{r:.2f}×',
                None if r is None else r > 1)
    if res.get('decode'):
        from .decode import targets as decode_targets
        for target, figure, met in decode_targets(res['decode']):
            add(target, figure, met)
    rd = res.get('readers')
    if rd:
        r = rd['ways']['ffrecord read() [crc]']['of_limit']
        w = rd['ways']['ffrecord read() [crc]']['of_limit_wall']
        add('raw reads: ffrecord read() ≥ 50% of the page-cache pread rate, one process',
            f'{100 * r:.0f}% per CPU-second ({100 * w:.0f}% by wall clock)', r >= 0.5)
    ttfbs = {name: _median(w['loaders'], 'loadr', 'ttfb_s') for name, w in wl.items()
             if w.get('workers') == 2}
    ttfbs = {k: v for k, v in ttfbs.items() if v is not None}
    if ttfbs:
        worst = max(ttfbs, key=ttfbs.get)
        add('time to first batch < 1 s with 2 workers',
            f'{ttfbs[worst]:.2f} s (slowest: {worst})', ttfbs[worst] < 1)
    rs = res.get('resume')
    if rs:
        import statistics
        lr = rs['loadr']
        med = statistics.median(lr['resume_s'])
        add('resume at step 10^12 of 10^9 no slower than a steady batch',
            f"{1e3 * med:.1f} ms vs {1e3 * lr['steady_batch_s']:.1f} ms",
            med <= lr['steady_batch_s'] and lr['correct_batch'],
            'resumed batch equals the workers=0 batch' if lr['correct_batch']
            else 'resumed batch DIFFERS from the workers=0 batch')
        big, small = lr['rss_growth_mib'], rs['loadr_small']['rss_growth_mib']
        add('main-process memory does not grow with N (10^9 vs 10^3)',
            f'main RSS grew {big:+.1f} MiB with N = 10^9, {small:+.1f} MiB with N = 10^3',
            big - small < 16)
    return out


def _machine_line(m: dict) -> str:
    libs = ', '.join(f'{k} {v}' for k, v in m['libraries'].items())
    return (f"{m['cores']} cores, {m['cpu_model']}, {m['memory_gib']} GiB, {m['os']}, "
            f"Python {m['python']}; {libs}. Load average at start {m['load_average']}, "
            f"at end {m.get('load_average_end', '?')} (the machine is shared).")


def _workload_table(name: str, w: dict) -> list[str]:
    lo = w['loaders']
    loadr_rate = _median(lo, 'loadr')
    lines = [f"### {TITLES.get(name, name)}", '',
             f"{w['n']} datapoints, {w['workers']} workers; median [min–max] of "
             f"{max((len(v['runs']) for v in lo.values()), default=0)} interleaved runs.", '',
             '| loader | samples/s | loadr ÷ this | first batch s | CPU ms/sample | '
             'RSS main MiB | RSS workers MiB | /dev/shm MiB |',
             '|---|---:|---:|---:|---:|---:|---:|---:|']
    for peer, row in lo.items():
        s = row['summary']
        if not s:
            lines.append(f"| {peer} | failed: {row['errors'][0] if row['errors'] else '?'} "
                         f"| | | | | | |")
            continue
        rate = s['samples_per_s']
        label = peer
        if row.get('limit'):
            label = f'{peer} (1 process × {w["workers"]})'
        elif row.get('ceiling'):
            label = f'{peer} ({w["workers"]} plain loops at once)'
        ratio = _ratio(loadr_rate, rate['median'])
        cells = [label, f"{rate['median']:,.0f} [{rate['min']:,.0f}–{rate['max']:,.0f}]",
                 '—' if peer == 'loadr' or ratio is None else f'{ratio:.2f}']
        for key, spec in (('ttfb_s', '.2f'), ('cpu_ms_per_sample', '.3f'),
                          ('rss_main_mib', ',.0f'), ('rss_workers_mib', ',.0f'),
                          ('shm_mib', ',.1f')):
            cells.append(_fmt(s.get(key, {}).get('median'), spec))
        lines.append('| ' + ' | '.join(cells) + ' |')
    notes = [f'{peer}: {row["note"]}' for peer, row in lo.items() if row.get('note')]
    if notes:
        lines += ['', '; '.join(notes) + '.']
    return lines + ['']


def markdown(res: dict) -> str:
    """Every table of the run, as markdown."""
    lines = ['## Results', '', f"Command: `{res['command'].strip()}`", '',
             f"Machine: {_machine_line(res['machine'])}", '']
    if res.get('missing_peers'):
        lines += [f"Not installed, so not measured: {', '.join(res['missing_peers'])}.", '']
    for name, w in res['workloads'].items():
        lines += _workload_table(name, w)
    if res.get('targets'):
        lines += ['### Targets', '', '| target | measured | met |', '|---|---|---|']
        for t in res['targets']:
            met = {True: 'yes', False: '**no**', None: 'not run'}[t['met']]
            detail = f" ({t['detail']})" if t.get('detail') else ''
            lines.append(f"| {t['target']} | {t['figure'] or '—'}{detail} | {met} |")
        lines.append('')
    if res.get('scaling'):
        lines += ['### Scaling: samples/s by worker count (median)', '']
        for name, table in res['scaling'].items():
            counts = sorted({int(w) for row in table.values() for w in row})
            lines += [f'{name}:', '', '| loader | ' + ' | '.join(f'{c} workers' for c in counts)
                      + ' |', '|---|' + '---:|' * len(counts)]
            for peer, row in table.items():
                lines.append(f'| {peer} | ' + ' | '.join(_fmt(row.get(str(c))) for c in counts)
                             + ' |')
            lines.append('')
    rs = res.get('resume')
    if rs:
        import statistics
        lr = rs['loadr']
        lines += ['### Resume far away', '',
                  f"loadr: `load()` at step {lr['step']:.0e} of a {lr['n']:.0e}-datapoint dataset, "
                  f"then `next()`: median {1e3 * statistics.median(lr['resume_s']):.1f} ms "
                  f"[{1e3 * min(lr['resume_s']):.1f}–{1e3 * max(lr['resume_s']):.1f}] over "
                  f"{len(lr['resume_s'])} resumes (the `load()` call itself: "
                  f"{1e6 * statistics.median(lr['load_call_s']):.0f} µs; a load() to the "
                  f"step the stream is already at, then next(): median "
                  f"{1e3 * statistics.median(lr['resume_near_s']):.1f} ms); a steady-state batch: "
                  f"median {1e3 * lr['steady_batch_s']:.2f} ms, slowest "
                  f"{1e3 * lr['steady_batch_max_s']:.2f} ms; one batch with nothing else in "
                  f"flight (prefetch=1): {1e3 * lr['batch_latency_s']:.2f} ms. The resumed batch "
                  f"{'equals' if lr['correct_batch'] else 'DIFFERS FROM'} the one a workers=0 "
                  f"loader gives at that step. Main-process RSS grew "
                  f"{lr['rss_growth_mib']:+.1f} MiB over the whole test with N = 10^9, "
                  f"{rs['loadr_small']['rss_growth_mib']:+.1f} MiB with N = 10^3.", '']
        go = rs.get('granular_order')
        if go:
            lines.append(f"granular's epoch order (a shuffled list of all N indices, built on "
                         f"every epoch change and on load()): {go['order_s']:.2f} s and "
                         f"{go['order_mib']:+,.0f} MiB for N = {go['n']:.0e}; it grows "
                         f"linearly, so N = 10^9 is out of reach (~100× that).")
        if rs.get('granular_error'):
            lines.append(f"granular resume failed: {rs['granular_error']}")
        if go or rs.get('granular_error'):
            lines.append('')
    if res.get('readers'):
        from .readers import markdown as readers_markdown
        lines += ['### Reader throughput (raw random reads)', '', readers_markdown(res['readers'])]
    if res.get('decode'):
        from .decode import markdown as decode_markdown
        lines += ['### Decode: CPU per sample', '', decode_markdown(res['decode'])]
    lines.append(f"Whole run: {res.get('wall_s', 0):.0f} s.")
    return '\n'.join(lines) + '\n'


def plot_scaling(res: dict, path: str) -> str | None:
    """samples/s against workers, one panel per workload; returns the path, or None."""
    if not res.get('scaling'):
        return None
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = list(res['scaling'].items())
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (name, table) in zip(axes[0], panels):
        for peer, row in table.items():
            pts = sorted((int(w), v) for w, v in row.items() if v)
            if not pts:
                continue
            style = dict(linestyle='--', color='grey') if peer == 'limit' else dict(marker='o')
            label = 'limit (W plain loops at once)' if peer == 'limit' else peer
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        ax.set_title(name)
        ax.set_xlabel('workers')
        ax.set_ylabel('samples/s')
        ax.set_yscale('log')
        ax.set_xticks(sorted({int(w) for row in table.values() for w in row}))
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=8)
    m = res['machine']
    fig.suptitle(f"loadr and peers: throughput by worker count ({m['cores']} cores, "
                 f"{m['cpu_model']})", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_benchmarks_md(res: dict, table: str, path: str) -> bool:
    r"""Put the run's tables (``table``, from :func:`markdown`) between :data:`RUN_START`
    and :data:`RUN_END` in BENCHMARKS.md, every other byte kept; False, and the file
    untouched, where it lacks them (the hand-written file is never overwritten).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), 'B.md')
    >>> _ = open(path, 'w').write('intro\n' + RUN_START + '\nold\n' + RUN_END + '\nnotes\n')
    >>> write_benchmarks_md({}, '## Results\n\n### images\n', path)
    True
    >>> print(open(path).read())
    intro
    <!-- python -m benchmarks writes from here ... -->
    ### The full side-by-side run
    <BLANKLINE>
    #### images
    <BLANKLINE>
    <!-- ... to here; the rest of this file is written by hand. -->
    notes
    <BLANKLINE>
    """
    if not os.path.exists(path):
        return False
    with open(path, encoding='utf-8') as f:
        old = f.read()
    if old.count(RUN_START) != 1 or old.count(RUN_END) != 1 or \
            old.index(RUN_START) > old.index(RUN_END):
        return False
    head, rest = old.split(RUN_START, 1)
    tail = rest.split(RUN_END, 1)[1]
    # The run's headings sit under "Details by topic": two levels down.
    lines = ['### The full side-by-side run' if line == '## Results' else
             '#' + line if line.startswith('### ') else line for line in table.splitlines()]
    with open(path, 'w', encoding='utf-8') as f:
        f.write(head + RUN_START + '\n' + '\n'.join(lines).rstrip('\n') + '\n\n' + RUN_END
                + tail)
    return True
