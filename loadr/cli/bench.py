"""``loadr bench``: a pipeline's throughput for each worker count (a table; a plot and a
trace of the last count)."""

from __future__ import annotations

from ..errors import ConfigError
from ..progress import Progress
from .common import EXIT_OK, batch_size, print_out

PLOT_POINTS = 50


def _load_pipeline(path: str, overrides: list, extra: dict | None = None,
                   storage_options: dict | None = None):
    from ..config import load_config, parse_override
    config = load_config(path, storage_options=storage_options)
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
            import matplotlib  # noqa: F401
        except ImportError:
            # matplotlib by name: "loadr[bench]" would fetch another project of that
            # name from the package index (and the bench extra pins torch and more).
            raise ConfigError("--plot needs matplotlib, which is not installed: "
                              "pip install matplotlib; "
                              "or leave out --plot for the table alone") from None
    rows, profiles, snapshots = [], [], []
    # The plot's snapshots: about PLOT_POINTS over the timed batches.
    every = max(1, args.steps // PLOT_POINTS)
    for k, workers in enumerate(counts):
        _, loader = _load_pipeline(args.pipeline, args.override, {'loader.workers': workers},
                                   args.storage_options)
        last = k == len(counts) - 1
        if last and args.trace:
            loader.trace(args.trace)            # written when the loader closes
        with loader:
            it = iter(loader)
            for _ in range(args.warmup):          # starts the workers, fills the prefetch
                next(it)
            before = loader.stats()
            snapshots = [before]
            bar = Progress(total=args.steps, unit='batches', label=f'bench workers={workers}')
            for i in range(args.steps):
                bar.update(1, samples=batch_size(next(it)))
                if last and args.plot and (i + 1) % every == 0:
                    snapshots.append(loader.stats())
            bar.close()
            profiles.append((workers, loader.stats().since(before)))
        rate, sample_rate = bar.rates()
        rows.append((workers, rate, sample_rate))
    base = rows[0][2] or 1e-9
    print_out(f'{"workers":>7}  {"batches/s":>10}  {"samples/s":>10}  {"speedup":>7}')
    for workers, rate, sample_rate in rows:
        print_out(f'{workers:>7}  {rate:>10.2f}  {sample_rate:>10.1f}  {sample_rate / base:>6.2f}x')
    from ..stats import format_table
    for workers, stats in profiles:         # then where the time went, for each count
        print_out('')
        print_out(f'workers={workers}:')
        print_out(format_table(stats))
    if args.trace:
        print_out(f'trace of workers={counts[-1]} written to {args.trace} (open it in '
                  f'ui.perfetto.dev or chrome://tracing)')
    if args.plot:
        from ..stats import plot
        plot([s.since(snapshots[0]) for s in snapshots[1:]] or [profiles[-1][1]], args.plot)
        print_out(f'plot of workers={counts[-1]} written to {args.plot}')
    return EXIT_OK
