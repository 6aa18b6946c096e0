"""Reading the small JSON files users hand us (label maps, 20BN lists), with errors that say which.

Example::

    table = read_json('labels.json', 'the label list', dict, '{label: index}')
"""

from __future__ import annotations

import json

from .errors import ConfigError

__all__ = ['read_json']


def read_json(path, what: str, kind: type, shape: str):
    """The JSON value of ``path``, which must be a ``kind`` (dict or list); else a
    ConfigError naming the file and ``what`` it was meant to be.

    >>> read_json('missing.json', 'the label list', dict, '{label: index}')
    Traceback (most recent call last):
        ...
    loadr.errors.ConfigError: missing.json: cannot read the label list: No such file or directory
    """
    try:
        with open(path, encoding='utf-8') as f:
            value = json.load(f)
    except OSError as exc:
        raise ConfigError(f'cannot read {what}: {exc.strerror or exc}', path) from exc
    except ValueError as exc:
        raise ConfigError(f'{what} is not valid JSON: {exc}', path) from exc
    if not isinstance(value, kind):
        noun = 'object' if kind is dict else 'array'
        raise ConfigError(f'{what} must be a JSON {noun} {shape}, got {type(value).__name__}',
                          path)
    return value
