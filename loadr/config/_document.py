"""The parsed pipeline: :class:`Config` (the YAML plus overrides, ready to build), and
:func:`load_config` and :func:`pipeline`, which read one and build it."""

from __future__ import annotations

import os

from ..errors import ConfigError
from ..storage import is_url
from ._fns_section import _FnsSection
from ._overrides import _Overrides
from ._reader_section import _ReaderSection
from ._schema import (_REQUIRED_LOADER_KEYS, LOADER_TYPES, SECTIONS, _did_you_mean, _is_kind,
                      _kind)
from ._yaml_guard import _Map, _parse_yaml, _plain, _Seq, pattern_in_mapping


class Config(_Overrides, _ReaderSection, _FnsSection):
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

    # -- building --------------------------------------------------------

    def _path(self, value, keys: tuple) -> str:
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
        from ..loader import Loader
        if not isinstance(self.data, dict):
            raise self.error(f'a pipeline is a mapping with sections {", ".join(SECTIONS)}; got '
                             f'{_kind(self.data)}', None)
        for key in self.data:
            if key not in SECTIONS:
                raise self.error(f'unknown section {key!r}', (key,), _did_you_mean(key, SECTIONS))
        reader = self.build_reader()
        fns = self.build_fns()
        kwargs = self.loader_args()
        if kwargs.get('remote') is not None:
            kwargs['remote'] = self._engine(kwargs['remote'])
        try:
            loader = Loader(reader, fns=fns, **kwargs)
        except ConfigError as exc:
            raise self.error('loader', ('loader',), exc.message) from exc
        if kwargs.get('remote') is not None:
            # Agents rebuild the reader and fns from the pipeline itself: nothing of the
            # user's is pickled for them.
            loader.recipe = (_plain_data(self.data), self.base_dir, dict(self.overridden))
            loader.rebuild = rebuild
        return loader

    def _engine(self, section: dict):
        """The engine ``loader.remote`` names: ``{engine: ray | subprocesses, ...its args}``."""
        args = {k: v for k, v in section.items() if k != 'engine'}
        kind = section.get('engine')
        try:
            if kind == 'subprocesses':
                from ..remote import Subprocesses
                return Subprocesses(**args)
            if kind == 'ray':
                from ..ray import Workers
                return Workers(**args)
        except TypeError as exc:
            raise self.error(f'loader.remote: {exc}', ('loader', 'remote')) from exc
        except ConfigError as exc:
            raise self.error(f'loader.remote: {exc.message}', ('loader', 'remote')) from exc
        raise self.error(f"loader.remote.engine must be 'ray' or 'subprocesses', got {kind!r}",
                         ('loader', 'remote', 'engine'))

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


def _plain_data(value):
    """A parsed YAML value as plain dicts and lists (its line numbers left behind)."""
    if isinstance(value, dict):
        return {k: _plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_data(v) for v in value]
    return value


def rebuild(data: dict, base_dir: str, overridden: dict) -> tuple:
    """``(reader, fns)`` of a pipeline's mapping: what a remote agent runs, rebuilt on its
    host from the same recipe (``loader.recipe``)."""
    config = Config(data, None, base_dir)
    config.overridden = dict(overridden)
    return config.build_reader(), config.build_fns()


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
