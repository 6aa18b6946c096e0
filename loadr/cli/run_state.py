"""``loadr run``'s state files: written and read (a run record with the loader state),
checked before one is overwritten, and what a resume may take from one (a state file
is data: a saved override that names code is applied only when given again)."""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import ConfigError

RUN_STATE_FORMAT = 'loadr run state'   # marks a state file written by `loadr run`


def write_state(path: str, state: dict) -> None:
    """Write ``state`` (JSON) to ``path`` whole or not at all: a temporary file beside it,
    renamed over it."""
    from ..storage import staging
    staging.reclaim(path)
    tmp = staging.make(path)
    with open(tmp, 'w', encoding='utf-8') as f:
        json.dump(state, f)
        f.write('\n')
    os.replace(tmp, path)


def read_state(path: str) -> tuple[dict, dict | None]:
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


def check_overwrite(path: str, resume: str | None, start: int, force: bool,
                     pipeline: str) -> None:
    """Refuse to replace a state file that is not one, or that lies ahead of this run."""
    if force or not os.path.lexists(path):
        return
    if resume is not None and os.path.exists(resume) and os.path.samefile(path, resume):
        return                         # going on from it: it is this run's own state
    hint = 'pass --force to overwrite it'
    try:
        state, _ = read_state(path)
    except ConfigError as exc:
        raise ConfigError(f'--save-state would overwrite a file that is not a readable loadr '
                          f'state ({exc.message}); pick another file or {hint}', path) from exc
    ahead = _position(state)
    if ahead is not None and ahead > start:
        raise ConfigError(f'--save-state would overwrite a state saved at position {ahead}, '
                          f'ahead of where this run starts ({start}): go on from it with  '
                          f'{resume_command(pipeline, path)}  or {hint}', path)


def quoted(text: str) -> str:
    """``text`` quoted for a shell command line."""
    import shlex
    return shlex.quote(str(text))


def resume_command(pipeline: str, state: str) -> str:
    """The command that goes on from ``state`` and saves to it again: without
    ``--save-state`` the resumed run's own Ctrl-C would save nothing."""
    return (f'loadr run {quoted(pipeline)} --resume {quoted(state)} '
            f'--save-state {quoted(state)}')


def names_code(override: str) -> bool:
    """Whether an ``-o KEY=VALUE`` text names code: an import path anywhere in its value
    (a fn, a ``decode`` callable), or unpickling (``decode: pickle``, ``allow_pickle``)."""
    from ..config import parse_override
    key, value = parse_override(override)
    last = key.replace('__', '.').split('.')[-1]
    stack: list[Any] = [{last: value}]
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


def refused_state(exc, args) -> str:
    """The loader's refusal of a state, told as the command line's options say it."""
    lines = exc.message.split('\n')
    diffs = [line.strip()[2:] for line in lines if line.strip().startswith('- ')]
    if not diffs:
        return exc.message.replace('call load(state, strict=False)', 'pass --no-strict')
    return ('the state does not belong to this pipeline:\n  - ' + '\n  - '.join(diffs)
            + '\nRun the pipeline, with the overrides, it was saved with; or pass --no-strict '
              "to go on from the state's position with its seed and order anyway; or start "
              'a new run without --resume.')


def same_dir(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are the same directory (or file); where one is gone, whether
    they are the same absolute path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


same_file = same_dir       # samefile, or the same absolute path where one is gone
