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

import logging
import os
import signal
import sys
import traceback

from ..errors import ConfigError, LoadrError, WorkerError
from ..workers.protocol import SKIP_SETTING
from .common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, print_err
from .parser import build_parser, usage

__all__ = ['main', 'build_parser']


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
        if (index is None or f'[index {index}]' not in text) \
                and f'dataset index {cause.index}' not in text:
            text += f' (at dataset index {cause.index})'
    # The hint that skipping exists, in a pipeline's words.
    text = text.replace(SKIP_SETTING, 'on_error: skip (in the loader section)')
    return text or type(exc).__name__


def _storage_options(pairs: list[str]) -> dict:
    """``--storage-option`` pairs as a dict; a dotted key nests, values are YAML scalars.

    >>> _storage_options(['anon=true', 'loadr.retries=3', 'endpoint_url=http://h:9000'])
    {'anon': True, 'loadr': {'retries': 3}, 'endpoint_url': 'http://h:9000'}
    """
    from ..config import parse_override

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
        return usage(parser)
    try:
        # Given to each command's opens explicitly (storage_options_of, load_config).
        args.storage_options = _storage_options(args.storage_option) or None
        return args.func(args)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print_err('loadr: interrupted')
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (loadr inspect x | head): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - the one place that turns errors into exit codes
        if args.verbose:
            traceback.print_exc()
        print_err(f'loadr: error: {_error_line(exc)}')
        if not isinstance(exc, LoadrError) and not args.verbose:
            print_err('loadr: (run with -v for the traceback)')
        return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILED
