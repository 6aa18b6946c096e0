"""The ``reader`` section: one dataset's reader (its format detected or checked, its
options checked against the reader's signature), or a :class:`loadr.Mix` of several."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from .. import fns as fns_module
from ..errors import ConfigError, DataError, LoadrError
from ..readers import detect, formats
from ..readers.patterns import names_files, names_nothing
from ..storage import (
    CACHE_KEYS,
    StorageSettings,
    is_url,
    merged_options,
    settings_for,
    storage_for,
    with_cache_settings,
)
from ._document import Document
from ._fns_section import FnsSection
from ._schema import did_you_mean, kind_of
from ._yaml_guard import plain

if TYPE_CHECKING:
    from ..mix import Mix


class ReaderSection:
    """The ``reader`` section of a :class:`Document`: the reader it describes
    (:meth:`build`); a mix's sources' ``fns`` are made by the document's ``fns`` section.

    ``storage_options`` are those of the whole command (the CLI's ``--storage-option``):
    each reader of a URL takes its own ``storage_options`` merged over them, key by key
    (:func:`loadr.storage.merged_options`); a local path takes none."""

    def __init__(self, document: Document, fns: FnsSection,
                 storage_options: dict | None = None):
        self.doc = document
        self.fns = fns
        self.storage_options = storage_options

    def build(self) -> Any:
        """The reader the ``reader`` section describes (format detected when not given).

        ``reader: {mix: {name: {path: ..., weight: ..., fns: [...]}, ...}}``
        makes a :class:`loadr.Mix` of several (see :meth:`build_mix`).
        """
        section = self.doc.section('reader', required=True)
        if 'mix' in section:
            return self.build_mix(section)
        return self._build_one(section, ('reader',))

    def build_mix(self, section: dict) -> Mix:
        """A :class:`loadr.Mix` from ``reader: {mix: {...}, source_key: ..., weights: ...}``.

        Each source is a reader section of its own plus ``weight`` and ``fns``.
        ``reader.weights``, a list of ``[position, {name: weight}]``, gives a
        weight schedule instead of per-source weights. No weights at all:
        proportional to the sources' sizes.
        """
        from ..mix import Mix

        for key in section:
            if key not in ('mix', 'source_key', 'weights'):
                raise self.doc.error(f'unknown key {key!r} in reader', ('reader', key),
                                     did_you_mean(key, ['mix', 'source_key', 'weights']) +
                                     ' (a mix names each source\'s path under reader.mix)')
        mix = section['mix']
        if not isinstance(mix, dict) or not mix:
            raise self.doc.error('reader.mix must map source names to {path: ..., weight: ...}',
                                 ('reader', 'mix'))
        readers, weights, fns = {}, {}, {}
        for name, source in mix.items():
            keys = ('reader', 'mix', name)
            if not isinstance(source, dict):
                raise self.doc.error(f'reader.mix.{name} must be a mapping '
                                     f'{{path: ..., weight: ...}}, got {kind_of(source)}', keys)
            own = {k: v for k, v in source.items() if k not in ('weight', 'fns')}
            readers[str(name)] = self._build_one(own, keys)
            if 'weight' in source:
                weights[str(name)] = source['weight']
            chain = source.get('fns')
            if chain is not None:
                if not isinstance(chain, list):
                    raise self.doc.error(f'reader.mix.{name}.fns must be a list', keys + ('fns',))
                fns[str(name)] = [self.fns.entry(i, entry, keys + ('fns', i))
                                  for i, entry in enumerate(chain)]
        schedule = section.get('weights')
        if schedule is not None and weights:
            raise self.doc.error('give the weights per source or as reader.weights, not both',
                                 ('reader', 'weights'))
        if weights and len(weights) != len(readers):
            missing = sorted(set(readers) - set(weights))
            raise self.doc.error(f'every source of the mix needs a weight; missing: {missing}',
                                 ('reader', 'mix', missing[0]))
        if schedule is not None:
            weights = plain(schedule)
        try:
            return Mix(readers, weights=weights or None, fns=fns,
                       source_key=section.get('source_key', 'source'))
        except ConfigError as exc:
            raise self.doc.error('reader.mix', ('reader', 'mix'), exc.message) from exc

    def _build_one(self, section: dict, where: tuple) -> Any:
        """One reader from its section; ``where`` is the section's key path."""
        dotted = '.'.join(map(str, where))
        if 'path' not in section:
            raise self.doc.error(f'{dotted} needs a path', where,
                                 'add e.g. "path: data/train" (relative to this file)')
        path = self.doc.resolve_path(section['path'], where + ('path',))
        cache = [key for key in CACHE_KEYS if key in section]
        if cache:
            # As loadr.open takes them: settings of the URL's storage.
            if not is_url(path):
                raise self.doc.error(f'{dotted}.{cache[0]} applies to datasets behind URLs; a '
                                     f'local dataset is read in place', where + (cache[0],))
            storage_options = with_cache_settings(plain(section.get('storage_options')),
                                                  {key: plain(section[key]) for key in cache})
            section = {k: v for k, v in section.items() if k not in CACHE_KEYS}
            section['storage_options'] = storage_options
        if is_url(path):
            # A URL's settings, made once: the detection and the reader share its storage.
            own = merged_options(self.storage_options, plain(section.get('storage_options')))
            section = {**section, 'storage_options': settings_for(path, own)}
        return self._build_at(section, where, path)

    def _build_at(self, section: dict, where: tuple, path: str) -> Any:
        dotted = '.'.join(map(str, where))
        settings = section.get('storage_options')
        settings = settings if isinstance(settings, StorageSettings) else None
        # A pattern (shards/train-{000000..000099}.tar, data/*.parquet) names files, not itself.
        if not names_files(path, settings):
            storage = storage_for(path, settings)
            kind = getattr(storage, 'kind', None)      # a URL's: unreachable is not "missing"
            try:
                there = kind(path) is not None if kind is not None else storage.exists(path)
            except LoadrError as exc:
                raise self.doc.error(f'{dotted}.path {section["path"]!r} cannot be reached',
                                     where + ('path',), f'{exc.message} ({path})') from None
        else:
            there = True
        if not there:
            raise self.doc.error(f'{dotted}.path {section["path"]!r} does not exist',
                                 where + ('path',), f'looked for {path}')
        known = {f.name: f for f in formats()}
        fmt_name = section.get('format')
        if fmt_name is None:
            try:
                fmt = detect(path, settings)
            except DataError as exc:
                nothing = names_nothing(path) if names_files(path, settings) else None
                if nothing is not None:
                    raise self.doc.error(f'{dotted}.path {section["path"]!r} names no file to read',
                                         where + ('path',), f'{nothing} ({path})') from exc
                raise self.doc.error(f'{dotted}.path {section["path"]!r} is not a dataset loadr '
                                     f'knows', where + ('path',),
                                     f'{exc.message} ({path}); set format: '
                                     f'{"|".join(known)} if it is one') from exc
        else:
            if fmt_name not in known:
                raise self.doc.error(f'unknown reader format {fmt_name!r}', where + ('format',),
                                     did_you_mean(fmt_name, list(known)))
            fmt = known[fmt_name]
            if not fmt.detects(path, settings):
                try:
                    actual = f'it looks like {detect(path, settings).name}'
                except DataError:
                    actual = 'it is not a dataset loadr recognises'
                raise self.doc.error(f'{dotted}.path {section["path"]!r} is not a {fmt_name} '
                                     f'dataset', where + ('format',), f'{actual} ({path})')
        params = {name: p for name, p in inspect.signature(fmt.reader).parameters.items()
                  if name != 'path' and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        options = {}
        for key, value in section.items():
            if key in ('format', 'path'):
                continue
            if key not in params:
                raise self.doc.error(f'unknown key {key!r} in {dotted}', where + (key,),
                                     did_you_mean(key, ['format', 'path', *params]))
            default = params[key].default
            if isinstance(default, bool) and not isinstance(value, bool):
                raise self.doc.error(f'{dotted}.{key} must be true or false, got {value!r}',
                                     where + (key,))
            if key == 'decode' and isinstance(value, str) and ':' in value:
                try:
                    value = fns_module.resolve(value, self.doc.import_dirs())
                except ConfigError as exc:
                    raise self.doc.error(f'{dotted}.decode {section[key]!r} not found',
                                         where + (key,), exc.message) from exc
            options[key] = plain(value)
        try:
            return fmt.reader(path, **options)
        except DataError:
            raise            # names the file and index already
        except (ConfigError, TypeError, ValueError) as exc:
            message = exc.message if isinstance(exc, ConfigError) else str(exc)
            raise self.doc.error(dotted, where, message) from exc
