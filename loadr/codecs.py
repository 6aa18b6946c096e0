"""Encoders and decoders by type name, as granular names them.

``encode(type, value) -> bytes`` and ``decode(type, data) -> value``; the
image codecs use Pillow. Decoders raise :class:`loadr.errors.DecodeError`
(the caller adds the file and index).

Example::

    data = encode('int', 300)          # b'\\x2c\\x01'
    decode('int', data)                # 300
    pixels = decode('jpg', jpeg_bytes) # uint8 H×W×3 (or H×W for grayscale)
"""

from __future__ import annotations

import io

import numpy as np

from .errors import DecodeError

__all__ = ['decode_image', 'encode_image', 'ENCODERS', 'DECODERS', 'encode', 'decode']

JPEG_QUALITY = 90


def decode_image(data: bytes, mode: str | None = None, draft: tuple[int, int] | None = None
                 ) -> np.ndarray:
    """Decode a JPEG or PNG with Pillow to a uint8 array (H×W×C, or H×W for grayscale).

    ``draft=(w, h)`` lets libjpeg scale down by DCT while decoding, to no
    smaller than that size.

    >>> decode_image(encode_image(np.zeros((4, 4, 3), np.uint8))).shape
    (4, 4, 3)
    """
    from PIL import Image
    try:
        with Image.open(io.BytesIO(data)) as img:
            if draft is not None and img.format == 'JPEG':
                img.draft(img.mode if mode is None else mode, draft)
            if mode is not None and img.mode != mode:
                img = img.convert(mode)
            return np.asarray(img)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DecodeError(f'cannot decode image: {exc}') from exc


def encode_image(array: np.ndarray, format: str = 'JPEG', quality: int = JPEG_QUALITY) -> bytes:
    """Encode a uint8 H×W×3 or H×W array as JPEG (default quality 90) or PNG.

    >>> encode_image(np.zeros((2, 2), np.uint8))[:2]
    b'\\xff\\xd8'
    """
    from PIL import Image
    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim not in (2, 3):
        raise ValueError(f'an image must be uint8 H×W or H×W×C, not {array.dtype} {array.shape}')
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    buf = io.BytesIO()
    options = {'quality': quality} if format.upper() in ('JPEG', 'JPG') else {}
    Image.fromarray(array).save(buf, format=format, **options)
    return buf.getvalue()


ENCODERS: dict = {}
DECODERS: dict = {}


def encode(type_name: str, value) -> bytes:
    """Encode one value of a granular type name (no ``[]`` suffix)."""
    try:
        fn = ENCODERS[type_name]
    except KeyError:
        raise ValueError(f'unknown type {type_name!r}; known: {sorted(ENCODERS)}') from None
    return fn(value)


def decode(type_name: str, data: bytes):
    """Decode one value of a granular type name; raises DecodeError on bad bytes."""
    try:
        fn = DECODERS[type_name]
    except KeyError:
        raise DecodeError(f'unknown type {type_name!r}; known: {sorted(DECODERS)}') from None
    return fn(data)
