"""The parsed pipeline: :class:`Config` (the YAML plus overrides, ready to build), and
:func:`load_config` and :func:`pipeline`, which read one and build it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ._document import Document
from ._fns_section import FnsSection
from ._loader_section import LoaderSection
from ._overrides import Overrides
from ._reader_section import ReaderSection
from ._remote_section import RemoteSection, rebuild
from ._schema import SECTIONS, did_you_mean, kind_of
from ._yaml_guard import parse_yaml

if TYPE_CHECKING:
    from ..loader import Loader
    from ..mix import Mix


class Config:
    """A pipeline description (the parsed YAML plus overrides), ready to :meth:`build`.

    ``data`` is the mapping as read (line numbers kept), ``path`` the YAML
    file (None for a dict), ``base_dir`` what relative paths in the file are
    relative to.

    It is made of parts, each built from the one :class:`Document`: ``overrides``
    (values changed by dotted key), and the sections ``reader_section``,
    ``fns_section``, ``loader_section`` and ``remote_section`` (``loader.remote``).
    ``storage_options`` are those of the whole command (the CLI's ``--storage-option``),
    under each reader's own (a reader of a URL merges its own over them).

    Example::

        config = load_config('configs/demo.yaml')
        config.override('loader.workers', 0)
        loader = config.build()
    """

    def __init__(self, data: Any, path: str | None = None, base_dir: str | None = None,
                 storage_options: dict | None = None):
        self.document = Document(data, path, base_dir)
        self.overrides = Overrides(self.document)
        self.fns_section = FnsSection(self.document)
        self.reader_section = ReaderSection(self.document, self.fns_section, storage_options)
        self.loader_section = LoaderSection(self.document)
        self.remote_section = RemoteSection(self.document)

    @property
    def data(self) -> Any:
        """The mapping as read, overrides applied (line numbers kept)."""
        return self.document.data

    @property
    def path(self) -> str | None:
        """The YAML file (None for a dict)."""
        return self.document.path

    @property
    def base_dir(self) -> str:
        """What relative paths in the file are relative to."""
        return self.document.base_dir

    @property
    def overridden(self) -> dict[tuple, str]:
        """The key paths set by an override, each with the directory its relative paths
        are relative to (the current directory when it was given)."""
        return self.document.overridden

    def override(self, key: str, value: Any, cwd: str | os.PathLike | None = None) -> None:
        """Set one value by dotted key (``'loader.batch'``, ``'fns.0.size'``, ``'fns.flip.p'``).

        A section name alone with a mapping (``'loader', {'batch': 8}``) merges it.
        A relative path in ``value`` is relative to ``cwd`` (default: the
        current directory), not to the file.
        """
        self.overrides.apply(key, value, cwd)

    def error(self, message: str, keys: tuple | None = (), hint: str | None = None
              ) -> ConfigError:
        """A ConfigError: ``'<message> (line N): <hint>'`` with ``.path`` and ``.line``.

        ``keys`` is the key path the mistake is at (None: nowhere in particular).
        """
        return self.document.error(message, keys, hint)

    def import_dirs(self) -> list[str]:
        """Where fns given by import path are looked for first: the file's folder, the cwd."""
        return self.document.import_dirs()

    def build_reader(self) -> Any:
        """The reader the ``reader`` section describes (format detected when not given)."""
        return self.reader_section.build()

    def build_mix(self, section: dict) -> Mix:
        """A :class:`loadr.Mix` from a ``reader`` section with ``mix``."""
        return self.reader_section.build_mix(section)

    def build_fns(self) -> list:
        """The transforms of the ``fns`` section, in order."""
        return self.fns_section.build()

    def loader_args(self) -> dict:
        """The ``loader`` section as checked keyword arguments for :class:`~loadr.Loader`."""
        return self.loader_section.args()

    def build(self) -> Loader:
        """Open the reader, make the fns and return the :class:`~loadr.Loader`."""
        from ..loader import Loader
        doc = self.document
        if not isinstance(doc.data, dict):
            raise doc.error(f'a pipeline is a mapping with sections {", ".join(SECTIONS)}; got '
                            f'{kind_of(doc.data)}', None)
        for key in doc.data:
            if key not in SECTIONS:
                raise doc.error(f'unknown section {key!r}', (key,), did_you_mean(key, SECTIONS))
        reader = self.reader_section.build()
        fns = self.fns_section.build()
        kwargs = self.loader_section.args()
        if kwargs.get('remote') is not None:
            kwargs['remote'] = self.remote_section.engine(kwargs['remote'])
        try:
            loader = Loader(reader, fns=fns, **kwargs)
        except ConfigError as exc:
            raise doc.error('loader', ('loader',), exc.message) from exc
        if kwargs.get('remote') is not None:
            # Agents rebuild the reader and fns from the pipeline itself: nothing of the
            # user's is pickled for them.
            loader.recipe = self.remote_section.recipe(self.reader_section.storage_options)
            loader.rebuild = rebuild
        return loader


def load_config(source: dict | str | os.PathLike, base_dir: str | os.PathLike | None = None,
                storage_options: dict | None = None) -> Config:
    """Read a pipeline from a YAML file path or a dict, without building it.

    Relative paths in a file are relative to the file; in a dict, to
    ``base_dir`` (default: the current directory). ``storage_options`` are
    those of the whole command (``loadr --storage-option``): each reader of a
    URL merges its own ``storage_options`` over them, key by key.

    >>> load_config({'reader': {'path': 'data'}, 'loader': {'batch': 4}}).data['loader']
    {'batch': 4}
    """
    if isinstance(source, dict):
        return Config(source, None, os.fspath(base_dir) if base_dir is not None else None,
                      storage_options)
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
    data = parse_yaml(text, path)
    return Config(data, path, os.fspath(base_dir) if base_dir is not None else None,
                  storage_options)


def pipeline(source: dict | str | os.PathLike, **overrides: Any) -> Loader:
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
