"""What a pipeline file may hold: its sections, the Loader keys with the YAML types each
takes, and the words a mistake is told in (``did you mean 'batch'?``, ``a list``)."""

from __future__ import annotations

import difflib


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


_REQUIRED_LOADER_KEYS = ('batch',)


# Built-in fn arguments that name a file, resolved like reader.path.
_PATH_ARGS = {('label_to_index', 'mapping')}


def _did_you_mean(word, choices) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    if close:
        return f'did you mean {close[0]!r}?'
    return f"expected one of: {', '.join(map(str, choices))}"


def _kind(value) -> str:
    """How a YAML value reads to its author: 'a list', 'a string', ..."""
    for types, name in ((bool, 'a boolean'), (dict, 'a mapping'), (list, 'a list'),
                        (str, 'a string'), (int, 'an int'), (float, 'a number')):
        if isinstance(value, types):
            return name
    return 'null' if value is None else type(value).__name__


def _is_kind(value, kind: str) -> bool:
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


def _fn_name(entry) -> str | None:
    if isinstance(entry, str) and entry:
        return entry
    if isinstance(entry, dict) and len(entry) == 1:
        name = next(iter(entry))
        if isinstance(name, str) and name:
            return name
    return None
