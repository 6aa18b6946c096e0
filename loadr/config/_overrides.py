"""Overrides: ``-o key=value`` text read as YAML, and a pipeline's values changed by dotted
key (``loader.batch``, ``fns.0.size``, ``fns.flip.p``)."""

from __future__ import annotations

import os
from typing import Any

import yaml

from ..errors import ConfigError
from ._document import Document
from ._schema import SECTIONS, did_you_mean, fn_name
from ._yaml_guard import TooBig, YamlMap, YamlSeq, load_value


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
        value = load_value(raw) if raw.strip() else None
    except TooBig as big:
        raise ConfigError(f'override {key!r}: the value is not a setting: {big.message}'
                          ) from None
    except yaml.YAMLError:
        value = raw           # not YAML (e.g. an odd path): take the text as it is
    return key, value


class Overrides:
    """Values of a :class:`Document` changed by dotted key: each one set in its ``data``
    and recorded in its ``overridden``, so that its errors and its relative paths are
    told from where the override was given, not from the file."""

    def __init__(self, document: Document):
        self.doc = document

    def apply(self, key: str, value: Any, cwd: str | os.PathLike | None = None) -> None:
        """Set one value by dotted key (``'loader.batch'``, ``'fns.0.size'``, ``'fns.flip.p'``).

        A section name alone with a mapping (``'loader', {'batch': 8}``) merges it.
        A relative path in ``value`` is relative to ``cwd`` (default: the
        current directory), not to the file.
        """
        doc = self.doc
        cwd = os.path.abspath(cwd) if cwd is not None else os.getcwd()
        parts = [p for p in key.replace('__', '.').split('.')]
        if not all(parts):
            raise ConfigError(f'bad override key {key!r}: use section.key, e.g. loader.batch')
        section = parts[0]
        if section not in SECTIONS:
            raise ConfigError(f'override {key!r}: unknown section {section!r}: '
                              f'{did_you_mean(section, SECTIONS)}', doc.path)
        if not isinstance(doc.data, dict):
            return        # the top level is wrong; build() says so
        if len(parts) == 1:
            if section != 'fns' and isinstance(value, dict) and isinstance(
                    doc.data.get(section), dict):
                for k, v in value.items():
                    self.apply(f'{section}.{k}', v, cwd)
                return
            doc.data[section] = value
            doc.overridden[(section,)] = cwd
            return
        if section == 'fns':
            self._apply_to_fn(key, parts[1:], value, cwd)
            return
        target = doc.data.get(section)
        if target is None:
            target = doc.data[section] = YamlMap()
        if not isinstance(target, dict):
            raise doc.error(f'override {key!r}: section {section!r} is not a mapping', (section,))
        for p in parts[1:-1]:
            if not isinstance(target.get(p), dict):
                target[p] = YamlMap()
            target = target[p]
        target[parts[-1]] = value
        doc.overridden[tuple(parts)] = cwd

    def _apply_to_fn(self, key: str, parts: list, value: Any, cwd: str) -> None:
        doc = self.doc
        entries = doc.data.get('fns')
        if not isinstance(entries, list):
            raise doc.error(f'override {key!r}: there is no fns list to change', ('fns',))
        which = parts[0]
        if which.lstrip('-').isdigit():
            position = int(which)
            if not -len(entries) <= position < len(entries):
                raise ConfigError(f'override {key!r}: there are {len(entries)} fns, no fn '
                                  f'{position}', doc.path)
            position %= len(entries)
        else:
            names = [fn_name(e) for e in entries]
            hits = [i for i, n in enumerate(names) if n == which]
            if not hits:
                raise ConfigError(f'override {key!r}: no fn named {which!r} in fns: '
                                  f'{did_you_mean(which, [n for n in names if n])}', doc.path)
            if len(hits) > 1:
                raise ConfigError(f'override {key!r}: fn {which!r} appears {len(hits)} times; '
                                  f'name it by position (fns.{hits[0]}.…)', doc.path)
            position = hits[0]
        entry = entries[position]
        name = fn_name(entry)
        if name is None:
            raise doc.error(f'override {key!r}: fn {position} is not a name or '
                            f'{{name: args}}', ('fns', position))
        if len(parts) == 1:                   # fns.0=<args> replaces the arguments
            args = value
        else:
            args = entry[name] if isinstance(entry, dict) else None
            args = YamlMap(args) if isinstance(args, dict) else YamlMap()
            if isinstance(entry, dict) and isinstance(entry[name], YamlMap):
                args.lines = dict(entry[name].lines)
            args[parts[1]] = value
            doc.overridden[('fns', position, name, parts[1])] = cwd
        new = YamlMap({name: args})
        new.lines = getattr(entry, 'lines', {}) if isinstance(entry, dict) else {}
        if isinstance(entries, YamlSeq):
            new.line = entries.lines[position]
        entries[position] = new
        if len(parts) == 1:
            doc.overridden[('fns', position)] = cwd
