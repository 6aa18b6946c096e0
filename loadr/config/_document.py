"""The parsed pipeline as every section reads it: :class:`Document`, the mapping with its
lines, the file it came from, and which values an override set."""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError
from ..storage import is_url
from ._schema import kind_of
from ._yaml_guard import YamlMap, YamlSeq, pattern_in_mapping


class Document:
    """A pipeline's mapping and where it came from: what the sections are built from.

    ``data`` is the mapping as read (line numbers kept), ``path`` the YAML
    file (None for a dict), ``base_dir`` what relative paths in the file are
    relative to, and ``overridden`` the key paths an override set, each with
    the directory its relative paths are relative to (the current directory
    when it was given). A mistake anywhere in it is told by :meth:`error`.
    """

    def __init__(self, data: Any, path: str | None = None, base_dir: str | None = None):
        self.path = path
        self.base_dir: str = base_dir if base_dir is not None else (
            os.path.dirname(os.path.abspath(path)) if path is not None else os.getcwd())
        self.data: Any = YamlMap() if data is None else data
        self.overridden: dict[tuple, str] = {}

    # -- errors ----------------------------------------------------------

    def _line(self, keys: tuple) -> int | None:
        """The line of the value at the key path ``keys`` (or of the nearest one above it
        that the file spells out); None for a dict."""
        node, line = self.data, getattr(self.data, 'line', None)
        for k in keys:
            if isinstance(node, YamlMap) and k in node:
                line = node.lines.get(k, line)
                node = node[k]
            elif isinstance(node, YamlSeq) and isinstance(k, int) and 0 <= k < len(node):
                line = node.lines[k]
                node = node[k]
            else:
                break
        return line

    def _where(self, keys: tuple) -> tuple[str | None, int | None]:
        """``(words, line)``: where the value at ``keys`` came from (``'line 9'``, ``'from
        the override loader.batch'``), and its line in the file (None if not from it)."""
        for n in range(len(keys), 0, -1):
            if keys[:n] in self.overridden:
                dotted = '.'.join(map(str, keys[:n]))
                return f'from the override {dotted}', None
        line = self._line(keys)
        return (None if line is None else f'line {line}'), line

    def error(self, message: str, keys: tuple | None = (), hint: str | None = None
              ) -> ConfigError:
        """A ConfigError: ``'<message> (line N): <hint>'`` with ``.path`` and ``.line``.

        ``keys`` is the key path the mistake is at (None: nowhere in particular).
        """
        where, line = self._where(keys) if keys is not None else (None, None)
        if where is not None:
            message = f'{message} ({where})'
        err = ConfigError(message + (f': {hint}' if hint else ''), self.path)
        err.line = line
        return err

    # -- reading ---------------------------------------------------------

    def resolve_path(self, value: Any, keys: tuple) -> str:
        """The path ``value`` (at ``keys``) names: a URL as it is; a relative one joined to
        the file's folder, or to the directory its override was given in."""
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            pattern = pattern_in_mapping(value)
            raise self.error(f'{".".join(map(str, keys))} must be a path, got {value!r}', keys,
                             None if pattern is None else
                             f"YAML reads an unquoted {pattern} as a mapping: quote the "
                             f"pattern, '{pattern}'")
        if is_url(value):
            return os.fspath(value)        # s3://, https://: not relative to this file
        value = os.path.expanduser(os.fspath(value))
        base = self.base_dir
        for n in range(len(keys), 0, -1):
            if keys[:n] in self.overridden:
                base = self.overridden[keys[:n]]
                break
        return os.path.normpath(os.path.join(base, value))

    def section(self, name: str, required: bool) -> dict:
        """The top-level section ``name`` (a mapping; empty when missing and not
        ``required``)."""
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(f'missing section {name!r}', None)
            return YamlMap()
        if not isinstance(value, dict):
            raise self.error(f'{name} must be a mapping (key: value lines), got '
                             f'{kind_of(value)} {value!r}', (name,))
        return value

    def import_dirs(self) -> list[str]:
        """Where fns given by import path are looked for first: the file's folder, the cwd.

        So ``- myaug:jitter`` finds ``myaug.py`` beside the YAML file (or in the
        current directory) without PYTHONPATH, under ``loadr run`` too.
        """
        return [self.base_dir, os.getcwd()]
