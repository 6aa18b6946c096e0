"""YAML with line numbers and guards: every YAML a pipeline is read from goes through here.

The loaders are ``yaml.SafeLoader`` subclasses (no ``!!python`` tags) that
refuse a document nested too deeply or expanded by aliases (a YAML bomb),
and remember the line of each mapping key and list item for the errors.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..errors import ConfigError


class YamlMap(dict):
    """A YAML mapping that remembers its line and the line of each key."""

    line: int | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: dict = {}


class YamlSeq(list):
    """A YAML sequence that remembers its line and the line of each item."""

    line: int | None = None

    def __init__(self, *args):
        super().__init__(*args)
        self.lines: list = []


class _Duplicate(Exception):
    def __init__(self, key, first: int, again: int):
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


# A pipeline is a few dozen lines: these bound what a hostile one can cost before
# anything reads it. Aliases are kept shared while parsing, but the pipeline is then
# walked as plain lists and dicts (overrides, plain(), error messages), so an alias
# bomb (a 500-byte file naming 9**9 values) is refused by the values its aliases add.
MAX_DEPTH = 64                 # nested lists and mappings


MAX_ALIAS_VALUES = 100_000     # values that aliases (and '<<' merges) add to the document


class TooBig(Exception):
    """A document (or an ``-o`` value) too deep or too expanded by aliases to be a setting:
    ``message`` says which, ``line`` where (None if not known)."""

    def __init__(self, message: str, line: int | None):
        super().__init__(message)
        self.message, self.line = message, line


class _GuardedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses, before constructing anything, a document nested
    deeper than :data:`MAX_DEPTH` (PyYAML composes recursively: a deep one ends in a
    bare RecursionError), one whose aliases expand it by more than
    :data:`MAX_ALIAS_VALUES` values, and one that contains itself."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise TooBig(f'nested deeper than {MAX_DEPTH} levels (line {line}): a '
                             f'pipeline needs a few; is this the file you meant?', line)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        _check_expansion(node)
        return node


class _LineLoader(_GuardedLoader):
    """The guarded loader that also records where each mapping key and list item starts."""

    def _map(self, node):
        data = YamlMap()
        data.line = node.start_mark.line + 1
        yield data
        seen: dict = {}
        for key_node, _ in node.value:   # explicit keys only: a '<<' merge may be overridden
            if key_node.tag == 'tag:yaml.org,2002:merge':
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _Duplicate(key, seen[key], line)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    'while constructing a mapping', node.start_mark,
                    'found an unhashable key', key_node.start_mark) from None
            seen[key] = line
        self.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            data[key] = self.construct_object(value_node, deep=True)
            data.lines[key] = key_node.start_mark.line + 1

    def _seq(self, node):
        data = YamlSeq()
        data.line = node.start_mark.line + 1
        yield data
        for child in node.value:
            data.append(self.construct_object(child, deep=True))
            data.lines.append(child.start_mark.line + 1)


def _check_expansion(root) -> None:
    """Raise TooBig when aliases expand the document ``root`` by more than MAX_ALIAS_VALUES.

    Each distinct node is visited once (its expanded size remembered), so a
    bomb costs as little to measure as its text; the line named is that of
    the first node (children first) whose expanded size is over the budget.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()       # entered, children not done: an alias to one is a loop
    first_over = None
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
        elif not children_done:
            if id(node) in open_nodes:
                line = node.start_mark.line + 1
                raise TooBig(f'an alias refers to a list or mapping that holds it (line '
                             f'{line}): a pipeline cannot contain itself', line)
            open_nodes.add(id(node))
            stack.append((node, True))
            kids = (node.value if isinstance(node, yaml.SequenceNode)
                    else [n for pair in node.value for n in pair])
            stack.extend((kid, False) for kid in kids if id(kid) not in sizes)
            continue
        else:
            kids = (node.value if isinstance(node, yaml.SequenceNode)
                    else [n for pair in node.value for n in pair])
            sizes[id(node)] = 1 + sum(sizes[id(kid)] for kid in kids)
        if first_over is None and sizes[id(node)] > MAX_ALIAS_VALUES:
            first_over = node
    added = sizes[id(root)] - len(sizes)
    if added > MAX_ALIAS_VALUES:
        # The root's own size is over the budget then: some node (the root at last) is first.
        assert first_over is not None
        line = first_over.start_mark.line + 1
        raise TooBig(f'its aliases expand it to {sizes[id(root)]:,} values (line {line}), more '
                     f'than {MAX_ALIAS_VALUES:,} beyond what the file spells out: refused as '
                     f'a YAML bomb; write the values out instead', line)


_LineLoader.add_constructor('tag:yaml.org,2002:map', _LineLoader._map)
_LineLoader.add_constructor('tag:yaml.org,2002:seq', _LineLoader._seq)


def plain(value: Any) -> Any:
    """Plain dicts and lists again (what fns and readers are given)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def parse_yaml(text: str, path: str | None) -> Any:
    """The document in ``text`` (the file ``path``), its mappings and lists a
    :class:`YamlMap` and :class:`YamlSeq` that know their lines; any mistake, or a document
    refused by the guards, is a ConfigError naming the file and the line."""
    try:
        return yaml.load(text, Loader=_LineLoader)   # noqa: S506 - a SafeLoader subclass
    except TooBig as big:
        err = ConfigError(f'not a pipeline: {big.message}', path)
        err.line = big.line
        raise err from None
    except _Duplicate as dup:
        lines = (f'line {dup.again}' if dup.first == dup.again
                 else f'lines {dup.first} and {dup.again}')
        err = ConfigError(f'key {dup.key!r} appears twice ({lines}): keep one', path)
        err.line = dup.again
        raise err from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = ' '.join(p for p in (exc.context, exc.problem) if p)
        at = f' (line {line}, column {mark.column + 1})' if mark is not None else ''
        marks = [m for m in (exc.problem_mark, exc.context_mark) if m is not None]
        pattern = _unquoted_pattern(text, [m.line for m in marks])
        if pattern is not None:
            what += (f"; YAML reads a value that starts with {{ as a mapping: quote the "
                     f"pattern, '{pattern}'")
        err = ConfigError(f'not valid YAML{at}: {what}', path)
        err.line = line
        raise err from None
    except yaml.YAMLError as exc:
        err = ConfigError(f'not valid YAML: {exc}', path)
        err.line = None
        raise err from None


# A brace pattern of file names ({a,b} or {000..009}, maybe with more after it), unquoted.
_PATTERN = re.compile(r"""(?<!['"\w])(\{[^{}\s'"]*(?:,|\.\.)[^{}\s'"]*\}[^\s,\]}#'"]*)""")


def _unquoted_pattern(text: str, lines: list[int]) -> str | None:
    """The first unquoted brace pattern (``{a,b}.tar``) on the lines (0-based) where
    the parser stopped: the likely cause, since YAML reads ``{`` as a mapping."""
    rows = text.splitlines()
    for k in dict.fromkeys(lines):
        if 0 <= k < len(rows):
            found = _PATTERN.search(rows[k])
            if found is not None:
                return found.group(1)
    return None


def pattern_in_mapping(value) -> str | None:
    """The brace pattern an unquoted ``{a,b}`` or ``{000..009}`` was read as a mapping
    from (``{'a': None, 'b': None}``), or None if ``value`` does not look like one.

    >>> pattern_in_mapping({'a': None, 'b': None}), pattern_in_mapping({'a': 1})
    ('{a,b}', None)
    """
    if not isinstance(value, dict) or not value or any(v is not None for v in value.values()):
        return None
    keys = [str(k) for k in value]
    if len(keys) == 1 and '..' not in keys[0]:
        return None
    return '{' + ','.join(keys) + '}'


def load_value(raw: str) -> Any:
    """One ``-o`` value read as YAML, guarded as a file is (raises TooBig or a YAMLError)."""
    return yaml.load(raw, Loader=_GuardedLoader)  # noqa: S506 - a SafeLoader subclass
