"""Labels: :class:`label_to_index` and :class:`one_hot`."""

from __future__ import annotations

import os

import numpy as np

from ..errors import ConfigError, SpecError
from .base import Fn, check_key, is_int, positive_int

# ---------------------------------------------------------------------------
# Labels


def _load_mapping(path) -> dict:
    from ..jsonfiles import read_json
    return read_json(path, 'the label mapping', dict, '{label: index}')


class label_to_index(Fn):  # noqa: N801
    """Map a label (or a list of labels) to its int index.

    ``mapping`` is a dict ``{label: index}`` or the path of a JSON file such
    as gulp's ``label2idx.json`` (read once, here). ``mapping=None`` accepts
    labels that are already integers and turns them into Python ints.

    Example::

        label_to_index(mapping={'cat': 0, 'dog': 1})({'label': 'dog'})['label']   # 1
    """

    key: str
    mapping: dict | str | None        # as given: a dict, a path or None

    def __init__(self, key: str = 'label', mapping=None):
        table: dict | None
        if isinstance(mapping, (str, os.PathLike)):
            table, shown = _load_mapping(mapping), os.fspath(mapping)
        elif isinstance(mapping, dict) or mapping is None:
            table, shown = mapping, mapping
        else:
            raise ConfigError(f'mapping must be None, a dict or the path of a JSON file, '
                              f'got {type(mapping).__name__}')
        if table is not None:
            bad = [k for k, v in table.items() if not is_int(v)]
            if bad:
                raise ConfigError(f'mapping values must be ints; label {bad[0]!r} maps to '
                                  f'{table[bad[0]]!r}')
            table = {k: int(v) for k, v in table.items()}
        self._keep(key=check_key(key), mapping=shown)
        self._table = table

    def __repr__(self) -> str:
        mapping = self.mapping
        if isinstance(mapping, dict) and len(mapping) > 6:
            mapping = f'<{len(mapping)} labels>'
            return f'{type(self).__name__}(key={self.key!r}, mapping={mapping})'
        return super().__repr__()

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        value = self._get(dp, self.key)
        if isinstance(value, (list, tuple)):
            return {**dp, self.key: [self._one(v) for v in value]}
        return {**dp, self.key: self._one(value)}

    def _one(self, label) -> int:
        if self._table is None:
            if is_int(label):
                return int(label)
            raise SpecError(f'{self!r}: label {label!r} of key {self.key!r} is not an int; '
                            f'pass mapping= (a dict or a label2idx.json path)')
        try:
            return self._table[label]
        except (KeyError, TypeError):
            raise SpecError(f'{self!r}: label {label!r} of key {self.key!r} is not in the mapping '
                            f'({len(self._table)} labels)') from None


class one_hot(Fn):  # noqa: N801
    """An int label to a float32 vector of ``num_classes`` with a 1 at the label.

    Example::

        one_hot(num_classes=4)({'label': 2})['label']   # [0., 0., 1., 0.]
    """

    key: str
    num_classes: int

    def __init__(self, key: str = 'label', num_classes: int | None = None):
        self._keep(key=check_key(key), num_classes=positive_int(num_classes, 'num_classes'))

    def __call__(self, dp: dict, seed: int | None = None) -> dict:
        label = self._get(dp, self.key)
        if isinstance(label, np.ndarray) and label.ndim == 0:
            label = label[()]
        if not is_int(label) or not 0 <= label < self.num_classes:
            raise SpecError(f'{self!r}: key {self.key!r} must be an int label in '
                            f'[0, {self.num_classes}), got {label!r}')
        out = np.zeros(self.num_classes, np.float32)
        out[int(label)] = 1
        return {**dp, self.key: out}
