"""What an FFRecord sample holds: msgpack (numpy values as msgpack-numpy) or JSON,
found out by looking when ``decode='auto'``.
"""

from __future__ import annotations

import json

import msgpack
import numpy as np

from ...codecs import array_from_parts
from ...errors import DecodeError, WriterError


def pack_msgpack(datapoint: dict, path: str | None = None, index: int | None = None) -> bytes:
    """One datapoint as the msgpack map an FFRecord sample holds; numpy values as msgpack-numpy.

    An array becomes ``{b'nd': True, b'type': dtype.str, b'kind': b'', b'shape': shape,
    b'data': C-order bytes}`` and a numpy scalar ``{b'nd': False, b'type', b'data'}``,
    exactly what ``msgpack_numpy.encode`` gives, so its users read the samples as they
    are; ``decode='msgpack'`` turns them back into arrays.

    >>> msgpack.unpackb(pack_msgpack({'label': 3}))
    {'label': 3}
    """
    try:
        return msgpack.packb(datapoint, use_bin_type=True, default=_pack_numpy)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WriterError(f'datapoint {index} cannot be stored as msgpack: {exc}', path,
                          index) from exc


def _pack_numpy(value):
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.hasobject or value.dtype.kind == 'V':
            raise TypeError(f'numpy values of dtype {value.dtype} cannot be stored as bytes')
        if isinstance(value, np.generic):
            return {b'nd': False, b'type': value.dtype.str, b'data': value.tobytes()}
        if not value.flags.c_contiguous:      # (ascontiguousarray would make 0-d arrays 1-d)
            value = value.copy(order='C')
        return {b'nd': True, b'type': value.dtype.str, b'kind': b'', b'shape': value.shape,
                b'data': value.tobytes()}
    raise TypeError(f'can not serialize {type(value).__name__!r} object')


def unpack_numpy(obj: dict):
    """``object_hook`` of the msgpack decoder: msgpack-numpy's maps back into numpy values.

    Arrays come back read-only, checked before anything is allocated
    (:func:`loadr.codecs.array_from_parts`); structured (``kind`` V) and object
    dtypes are refused.
    """
    nd = obj.get(b'nd')
    if nd is None or b'type' not in obj or b'data' not in obj:
        return obj
    if nd is True:
        if obj.get(b'kind', b'') != b'':
            raise DecodeError(f'a numpy array of kind {obj[b"kind"]!r} (structured) is not '
                              f'supported')
        return array_from_parts(obj[b'type'], obj.get(b'shape'), obj[b'data'])
    if nd is False:
        return array_from_parts(obj[b'type'], [], obj[b'data'])[()]
    return obj


def detect_decode(data: bytes) -> str | None:
    """``'msgpack'`` for a msgpack map, ``'json'`` for a JSON object, else None (bytes)."""
    try:
        if isinstance(msgpack.unpackb(data, raw=False, strict_map_key=False), dict):
            return 'msgpack'
    except Exception:   # noqa: BLE001 - any failure just means "not msgpack"
        pass
    try:
        if isinstance(json.loads(data), dict):
            return 'json'
    except (ValueError, RecursionError):
        pass
    return None


def decode_named(decode: str, data: bytes):
    """One sample's bytes decoded as ``decode`` says: ``'msgpack'`` (numpy values too) or JSON."""
    if decode == 'msgpack':
        return msgpack.unpackb(data, raw=False, strict_map_key=False, object_hook=unpack_numpy)
    return json.loads(data)
