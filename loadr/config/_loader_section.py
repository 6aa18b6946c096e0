"""The ``loader`` section: the :class:`~loadr.Loader`'s keyword arguments, each checked
against the YAML types :data:`~loadr.config.LOADER_TYPES` gives it."""

from __future__ import annotations

from ._document import Document
from ._schema import LOADER_TYPES, REQUIRED_LOADER_KEYS, did_you_mean, is_kind
from ._yaml_guard import plain

# How a mistake names each YAML type of LOADER_TYPES.
_WANTED = {'int': 'an int', 'bool': 'true or false', 'null': 'null', 'str': 'a string',
           'number': 'a number', 'mapping': 'a mapping'}


class LoaderSection:
    """The ``loader`` section of a :class:`Document`, as checked keyword arguments
    (:meth:`args`); what ``loader.remote`` holds is the remote section's to make."""

    def __init__(self, document: Document):
        self.doc = document

    def args(self) -> dict:
        """The ``loader`` section as checked keyword arguments for :class:`~loadr.Loader`."""
        section = self.doc.section('loader', required=True)
        out = {}
        for key, value in section.items():
            if key not in LOADER_TYPES:
                raise self.doc.error(f'unknown key {key!r} in loader', ('loader', key),
                                     did_you_mean(key, LOADER_TYPES))
            kinds = LOADER_TYPES[key]
            if not any(is_kind(value, k) for k in kinds):
                wanted = ' or '.join(_WANTED[k] for k in kinds)
                raise self.doc.error(f'loader.{key} must be {wanted}, got {value!r}',
                                     ('loader', key))
            out[key] = plain(value)
        for key in REQUIRED_LOADER_KEYS:
            if key not in out:
                raise self.doc.error(f'loader needs {key}', ('loader',), f'add e.g. "{key}: 32"')
        return out
