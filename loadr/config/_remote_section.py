"""``loader.remote``: the engine that starts agents on other hosts (``{engine: ray |
subprocesses, ...its args}``), and the recipe they rebuild the reader and fns from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ._document import Document
from ._fns_section import FnsSection
from ._reader_section import ReaderSection
from ._yaml_guard import plain

if TYPE_CHECKING:
    from ..ray import Workers
    from ..remote import Subprocesses

# What an agent is given to rebuild a pipeline: (its mapping, its folder, its overrides, the
# command's storage options: the CLI's --storage-option, which no mapping holds).
Recipe = tuple[dict, str, dict, dict]


class RemoteSection:
    """``loader.remote`` of a :class:`Document`: the engine it names (:meth:`engine`), and
    the recipe of the whole pipeline for the agents (:meth:`recipe`, rebuilt there by
    :func:`rebuild`): nothing of the user's is pickled for them."""

    def __init__(self, document: Document):
        self.doc = document

    def engine(self, section: dict) -> Subprocesses | Workers:
        """The engine ``section`` (``loader.remote``, checked a mapping) names."""
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
            raise self.doc.error(f'loader.remote: {exc}', ('loader', 'remote')) from exc
        except ConfigError as exc:
            raise self.doc.error(f'loader.remote: {exc.message}', ('loader', 'remote')) from exc
        raise self.doc.error(f"loader.remote.engine must be 'ray' or 'subprocesses', got "
                             f"{kind!r}", ('loader', 'remote', 'engine'))

    def recipe(self, storage_options: dict | None = None) -> Recipe:
        """What :func:`rebuild` makes the same reader and fns from, on an agent's host: the
        mapping as plain dicts and lists (its line numbers left behind), its folder, where
        its overrides were given, and the command's ``storage_options`` (an endpoint, a
        profile: what the agents need to read the same URLs)."""
        return (plain(self.doc.data), self.doc.base_dir, dict(self.doc.overridden),
                dict(storage_options or {}))


def rebuild(data: dict, base_dir: str, overridden: dict,
            storage_options: dict | None = None) -> tuple[Any, list]:
    """``(reader, fns)`` of a pipeline's mapping: what a remote agent runs, rebuilt on its
    host from the same recipe (``loader.recipe``)."""
    document = Document(data, None, base_dir)
    document.overridden = dict(overridden)
    fns = FnsSection(document)
    return ReaderSection(document, fns, storage_options or None).build(), fns.build()
