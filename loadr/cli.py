"""The ``loadr`` command: demo, run, inspect, check, convert, ingest, bench.

Each command is one ``cmd_*`` function taking the parsed arguments and
returning the exit code. Exit codes: 0 success; 1 bad data, failed checks
or a run-time error (one line naming the file and index; ``-v`` adds the
traceback); 2 a usage or pipeline mistake; 130 interrupted (Ctrl-C).
Progress goes to stderr, results to stdout.

Example::

    loadr demo
    loadr run configs/imagenet_bag.yaml --steps 100 -o loader.batch=128
    loadr inspect data/train --json
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

from . import __version__
from .errors import ConfigError, LoadrError, WorkerError
from .progress import Progress, format_count
from .readers import formats
from .readers.patterns import names_files
from .storage import is_url, using_storage_options

__all__ = ['main', 'build_parser']

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
FIRST_VALUES = 8          # values shown per array by inspect
DEMO_RESUME_AFTER = 20    # batches before the demo saves its state


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler pre-empting the job), handled like Ctrl-C."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _out(*parts, **kwargs) -> None:
    print(*parts, **kwargs, flush=True)


def _err(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _plural(n: int, word: str) -> str:
    return f'{n} {word}' + ('' if n == 1 else 's')


def _size(nbytes: int) -> str:
    for unit, scale in (('GB', 1 << 30), ('MB', 1 << 20), ('kB', 1 << 10)):
        if nbytes >= scale:
            return f'{nbytes / scale:.1f} {unit}'
    return f'{nbytes} B'


def _disk_size(path: str) -> tuple[int, int]:
    """(bytes, files) under ``path`` (a file or a directory)."""
    if os.path.isfile(path):
        return os.path.getsize(path), 1
    total = files = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
                files += 1
            except OSError:
                pass
    return total, files


def _reader_size(reader) -> tuple[int, int]:
    """(bytes, files) that ``reader`` reads, from its identity (a URL has no disk to walk)."""
    identity = reader.identity()
    if 'files' in identity:
        return sum(identity['files'].values()), len(identity['files'])
    return int(identity.get('bytes', 0)), int(identity.get('file_count', 0))


def _batch_size(batch: dict) -> int:
    for value in batch.values():
        return len(value)
    return 0


def _describe_spec(spec: dict) -> str:
    import numpy as np
    parts = []
    for key, (dtype, shape) in spec.items():
        parts.append(f'{key} list' if dtype == np.dtype(object) else f'{key} {dtype}{list(shape)}')
    return ', '.join(parts)


def _load_pipeline(path: str, overrides: list, extra: dict | None = None):
    from .config import load_config, parse_override
    config = load_config(path)
    for text in overrides or ():
        config.override(*parse_override(text))
    for key, value in (extra or {}).items():
        config.override(key, value)
    return config, config.build()


# ---------------------------------------------------------------------------
# demo


def cmd_demo(args) -> int:
    """Synthetic JPEGs, the demo pipeline with workers, and a resume check: ``loadr demo``."""
    from .config import pipeline
    from .demo import DATA_DIR_NAME, DEMO_YAML, IMAGE_HW, batch_digest, make_images
    tmp = tempfile.mkdtemp(prefix='loadr-demo-')
    try:
        data = os.path.join(tmp, DATA_DIR_NAME)
        t0 = time.perf_counter()
        _out(f'1. Writing {args.images} synthetic {IMAGE_HW[0]}x{IMAGE_HW[1]} JPEG images '
             f'(10 labels) as a bag dataset: {data}')
        size = make_images(data, n=args.images)
        _out(f'   {args.images} datapoints, {_size(size)}, in {time.perf_counter() - t0:.1f} s')
        yaml_path = os.path.join(tmp, 'demo.yaml')
        with open(yaml_path, 'w', encoding='utf-8') as f:
            f.write(DEMO_YAML)
        _out(f'2. The pipeline ({yaml_path}, the same as configs/demo.yaml):')
        for line in DEMO_YAML.splitlines():
            if line and not line.startswith('#'):
                _out(f'     {line}')
        overrides = {'loader.workers': args.workers}
        with pipeline(yaml_path, **overrides) as loader:
            steps = max(DEMO_RESUME_AFTER + 1, 2 * _epoch_batches(loader))
            _out(f'3. Running {steps} batches of {loader.batch} ({steps * loader.batch} samples, '
                 f'{steps * loader.batch / len(loader.reader):.0f} epochs) with '
                 f'{loader.workers} worker processes:')
            bar = Progress(total=steps, unit='batches', label='   demo')
            it = iter(loader)
            state = expected = first = None
            for k in range(steps):
                batch = next(it)
                first = first or {key: (v.dtype, v.shape) for key, v in batch.items()}
                if k == DEMO_RESUME_AFTER - 1:
                    state = loader.save()
                elif k == DEMO_RESUME_AFTER:
                    expected = batch_digest(batch)
                bar.update(1, samples=_batch_size(batch))
            bar.close()
            rate, sample_rate = bar.rates()
        _out(f'   {bar.samples} samples in {bar.elapsed:.2f} s: {format_count(sample_rate)} '
             f'samples/s, {rate:.1f} batches/s')
        _out('   a batch: ' + ', '.join(f'{k} {d}{list(s)}' for k, (d, s) in first.items()))
        other = 1 if args.workers != 1 else 0
        _out(f'4. Resume: the state saved after batch {DEMO_RESUME_AFTER} is {json.dumps(state)}')
        with pipeline(yaml_path, **{'loader.workers': other}) as fresh:
            fresh.load(state)
            got = batch_digest(next(iter(fresh)))
        same = got == expected
        _out(f'   a fresh loader ({_plural(other, "worker")}) that loads it gives batch '
             f'{DEMO_RESUME_AFTER + 1}: sha256 {got[:16]}… vs {expected[:16]}… in the first '
             f'run: {"the same batch" if same else "DIFFERENT (a bug: please report it)"}')
        return EXIT_OK if same else EXIT_FAILED
    finally:
        if args.keep:
            _out(f'5. Kept {tmp} (remove it when done)')
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            _out(f'5. Removed {tmp}. Next: loadr run configs/demo.yaml -o reader.path=YOUR_BAG')


# ---------------------------------------------------------------------------
# run


RUN_STATE_FORMAT = 'loadr run state'   # marks a state file written by `loadr run`


def _epoch_batches(loader) -> int:
    """Batches in one epoch (``len(loader)`` in 0.1; ``batches_per_epoch()`` where it exists)."""
    per_epoch = getattr(loader, 'batches_per_epoch', None)
    return per_epoch() if per_epoch is not None else len(loader)


def _write_state(path: str, state: dict) -> None:
    from .storage import staging
    staging.reclaim(path)
    tmp = staging.make(path)
    with open(tmp, 'w', encoding='utf-8') as f:
        json.dump(state, f)
        f.write('\n')
    os.replace(tmp, path)


def _read_state(path: str) -> tuple[dict, dict | None]:
    """``(loader state, run record or None)`` from a state file.

    ``loadr run`` writes ``{'format', 'loader', 'config', 'overrides', 'cwd',
    'start', 'steps'}``: the loader's own state (opaque here) and what it
    takes to go on with the same pipeline to the same end. A 0.1 state file
    is the loader state alone (no run record).
    """
    try:
        with open(path, encoding='utf-8') as f:
            data = json.load(f)
    except OSError as exc:
        raise ConfigError(f'cannot read the state file: {exc.strerror or exc}', path) from exc
    except ValueError as exc:
        raise ConfigError(f'the state file is not JSON: {exc}', path) from exc
    except RecursionError:
        raise ConfigError('the state file is not a loadr state: its JSON is nested too deeply '
                          'to read', path) from None
    if isinstance(data, dict) and data.get('format') == RUN_STATE_FORMAT:
        run = data
        ok = (isinstance(run.get('loader'), dict) and isinstance(run.get('config'), str)
              and isinstance(run.get('overrides'), list)
              and all(isinstance(o, str) for o in run['overrides'])
              and isinstance(run.get('cwd'), str)
              and all(isinstance(run.get(k), int) and not isinstance(run.get(k), bool)
                      and run[k] >= 0 for k in ('start', 'steps')))
        if not ok:
            raise ConfigError('the state file is damaged: a run state needs loader, config, '
                              'overrides, cwd, start and steps', path)
        return run['loader'], run
    if isinstance(data, dict) and 'step' in data:
        return data, None              # loadr 0.1: the loader state alone
    raise ConfigError('not a loadr state file (written by loadr run --save-state or '
                      'Loader.save())', path)


def _position(state: dict):
    step = state.get('step') if isinstance(state, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _check_overwrite(path: str, resume: str | None, start: int, force: bool,
                     pipeline: str) -> None:
    """Refuse to replace a state file that is not one, or that lies ahead of this run."""
    if force or not os.path.lexists(path):
        return
    if resume is not None and os.path.exists(resume) and os.path.samefile(path, resume):
        return                         # going on from it: it is this run's own state
    hint = 'pass --force to overwrite it'
    try:
        state, _ = _read_state(path)
    except ConfigError as exc:
        raise ConfigError(f'--save-state would overwrite a file that is not a readable loadr '
                          f'state ({exc.message}); pick another file or {hint}', path) from exc
    ahead = _position(state)
    if ahead is not None and ahead > start:
        raise ConfigError(f'--save-state would overwrite a state saved at position {ahead}, '
                          f'ahead of where this run starts ({start}): go on from it with  '
                          f'{_resume_command(pipeline, path)}  or {hint}', path)


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
    from .config import load_config, parse_override
    from .errors import StateError
    loader_state = run = None
    if args.resume:
        loader_state, run = _read_state(args.resume)
    cwd = os.getcwd()
    if args.pipeline is None:
        if run is not None:
            raise ConfigError(
                f"--resume needs the pipeline YAML file on the command line: a state file is "
                f"data and never chooses the code to run. It was saved from {run['config']}; "
                f"if that is your pipeline, go on with  loadr run {_quoted(run['config'])} "
                f"--resume {_quoted(args.resume)}", args.resume)
        raise ConfigError('loadr run needs the pipeline YAML file (with --resume FILE too: '
                          'loadr run PIPELINE --resume FILE)')
    pipeline_path = args.pipeline
    if run is not None:
        saved = list(run['overrides'])
        # An -o that repeats a saved override confirms it (and is applied once, in its place).
        new = [text for text in args.override if text not in saved]
        code = [text for text in saved if text not in args.override and _names_code(text)]
        if code:
            again = ' '.join(f'-o {_quoted(text)}' for text in code)
            raise ConfigError(
                f'the state file holds {_plural(len(code), "override")} that '
                f'{"names" if len(code) == 1 else "name"} code to run (an import path, or '
                f'unpickling): {", ".join(map(repr, code))}. A state file is data and cannot '
                f'choose code: if you mean {"it" if len(code) == 1 else "them"}, pass '
                f'{"it" if len(code) == 1 else "them"} again:  loadr run '
                f'{_quoted(pipeline_path)} --resume {_quoted(args.resume)} {again}  '
                f'(or start a new run without --resume)', args.resume)
        if new and saved and not _same_dir(cwd, run['cwd']):
            raise ConfigError(f"the saved run's overrides are relative to {run['cwd']}: add "
                              f"-o overrides from there (or start a new run)", args.resume)
        if not _same_file(pipeline_path, run['config']):
            _err(f"loadr: note: the state was saved with the pipeline {run['config']}; this run "
                 f"builds {os.path.abspath(pipeline_path)} (the state must belong to it)")
        overrides, saved_cwd = saved, run['cwd']
    else:
        overrides, new, saved_cwd = [], list(args.override), cwd
    config = load_config(pipeline_path)
    for text in overrides:
        config.override(*parse_override(text), cwd=saved_cwd)
    for text in new:
        config.override(*parse_override(text), cwd=cwd)
    loader = config.build()
    with loader:
        if loader_state is not None:
            try:
                loader.load(loader_state, strict=not args.no_strict)
            except StateError as exc:
                raise ConfigError(_refused_state(exc, args), args.resume) from exc
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
            record['steps'] = args.steps if args.steps is not None else _epoch_batches(loader)
        if args.save_state:
            _check_overwrite(args.save_state, args.resume, loader.step, args.force,
                             record['config'])
        return _run(args, loader, record, pipeline_path)


def _quoted(text: str) -> str:
    import shlex
    return shlex.quote(str(text))


def _resume_command(pipeline: str, state: str) -> str:
    return f'loadr run {_quoted(pipeline)} --resume {_quoted(state)}'


def _names_code(override: str) -> bool:
    """Whether an ``-o KEY=VALUE`` text names code: an import path anywhere in its value
    (a fn, a ``decode`` callable), or unpickling (``decode: pickle``, ``allow_pickle``)."""
    from .config import parse_override
    key, value = parse_override(override)
    last = key.replace('__', '.').split('.')[-1]
    stack = [({last: value})]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _is_import_path(item):
                return True
        elif isinstance(item, dict):
            if item.get('decode') == 'pickle' or item.get('allow_pickle') not in (None, False):
                return True
            for k, v in item.items():
                stack += [k, v]
        elif isinstance(item, (list, tuple)):
            stack += list(item)
    return False


def _is_import_path(text: str) -> bool:
    """``'pkg.module:attr'`` as :func:`loadr.fns.resolve` reads one."""
    module, sep, attr = text.partition(':')
    return bool(sep) and all(p.isidentifier() for p in module.split('.') + attr.split('.'))


def _refused_state(exc, args) -> str:
    """The loader's refusal of a state, told as the command line's options say it."""
    lines = exc.message.split('\n')
    diffs = [line.strip()[2:] for line in lines if line.strip().startswith('- ')]
    if not diffs:
        return exc.message.replace('call load(state, strict=False)', 'pass --no-strict')
    return ('the state does not belong to this pipeline:\n  - ' + '\n  - '.join(diffs)
            + '\nRun the pipeline, with the overrides, it was saved with; or pass --no-strict '
              "to go on from the state's position with its seed and order anyway; or start "
              'a new run without --resume.')


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


_same_file = _same_dir       # samefile, or the same absolute path where one is gone


def _run(args, loader, record: dict, pipeline_path: str) -> int:
    from .demo import batch_digest
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
        _err(f'loadr run {pipeline_path}: {type(reader).__name__} '
             f'{getattr(reader, "path", "")} ({len(reader)} datapoints), {len(loader.fns)} fns, '
             f'batch {loader.batch}, {_plural(loader.workers, "worker")}, from position '
             f'{loader.step}, {goal}')
        if args.resume and steps == 0:
            _err(f'loadr: nothing left to run: position {loader.step} is at the goal of '
                 f'{record["steps"]} batches (--steps sets another goal, counted from '
                 f'position {record["start"]})')
        bar = Progress(total=steps, unit='batches', label='run')
        export = _stats_export(args, loader)
        it = iter(loader) if steps else None
        first = None
        processed = loader.step      # the end of the last batch fully handled
        for _ in range(steps):
            batch = next(it)
            if first is None:
                first = batch
            if args.digest:
                _out(f'position {processed} {batch_digest(batch)}')
            bar.update(1, samples=_batch_size(batch))
            processed = loader.step
        bar.close()
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
            _write_state(args.save_state, {**record, 'loader': state})
            _err(f'loadr: {what} at position {state["step"]}; state saved to '
                 f'{args.save_state}: go on with  '
                 f'{_resume_command(record["config"], args.save_state)}')
        else:
            _err(f'loadr: {what} at position {state["step"]} (pass --save-state FILE to be '
                 f'able to resume)')
        _stats_end(args, loader, export)
        loader.close()
        return EXIT_INTERRUPTED if not isinstance(exc, _Terminated) else 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    state = loader.save()
    if args.save_state:
        _write_state(args.save_state, {**record, 'loader': state})
    stats_table = _stats_end(args, loader, export)
    loader.close()
    rate, sample_rate = bar.rates()
    _out(f'batches: {bar.done}   samples: {bar.samples}   time: {bar.elapsed:.2f} s')
    _out(f'throughput: {format_count(sample_rate)} samples/s, {rate:.2f} batches/s')
    if first is not None:
        _out('batch: ' + ', '.join(
            f'{k} {v.dtype}{list(v.shape)}' if hasattr(v, 'dtype') else f'{k} list[{len(v)}]'
            for k, v in first.items()))
    if loader.on_error == 'skip':
        _out(f'replaced datapoints (on_error=skip): {loader.errors} of {loader.samples}')
    _out(f'state: position {state["step"]}' + (f', saved to {args.save_state}'
                                                 if args.save_state else ''))
    if stats_table:
        _out(stats_table)
    return EXIT_OK


def _stats_export(args, loader):
    """``--stats-file``: a JSON line of loader.stats() every ``--stats-every`` batches
    (appended), through the loader's on_stats hook; returns the writer, or None."""
    if not getattr(args, 'stats_file', None):
        return None
    out = open(args.stats_file, 'a', encoding='utf-8')

    def write(stats):
        if stats.batches != write.last:         # the end's line may be the last one
            out.write(json.dumps(stats.as_dict()) + '\n')
            out.flush()
            write.last = stats.batches

    write.file, write.last = out, None
    loader.stats_every, loader.on_stats = args.stats_every, write
    return write


def _stats_end(args, loader, export) -> str | None:
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
    from .stats import format_table
    table = format_table(stats)
    if sys.exc_info()[0] is not None:       # interrupted: no summary follows
        _err(table)
        return None
    return table


# ---------------------------------------------------------------------------
# inspect and check


def _summary(value) -> dict:
    """A JSON-able description of one value: type, shape/dtype/len and the first values."""
    import numpy as np
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)[:FIRST_VALUES]
        if value.dtype == object:
            first = [repr(v) for v in flat]
        elif value.dtype.kind in 'fc':
            first = [float(f'{v:.6g}') if value.dtype.kind == 'f' else str(v) for v in flat]
        else:
            first = flat.tolist()
        return {'type': 'array', 'dtype': str(value.dtype), 'shape': list(value.shape),
                'first': first}
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        kind = ('jpeg' if data[:2] == b'\xff\xd8' else
                'png' if data[:8] == b'\x89PNG\r\n\x1a\n' else None)
        out = {'type': 'bytes', 'len': len(data), 'first': data[:16].hex()}
        if kind:
            out['looks_like'] = kind
            out.update(_image_header(data))
        return out
    if isinstance(value, str):
        return {'type': 'str', 'len': len(value), 'value': value[:80]}
    if isinstance(value, (bool, int, float)) or value is None or isinstance(value, np.generic):
        return {'type': type(value).__name__, 'value': value.item() if isinstance(
            value, np.generic) else value}
    if isinstance(value, (list, tuple)):
        out = {'type': 'list', 'len': len(value)}
        if value:
            out['first'] = _summary(value[0])
        return out
    if isinstance(value, dict):
        text = repr(value)
        return {'type': 'dict', 'keys': [str(k) for k in value][:20],
                'value': text if len(text) <= 120 else text[:117] + '...'}
    return {'type': type(value).__name__, 'value': repr(value)[:80]}


def _image_header(data: bytes) -> dict:
    """The decoded shape of encoded image bytes, from the header alone."""
    from PIL import Image

    from .codecs import IMAGE_FORMATS
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
            w, h = img.size
            channels = len(img.getbands())
    except Exception:  # noqa: BLE001 - a summary never fails on a bad image
        return {}
    return {'image_shape': [h, w] if channels == 1 else [h, w, channels]}


def _summary_text(s: dict) -> str:
    kind = s['type']
    if kind == 'array':
        return f"{s['dtype']} array {tuple(s['shape'])}, first values {s['first']}"
    if kind == 'bytes':
        shape = 'x'.join(map(str, s.get('image_shape', ())))
        like = f" ({s['looks_like']} {shape})" if 'looks_like' in s else ''
        return f"{s['len']} bytes{like}, starting {s['first']}"
    if kind == 'str':
        return f"str of {s['len']} chars: {s['value']!r}"
    if kind == 'list':
        first = f", first: {_summary_text(s['first'])}" if 'first' in s else ''
        return f"list of {s['len']}{first}"
    if kind == 'dict':
        return f"dict {s['value']}"
    return f"{kind} {s['value']!r}"


def _inspect_mix(args) -> int:
    """``loadr inspect mix.yaml``: each source's size, weight and epochs per 10^6 samples."""
    from .config import load_config
    from .mix import Mix
    reader = load_config(args.path).build_reader()
    if not isinstance(reader, Mix):
        raise ConfigError(f'{args.path}: inspect takes a pipeline file only for a mix '
                          f'(reader: {{mix: ...}}); give the dataset path itself')
    per = 10**6
    info = {'path': args.path, 'format': 'mix', 'datapoints': len(reader),
            'source_key': reader.source_key, 'schedule': []}
    for position, _ in reader.schedule:
        weights = reader.weights_at(position)
        info['schedule'].append({'from': position, 'sources': [
            {'name': name, 'datapoints': size, 'weight': weights[name],
             'epochs_per_million': weights[name] * per / size}
            for name, size in zip(reader.names, reader.sizes)]})
    if args.json:
        _out(json.dumps(info, indent=2))
        return EXIT_OK
    _out(f'{args.path}: a mix of {len(reader.names)} sources, {len(reader)} datapoints in all')
    for part in info['schedule']:
        if len(info['schedule']) > 1:
            _out(f"  from position {part['from']}:")
        width = max(len(s['name']) for s in part['sources'])
        _out(f"  {'source':<{width}}  {'datapoints':>12}  {'weight':>8}  epochs per 10^6 samples")
        for s in part['sources']:
            _out(f"  {s['name']:<{width}}  {s['datapoints']:>12}  {s['weight']:>8.4g}  "
                 f"{s['epochs_per_million']:.4g}")
    return EXIT_OK


def cmd_inspect(args) -> int:
    """Describe a dataset and one datapoint: ``loadr inspect data/train --json``."""
    from .readers import detect
    path = args.path
    if path.endswith(('.yaml', '.yml')) and os.path.isfile(path):
        return _inspect_mix(args)
    fmt = detect(path)
    # What to show besides the datapoint is the format's to say (its reader's details()).
    reader = fmt.reader.probe(path, allow_pickle=args.allow_pickle)
    with reader:
        n = len(reader)
        extra = reader.details()
        if names_files(path):       # files named by a pattern: the reader's own
            sizes = reader._identity_files()
            size, files = sum(sizes.values()), len(sizes)
        elif is_url(path):
            size, files = _reader_size(reader)      # a URL has no disk to walk
        else:
            size, files = _disk_size(path)
        info = {'path': path, 'format': fmt.name, 'datapoints': n,
                'spec': {str(k): str(v) for k, v in reader.spec.items()},
                'size_bytes': size, 'files': files, **extra}
        if n:
            index = args.index if args.index >= 0 else n + args.index
            if not 0 <= index < n:
                raise ConfigError(f'--index {args.index} is out of range: the dataset has {n} '
                                  f'datapoints')
            dp = reader[index]
            info['datapoint'] = {'index': index,
                                 'keys': {str(k): _summary(v) for k, v in dp.items()}}
    if args.json:
        _out(json.dumps(info, indent=2, default=str))
        return EXIT_OK
    _out(f"{info['path']}: {info['format']}, {n} datapoints, {_size(size)} in {files} file(s)")
    for key in extra:
        _out(f'  {key}: {extra[key]}')
    _out('  spec: ' + ', '.join(f'{k}: {v}' for k, v in info['spec'].items()))
    if n:
        _out(f"  datapoint {info['datapoint']['index']}:")
        width = max(len(k) for k in info['datapoint']['keys'])
        for key, s in info['datapoint']['keys'].items():
            _out(f'    {key:<{width}}  {_summary_text(s)}')
    return EXIT_OK


def cmd_check(args) -> int:
    """Check datasets; exit 1 if any has a problem: ``loadr check data/train``."""
    from .check import check, write_digests
    reports = []
    for path in args.paths:
        t0 = time.perf_counter()
        report = check(path)
        reports.append(report)
        wrote = None
        if args.write_digests and report.ok:
            wrote = write_digests(path)
        if args.json:
            continue
        if report.ok:
            # Say what was checked: no checksum is promised where the format has none.
            what = (f'checked against {report.checksums}' if report.checksums else
                    f'structure and decoding only: {report.format} has no checksums; '
                    f'loadr check --write-digests records digests to check against')
            _out(f'{report.path}: {report.format}, OK: no problems ({what}; '
                 f'{time.perf_counter() - t0:.2f} s)')
        else:
            _out(str(report))
        if wrote:
            _out(f'{report.path}: wrote digests of every file and record to {wrote}')
        elif args.write_digests:
            _out(f'{report.path}: digests not written: the check found problems')
    if args.json:
        out = [{'path': r.path, 'format': r.format, 'ok': r.ok, 'checksums': r.checksums,
                'problems': [{'path': p.path, 'index': p.index, 'message': p.message}
                             for p in r.problems]} for r in reports]
        _out(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    return EXIT_OK if all(r.ok for r in reports) else EXIT_FAILED


# ---------------------------------------------------------------------------
# convert and ingest


def _list_arg(text: str | None) -> list | None:
    return [k.strip() for k in text.split(',') if k.strip()] if text else None


def cmd_convert(args) -> int:
    """Copy a dataset into another format: ``loadr convert a.ffr b --to bag``."""
    from .convert import convert, open_source, plan_conversion
    source = open_source(args.src, args.decode, allow_pickle=args.allow_pickle)
    # Each target takes the options it knows (frames, shardlen, videos_per_chunk).
    options = {'frames': args.frames, 'shardlen': args.shardlen,
               'videos_per_chunk': args.videos_per_chunk}
    plan = plan_conversion(source, args.dst, args.to, _list_arg(args.keys), **options)
    _err(f'loadr convert: {plan.describe()}')
    bar = Progress(total=len(source), unit='datapoints', label='convert')
    convert(source, args.dst, args.to, keys=_list_arg(args.keys), progress=bar, **options)
    bar.close()
    size, files = _disk_size(args.dst)
    _out(f'wrote {_plural(len(source), "datapoint")} to {args.dst} ({args.to}, {_size(size)} in '
         f'{files} file(s)) in {bar.elapsed:.2f} s')
    return EXIT_OK


def cmd_index(args) -> int:
    """Index WebDataset shards once: ``loadr index 'shards/train-{000000..000099}.tar'``."""
    from .readers.webdataset import build_index
    bar = None
    seen = [0]

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = Progress(total=total, unit='bytes', label='index')
        bar.update(done - seen[0])
        seen[0] = done
    t0 = time.perf_counter()
    built = build_index(args.path, write=True, progress=progress, rebuild=args.rebuild)
    if bar is not None:
        bar.close()
    total = sum(index.tar_size for _, index in built)
    read = sum(index.bytes_read for _, index in built)
    scanned = sum(1 for _, index in built if index.bytes_read)
    kept = sum(1 for _, index in built if index.sidecar)
    samples = sum(index.samples for _, index in built)
    members = sum(index.members for _, index in built)
    _out(f'{args.path}: {_plural(len(built), "tar")}, {_plural(samples, "sample")} of '
         f'{_plural(members, "member")}; scanned {scanned} (read {_size(read)} of '
         f'{_size(total)}, {100 * read / max(1, total):.2f}% of the bytes: the headers), '
         f'{len(built) - scanned} had a good index; {kept} sidecar(s) beside the tars '
         f'({time.perf_counter() - t0:.2f} s)')
    if kept < len(built):
        _err(f'loadr index: {len(built) - kept} index(es) could not be written beside their '
             f'tar (read-only place); loadr builds them in memory when it opens the shards')
    return EXIT_OK


SHOWN_PER_LIST = 10    # files listed per kind of change (all of them with -v)


def _listing(title: str, entries: list, verbose: bool) -> None:
    """``title`` then each entry on its own line (the first few unless verbose), to stderr."""
    if not entries:
        return
    _err(f'loadr: {title}:')
    shown = entries if verbose else entries[:SHOWN_PER_LIST]
    for entry in shown:
        _err(f'  {entry}')
    if len(shown) < len(entries):
        _err(f'  … and {len(entries) - len(shown)} more (-v lists them all)')


def _ingest_done(summary: dict, bar: Progress, verbose: bool = False) -> int:
    bar.close()
    for line in summary['skipped']:
        _err(f'loadr: skipped {line}')
    changed = summary.get('changed', [])
    _listing('stored differently from the file (what changed)',
             [f'{path}: {", ".join(what)}' for path, what in changed], verbose)
    _listing('kept as they are, but note',
             [f'{path}: {", ".join(what)}' for path, what in summary.get('notes', [])], verbose)
    _listing('not taken (not an image in a class folder)', summary.get('ignored', []), verbose)
    size, files = _disk_size(summary['out'])
    skipped = f", skipped {len(summary['skipped'])}" if summary['skipped'] else ''
    _out(f"wrote {_plural(summary['written'], 'datapoint')} "
         f"({_plural(summary['labels'], 'label')}{skipped}) to "
         f"{summary['out']} ({summary['format']}, {_size(size)}) in {bar.elapsed:.2f} s")
    if 'image_type' in summary:        # images: say what the dataset holds against the files
        parts = [f"images stored as {summary['image_type']}",
                 f"{len(changed)} changed (re-encoded, converted, shrunk or rotated)",
                 f"{len(summary['notes'])} with a note",
                 f"{_plural(len(summary['ignored']), 'file')} not taken"]
        if summary['empty_labels']:
            parts.append(f"empty labels: {', '.join(summary['empty_labels'])}")
        _out('; '.join(parts) + ('' if not (changed or summary['notes'] or summary['ignored'])
                                 else ' (listed on stderr)'))
    return EXIT_OK


def cmd_ingest_images(args) -> int:
    """Folders of images to a dataset: ``loadr ingest images photos out``."""
    from .ingest import ingest_images
    bar = Progress(unit='images', label='ingest')
    summary = ingest_images(args.dir, args.out, format=args.format, workers=args.workers,
                            short_side=args.short_side, skip_bad=args.skip_bad, progress=bar,
                            shardlen=args.shardlen, videos_per_chunk=args.videos_per_chunk,
                            image_type=args.image_type, allow_empty=args.allow_empty,
                            exif_transpose=args.exif_transpose, max_side=args.max_side)
    return _ingest_done(summary, bar, args.verbose)


def cmd_ingest_videos(args) -> int:
    """Folders of videos to a dataset: ``loadr ingest videos clips out``."""
    from .ingest import ingest_videos
    bar = Progress(unit='videos', label='ingest', sample_unit='frames')
    summary = ingest_videos(args.dir, args.out, format=args.format, workers=args.workers,
                            fps=args.fps, short_side=args.short_side, backend=args.backend,
                            skip_bad=args.skip_bad, progress=bar, shardlen=args.shardlen,
                            videos_per_chunk=args.videos_per_chunk)
    return _ingest_done(summary, bar)


def cmd_ingest_json(args) -> int:
    """A 20BN list to a dataset: ``loadr ingest json list.json videos out``."""
    from .ingest import ingest_json
    bar = Progress(unit='videos', label='ingest', sample_unit='frames')
    summary = ingest_json(args.list, args.videos, args.out, format=args.format,
                          workers=args.workers, labels=args.labels, label_field=args.label_field,
                          fps=args.fps, short_side=args.short_side, backend=args.backend,
                          skip_bad=args.skip_bad, progress=bar, shardlen=args.shardlen,
                          videos_per_chunk=args.videos_per_chunk)
    return _ingest_done(summary, bar)


# ---------------------------------------------------------------------------
# bench


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
    from .stats import format_table
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


# ---------------------------------------------------------------------------
# The parser


def _command(sub, name: str, func, help_text: str, example: str, parents):
    p = sub.add_parser(name, help=help_text, description=help_text, parents=parents,
                       epilog='Example:\n  ' + example.replace('\n', '\n  '),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=func)
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a positive int, got {text!r}') from None
    if value < 1:
        raise argparse.ArgumentTypeError(f'expected a positive int, got {text!r}')
    return value


def _ingest_options(p, default_format: str, video: bool) -> None:
    p.add_argument('--format', choices=('bag', 'gulp'), default=default_format,
                   help=f'output format (default: {default_format})')
    p.add_argument('--workers', type=int, default=None,
                   help='processes that read and encode (default: min(8, CPUs))')
    p.add_argument('--short-side', type=_positive, default=None, metavar='PX',
                   help='shrink larger images/frames to this short side (re-encoded as JPEG)')
    if video:
        p.add_argument('--fps', type=float, default=None,
                       help='frames per second to keep from video files (default: all)')
        p.add_argument('--backend', choices=('auto', 'pyav', 'ffmpeg'), default='auto',
                       help='what decodes video files (default: PyAV, else ffmpeg)')
    p.add_argument('--skip-bad', action='store_true',
                   help='leave out unreadable files (listed at the end) instead of stopping')
    p.add_argument('--shardlen', type=_positive, default=None,
                   help='bag: datapoints per shard (default: one unsharded dataset)')
    p.add_argument('--videos-per-chunk', type=_positive, default=100,
                   help='gulp: videos per chunk file (default: 100)')


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``loadr`` command."""
    # The common options go before or after the command (loadr -v check x, loadr check -v
    # x). A subcommand's defaults would overwrite what was given before it, so there they
    # default to nothing, and its --storage-option values are kept apart and added in main.
    common, common_sub = (argparse.ArgumentParser(add_help=False) for _ in range(2))
    for where, top in ((common, True), (common_sub, False)):
        where.add_argument('-v', '--verbose', action='store_true',
                           default=False if top else argparse.SUPPRESS,
                           help='show full tracebacks and info logs')
        where.add_argument('--storage-option', action='append', metavar='KEY=VALUE',
                           dest='storage_option' if top else 'storage_option_after',
                           default=[] if top else argparse.SUPPRESS,
                           help='an fsspec storage option for URLs (s3://, https://, ...), '
                                'e.g. endpoint_url=http://127.0.0.1:9000 or loadr.retries=3; '
                                'repeat for more (AWS_* variables and the credentials chain '
                                'apply too)')
    parser = argparse.ArgumentParser(
        prog='loadr', parents=[common],
        description='loadr: a deterministic, resumable, multiprocess data loader.',
        epilog='Example:\n  loadr demo\n  loadr run configs/demo.yaml -o reader.path=data/bag\n\n'
               'Exit codes: 0 ok, 1 bad data or a failed run, 2 usage or pipeline mistake, '
               '130 interrupted.\n"loadr COMMAND --help" shows each command\'s options.',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--version', action='version', version=f'loadr {__version__}')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    parents = [common_sub]

    p = _command(sub, 'demo', cmd_demo,
                 'Make a small synthetic JPEG dataset, run a real pipeline over it with '
                 'workers, and show a save/load resume giving the same batch.',
                 'loadr demo\n  loadr demo --images 256 --workers 1 --keep', parents)
    p.add_argument('--images', type=_positive, default=512, help='images to make (default 512)')
    p.add_argument('--workers', type=int, default=2, help='worker processes (default 2)')
    p.add_argument('--keep', action='store_true', help='keep the temporary dataset and YAML')

    p = _command(sub, 'run', cmd_run,
                 'Iterate a YAML pipeline with a progress bar and print a summary. Ctrl-C '
                 'stops cleanly (exit 130), saving the state when --save-state is given.',
                 'loadr run configs/imagenet_bag.yaml --steps 1000 -o loader.batch=128 '
                 '-o reader.path=/data/train --save-state state.json\n'
                 'loadr run configs/imagenet_bag.yaml --resume state.json '
                 '--save-state state.json', parents)
    p.add_argument('pipeline', nargs='?',
                   help='the pipeline YAML file (with --resume too: a state file never names '
                        'the code to run)')
    p.add_argument('--steps', type=_positive, default=None,
                   help='the goal: batches in all, counted from where the run began, also '
                        'with --resume (default: one epoch; with --resume, the saved goal)')
    p.add_argument('-o', '--override', action='append', default=[], metavar='KEY=VALUE',
                   help='change one setting, e.g. loader.batch=128, reader.path=data/x, '
                        'fns.0.size=[64,64] (value read as YAML; repeatable; with --resume, '
                        'on top of the saved ones)')
    p.add_argument('--save-state', metavar='FILE',
                   help='write the state (JSON: the loader state, the pipeline, its overrides '
                        'and the goal) here at the end or on Ctrl-C')
    p.add_argument('--resume', metavar='FILE',
                   help='go on from a state saved with --save-state: the saved overrides, to '
                        'the same goal (a saved override that names code, an import path or '
                        'unpickling, only when -o gives it again)')
    p.add_argument('--no-strict', action='store_true',
                   help='with --resume: go on from a state saved with another pipeline or '
                        "overrides anyway, from its position with its seed and order (what "
                        'differs is logged)')
    p.add_argument('--force', action='store_true',
                   help='let --save-state overwrite a state that lies ahead of this run')
    p.add_argument('--digest', action='store_true',
                   help="print each batch's stream position and sha256 to stdout")
    p.add_argument('--profile', action='store_true',
                   help='at the end (or on Ctrl-C) print where the time went: seconds per '
                        'stage (read, each fn, write, waiting) and one line of verdict')
    p.add_argument('--stats-file', metavar='PATH',
                   help="append the loader's stats (loader.stats().as_dict()) as JSON lines "
                        'to PATH, every --stats-every batches and at the end')
    p.add_argument('--stats-every', type=_positive, default=10, metavar='N',
                   help='batches between two --stats-file lines (default 10)')

    p = _command(sub, 'inspect', cmd_inspect,
                 'Show a dataset: format, datapoints, spec, size on disk, and one datapoint '
                 '(shapes, dtypes, first values).',
                 'loadr inspect data/train\n  loadr inspect train.ffr --json --index 5', parents)
    p.add_argument('path', help='a gulp directory, .ffr file or directory, or bag dataset '
                   '(or a pipeline YAML whose reader is a mix: its sources)')
    p.add_argument('--json', action='store_true', help='print JSON instead of text')
    p.add_argument('--index', type=int, default=0, help='the datapoint to show (default 0)')
    p.add_argument('--allow-pickle', action='store_true',
                   help='read a gulp directory whose .gmeta files are pickles (trusted files '
                        'only: unpickling can run code; restricted to what gulpio2 writes)')

    p = _command(sub, 'check', cmd_check,
                 'Check every file of one or more datasets: index tables, sizes, duplicate '
                 'ids, every image and frame decoded, and the bytes against checksums where '
                 'there are any (FFRecord has a CRC32 per sample; bag and gulp have none, so '
                 '--write-digests records digests beside the dataset that later checks, and '
                 'readers opened with verify=True, compare). Exit code 0 only when all are '
                 'clean; each problem names the file and the index.',
                 'loadr check data/train && echo clean\n'
                 'loadr check data/train data/val --json', parents)
    p.add_argument('paths', nargs='+', metavar='PATH',
                   help='gulp directories, .ffr files or directories, or bag datasets')
    p.add_argument('--json', action='store_true', help='print JSON instead of text')
    p.add_argument('--write-digests', action='store_true',
                   help='after a clean check, record a digest of every file and record in '
                        'PATH.loadr-digests beside the dataset (the dataset is not touched)')

    p = _command(sub, 'convert', cmd_convert,
                 'Copy a dataset into another format (images stay encoded: nothing is lost). '
                 'Refuses, saying why, where the data does not fit; the output appears only '
                 'when complete. In an FFRecord sample (a msgpack map) a numpy array is stored '
                 'as msgpack-numpy stores it, a map {nd: true, type: dtype string, kind: "", '
                 'shape, data: the C-order bytes} (a numpy scalar: {nd: false, type, data}); '
                 'loadr reads it back as an array with decode msgpack.',
                 'loadr convert data/train train.ffr --to ffrecord --keys image,label\n'
                 'loadr convert train.ffr data/train_bag --to bag --shardlen 10000', parents)
    p.add_argument('src', help='the dataset to read (any format)')
    p.add_argument('dst', help='the new dataset (must not exist; ffrecord: a .ffr file)')
    p.add_argument('--to', required=True, choices=[f.name for f in formats()],
                   help='the output format')
    p.add_argument('--keys', help='copy only these keys (comma-separated)')
    p.add_argument('--frames', help='gulp: the key holding the frames (default: the jpg[] key)')
    p.add_argument('--decode', choices=('auto', 'msgpack', 'json', 'none'), default='auto',
                   help='how FFRecord samples are read (default: auto-detect)')
    p.add_argument('--allow-pickle', action='store_true',
                   help='read a gulp directory whose .gmeta files are pickles (trusted files '
                        'only: unpickling can run code; restricted to what gulpio2 writes)')
    p.add_argument('--shardlen', type=_positive, default=None,
                   help='bag: datapoints per shard (default: one unsharded dataset)')
    p.add_argument('--videos-per-chunk', type=_positive, default=100,
                   help='gulp: videos per chunk file (default 100)')

    p = _command(sub, 'index', cmd_index,
                 'Index WebDataset shards: one pass over each tar\'s headers (the member data '
                 'is skipped), kept in a sidecar <tar>.loadr-index beside it, so that loadr '
                 'reads the samples at random. loadr.open does it too, on first open, where '
                 'the tars are local and writable.',
                 "loadr index 'shards/train-{000000..000999}.tar'\n"
                 'loadr index s3://bucket/shards --storage-option endpoint_url=http://...',
                 parents)
    p.add_argument('path', help='a .tar, a directory of them, or a pattern '
                   '(train-{000000..000999}.tar, *.tar)')
    p.add_argument('--rebuild', action='store_true',
                   help='scan every tar again, even where its sidecar is good')

    p = _command(sub, 'ingest', None,
                 'Make a dataset from folders of images or videos, or a 20BN JSON list '
                 '(in parallel, with progress).',
                 'loadr ingest images photos/ data/photos\n'
                 'loadr ingest json train.json videos/ data/ssv2 --format gulp', parents)
    ingest = p.add_subparsers(dest='what', metavar='WHAT')
    p.set_defaults(func=lambda a: _usage(p))
    q = _command(ingest, 'images', cmd_ingest_images,
                 'Images in DIR/<label>/ (the folder is the label, numbered in sorted order '
                 "as torchvision's ImageFolder) into a bag (default) or gulp dataset. Bag spec: "
                 'image jpg or png, label int, label_name utf8, path utf8. Every image stored '
                 'differently from its file, and every file not taken, is listed.',
                 'loadr ingest images photos/ data/photos --workers 4 --short-side 256',
                 parents)
    q.add_argument('dir', help='the folder with one subfolder per label')
    q.add_argument('out', help='the new dataset (must not exist)')
    _ingest_options(q, 'bag', video=False)
    q.add_argument('--image-type', choices=('auto', 'jpg', 'png'), default='auto',
                   help="bag: what the image key holds; files of that format are stored as they "
                        "are, others encoded (default auto: jpg when any file is a JPEG, else "
                        "png, lossless)")
    q.add_argument('--allow-empty', action='store_true',
                   help='accept class folders without images (their labels keep their numbers, '
                        "as torchvision's ImageFolder(allow_empty=True)); refused by default")
    q.add_argument('--exif-transpose', action='store_true',
                   help='rotate images by their EXIF orientation (re-encoding them); by default '
                        "the pixels are stored as the file has them, as ImageFolder reads them")
    q.add_argument('--max-side', type=_positive, default=None, metavar='PX',
                   help='store images whose long side is larger shrunk to this long side, '
                        're-encoded once (JPEG quality 90, or PNG) and listed: every epoch '
                        'after decodes less (default: off, images as they are)')
    q = _command(ingest, 'videos', cmd_ingest_videos,
                 'Videos in DIR/<label>/ (video files, or folders of frame JPEGs) into a gulp '
                 '(default) or bag dataset. Video files need PyAV or an ffmpeg binary.',
                 'loadr ingest videos clips/ data/clips --fps 8 --short-side 128', parents)
    q.add_argument('dir', help='the folder with one subfolder per label')
    q.add_argument('out', help='the new dataset (must not exist)')
    _ingest_options(q, 'gulp', video=True)
    q = _command(ingest, 'json', cmd_ingest_json,
                 'The videos of a 20BN-style JSON list [{"id": ..., "label": ...}] into a gulp '
                 '(default) or bag dataset; a video is VIDEOS/<id>/ (frame JPEGs) or '
                 'VIDEOS/<id>.webm/.mp4/...',
                 'loadr ingest json something-something-v2-train.json videos/ data/ssv2 '
                 '--labels something-something-v2-labels.json --label-field template', parents)
    q.add_argument('list', help='the JSON list of {"id", "label"} objects')
    q.add_argument('videos', help='the folder holding the videos')
    q.add_argument('out', help='the new dataset (must not exist)')
    q.add_argument('--labels', help='a JSON {label: index} file (default: sorted labels)')
    q.add_argument('--label-field', default='label',
                   help='the entry field holding the label (default: label)')
    _ingest_options(q, 'gulp', video=True)

    p = _command(sub, 'bench', cmd_bench,
                 'Measure a pipeline\'s throughput for each worker count; a table, and a '
                 'plot with --plot (needs matplotlib).',
                 'loadr bench configs/imagenet_bag.yaml --workers 1,2,4,8 --steps 50 '
                 '--plot bench.png', parents)
    p.add_argument('pipeline', help='the pipeline YAML file')
    p.add_argument('--workers', default='1,2,4', help='worker counts (default 1,2,4)')
    p.add_argument('--steps', type=_positive, default=20, help='timed batches per count')
    p.add_argument('--warmup', type=int, default=2, help='untimed batches first (default 2)')
    p.add_argument('-o', '--override', action='append', default=[], metavar='KEY=VALUE',
                   help='change one setting, as for run')
    p.add_argument('--plot', metavar='PNG', help='draw samples/s against workers into this file')
    return parser


def _usage(parser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _error_line(exc: BaseException) -> str:
    """One line that says what failed and where (file, index), for any exception."""
    cause = exc.__cause__
    if isinstance(exc, LoadrError):
        text = str(exc)
    else:
        text = f'{type(exc).__name__}: {exc}'
    # Up to a blank line (a traceback may follow), its lines joined: a message that
    # lists what differs, one item a line, stays whole.
    lines = [ln.strip() for ln in text.split('\n\n')[0].split('\n') if ln.strip()]
    text = ''
    for line in lines:
        line = line[2:] if line.startswith('- ') else line
        text += ('' if not text else ' ' if text.endswith((':', '.', ';')) else '; ') + line
    if isinstance(cause, WorkerError) and cause.index is not None:
        index = getattr(exc, 'index', None)
        if index is None or f'[index {index}]' not in text:
            text += f' (at dataset index {cause.index})'
    return text or type(exc).__name__


def _storage_options(pairs: list[str]) -> dict:
    """``--storage-option`` pairs as a dict; a dotted key nests, values are YAML scalars.

    >>> _storage_options(['anon=true', 'loadr.retries=3', 'endpoint_url=http://h:9000'])
    {'anon': True, 'loadr': {'retries': 3}, 'endpoint_url': 'http://h:9000'}
    """
    from .config import parse_override

    options: dict = {}
    for pair in pairs:
        key, sep, text = pair.partition('=')
        if not sep or not key:
            raise ConfigError(f'--storage-option {pair!r}: expected KEY=VALUE')
        *parents, last = key.split('.')
        where = options
        for name in parents:
            where = where.setdefault(name, {})
        # Read as an -o value is (a YAML scalar, or the text as it is), with its guards.
        try:
            where[last] = parse_override(f'{key}={text}')[1] if text else ''
        except ConfigError as exc:
            raise ConfigError(f'--storage-option {key}: {exc.message}') from None
    return options


def main(argv: list[str] | None = None) -> int:
    """Run the ``loadr`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    >>> main([])                 # no command: the usage goes to stderr, exit code 2
    2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.storage_option = args.storage_option + getattr(args, 'storage_option_after', [])
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format='%(message)s', stream=sys.stderr)
    if not getattr(args, 'func', None):
        return _usage(parser)
    try:
        with using_storage_options(_storage_options(args.storage_option) or None):
            return args.func(args)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _err('loadr: interrupted')
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (loadr inspect x | head): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - the one place that turns errors into exit codes
        if args.verbose:
            traceback.print_exc()
        _err(f'loadr: error: {_error_line(exc)}')
        if not isinstance(exc, LoadrError) and not args.verbose:
            _err('loadr: (run with -v for the traceback)')
        return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILED


if __name__ == '__main__':
    sys.exit(main())
