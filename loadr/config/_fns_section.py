"""The ``fns`` section: each entry a built-in by short name or a factory by import path,
its arguments checked against the factory's signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .. import fns as fns_module
from ..errors import ConfigError
from ._document import Document
from ._schema import PATH_ARGS, did_you_mean, fn_name, kind_of
from ._yaml_guard import plain


class FnsSection:
    """The ``fns`` section of a :class:`Document`: its transforms, made (:meth:`build`); and
    one entry made anywhere in the document (:meth:`entry`: a mix source's ``fns`` too)."""

    def __init__(self, document: Document):
        self.doc = document

    def build(self) -> list[Callable]:
        """The transforms of the ``fns`` section, in order."""
        entries = self.doc.data.get('fns')
        if entries is None:
            return []
        if not isinstance(entries, list):
            raise self.doc.error(f'fns must be a list (lines starting with "- "), got '
                                 f'{kind_of(entries)}', ('fns',))
        return [self.entry(i, entry) for i, entry in enumerate(entries)]

    def entry(self, i: int, entry: Any, keys: tuple | None = None) -> Callable:
        """The transform that ``entry``, the ``i``-th of its list, makes; ``keys`` is its
        key path (default ``('fns', i)``), for the errors."""
        keys = ('fns', i) if keys is None else keys     # a mix source's fns: its own keys
        name = fn_name(entry)
        if name is None:
            raise self.doc.error(f'fn {i} must be a name or a one-key mapping '
                                 f'{{name: {{args}}}}, got {entry!r}', keys)
        factory = self._resolve(name, keys)
        raw_args = entry[name] if isinstance(entry, dict) else None
        builtin = name in fns_module.REGISTRY
        if not builtin and raw_args is None:
            if inspect.isclass(factory):
                return self._call(name, factory, (), {}, keys)
            return factory
        args: tuple
        kwargs: dict[str, Any]
        if raw_args is None:
            args, kwargs = (), {}
        elif isinstance(raw_args, dict):
            args, kwargs = (), {str(k): v for k, v in raw_args.items()}
            self._check_kwargs(name, factory, kwargs, keys + (name,))
            for key in list(kwargs):
                if (name, key) in PATH_ARGS and isinstance(kwargs[key], str):
                    kwargs[key] = self.doc.resolve_path(kwargs[key], keys + (name, key))
        else:
            args, kwargs = (raw_args,), {}
        return self._call(name, factory, tuple(plain(a) for a in args), plain(kwargs), keys)

    def _resolve(self, name: str, keys: tuple):
        if name in fns_module.REGISTRY:
            return fns_module.REGISTRY[name]
        if ':' not in name:
            raise self.doc.error(f'unknown fn {name!r}', keys,
                                 did_you_mean(name, fns_module.REGISTRY) + " (or an import path "
                                 "'package.module:function')")
        try:
            return fns_module.resolve(name, self.doc.import_dirs())
        except ConfigError as exc:
            detail = exc.message
            if detail.startswith(f'fn {name!r}: '):
                detail = detail[len(f'fn {name!r}: '):]
            raise self.doc.error(f'fn {name!r} not found', keys, detail) from exc

    def _check_kwargs(self, name: str, factory, kwargs: dict, keys: tuple) -> None:
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            return             # a builtin without a signature: let the call decide
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return
        accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                 p.KEYWORD_ONLY)]
        for key in kwargs:
            if key not in accepted:
                hint = did_you_mean(key, accepted) if accepted else 'it takes no arguments'
                raise self.doc.error(f'unknown argument {key!r} for fn {name!r}', keys + (key,),
                                     hint)

    def _call(self, name: str, factory, args: tuple, kwargs: dict, keys: tuple):
        try:
            fn = factory(*args, **kwargs)
        except ConfigError as exc:
            raise self.doc.error(f'fn {name!r}', keys, exc.message) from exc
        except (TypeError, ValueError) as exc:
            raise self.doc.error(f'fn {name!r}', keys, f'{type(exc).__name__}: {exc}') from exc
        if not callable(fn):
            raise self.doc.error(f'fn {name!r} made a {type(fn).__name__}, not a callable '
                                 f'transform', keys,
                                 'a factory must return fn(datapoint, seed) -> datapoint')
        return fn
