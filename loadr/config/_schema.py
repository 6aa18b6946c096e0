"""What a pipeline file may hold: its sections, the Loader keys with the YAML types each
takes, and the words a mistake is told in (``did you mean 'batch'?``, ``a list``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

SECTIONS = ('reader', 'fns', 'loader')


# The Loader arguments a pipeline may set, with the YAML types each accepts
# (tests/test_config.py keeps this in step with Loader's signature).
LOADER_TYPES: dict[str, tuple[str, ...]] = {
    'batch': ('int',),
    'shuffle': ('bool',),
    'seed': ('int',),
    'workers': ('int', 'str', 'null'),       # 'auto'
    'prefetch': ('int', 'str', 'null'),      # 'auto'
    'shard_id': ('int',),
    'num_shards': ('int',),
    'spec': ('mapping', 'null'),
    'ring': ('bool',),
    'on_error': ('str',),
    'max_error_fraction': ('number',),
    'timeout': ('number', 'null'),
    'start_method': ('str', 'null'),
    'order_version': ('int', 'null'),
    'stats_every': ('int', 'null'),
    'on_stats': ('null',),                   # a callback: from Python only
    'trace': ('null',),                      # from Python, or `loadr run/bench --trace PATH`
    'remote': ('mapping', 'null'),           # {engine: ray | subprocesses, ...}: the engine's args
}


REQUIRED_LOADER_KEYS = ('batch',)


# Built-in fn arguments that name a file, resolved like reader.path.
PATH_ARGS = {('label_to_index', 'mapping')}


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """``did you mean 'batch'?`` for the closest of ``choices``, or all of them.

    >>> did_you_mean('bach', ['batch', 'seed']), did_you_mean('x', ['batch', 'seed'])
    ("did you mean 'batch'?", 'expected one of: batch, seed')
    """
    choices = list(choices)
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    if close:
        return f'did you mean {close[0]!r}?'
    return f"expected one of: {', '.join(map(str, choices))}"


def kind_of(value: object) -> str:
    """How a YAML value reads to its author: 'a list', 'a string', ..."""
    for types, name in ((bool, 'a boolean'), (dict, 'a mapping'), (list, 'a list'),
                        (str, 'a string'), (int, 'an int'), (float, 'a number')):
        if isinstance(value, types):
            return name
    return 'null' if value is None else type(value).__name__


def is_kind(value: object, kind: str) -> bool:
    """Whether ``value`` is of the YAML ``kind`` (``LOADER_TYPES``' words: ``'int'``,
    ``'bool'``, ``'null'``, ``'str'``, ``'number'``, ``'mapping'``); a bool is no int."""
    if kind == 'null':
        return value is None
    if kind == 'bool':
        return isinstance(value, bool)
    if kind == 'int':
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == 'number':
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == 'str':
        return isinstance(value, str)
    return isinstance(value, dict)


def fn_name(entry: object) -> str | None:
    """The name of an ``fns`` entry (``flip``, or ``{name: args}``), or None if it is neither."""
    if isinstance(entry, str) and entry:
        return entry
    if isinstance(entry, dict) and len(entry) == 1:
        name = next(iter(entry))
        if isinstance(name, str) and name:
            return name
    return None
