"""Encoders and decoders by type name, as granular 0.20.3 names them.

``encode(type, value) -> bytes`` and ``decode(type, data) -> value`` for the
types of granular's ``formats.py``: ``bytes``, ``utf8``, ``msgpack``,
``int``, ``i64``, ``u64``, ``array``, ``tree``, ``jpg``, ``png``. The bytes
are granular's, byte for byte, for every value granular can encode
(``tests/test_codecs.py`` and the bag fixtures prove it). ``mp4``/``webm``
are known names that loadr does not support (a clear error both ways).

Where loadr differs from granular, on purpose:

- ``int``: granular sizes the value with ``ceil(log2(1 + v) / 8)`` bytes and
  so fails for negatives and for values whose bit length is a multiple of 8
  (128..255, 32768..65535, ...). loadr writes the fewest bytes of signed
  little-endian two's complement (at least 1), which is exactly granular's
  output wherever granular succeeds, and which granular's decoder reads
  back right. Values that need more than 16 bytes are refused, because
  granular's decoder refuses them.
- ``jpg``/``png`` given as ``bytes`` are stored as they are (already
  encoded; the magic number is checked). Arrays are encoded like granular:
  Pillow's defaults, so JPEG quality 75 (granular ignores its quality
  argument).
- ``array``/``tree`` accept non-contiguous arrays (copied to C order) and
  refuse object dtypes; their decoders check the dtype string (nothing that
  could unpickle) and that the byte count matches the shape.
- ``msgpack``/``tree`` decode maps with non-string keys (granular's writer
  can write them; its reader cannot).
- ``tree``: a 4-list ``['_', dtype, shape, bytes]`` is an array leaf only
  when its parts have those types; anything else stays a list.

Encoders raise TypeError (wrong kind of value) or ValueError (a value that
does not fit); decoders raise :class:`loadr.errors.DecodeError` (the caller
adds the file and index).

Example::

    data = encode('int', 300)          # b'\\x2c\\x01'
    decode('int', data)                # 300
    pixels = decode('jpg', jpeg_bytes) # uint8 H×W×3 (or H×W for grayscale)
"""

from __future__ import annotations

import io
import math
import operator
import re

import msgpack
import numpy as np

from .errors import DecodeError

__all__ = ['decode_image', 'encode_image', 'jpeg_header', 'ENCODERS', 'DECODERS', 'encode',
           'decode', 'TYPES', 'UNSUPPORTED_TYPES']

JPEG_QUALITY = 90
# The only formats decode_image hands to Pillow. Without this list Pillow picks a
# plugin by content, so a 'jpg' value from an untrusted file could be an EPS
# (run through Ghostscript when loaded), a TIFF, a PSD, ...: far more parser
# than a data loader needs to expose.
IMAGE_FORMATS = ('JPEG', 'PNG')


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
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
            if draft is not None and img.format == 'JPEG':
                img.draft(img.mode if mode is None else mode, draft)
            if mode is not None and img.mode != mode:
                return np.asarray(img.convert(mode))
            return np.asarray(img)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DecodeError(f'cannot decode image: {image_problem(data, exc)}') from exc
    except KeyError as exc:     # formats= names a plugin that this Pillow could not import
        raise DecodeError(f'cannot decode image: Pillow has no {exc.args[0]} plugin '
                          f'(a broken Pillow install?)') from exc


# What a file starts with, for naming what a damaged one was meant to be.
_IMAGE_MAGIC = (('JPEG', (b'\xff\xd8',)), ('PNG', (b'\x89PNG\r\n\x1a\n',)),
                ('GIF', (b'GIF87a', b'GIF89a')), ('TIFF', (b'II*\x00', b'MM\x00*')),
                ('BMP', (b'BM',)))
_BYTESIO = re.compile(r'<_io\.BytesIO object at 0x[0-9a-fA-F]+>')


def image_kind(data: bytes) -> str | None:
    """The image format ``data`` starts like ('JPEG', 'PNG', ...), or None.

    >>> image_kind(b'\\xff\\xd8\\xff\\xe0'), image_kind(b'hello')
    ('JPEG', None)
    """
    head = bytes(data[:12])
    if head[:4] == b'RIFF' and head[8:12] == b'WEBP':
        return 'WEBP'
    for kind, magics in _IMAGE_MAGIC:
        if head.startswith(magics):
            return kind
    return None


def image_problem(data: bytes, exc: BaseException, expected: str = 'a JPEG or PNG file',
                  accepted: tuple = IMAGE_FORMATS) -> str:
    """What is wrong with image bytes that Pillow refused with ``exc``, in words.

    Says *empty* for no bytes, *a damaged JPEG* (PNG, ...) for bytes that start
    like one of the ``accepted`` formats, and *not {expected}* for anything
    else; never Pillow's ``<_io.BytesIO object at 0x...>``.

    >>> from PIL import UnidentifiedImageError
    >>> image_problem(b'', UnidentifiedImageError('x'))
    'an empty file (0 bytes), not an image'
    >>> image_problem(b'\\xff\\xd8\\xff\\xe0\\x00\\x00', UnidentifiedImageError('x'))
    'a damaged JPEG (6 bytes): its header does not parse'
    """
    from PIL import UnidentifiedImageError
    n = len(data)
    if n == 0:
        return 'an empty file (0 bytes), not an image'
    kind = image_kind(data)
    if kind is not None and kind not in accepted:
        return f'not {expected}: a {kind} file ({n} bytes starting {bytes(data[:4])!r})'
    if isinstance(exc, UnidentifiedImageError):
        if kind is not None:
            return f'a damaged {kind} ({n} bytes): its header does not parse'
        return f'not {expected} ({n} bytes starting {bytes(data[:4])!r})'
    text = _BYTESIO.sub('the image bytes', str(exc)) or type(exc).__name__
    # Pillow reports broken and truncated data as OSError (SyntaxError in a few
    # plugins); a decompression bomb or a bad mode is no damage.
    damaged = isinstance(exc, (OSError, SyntaxError)) and kind is not None
    return f'a damaged {kind} ({n} bytes): {text}' if damaged else text


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


# ---------------------------------------------------------------------------
# granular's value codecs

#: The type names loadr encodes and decodes (granular 0.20.3's formats.py).
TYPES = ('bytes', 'utf8', 'msgpack', 'int', 'i64', 'u64', 'array', 'tree', 'jpg', 'png')
#: Type names granular knows that loadr refuses with a clear error (video needs PyAV).
UNSUPPORTED_TYPES = ('mp4', 'webm')

# granular's decode_int asserts at most 16 bytes; we never write what it cannot read.
INT_MAX_BYTES = 16
# numpy's own limit is 64 dimensions; a shape longer than that is corrupt data.
ARRAY_MAX_DIMS = 64
# What a dtype.str looks like: byte order, kind, item size, optional datetime unit.
# Kind 'O' (object) is absent on purpose: it is the only way to pickles.
_DTYPE_STR = re.compile(r'[<>|=]?[biufcmMSUV][0-9]{1,9}(\[[0-9]*[A-Za-z]+\])?\Z')
_MAGIC = {'jpg': (b'\xff\xd8',), 'png': (b'\x89PNG\r\n\x1a\n',)}


# The JPEG frame types jpeg_header takes: baseline, extended and progressive Huffman.
_SOF_TAKEN = (0xC0, 0xC1, 0xC2)
_SOF_ANY = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_header(data: bytes) -> tuple[int, int, str] | None:
    """``(height, width, mode)`` from a JPEG's frame header ('RGB' for 3 components, 'L'
    for 1), or None for anything else: not a JPEG, 4 components, not 8-bit, a frame type
    other than baseline, extended or progressive Huffman (lossless, hierarchical and
    arithmetic-coded files, which libjpeg-turbo versions do not all decode alike).

    >>> jpeg_header(encode_image(np.zeros((30, 40, 3), np.uint8)))
    (30, 40, 'RGB')
    >>> jpeg_header(b'not a JPEG') is None
    True
    """
    if data[:3] != b'\xff\xd8\xff':
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:          # fill bytes before a marker
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            i += 2                  # markers without a length
            continue
        if marker in (0xD9, 0xDA):  # end of image, or entropy data before any frame
            return None
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            return None
        if marker in _SOF_ANY:
            if marker not in _SOF_TAKEN or i + 10 > n or data[i + 4] != 8:
                return None
            h, w, comps = (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8], \
                data[i + 9]
            if h == 0 or w == 0 or comps not in (1, 3):
                return None
            return h, w, 'L' if comps == 1 else 'RGB'
        i += 2 + length
    return None


def _as_int(value) -> int:
    if isinstance(value, bool) or not hasattr(value, '__index__'):
        raise TypeError(f'expected an int, got {type(value).__name__}')
    return operator.index(value)


def encode_int(value) -> bytes:
    """Signed little-endian two's complement in the fewest bytes (at least 1).

    >>> encode_int(255), encode_int(-1)
    (b'\\xff\\x00', b'\\xff')
    """
    value = _as_int(value)
    magnitude = value if value >= 0 else ~value
    size = max(1, (magnitude.bit_length() + 8) // 8)  # +1 bit for the sign
    if size > INT_MAX_BYTES:
        raise ValueError(f'int {value} needs {size} bytes; granular reads at most {INT_MAX_BYTES}')
    return value.to_bytes(size, 'little', signed=True)


def decode_int(data: bytes) -> int:
    """Inverse of :func:`encode_int`. ``decode_int(b'\\x2c\\x01') == 300``."""
    if not 1 <= len(data) <= INT_MAX_BYTES:
        raise DecodeError(f'an int takes 1 to {INT_MAX_BYTES} bytes, not {len(data)}')
    return int.from_bytes(data, 'little', signed=True)


def _fixed_int(signed: bool):
    def encode_fixed(value) -> bytes:
        value = _as_int(value)
        try:
            return value.to_bytes(8, 'little', signed=signed)
        except OverflowError:
            kind = 'i64' if signed else 'u64'
            raise ValueError(f'{value} does not fit in {kind}') from None

    def decode_fixed(data: bytes) -> int:
        if len(data) != 8:
            raise DecodeError(f'an {"i64" if signed else "u64"} takes 8 bytes, not {len(data)}')
        return int.from_bytes(data, 'little', signed=signed)
    return encode_fixed, decode_fixed


encode_i64, decode_i64 = _fixed_int(True)
encode_u64, decode_u64 = _fixed_int(False)


def _contiguous(value: np.ndarray) -> np.ndarray:
    if value.dtype.hasobject:
        raise TypeError(f'object arrays cannot be stored (dtype {value.dtype})')
    return value if value.flags.c_contiguous else value.copy(order='C')


def _unpack(data: bytes):
    try:
        return msgpack.unpackb(data, strict_map_key=False)
    except (ValueError, TypeError, OverflowError, RecursionError,
            msgpack.UnpackException) as exc:
        raise DecodeError(f'bad msgpack: {exc}') from exc


def array_from_parts(dtype, shape, data) -> np.ndarray:
    """A read-only array from a stored ``(dtype.str, shape, bytes)``, all checked.

    >>> array_from_parts('<i2', [2], b'\\x01\\x00\\x02\\x00').tolist()
    [1, 2]
    """
    if not isinstance(dtype, str) or not _DTYPE_STR.match(dtype):
        raise DecodeError(f'not a plain numpy dtype string: {dtype!r}')
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise DecodeError(f'bad dtype {dtype!r}: {exc}') from exc
    if dt.hasobject or dt.itemsize == 0:
        raise DecodeError(f'dtype {dtype!r} cannot be stored as bytes')
    if (not isinstance(shape, (list, tuple)) or len(shape) > ARRAY_MAX_DIMS
            or not all(type(n) is int and n >= 0 for n in shape)):
        raise DecodeError(f'bad array shape {shape!r}')
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f'array data must be bytes, not {type(data).__name__}')
    # Compare before numpy sees the shape: a lying shape must not allocate.
    want = math.prod(shape) * dt.itemsize
    if want != len(data):
        raise DecodeError(f'array {dtype}{tuple(shape)} needs {want} bytes, has {len(data)}')
    return np.frombuffer(data, dt).reshape(shape)


def encode_array(value) -> bytes:
    """msgpack of ``(dtype.str, shape, C-order bytes)``, as granular writes it.

    >>> encode_array(np.zeros(2, np.uint8))
    b'\\x93\\xa3|u1\\x91\\x02\\xc4\\x02\\x00\\x00'
    """
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise TypeError(f'expected a numpy array, got {type(value).__name__}')
    value = _contiguous(value)
    return msgpack.packb((value.dtype.str, value.shape, value.tobytes()))


def decode_array(data: bytes) -> np.ndarray:
    """Inverse of :func:`encode_array`; a read-only array (as granular's).

    >>> decode_array(encode_array(np.arange(3))).tolist()
    [0, 1, 2]
    """
    parts = _unpack(data)
    if not isinstance(parts, list) or len(parts) != 3:
        raise DecodeError('an array is a msgpack list [dtype, shape, bytes]')
    return array_from_parts(*parts)


def _tree_pack(value):
    if isinstance(value, (list, tuple)):
        return [_tree_pack(x) for x in value]
    if isinstance(value, dict):
        return {k: _tree_pack(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        value = _contiguous(value)
        return ('_', value.dtype.str, value.shape, value.tobytes())
    return value


def _is_leaf(x) -> bool:
    return (len(x) == 4 and x[0] == '_' and isinstance(x[1], str)
            and isinstance(x[2], list) and isinstance(x[3], bytes))


def _tree_unpack(value):
    if isinstance(value, list):
        if _is_leaf(value):
            return array_from_parts(*value[1:])
        return [_tree_unpack(x) for x in value]
    if isinstance(value, dict):
        return {k: _tree_unpack(v) for k, v in value.items()}
    return value


def encode_tree(value) -> bytes:
    """msgpack of nested lists/dicts; arrays become ``('_', dtype.str, shape, bytes)``.

    >>> encode_tree({'a': (1, None)})
    b'\\x81\\xa1a\\x92\\x01\\xc0'
    """
    try:
        return msgpack.packb(_tree_pack(value))
    except RecursionError:
        raise ValueError('tree is nested too deeply') from None


def decode_tree(data: bytes):
    """Inverse of :func:`encode_tree`; tuples come back as lists, leaves as arrays.

    >>> decode_tree(encode_tree({'a': (1, np.ones(2))}))['a'][1].tolist()
    [1.0, 1.0]
    """
    tree = _unpack(data)
    try:
        return _tree_unpack(tree)
    except RecursionError:
        raise DecodeError('tree is nested too deeply') from None


def _image_codec(type_name: str, pillow_format: str):
    def encode_img(value) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value)  # already encoded: stored as it is
            if not value.startswith(_MAGIC[type_name]):
                raise ValueError(f'bytes given for {type_name!r} are not a {pillow_format} file')
            return value
        if not isinstance(value, np.ndarray):
            raise TypeError(f'expected an image array or encoded bytes, got {type(value).__name__}')
        if value.ndim == 3 and value.shape[2] == 1:
            value = value[:, :, 0]
        from PIL import Image
        buf = io.BytesIO()
        try:
            # No save options: Pillow's defaults are granular's bytes (JPEG quality 75).
            Image.fromarray(_contiguous(value)).save(buf, format=pillow_format)
        except (TypeError, ValueError, OSError, KeyError) as exc:
            raise ValueError(f'cannot encode {value.dtype}{value.shape} as {type_name}: {exc}'
                             ) from exc
        return buf.getvalue()

    def decode_img(data: bytes) -> np.ndarray:
        return decode_image(data)
    return encode_img, decode_img


encode_jpg, decode_jpg = _image_codec('jpg', 'JPEG')
encode_png, decode_png = _image_codec('png', 'PNG')


def _unsupported(type_name: str):
    message = (f'type {type_name!r} (video) is not supported by loadr; '
               f'read that key with a mask that leaves it out')

    def encode_video(value):
        raise ValueError(message)

    def decode_video(data):
        raise DecodeError(message)
    return encode_video, decode_video


def _encode_bytes(value) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f'expected bytes, got {type(value).__name__}')
    return bytes(value)


def _encode_utf8(value) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f'expected a str, got {type(value).__name__}')
    return value.encode('utf-8')


def _decode_utf8(data: bytes) -> str:
    try:
        return bytes(data).decode('utf-8')
    except UnicodeDecodeError as exc:
        raise DecodeError(f'bad utf8: {exc}') from exc


ENCODERS: dict = {
    'bytes': _encode_bytes,
    'utf8': _encode_utf8,
    'msgpack': msgpack.packb,
    'int': encode_int,
    'i64': encode_i64,
    'u64': encode_u64,
    'array': encode_array,
    'tree': encode_tree,
    'jpg': encode_jpg,
    'png': encode_png,
}
DECODERS: dict = {
    'bytes': bytes,
    'utf8': _decode_utf8,
    'msgpack': _unpack,
    'int': decode_int,
    'i64': decode_i64,
    'u64': decode_u64,
    'array': decode_array,
    'tree': decode_tree,
    'jpg': decode_jpg,
    'png': decode_png,
}
for _name in UNSUPPORTED_TYPES:
    ENCODERS[_name], DECODERS[_name] = _unsupported(_name)


def encode(type_name: str, value) -> bytes:
    """Encode one value of a granular type name (no ``[]`` suffix).

    >>> encode('utf8', 'hé')
    b'h\\xc3\\xa9'
    """
    try:
        fn = ENCODERS[type_name]
    except KeyError:
        raise ValueError(f'unknown type {type_name!r}; known: {sorted(ENCODERS)}') from None
    return fn(value)


def decode(type_name: str, data: bytes):
    """Decode one value of a granular type name; raises DecodeError on bad bytes.

    >>> decode('i64', b'\\xff' * 8)
    -1
    """
    try:
        fn = DECODERS[type_name]
    except KeyError:
        raise DecodeError(f'unknown type {type_name!r}; known: {sorted(DECODERS)}') from None
    return fn(data)
