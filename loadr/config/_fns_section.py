"""The ``fns`` section: each entry a built-in by short name or a factory by import path,
its arguments checked against the factory's signature."""

from __future__ import annotations

import inspect
import os

from .. import fns as fns_module
from ..errors import ConfigError
from ._schema import _PATH_ARGS, _did_you_mean, _fn_name, _kind
from ._yaml_guard import _plain


class _FnsSection:
    """:class:`~loadr.config.Config`'s ``fns`` section (a part of it: uses its ``error``,
    ``_path`` and ``base_dir``)."""

    def build_fns(self) -> list:
        """The transforms of the ``fns`` section, in order."""
        entries = self.data.get('fns')
        if entries is None:
            return []
        if not isinstance(entries, list):
            raise self.error(f'fns must be a list (lines starting with "- "), got '
                             f'{_kind(entries)}', ('fns',))
        return [self._fn(i, entry) for i, entry in enumerate(entries)]

    def _fn(self, i: int, entry, keys: tuple | None = None):
        keys = ('fns', i) if keys is None else keys     # a mix source's fns: its own keys
        name = _fn_name(entry)
        if name is None:
            raise self.error(f'fn {i} must be a name or a one-key mapping {{name: {{args}}}}, '
                             f'got {entry!r}', keys)
        factory = self._resolve(name, keys)
        raw_args = entry[name] if isinstance(entry, dict) else None
        builtin = name in fns_module.REGISTRY
        if not builtin and raw_args is None:
            if inspect.isclass(factory):
                return self._call(name, factory, (), {}, keys)
            return factory
        if raw_args is None:
            args, kwargs = (), {}
        elif isinstance(raw_args, dict):
            args, kwargs = (), {str(k): v for k, v in raw_args.items()}
            self._check_kwargs(name, factory, kwargs, keys + (name,))
            for key in list(kwargs):
                if (name, key) in _PATH_ARGS and isinstance(kwargs[key], str):
                    kwargs[key] = self._path(kwargs[key], keys + (name, key))
        else:
            args, kwargs = (raw_args,), {}
        return self._call(name, factory, tuple(_plain(a) for a in args), _plain(kwargs), keys)

    def _resolve(self, name: str, keys: tuple):
        if name in fns_module.REGISTRY:
            return fns_module.REGISTRY[name]
        if ':' not in name:
            raise self.error(f'unknown fn {name!r}', keys,
                             _did_you_mean(name, fns_module.REGISTRY) + " (or an import path "
                             "'package.module:function')")
        try:
            return fns_module.resolve(name, self.import_dirs())
        except ConfigError as exc:
            detail = exc.message
            if detail.startswith(f'fn {name!r}: '):
                detail = detail[len(f'fn {name!r}: '):]
            raise self.error(f'fn {name!r} not found', keys, detail) from exc

    def import_dirs(self) -> list[str]:
        """Where fns given by import path are looked for first: the file's folder, the cwd.

        So ``- myaug:jitter`` finds ``myaug.py`` beside the YAML file (or in the
        current directory) without PYTHONPATH, under ``loadr run`` too.
        """
        return [self.base_dir, os.getcwd()]

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
                hint = _did_you_mean(key, accepted) if accepted else 'it takes no arguments'
                raise self.error(f'unknown argument {key!r} for fn {name!r}', keys + (key,), hint)

    def _call(self, name: str, factory, args: tuple, kwargs: dict, keys: tuple):
        try:
            fn = factory(*args, **kwargs)
        except ConfigError as exc:
            raise self.error(f'fn {name!r}', keys, exc.message) from exc
        except (TypeError, ValueError) as exc:
            raise self.error(f'fn {name!r}', keys, f'{type(exc).__name__}: {exc}') from exc
        if not callable(fn):
            raise self.error(f'fn {name!r} made a {type(fn).__name__}, not a callable transform',
                             keys, 'a factory must return fn(datapoint, seed) -> datapoint')
        return fn
