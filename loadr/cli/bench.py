"""``loadr bench``: a pipeline's throughput for each worker count (a table, a plot)."""

from __future__ import annotations

import os

from ..errors import ConfigError
from ..progress import Progress
from .common import EXIT_OK, _batch_size, _out


def _load_pipeline(path: str, overrides: list, extra: dict | None = None):
    from ..config import load_config, parse_override
    config = load_config(path)
    for text in overrides or ():
        config.override(*parse_override(text))
    for key, value in (extra or {}).items():
        config.override(key, value)
    return config, config.build()


def _worker_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(',') if x.strip()]
    except ValueError:
        raise ConfigError(f'--workers takes comma-separated ints, e.g. 1,2,4; got {text!r}'
                          ) from None
    if not counts or any(c < 0 for c in counts):
        raise ConfigError(f'--workers takes ints >= 0, e.g. 0,1,2,4; got {text!r}')
    return counts


def cmd_bench(args) -> int:
    """Throughput per worker count: ``loadr bench p.yaml --workers 1,2,4``."""
    counts = _worker_counts(args.workers)
    if args.plot:
        try:
            import matplotlib
        except ImportError:
            # matplotlib by name: "loadr[bench]" would fetch another project of that
            # name from the package index (and the bench extra pins torch and more).
            raise ConfigError("--plot needs matplotlib, which is not installed: "
                              "pip install matplotlib; "
                              "or leave out --plot for the table alone") from None
    rows, profiles = [], []
    for workers in counts:
        _, loader = _load_pipeline(args.pipeline, args.override, {'loader.workers': workers})
        with loader:
            it = iter(loader)
            for _ in range(args.warmup):          # starts the workers, fills the prefetch
                next(it)
            before = loader.stats()
            bar = Progress(total=args.steps, unit='batches', label=f'bench workers={workers}')
            for _ in range(args.steps):
                bar.update(1, samples=_batch_size(next(it)))
            bar.close()
            profiles.append((workers, loader.stats().since(before)))
        rate, sample_rate = bar.rates()
        rows.append((workers, rate, sample_rate))
    base = rows[0][2] or 1e-9
    _out(f'{"workers":>7}  {"batches/s":>10}  {"samples/s":>10}  {"speedup":>7}')
    for workers, rate, sample_rate in rows:
        _out(f'{workers:>7}  {rate:>10.2f}  {sample_rate:>10.1f}  {sample_rate / base:>6.2f}x')
    from ..stats import format_table
    for workers, stats in profiles:         # then where the time went, for each count
        _out('')
        _out(f'workers={workers}:')
        _out(format_table(stats))
    if args.plot:
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r[0] for r in rows], [r[2] for r in rows], marker='o')
        ax.set_xlabel('workers')
        ax.set_ylabel('samples/s')
        ax.set_title(os.path.basename(args.pipeline))
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot)
        plt.close(fig)
        _out(f'plot written to {args.plot}')
    return EXIT_OK
