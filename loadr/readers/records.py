"""The records of a conversion (``loadr convert``): the :class:`Source` a reader opens for
copying, the :class:`Plan` a target's writer fills, and the bag types
(:mod:`loadr.codecs`) inferred from values.

Nothing here imports a reader: readers build a :class:`Source` (``Reader.source``) and
writers fill a :class:`Plan` (``Writer.plan``), and :mod:`loadr.convert` drives both.
These records live with the readers, under the conversion: a reader that imported
the conversion's package would import every reader through it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:     # the writers' base imports these records: only mypy reads this
    from .base import Writer


_JPEG_MAGIC = b'\xff\xd8'
_PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def value_type(value) -> str:
    """The bag type (:mod:`loadr.codecs`) that stores ``value`` as it is.

    A non-empty list of values of one storable type is that type's list
    (``utf8[]``, ``int[]``, ``jpg[]``, ...); other lists are stored whole.

    >>> value_type(b'\\xff\\xd8...'), value_type(3), value_type({'a': 1}), value_type(['a', 'b'])
    ('jpg', 'int', 'msgpack', 'utf8[]')
    """
    kind = _type_of(value)
    return 'msgpack' if kind == _EMPTY_LIST else kind


def infer_types(reader, batch: int = 64) -> dict:
    """``{key: bag type}`` that stores every datapoint of ``reader``: each key's
    :func:`value_type` over all datapoints, joined by :func:`join_types` (so a list key
    empty in datapoint 0 is still ``jpg[]``, and a key that holds a JPEG in one
    datapoint and other bytes in another is ``bytes``). Keys in the order first seen.
    """
    types: dict = {}
    n = len(reader)
    for start in range(0, n, batch):
        for dp in reader.read_batch(range(start, min(n, start + batch))):
            for key, value in dp.items():
                key = str(key)
                kind = _type_of(value)
                types[key] = kind if key not in types else join_types(types[key], kind)
    return {k: 'msgpack' if t == _EMPTY_LIST else t for k, t in types.items()}


# Element types a bag list key is made of when inferred (msgpack and tree values,
# lists among them, are stored whole: a list of floats stays one msgpack value).
_LISTABLE = ('bytes', 'utf8', 'int', 'array', 'jpg', 'png')
_EMPTY_LIST = '[]'          # an empty list: fits any list type


def _type_of(value) -> str:
    if isinstance(value, (list, tuple)):
        if not value:
            return _EMPTY_LIST
        kinds = {_scalar_type(v) for v in value}
        kind = kinds.pop() if len(kinds) == 1 else _join_scalars(kinds)
        if kind in _LISTABLE:
            return kind + '[]'
        import numpy as np
        return 'tree' if _holds_array(value, np) else 'msgpack'
    return _scalar_type(value)


def _scalar_type(value) -> str:
    import numpy as np
    if isinstance(value, bool) or value is None:
        return 'msgpack'
    if isinstance(value, int):
        return 'int'
    if isinstance(value, str):
        return 'utf8' if value else 'msgpack'
    if isinstance(value, (np.ndarray, np.generic)):
        return 'array'
    if isinstance(value, (bytes, bytearray)):
        if value.startswith(_JPEG_MAGIC):
            return 'jpg'
        if value.startswith(_PNG_MAGIC):
            return 'png'
        return 'bytes' if value else 'msgpack'
    if _holds_array(value, np):
        return 'tree'                   # lists and maps with arrays inside
    return 'msgpack'


def _join_scalars(kinds: set) -> str:
    if kinds <= {'jpg', 'png', 'bytes'}:
        return 'bytes'                  # images of two kinds, or images and other bytes
    if kinds & {'array', 'tree'}:
        return 'tree'                   # the one whole-value type that holds arrays
    return 'msgpack'


def join_types(a: str, b: str) -> str:
    """The bag type that stores values of both types ``a`` and ``b``.

    >>> join_types('jpg[]', '[]'), join_types('jpg', 'png'), join_types('int', 'utf8')
    ('jpg[]', 'bytes', 'msgpack')
    >>> join_types('utf8[]', 'msgpack'), join_types('array[]', 'int')
    ('msgpack', 'tree')
    """
    if a == b:
        return a
    if _EMPTY_LIST in (a, b):
        other = b if a == _EMPTY_LIST else a
        if other.endswith('[]'):
            return other
        return 'tree' if other in ('array', 'tree') else 'msgpack'
    if a.endswith('[]') and b.endswith('[]'):
        kind = _join_scalars({a[:-2], b[:-2]})
        if kind in _LISTABLE:
            return kind + '[]'
    kinds = {k[:-2] if k.endswith('[]') else k for k in (a, b)}
    return 'tree' if kinds & {'array', 'tree'} else _join_scalars(kinds)


def _holds_array(value, np, depth: int = 0) -> bool:
    if isinstance(value, (np.ndarray, np.generic)):
        return True
    if depth > 32:
        return False
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return False
    return any(_holds_array(v, np, depth + 1) for v in value)


class CopiedReader(Protocol):
    """What a :class:`Source` copies from: its length, and datapoints read in batches."""

    def __len__(self) -> int: ...

    def read_batch(self, indices) -> list: ...


@dataclasses.dataclass
class Source:
    """A dataset opened for copying (:meth:`Reader.source`): images stay encoded bytes.

    ``types`` is ``{key: bag type}``; ``raw`` is True for samples that are
    opaque bytes (``{'data': bytes}``); ``extras`` holds what a target may
    keep besides datapoints (``label2idx``).
    """

    path: str
    format: str
    reader: CopiedReader
    types: dict
    raw: bool = False
    extras: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.reader)


@dataclasses.dataclass
class Plan:
    """How the datapoints of ``source`` map onto the format ``target`` (its writer decides).

    ``settings`` holds the target's decisions (a bag spec, which key holds
    gulp frames, …); :meth:`describe`, :meth:`open` and :meth:`datapoint`
    ask the writer class.
    """

    source: Source
    target: str
    keys: list
    writer: type[Writer]
    settings: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """One line saying what becomes of the data."""
        return f'{self.source.format} {self.source.path} -> {self.writer.describe_plan(self)}'

    def open(self, dst: str, **options):
        """The writer of ``dst``; ``options`` are the command line's, each format takes its own."""
        return self.writer.from_plan(self, dst, **options)

    def datapoint(self, index: int, dp):
        """What the writer appends for datapoint ``index`` of the source."""
        return self.writer.datapoint_for(self, index, dp)
