"""``loadr run``: iterate a pipeline to a goal, resumable (``--save-state``, ``--resume``),
with ``--digest``, ``--profile`` and ``--stats-file``; Ctrl-C and SIGTERM stop it cleanly."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import TYPE_CHECKING, TextIO

from ..errors import ConfigError
from ..progress import Progress, format_count
from .common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    batch_size,
    epoch_batches,
    plural,
    print_err,
    print_out,
)
from .run_state import (
    RUN_STATE_FORMAT,
    check_overwrite,
    names_code,
    quoted,
    read_state,
    refused_state,
    resume_command,
    same_dir,
    same_file,
    write_state,
)

if TYPE_CHECKING:
    from ..stats import Stats


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler pre-empting the job), handled like Ctrl-C."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def cmd_run(args) -> int:
    """Iterate a pipeline: ``loadr run p.yaml --steps 100 -o loader.batch=8``.

    ``--steps`` is the run's goal: batches in all, counted from where the run
    began. ``--save-state`` records the loader state with the pipeline, the
    overrides and the goal, so ``loadr run p.yaml --resume FILE`` goes on
    with the same overrides to the same end.

    A state file is data, never code (SECURITY.md): the pipeline is built
    from the YAML file named on the command line only (the path saved in the
    state is compared, never read), and a saved override that names code (an
    import path, or unpickling) is applied only when ``-o`` gives it again.
    """
    from ..config import load_config, parse_override
    from ..errors import StateError
    loader_state = run = None
    if args.resume:
        loader_state, run = read_state(args.resume)
    cwd = os.getcwd()
    if args.pipeline is None:
        if run is not None:
            raise ConfigError(
                f"--resume needs the pipeline YAML file on the command line: a state file is "
                f"data and never chooses the code to run. It was saved from {run['config']}; "
                f"if that is your pipeline, go on with  loadr run {quoted(run['config'])} "
                f"--resume {quoted(args.resume)}", args.resume)
        raise ConfigError('loadr run needs the pipeline YAML file (with --resume FILE too: '
                          'loadr run PIPELINE --resume FILE)')
    pipeline_path = args.pipeline
    if run is not None:
        saved = list(run['overrides'])
        # An -o that repeats a saved override confirms it (and is applied once, in its place).
        new = [text for text in args.override if text not in saved]
        code = [text for text in saved if text not in args.override and names_code(text)]
        if code:
            again = ' '.join(f'-o {quoted(text)}' for text in code)
            raise ConfigError(
                f'the state file holds {plural(len(code), "override")} that '
                f'{"names" if len(code) == 1 else "name"} code to run (an import path, or '
                f'unpickling): {", ".join(map(repr, code))}. A state file is data and cannot '
                f'choose code: if you mean {"it" if len(code) == 1 else "them"}, pass '
                f'{"it" if len(code) == 1 else "them"} again:  loadr run '
                f'{quoted(pipeline_path)} --resume {quoted(args.resume)} {again}  '
                f'(or start a new run without --resume)', args.resume)
        if new and saved and not same_dir(cwd, run['cwd']):
            raise ConfigError(f"the saved run's overrides are relative to {run['cwd']}: add "
                              f"-o overrides from there (or start a new run)", args.resume)
        if not same_file(pipeline_path, run['config']):
            print_err(f"loadr: note: the state was saved with the pipeline {run['config']}; this "
                      f"run builds {os.path.abspath(pipeline_path)} (the state must belong to "
                      f"it)")
        overrides, saved_cwd = saved, run['cwd']
    else:
        overrides, new, saved_cwd = [], list(args.override), cwd
    config = load_config(pipeline_path, storage_options=args.storage_options)
    for text in overrides:
        config.override(*parse_override(text), cwd=saved_cwd)
    for text in new:
        config.override(*parse_override(text), cwd=cwd)
    loader = config.build()
    if getattr(args, 'trace', None):
        loader.trace(args.trace)            # written when the loader closes
    with loader:
        if loader_state is not None:
            try:
                loader.load(loader_state, strict=not args.no_strict)
            except StateError as exc:
                raise ConfigError(refused_state(exc, args), args.resume) from exc
        record = {'format': RUN_STATE_FORMAT, 'config': os.path.abspath(pipeline_path),
                  'overrides': overrides + new,
                  'cwd': saved_cwd if overrides else cwd}
        if run is not None:
            record['start'] = run['start']
            record['steps'] = args.steps if args.steps is not None else run['steps']
        else:
            # A fresh run starts where the loader is; a 0.1 state file kept no goal,
            # so its --steps count from position 0 (where a 0.1 run began).
            record['start'] = 0 if loader_state is not None else loader.step
            record['steps'] = args.steps if args.steps is not None else epoch_batches(loader)
        if args.save_state:
            check_overwrite(args.save_state, args.resume, loader.step, args.force,
                            record['config'])
        return _run(args, loader, record, pipeline_path)


def _run(args, loader, record: dict, pipeline_path: str) -> int:
    from ..demo import batch_digest
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    bar = processed = None
    try:
        gb = loader.global_batch
        end = record['start'] + record['steps'] * gb
        steps = max(0, -(-(end - loader.step) // gb))       # what is left of the goal
        done = record['steps'] - steps
        reader = loader.reader
        goal = (f'batches {done + 1}..{record["steps"]} of {record["steps"]}' if done
                else f'{steps} batches')
        print_err(f'loadr run {pipeline_path}: {type(reader).__name__} '
                  f'{getattr(reader, "path", "")} ({len(reader)} datapoints), '
                  f'{len(loader.fns)} fns, batch {loader.batch}, '
                  f'{plural(loader.workers, "worker")}, from position '
                  f'{loader.step}, {goal}')
        if args.resume and steps == 0:
            print_err(f'loadr: nothing left to run: position {loader.step} is at the goal of '
                      f'{record["steps"]} batches (--steps sets another goal, counted from '
                      f'position {record["start"]})')
        bar = Progress(total=steps, unit='batches', label='run')
        export = _stats_export(args, loader)
        it = iter(loader) if steps else iter(())
        first = None
        processed = loader.step      # the end of the last batch fully handled
        for _ in range(steps):
            batch = next(it)
            if first is None:
                first = batch
            if args.digest:
                print_out(f'position {processed} {batch_digest(batch)}')
            bar.update(1, samples=batch_size(batch))
            processed = loader.step
        bar.close()
        # Saved here, inside the try: a Ctrl-C that lands just after the last batch
        # still finds the state written (by the handler below, if not yet here).
        state = loader.save()
        if args.save_state:
            write_state(args.save_state, {**record, 'loader': state})
    except KeyboardInterrupt as exc:
        # A second Ctrl-C while the state is written must not cut it short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if bar is not None:
            bar.close()
        state = loader.save()
        if processed is not None:
            # A batch that arrived but was not handled yet is the first one to resume with.
            state['step'] = processed
        what = 'terminated' if isinstance(exc, _Terminated) else 'interrupted'
        if args.save_state:
            write_state(args.save_state, {**record, 'loader': state})
            print_err(f'loadr: {what} at position {state["step"]}; state saved to '
                      f'{args.save_state}: go on with  '
                      f'{resume_command(record["config"], args.save_state)}')
        else:
            print_err(f'loadr: {what} at position {state["step"]} (pass --save-state FILE to be '
                      f'able to resume)')
        _stats_end(args, loader, export)
        loader.close()
        return EXIT_INTERRUPTED if not isinstance(exc, _Terminated) else 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    stats_table = _stats_end(args, loader, export)
    loader.close()
    rate, sample_rate = bar.rates()
    print_out(f'batches: {bar.done}   samples: {bar.samples}   time: {bar.elapsed:.2f} s')
    print_out(f'throughput: {format_count(sample_rate)} samples/s, {rate:.2f} batches/s')
    if first is not None:
        print_out('batch: ' + ', '.join(
            f'{k} {v.dtype}{list(v.shape)}' if hasattr(v, 'dtype') else f'{k} list[{len(v)}]'
            for k, v in first.items()))
    if loader.on_error == 'skip':
        print_out(f'replaced datapoints (on_error=skip): {loader.errors} of {loader.samples}')
    print_out(f'state: position {state["step"]}' + (f', saved to {args.save_state}'
                                                      if args.save_state else ''))
    if stats_table:
        print_out(stats_table)
    return EXIT_OK


def _stats_export(args, loader) -> _StatsExport | None:
    """``--stats-file``: a JSON line of loader.stats() every ``--stats-every`` batches
    (appended), through the loader's on_stats hook; returns the writer, or None."""
    if not getattr(args, 'stats_file', None):
        return None
    export = _StatsExport(open(args.stats_file, 'a', encoding='utf-8'))
    loader.stats_every, loader.on_stats = args.stats_every, export
    return export


class _StatsExport:
    """``--stats-file``'s writer: the loader's ``on_stats``, a JSON line per call but one
    (the end's line may be the last one again)."""

    def __init__(self, file: TextIO):
        self.file = file
        self.last: int | None = None        # the batches of the last line written

    def __call__(self, stats: Stats) -> None:
        if stats.batches != self.last:
            self.file.write(json.dumps(stats.as_dict()) + '\n')
            self.file.flush()
            self.last = stats.batches


def _stats_end(args, loader, export: _StatsExport | None) -> str | None:
    """The last stats line (``--stats-file``) and, with ``--profile``, the table: printed
    at once on Ctrl-C, returned for the summary otherwise."""
    if export is None and not getattr(args, 'profile', False):
        return None
    stats = loader.stats()
    if export is not None:
        export(stats)
        export.file.close()
    if not args.profile:
        return None
    from ..stats import format_table
    table = format_table(stats)
    if sys.exc_info()[0] is not None:       # interrupted: no summary follows
        print_err(table)
        return None
    return table
