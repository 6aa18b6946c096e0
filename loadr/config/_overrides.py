"""Overrides: ``-o key=value`` text read as YAML, and a pipeline's values changed by dotted
key (``loader.batch``, ``fns.0.size``, ``fns.flip.p``)."""

from __future__ import annotations

import os
from typing import Any

import yaml

from ..errors import ConfigError
from ._schema import SECTIONS, _did_you_mean, _fn_name
from ._yaml_guard import _load_value, _Map, _Seq, _TooBig


def parse_override(text: str) -> tuple[str, Any]:
    """``'loader.batch=128'`` -> ``('loader.batch', 128)``; the value is read as YAML.

    >>> parse_override('fns.0.size=[64, 64]')
    ('fns.0.size', [64, 64])
    """
    key, sep, raw = text.partition('=')
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f'an override is key=value, e.g. loader.batch=128; got {text!r}')
    try:
        value = _load_value(raw) if raw.strip() else None
    except _TooBig as big:
        raise ConfigError(f'override {key!r}: the value is not a setting: {big.message}'
                          ) from None
    except yaml.YAMLError:
        value = raw           # not YAML (e.g. an odd path): take the text as it is
    return key, value


class _Overrides:
    """:class:`~loadr.config.Config`'s overrides (a part of it: uses its ``data``, ``path``,
    ``overridden`` and ``error``)."""

    def override(self, key: str, value, cwd: str | os.PathLike | None = None) -> None:
        """Set one value by dotted key (``'loader.batch'``, ``'fns.0.size'``, ``'fns.flip.p'``).

        A section name alone with a mapping (``'loader', {'batch': 8}``) merges it.
        A relative path in ``value`` is relative to ``cwd`` (default: the
        current directory), not to the file.
        """
        cwd = os.path.abspath(cwd) if cwd is not None else os.getcwd()
        parts = [p for p in key.replace('__', '.').split('.')]
        if not all(parts):
            raise ConfigError(f'bad override key {key!r}: use section.key, e.g. loader.batch')
        section = parts[0]
        if section not in SECTIONS:
            raise ConfigError(f'override {key!r}: unknown section {section!r}: '
                              f'{_did_you_mean(section, SECTIONS)}', self.path)
        if not isinstance(self.data, dict):
            return        # the top level is wrong; build() says so
        if len(parts) == 1:
            if section != 'fns' and isinstance(value, dict) and isinstance(
                    self.data.get(section), dict):
                for k, v in value.items():
                    self.override(f'{section}.{k}', v, cwd)
                return
            self.data[section] = value
            self.overridden[(section,)] = cwd
            return
        if section == 'fns':
            self._override_fn(key, parts[1:], value, cwd)
            return
        target = self.data.get(section)
        if target is None:
            target = self.data[section] = _Map()
        if not isinstance(target, dict):
            raise self.error(f'override {key!r}: section {section!r} is not a mapping', (section,))
        for p in parts[1:-1]:
            if not isinstance(target.get(p), dict):
                target[p] = _Map()
            target = target[p]
        target[parts[-1]] = value
        self.overridden[tuple(parts)] = cwd

    def _override_fn(self, key: str, parts: list, value, cwd: str) -> None:
        entries = self.data.get('fns')
        if not isinstance(entries, list):
            raise self.error(f'override {key!r}: there is no fns list to change', ('fns',))
        which = parts[0]
        if which.lstrip('-').isdigit():
            position = int(which)
            if not -len(entries) <= position < len(entries):
                raise ConfigError(f'override {key!r}: there are {len(entries)} fns, no fn '
                                  f'{position}', self.path)
            position %= len(entries)
        else:
            names = [_fn_name(e) for e in entries]
            hits = [i for i, n in enumerate(names) if n == which]
            if not hits:
                raise ConfigError(f'override {key!r}: no fn named {which!r} in fns: '
                                  f'{_did_you_mean(which, [n for n in names if n])}', self.path)
            if len(hits) > 1:
                raise ConfigError(f'override {key!r}: fn {which!r} appears {len(hits)} times; '
                                  f'name it by position (fns.{hits[0]}.…)', self.path)
            position = hits[0]
        entry = entries[position]
        name = _fn_name(entry)
        if name is None:
            raise self.error(f'override {key!r}: fn {position} is not a name or '
                             f'{{name: args}}', ('fns', position))
        if len(parts) == 1:                   # fns.0=<args> replaces the arguments
            args = value
        else:
            args = entry[name] if isinstance(entry, dict) else None
            args = _Map(args) if isinstance(args, dict) else _Map()
            if isinstance(entry, dict) and isinstance(entry[name], _Map):
                args.lines = dict(entry[name].lines)
            args[parts[1]] = value
            self.overridden[('fns', position, name, parts[1])] = cwd
        new = _Map({name: args})
        new.lines = getattr(entry, 'lines', {}) if isinstance(entry, dict) else {}
        if isinstance(entries, _Seq):
            new.line = entries.lines[position]
        entries[position] = new
        if len(parts) == 1:
            self.overridden[('fns', position)] = cwd
