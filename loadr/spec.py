"""The spec of a batch: ``{key: (dtype, shape)}``, inferred from one datapoint.

A datapoint becomes arrays key by key: a value that numpy sees as numbers or
booleans (an ndarray, a Python or numpy scalar, a list of equal-shape
frames) is an *array key*, stacked into a ``(batch, *shape)`` array; any
other value (str, bytes, dict, ragged lists) is a *list key*, handed over as
a Python list. The spec says which is which (``dtype == object`` for list
keys); every datapoint of a batch must match it (:mod:`loadr.assemble` writes
the rows and checks them).

Example::

    infer_spec({'image': np.zeros((2, 2, 3), np.uint8), 'label': 7, 'path': 'a.jpg'})
    # {'image': (dtype('uint8'), (2, 2, 3)), 'label': (dtype('int64'), ()),
    #  'path': (dtype('O'), ())}
"""

from __future__ import annotations

import numpy as np

from .errors import SpecError

__all__ = ['OBJECT', 'value_spec', 'as_array', 'infer_spec']

# The dtype of a list key.
OBJECT = np.dtype(object)


def value_spec(value) -> tuple[np.dtype, tuple]:
    """``(dtype, shape)`` of one value; dtype is object for a list key.

    >>> value_spec(3)
    (dtype('int64'), ())
    >>> value_spec('cat')
    (dtype('O'), ())
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, (bool, int, float, complex, np.generic)):
        arr = np.asarray(value)
    elif _array_like(value):
        try:
            arr = as_array(value)
        except Exception:           # e.g. a tensor on a GPU: a list key, as it always was
            return OBJECT, ()
    elif (isinstance(value, (list, tuple)) and value
          and (isinstance(value[0], (np.ndarray, np.generic, bool, int, float))
               or _array_like(value[0]))):
        try:
            arr = as_array(value)
        except (ValueError, TypeError):
            return OBJECT, ()
    else:
        return OBJECT, ()
    if arr.dtype.kind not in 'biufc':
        return OBJECT, ()
    return arr.dtype, arr.shape


def _array_like(value) -> bool:
    cls = type(value)
    return hasattr(cls, '__array__') or hasattr(cls, '__dlpack__')


def as_array(value) -> np.ndarray:
    """``value`` as a numpy array: a torch or jax array, or anything with ``__array__`` or
    DLPack (``__dlpack__``), is viewed, not copied, where numpy can.

    >>> as_array([1, 2]).tolist()
    [1, 2]
    """
    cls = type(value)
    if not hasattr(cls, '__array__') and hasattr(cls, '__dlpack__'):
        return np.from_dlpack(value)
    return np.asarray(value)


def infer_spec(datapoint: dict | tuple) -> dict:
    """The spec of one datapoint, keys in the datapoint's order.

    A tuple datapoint ``(x, y)`` has the keys ``0, 1``; a spec whose keys
    are ``0 .. k-1`` makes the Loader give tuple batches.

    >>> infer_spec((np.zeros(3, np.float32), 7))
    {0: (dtype('float32'), (3,)), 1: (dtype('int64'), ())}
    """
    if isinstance(datapoint, tuple):
        return {key: value_spec(value) for key, value in enumerate(datapoint)}
    if not isinstance(datapoint, dict):
        raise SpecError(f'a datapoint must be a dict or a tuple, got '
                        f'{type(datapoint).__name__}')
    return {key: value_spec(value) for key, value in datapoint.items()}
