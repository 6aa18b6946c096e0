"""YAML pipelines: a reader, its fns and a Loader, from one file.

A pipeline file has three sections::

    reader: {format: bag, path: data/train, decode_images: false}   # format: optional
    fns:
      - decode_jpeg: {size: 256}          # a built-in, by short name, with arguments
      - flip                              # a built-in with its defaults
      - mypkg.augment:jitter: {p: 0.4}    # any importable factory, 'module:name'
    loader: {batch: 256, shuffle: true, seed: 0, workers: 8}

``reader`` names the dataset (``format`` is detected when left out) and the
reader's own options; ``fns`` lists transforms in order; ``loader`` holds the
:class:`~loadr.Loader` arguments. Paths in the file are relative to the file;
paths given as overrides are relative to the current directory.

A fn entry is a name, or a one-key mapping ``{name: args}``: a mapping of
arguments calls the factory with them, any other value is its one positional
argument (``select: [image, label]``). A built-in name always names a
factory. A bare import path (``- mypkg.aug:jitter``, no arguments) is the
transform itself, called ``fn(datapoint, seed=s)`` (a class is instantiated
first); with arguments it is a factory, called once to make the transform.

Every mistake is a :class:`~loadr.errors.ConfigError` naming the file and the
line, and what would be right: ``unknown key 'bach' in loader (line 9): did
you mean 'batch'?``. Its ``.path`` is the YAML file and ``.line`` the line.

Example::

    loader = loadr.pipeline('configs/imagenet_bag.yaml', **{'loader.batch': 128})
    loader = loadr.pipeline({'reader': {'path': 'data/train'}, 'loader': {'batch': 8}},
                            loader={'workers': 0})
"""

from __future__ import annotations

import difflib
import inspect
import os
from typing import Any

import yaml

from . import fns as fns_module
from .errors import ConfigError, DataError, LoadrError
from .readers import detect, formats
from .readers.patterns import names_files
from .storage import (CACHE_KEYS, is_url, storage_for, using_storage_options,
                      with_cache_settings)

__all__ = ['pipeline', 'load_config', 'parse_override', 'Config', 'SECTIONS', 'LOADER_TYPES']

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
}
_REQUIRED_LOADER_KEYS = ('batch',)

# Built-in fn arguments that name a file, resolved like reader.path.
_PATH_ARGS = {('label_to_index', 'mapping')}


# ---------------------------------------------------------------------------
# YAML with line numbers


class _Map(dict):
    """A YAML mapping that remembers its line and the line of each key."""

    line: int | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: dict = {}


class _Seq(list):
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
# walked as plain lists and dicts (overrides, _plain, error messages), so an alias
# bomb (a 500-byte file naming 9**9 values) is refused by the values its aliases add.
MAX_DEPTH = 64                 # nested lists and mappings
MAX_ALIAS_VALUES = 100_000     # values that aliases (and '<<' merges) add to the document


class _TooBig(Exception):
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
                raise _TooBig(f'nested deeper than {MAX_DEPTH} levels (line {line}): a '
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
        data = _Map()
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
        data = _Seq()
        data.line = node.start_mark.line + 1
        yield data
        for child in node.value:
            data.append(self.construct_object(child, deep=True))
            data.lines.append(child.start_mark.line + 1)


def _check_expansion(root) -> None:
    """Raise _TooBig when aliases expand the document ``root`` by more than MAX_ALIAS_VALUES.

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
                raise _TooBig(f'an alias refers to a list or mapping that holds it (line '
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
        line = first_over.start_mark.line + 1
        raise _TooBig(f'its aliases expand it to {sizes[id(root)]:,} values (line {line}), more '
                      f'than {MAX_ALIAS_VALUES:,} beyond what the file spells out: refused as '
                      f'a YAML bomb; write the values out instead', line)


_LineLoader.add_constructor('tag:yaml.org,2002:map', _LineLoader._map)
_LineLoader.add_constructor('tag:yaml.org,2002:seq', _LineLoader._seq)


def _plain(value):
    """Plain dicts and lists again (what fns and readers are given)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _parse_yaml(text: str, path: str | None):
    try:
        return yaml.load(text, Loader=_LineLoader)   # noqa: S506 - a SafeLoader subclass
    except _TooBig as big:
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
        err = ConfigError(f'not valid YAML{at}: {what}', path)
        err.line = line
        raise err from None
    except yaml.YAMLError as exc:
        err = ConfigError(f'not valid YAML: {exc}', path)
        err.line = None
        raise err from None


# ---------------------------------------------------------------------------
# Overrides


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
        value = yaml.load(raw, Loader=_GuardedLoader) if raw.strip() else None  # noqa: S506
    except _TooBig as big:
        raise ConfigError(f'override {key!r}: the value is not a setting: {big.message}'
                          ) from None
    except yaml.YAMLError:
        value = raw           # not YAML (e.g. an odd path): take the text as it is
    return key, value


def _did_you_mean(word, choices) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    if close:
        return f'did you mean {close[0]!r}?'
    return f"expected one of: {', '.join(map(str, choices))}"


# ---------------------------------------------------------------------------
# The parsed pipeline


class Config:
    """A pipeline description (the parsed YAML plus overrides), ready to :meth:`build`.

    ``data`` is the mapping as read (line numbers kept), ``path`` the YAML
    file (None for a dict), ``base_dir`` what relative paths in the file are
    relative to.

    Example::

        config = load_config('configs/demo.yaml')
        config.override('loader.workers', 0)
        loader = config.build()
    """

    def __init__(self, data, path: str | None = None, base_dir: str | None = None):
        self.path = path
        self.base_dir = base_dir if base_dir is not None else (
            os.path.dirname(os.path.abspath(path)) if path is not None else os.getcwd())
        if data is None:
            data = _Map()
        self.data = data
        # The key paths set by an override, each with the directory its relative
        # paths are relative to (the current directory when it was given).
        self.overridden: dict[tuple, str] = {}

    # -- errors ----------------------------------------------------------

    def _line(self, keys: tuple):
        node, line = self.data, getattr(self.data, 'line', None)
        for k in keys:
            if isinstance(node, _Map) and k in node:
                line = node.lines.get(k, line)
                node = node[k]
            elif isinstance(node, _Seq) and isinstance(k, int) and 0 <= k < len(node):
                line = node.lines[k]
                node = node[k]
            else:
                break
        return line

    def _where(self, keys: tuple) -> tuple[str, int | None]:
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

    # -- overrides -------------------------------------------------------

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

    # -- building --------------------------------------------------------

    def _path(self, value, keys: tuple) -> str:
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise self.error(f'{".".join(map(str, keys))} must be a path, got {value!r}', keys)
        if is_url(value):
            return os.fspath(value)        # s3://, https://: not relative to this file
        value = os.path.expanduser(os.fspath(value))
        base = self.base_dir
        for n in range(len(keys), 0, -1):
            if keys[:n] in self.overridden:
                base = self.overridden[keys[:n]]
                break
        return os.path.normpath(os.path.join(base, value))

    def _section(self, name: str, required: bool) -> dict:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(f'missing section {name!r}', None)
            return _Map()
        if not isinstance(value, dict):
            raise self.error(f'{name} must be a mapping (key: value lines), got '
                             f'{_kind(value)} {value!r}', (name,))
        return value

    def build(self):
        """Open the reader, make the fns and return the :class:`~loadr.Loader`."""
        from .loader import Loader
        if not isinstance(self.data, dict):
            raise self.error(f'a pipeline is a mapping with sections {", ".join(SECTIONS)}; got '
                             f'{_kind(self.data)}', None)
        for key in self.data:
            if key not in SECTIONS:
                raise self.error(f'unknown section {key!r}', (key,), _did_you_mean(key, SECTIONS))
        reader = self.build_reader()
        fns = self.build_fns()
        kwargs = self.loader_args()
        try:
            return Loader(reader, fns=fns, **kwargs)
        except ConfigError as exc:
            raise self.error('loader', ('loader',), exc.message) from exc

    def build_reader(self):
        """The reader the ``reader`` section describes (format detected when not given).

        ``reader: {mix: {name: {path: ..., weight: ..., fns: [...]}, ...}}``
        makes a :class:`loadr.Mix` of several (see :meth:`build_mix`).
        """
        section = self._section('reader', required=True)
        if 'mix' in section:
            return self.build_mix(section)
        return self._build_one(section, ('reader',))

    def build_mix(self, section: dict):
        """A :class:`loadr.Mix` from ``reader: {mix: {...}, source_key: ..., weights: ...}``.

        Each source is a reader section of its own plus ``weight`` and ``fns``.
        ``reader.weights``, a list of ``[position, {name: weight}]``, gives a
        weight schedule instead of per-source weights. No weights at all:
        proportional to the sources' sizes.
        """
        from .mix import Mix

        for key in section:
            if key not in ('mix', 'source_key', 'weights'):
                raise self.error(f'unknown key {key!r} in reader', ('reader', key),
                                 _did_you_mean(key, ['mix', 'source_key', 'weights']) +
                                 ' (a mix names each source\'s path under reader.mix)')
        mix = section['mix']
        if not isinstance(mix, dict) or not mix:
            raise self.error('reader.mix must map source names to {path: ..., weight: ...}',
                             ('reader', 'mix'))
        readers, weights, fns = {}, {}, {}
        for name, source in mix.items():
            keys = ('reader', 'mix', name)
            if not isinstance(source, dict):
                raise self.error(f'reader.mix.{name} must be a mapping {{path: ..., weight: ...}},'
                                 f' got {_kind(source)}', keys)
            own = {k: v for k, v in source.items() if k not in ('weight', 'fns')}
            readers[str(name)] = self._build_one(own, keys)
            if 'weight' in source:
                weights[str(name)] = source['weight']
            chain = source.get('fns')
            if chain is not None:
                if not isinstance(chain, list):
                    raise self.error(f'reader.mix.{name}.fns must be a list', keys + ('fns',))
                fns[str(name)] = [self._fn(i, entry, keys + ('fns', i))
                                  for i, entry in enumerate(chain)]
        schedule = section.get('weights')
        if schedule is not None and weights:
            raise self.error('give the weights per source or as reader.weights, not both',
                             ('reader', 'weights'))
        if weights and len(weights) != len(readers):
            missing = sorted(set(readers) - set(weights))
            raise self.error(f'every source of the mix needs a weight; missing: {missing}',
                             ('reader', 'mix', missing[0]))
        if schedule is not None:
            weights = _plain(schedule)
        try:
            return Mix(readers, weights=weights or None, fns=fns,
                       source_key=section.get('source_key', 'source'))
        except ConfigError as exc:
            raise self.error('reader.mix', ('reader', 'mix'), exc.message) from exc

    def _build_one(self, section: dict, where: tuple):
        """One reader from its section; ``where`` is the section's key path."""
        dotted = '.'.join(map(str, where))
        if 'path' not in section:
            raise self.error(f'{dotted} needs a path', where,
                             'add e.g. "path: data/train" (relative to this file)')
        path = self._path(section['path'], where + ('path',))
        cache = [key for key in CACHE_KEYS if key in section]
        if cache:
            # As loadr.open takes them: settings of the URL's storage.
            if not is_url(path):
                raise self.error(f'{dotted}.{cache[0]} applies to datasets behind URLs; a '
                                 f'local dataset is read in place', where + (cache[0],))
            storage_options = with_cache_settings(_plain(section.get('storage_options')),
                                                  {key: _plain(section[key]) for key in cache})
            section = {k: v for k, v in section.items() if k not in CACHE_KEYS}
            section['storage_options'] = storage_options
        # A URL's storage_options apply to the detection too (loadr.storage).
        with using_storage_options(_plain(section.get('storage_options'))):
            return self._build_at(section, where, path)

    def _build_at(self, section: dict, where: tuple, path: str):
        dotted = '.'.join(map(str, where))
        # A pattern (shards/train-{000000..000099}.tar, data/*.parquet) names files, not itself.
        if not names_files(path):
            storage = storage_for(path)
            kind = getattr(storage, 'kind', None)      # a URL's: unreachable is not "missing"
            try:
                there = kind(path) is not None if kind is not None else storage.exists(path)
            except LoadrError as exc:
                raise self.error(f'{dotted}.path {section["path"]!r} cannot be reached',
                                 where + ('path',), f'{exc.message} ({path})') from None
        else:
            there = True
        if not there:
            raise self.error(f'{dotted}.path {section["path"]!r} does not exist', where + ('path',),
                             f'looked for {path}')
        known = {f.name: f for f in formats()}
        fmt_name = section.get('format')
        if fmt_name is None:
            try:
                fmt = detect(path)
            except DataError as exc:
                raise self.error(f'{dotted}.path {section["path"]!r} is not a dataset loadr knows',
                                 where + ('path',), f'{exc.message} ({path}); set format: '
                                 f'{"|".join(known)} if it is one') from exc
        else:
            if fmt_name not in known:
                raise self.error(f'unknown reader format {fmt_name!r}', where + ('format',),
                                 _did_you_mean(fmt_name, list(known)))
            fmt = known[fmt_name]
            if not fmt.detect(path):
                try:
                    actual = f'it looks like {detect(path).name}'
                except DataError:
                    actual = 'it is not a dataset loadr recognises'
                raise self.error(f'{dotted}.path {section["path"]!r} is not a {fmt_name} dataset',
                                 where + ('format',), f'{actual} ({path})')
        params = {name: p for name, p in inspect.signature(fmt.reader).parameters.items()
                  if name != 'path' and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        options = {}
        for key, value in section.items():
            if key in ('format', 'path'):
                continue
            if key not in params:
                raise self.error(f'unknown key {key!r} in {dotted}', where + (key,),
                                 _did_you_mean(key, ['format', 'path', *params]))
            default = params[key].default
            if isinstance(default, bool) and not isinstance(value, bool):
                raise self.error(f'{dotted}.{key} must be true or false, got {value!r}',
                                 where + (key,))
            if key == 'decode' and isinstance(value, str) and ':' in value:
                try:
                    value = fns_module.resolve(value, self.import_dirs())
                except ConfigError as exc:
                    raise self.error(f'{dotted}.decode {section[key]!r} not found', where + (key,),
                                     exc.message) from exc
            options[key] = _plain(value)
        try:
            return fmt.reader(path, **options)
        except DataError:
            raise            # names the file and index already
        except (ConfigError, TypeError, ValueError) as exc:
            message = exc.message if isinstance(exc, ConfigError) else str(exc)
            raise self.error(dotted, where, message) from exc

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

    def loader_args(self) -> dict:
        """The ``loader`` section as checked keyword arguments for :class:`~loadr.Loader`."""
        section = self._section('loader', required=True)
        out = {}
        for key, value in section.items():
            if key not in LOADER_TYPES:
                raise self.error(f'unknown key {key!r} in loader', ('loader', key),
                                 _did_you_mean(key, LOADER_TYPES))
            kinds = LOADER_TYPES[key]
            if not any(_is_kind(value, k) for k in kinds):
                wanted = ' or '.join({'int': 'an int', 'bool': 'true or false', 'null': 'null',
                                      'str': 'a string', 'number': 'a number',
                                      'mapping': 'a mapping'}[k] for k in kinds)
                raise self.error(f'loader.{key} must be {wanted}, got {value!r}', ('loader', key))
            out[key] = _plain(value)
        for key in _REQUIRED_LOADER_KEYS:
            if key not in out:
                raise self.error(f'loader needs {key}', ('loader',), f'add e.g. "{key}: 32"')
        return out


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


# ---------------------------------------------------------------------------
# The public entry points


def load_config(source, base_dir: str | os.PathLike | None = None) -> Config:
    """Read a pipeline from a YAML file path or a dict, without building it.

    Relative paths in a file are relative to the file; in a dict, to
    ``base_dir`` (default: the current directory).

    >>> load_config({'reader': {'path': 'data'}, 'loader': {'batch': 4}}).data['loader']
    {'batch': 4}
    """
    if isinstance(source, dict):
        return Config(source, None, os.fspath(base_dir) if base_dir is not None else None)
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(f'a pipeline is a YAML file path or a dict, got {type(source).__name__}')
    path = os.fspath(source)
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f'cannot read the pipeline file: {exc.strerror or exc}', path) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f'the pipeline file is not UTF-8 text: {exc}', path) from exc
    data = _parse_yaml(text, path)
    return Config(data, path, os.fspath(base_dir) if base_dir is not None else None)


def pipeline(source, **overrides):
    """A :class:`~loadr.Loader` from a YAML pipeline file (or a dict), with overrides.

    Overrides are dotted keys (``**{'loader.batch': 128}``, or
    ``loader__batch=128``), or a section with a mapping to merge
    (``loader={'workers': 0}``). Values are used as given; the command
    line's ``-o key=value`` strings go through :func:`parse_override`.

    Example::

        with loadr.pipeline('configs/demo.yaml', loader={'workers': 2}) as loader:
            batch = next(iter(loader))
    """
    config = load_config(source)
    for key, value in overrides.items():
        config.override(key, value)
    return config.build()
