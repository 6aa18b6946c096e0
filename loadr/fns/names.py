"""Names: the built-ins' :data:`REGISTRY` and :func:`resolve`, which turns a short name
or an import path from YAML into a factory."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable

from ..errors import ConfigError
from .base import Fn
from .geometry import center_crop, flip, random_crop, random_resized_crop, resize
from .jpeg import decode_jpeg
from .labels import label_to_index, one_hot
from .structure import pad_sequence, rename, select, truncate
from .values import normalize, to_float
from .video import sample_frames

# ---------------------------------------------------------------------------
# Names


REGISTRY: dict[str, Callable[..., Fn]] = {fn.__name__: fn for fn in (
    decode_jpeg, resize, center_crop, random_crop, random_resized_crop, flip, normalize,
    to_float, sample_frames, label_to_index, one_hot, select, rename, pad_sequence, truncate,
)}


def resolve(name: str, search=()) -> Callable:
    """The factory for a short name (``'flip'``) or an import path (``'pkg.module:function'``).

    The path is imported with importlib (never evaluated); an unknown name
    or a path that does not import is a ConfigError naming it. ``search``
    lists folders to look in first (a pipeline gives its YAML file's folder
    and the current directory): see :func:`_import_module`.

    >>> resolve('flip')(p=1.0)
    flip(key='image', p=1.0)
    """
    if not isinstance(name, str):
        raise ConfigError(f'a fn name must be a string, got {type(name).__name__}')
    if name in REGISTRY:
        return REGISTRY[name]
    if ':' not in name:
        close = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f'; did you mean {close[0]!r}?' if close else '.'
        raise ConfigError(f"unknown fn {name!r}{hint} Built-ins: {', '.join(REGISTRY)}; or give an "
                          f"import path 'package.module:function'")
    module_name, _, attr = name.partition(':')
    parts = module_name.split('.') + attr.split('.')
    if not all(p.isidentifier() for p in parts):
        raise ConfigError(f"fn {name!r} is not an import path 'package.module:function'")
    try:
        obj = _import_module(module_name, search)
    except Exception as exc:  # the user's module may fail to import in any way
        looked = ''
        if isinstance(exc, ImportError) and search:
            folders = ', '.join(dict.fromkeys(os.path.abspath(d) for d in search))
            looked = (f' (looked in {folders} and on sys.path; set PYTHONPATH for a module '
                      f'elsewhere)')
        raise ConfigError(f'fn {name!r}: cannot import {module_name!r}: '
                          f'{type(exc).__name__}: {exc}{looked}') from exc
    for part in attr.split('.'):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f'fn {name!r}: {module_name!r} has no {attr!r}') from None
    if not callable(obj):
        raise ConfigError(f'fn {name!r} is a {type(obj).__name__}, not something callable')
    return obj


def _import_module(module_name: str, search=()):
    """``importlib.import_module(module_name)``, looking in the ``search`` folders first.

    The folders go on ``sys.path`` only while importing. A folder the module
    was found in stays at the end of ``sys.path`` afterwards, where it
    shadows nothing: the module's own later imports, and worker processes
    started by spawn (which copy ``sys.path``), must find it again.

    >>> _import_module("json").__name__
    'json'
    """
    on_path = {os.path.abspath(p or os.curdir) for p in sys.path}
    extra = [d for d in dict.fromkeys(os.path.abspath(d) for d in search) if d not in on_path]
    if not extra:
        return importlib.import_module(module_name)
    sys.path[:0] = extra
    try:
        module = importlib.import_module(module_name)
    finally:
        for folder in extra:
            sys.path.remove(folder)
    top = sys.modules.get(module_name.partition('.')[0], module)
    files = [getattr(top, '__file__', None), *getattr(top, '__path__', ())]
    for folder in extra:
        if any(f and os.path.abspath(f).startswith(folder + os.sep) for f in files):
            sys.path.append(folder)
    return module
