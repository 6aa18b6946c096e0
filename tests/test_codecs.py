"""loadr.codecs: granular's value codecs, byte for byte, and their checks on bad bytes."""

from __future__ import annotations

import hashlib
import importlib.util
import io

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from loadr import codecs
from loadr.codecs import decode, encode
from loadr.errors import DecodeError
from tests.readers.common import assert_equal


def granular_int_bytes(value: int) -> bytes | None:
    """granular 0.20.3's int encoding as the fixtures README states it, or None where it fails:
    ceil(log2(1 + v) / 8) bytes (at least 1), signed little-endian."""
    try:
        with np.errstate(all='ignore'):
            size = np.ceil(np.log2(1 + value) / 8)
    except TypeError:           # beyond uint64 numpy has no log2 for a Python int
        return None
    if not np.isfinite(size):
        return None
    try:
        return value.to_bytes(max(1, int(size)), 'little', signed=True)
    except OverflowError:
        return None


# -- int, i64, u64 -------------------------------------------------------------------------

@pytest.mark.parametrize('value, data', [
    (0, b'\x00'), (1, b'\x01'), (127, b'\x7f'), (300, b'\x2c\x01'), (4095, b'\xff\x0f'),
    (32767, b'\xff\x7f'), (70000, b'\x70\x11\x01'),
    (2 ** 40 + 3, b'\x03\x00\x00\x00\x00\x01'),   # the fixtures README's example: 6 bytes
])
def test_int_bytes_are_granulars(value, data):
    assert encode('int', value) == data == granular_int_bytes(value)
    assert decode('int', data) == value


def test_int_matches_granular_wherever_granular_succeeds():
    values = list(range(0, 70_000)) + [2 ** k + d for k in range(8, 63) for d in (-2, -1, 0, 1)]
    compared = 0
    for v in values:
        expected = granular_int_bytes(v)
        if expected is not None:
            assert encode('int', v) == expected, v
            compared += 1
    assert compared > 37_000   # all but 128..255 and 32768..65535


@pytest.mark.parametrize('value, data', [
    # granular raises for these (negatives; bit length a multiple of 8): fewest signed bytes.
    (128, b'\x80\x00'), (255, b'\xff\x00'), (32768, b'\x00\x80\x00'), (65535, b'\xff\xff\x00'),
    (-1, b'\xff'), (-128, b'\x80'), (-129, b'\x7f\xff'), (-(2 ** 63), b'\x00' * 7 + b'\x80'),
    (2 ** 127 - 1, b'\xff' * 15 + b'\x7f'),
])
def test_int_quirk_values_get_fewest_signed_bytes(value, data):
    assert granular_int_bytes(value) is None
    assert encode('int', value) == data
    # granular's decoder is int.from_bytes(signed=True): it reads these back right.
    assert int.from_bytes(data, 'little', signed=True) == value
    assert decode('int', data) == value


@given(st.integers(min_value=-(2 ** 127), max_value=2 ** 127 - 1))
@settings(max_examples=300, deadline=None)
def test_int_round_trips_in_fewest_bytes(value):
    data = encode('int', value)
    assert decode('int', data) == value
    if len(data) > 1:   # one byte fewer would not hold it
        with pytest.raises(OverflowError):
            value.to_bytes(len(data) - 1, 'little', signed=True)


def test_int_refuses_what_granular_cannot_read_and_wrong_kinds():
    with pytest.raises(ValueError, match='16'):
        encode('int', 2 ** 127)
    for bad in ('3', 3.0, True, None):
        with pytest.raises(TypeError):
            encode('int', bad)
    assert encode('int', np.int64(-5)) == b'\xfb'
    for data in (b'', b'\x01' * 17):
        with pytest.raises(DecodeError):
            decode('int', data)


def test_i64_u64():
    assert encode('i64', -1) == b'\xff' * 8
    assert encode('i64', 12345) == b'\x39\x30' + b'\x00' * 6
    assert encode('u64', 2 ** 64 - 1) == b'\xff' * 8
    assert decode('i64', b'\x00' * 7 + b'\x80') == -(2 ** 63)
    assert decode('u64', b'\x00' * 7 + b'\x80') == 2 ** 63
    for kind, bad in (('i64', 2 ** 63), ('i64', -(2 ** 63) - 1), ('u64', -1), ('u64', 2 ** 64)):
        with pytest.raises(ValueError):
            encode(kind, bad)
    for kind in ('i64', 'u64'):
        for data in (b'', b'\x00' * 7, b'\x00' * 9):
            with pytest.raises(DecodeError, match='8 bytes'):
                decode(kind, data)


# -- bytes, utf8, msgpack ------------------------------------------------------------------

def test_bytes_and_utf8():
    assert encode('bytes', b'\x00\xff') == b'\x00\xff'
    assert encode('bytes', bytearray(b'ab')) == b'ab'
    assert decode('bytes', b'\x00\xff') == b'\x00\xff'
    assert encode('utf8', 'naïve 🎉') == 'naïve 🎉'.encode()
    assert decode('utf8', '日本語'.encode()) == '日本語'
    with pytest.raises(TypeError):
        encode('bytes', 'text')
    with pytest.raises(TypeError):
        encode('utf8', b'bytes')
    with pytest.raises(DecodeError, match='utf8'):
        decode('utf8', b'ok \xff\xfe')


def test_msgpack_is_plain_packb_and_checks_bytes():
    value = {'split': 'val', 'score': 0.454761, 'ok': True, 'nested': {'a': [14], 'b': None},
             'neg': -1000, 'raw': b'\x00'}
    assert encode('msgpack', value) == msgpack.packb(value)
    assert decode('msgpack', encode('msgpack', value)) == value
    assert decode('msgpack', msgpack.packb({1: 'int key'})) == {1: 'int key'}
    for bad in (b'', b'\xc1', b'\x92\x01', b'\x01\x02', b'\xa5ab'):
        with pytest.raises(DecodeError, match='msgpack'):
            decode('msgpack', bad)
    with pytest.raises(TypeError):
        encode('msgpack', np.zeros(2))


# -- array ---------------------------------------------------------------------------------

def test_array_bytes_are_granulars():
    assert encode('array', np.arange(3, dtype='<i2')) == (
        b'\x93\xa3<i2\x91\x03\xc4\x06\x00\x00\x01\x00\x02\x00')
    assert encode('array', np.zeros((0, 3), '<f4')) == b'\x93\xa3<f4\x92\x00\x03\xc4\x00'
    assert encode('array', np.array(5, np.uint8)) == b'\x93\xa3|u1\x90\xc4\x01\x05'


@pytest.mark.parametrize('array', [
    np.arange(6, dtype='<i8').reshape(2, 3), np.array([True, False]), np.float16([1.5, -2]),
    np.arange(4, dtype='>i4'), np.array([1 + 2j], '<c16'), np.array(['ab', 'c']),
    np.array([b'xy']), np.array(['2024-06-11'], 'datetime64[ns]'), np.array(7.25),
    np.zeros((2, 0, 3), np.uint8), np.arange(12, dtype=np.float32).reshape(3, 4).T,
    np.zeros(2, dtype=[('a', '<i4'), ('b', '<f8')]),
], ids=lambda a: f'{a.dtype.str}{a.shape}')
def test_array_round_trips(array):
    out = decode('array', encode('array', array))
    expected = array.copy(order='C')
    if array.dtype.names:      # granular stores dtype.str: a structured array comes back as void
        expected = expected.view(f'|V{array.dtype.itemsize}')
    assert_equal(out, expected)


@pytest.mark.parametrize('parts, match', [
    (['|O', [1], b'\x00' * 8], 'dtype'),
    (['O8', [1], b'\x00' * 8], 'dtype'),
    (['object', [1], b'\x00' * 8], 'dtype'),
    (["[('a', 'O')]", [1], b'\x00' * 8], 'dtype'),
    (['|S0', [1], b''], 'dtype'),
    (['<q9', [1], b'\x00'], 'dtype'),
    ([5, [1], b'\x00'], 'dtype'),
    (['<i4', [3], b'\x00' * 8], 'needs 12 bytes'),
    (['<i4', [2 ** 60, 2 ** 60], b'\x00' * 8], 'bytes'),       # a lying shape: no allocation
    (['<i4', [-2], b'\x00' * 8], 'shape'),
    (['<i4', [True], b'\x00' * 4], 'shape'),
    (['<i4', 2, b'\x00' * 8], 'shape'),
    (['<i4', [1] * 65, b'\x00' * 4], 'shape'),
    (['<i4', [1], 'text'], 'bytes'),
])
def test_array_decoder_refuses_bad_parts(parts, match):
    with pytest.raises(DecodeError, match=match):
        decode('array', msgpack.packb(parts))


def test_array_decoder_refuses_bad_structure_and_encoder_object_arrays():
    for bad in (msgpack.packb(['<i4', [1]]), msgpack.packb({'a': 1}), b'\xc1', b''):
        with pytest.raises(DecodeError):
            decode('array', bad)
    with pytest.raises(TypeError, match='object'):
        encode('array', np.array([{}, 1], dtype=object))
    with pytest.raises(TypeError):
        encode('array', [1, 2, 3])


# -- tree ----------------------------------------------------------------------------------

def test_tree_bytes_are_granulars_and_round_trip():
    tree = {'arr': np.array([[19], [34]], '<i4'), 'list': (0, 's0', np.zeros(0), None, True),
            'nested': {'x': 0.5, 'y': [[], {}], 'z': [1, 2]}}
    data = encode('tree', tree)
    assert data == msgpack.packb({
        'arr': ['_', '<i4', [2, 1], np.array([[19], [34]], '<i4').tobytes()],
        'list': [0, 's0', ['_', '<f8', [0], b''], None, True],
        'nested': {'x': 0.5, 'y': [[], {}], 'z': [1, 2]}})
    out = decode('tree', data)
    assert_equal(out, {'arr': tree['arr'], 'list': [0, 's0', np.zeros(0), None, True],
                       'nested': tree['nested']})


def test_tree_leaves_only_when_they_look_like_leaves():
    assert decode('tree', msgpack.packb(['_', 1, 2, 3])) == ['_', 1, 2, 3]
    assert decode('tree', msgpack.packb({'k': ['_', 'a', 'b']})) == {'k': ['_', 'a', 'b']}
    with pytest.raises(DecodeError, match='dtype'):
        decode('tree', msgpack.packb({'k': ['_', '|O', [1], b'\x00' * 8]}))
    with pytest.raises(DecodeError, match='bytes'):
        decode('tree', msgpack.packb([['_', '<f8', [3], b'\x00' * 8]]))
    with pytest.raises(DecodeError):
        decode('tree', b'\x91')
    with pytest.raises(TypeError, match='object'):
        encode('tree', {'a': np.array([None])})
    with pytest.raises(TypeError):
        encode('tree', {'a': np.int64(3)})     # as granular: msgpack cannot pack numpy ints


def test_tree_nested_too_deeply_is_a_decode_error():
    deep = b'\x91' * 2000 + b'\x00'
    with pytest.raises(DecodeError):
        decode('tree', deep)


# -- images --------------------------------------------------------------------------------

def _synth(fixtures):
    spec = importlib.util.spec_from_file_location('synth', fixtures / 'synth.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synth_image


def _images(manifest, key):
    for dp in manifest['datasets'][key]['datapoints']:
        for value in dp['values'].values():
            for item in value.get('items', [value]):
                if 'source' in item:
                    yield item


@pytest.mark.parametrize('key, kind', [('bag', 'jpg'), ('bag_types', 'png')])
def test_image_encoders_give_granulars_bytes(fixtures, manifest, key, kind):
    synth = _synth(fixtures)
    count = 0
    for item in _images(manifest, key):
        src = item['source']
        pixels = synth(src['seed'], src['h'], src['w'], src['c'])
        assert hashlib.sha256(pixels.tobytes()).hexdigest() == src['sha256']
        data = encode(kind, pixels)
        assert hashlib.sha256(data).hexdigest() == item['sha256']
        decoded = decode(kind, data)
        assert list(decoded.shape) == item['pillow']['shape']
        assert hashlib.sha256(decoded.tobytes()).hexdigest() == item['pillow']['sha256']
        count += 1
    assert count >= 15


def test_image_bytes_are_stored_as_they_are_and_checked():
    png = encode('png', np.arange(12, dtype=np.uint8).reshape(3, 4))
    assert encode('png', png) == png
    jpg = encode('jpg', np.zeros((8, 8, 3), np.uint8))
    assert encode('jpg', bytearray(jpg)) == jpg
    with pytest.raises(ValueError, match='not a JPEG'):
        encode('jpg', png)
    with pytest.raises(ValueError, match='not a PNG'):
        encode('png', b'hello')
    assert_equal(decode('png', encode('png', np.ones((3, 4, 1), np.uint8))),
                 np.ones((3, 4), np.uint8))
    with pytest.raises(ValueError, match='cannot encode'):
        encode('jpg', np.zeros((4, 4), np.float64))
    with pytest.raises(TypeError):
        encode('png', [[1, 2]])


def test_jpg_is_pillows_default_quality():
    pixels = np.random.RandomState(0).randint(0, 256, (16, 16, 3)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format='JPEG', quality=75)
    assert encode('jpg', pixels) == buf.getvalue()


@pytest.mark.parametrize('kind', ['jpg', 'png'])
def test_bad_image_bytes_are_decode_errors(kind):
    good = encode(kind, np.random.RandomState(1).randint(0, 256, (16, 16, 3)).astype(np.uint8))
    for bad in (b'', b'not an image', good[:len(good) // 2], b'\x00' + good[1:]):
        with pytest.raises(DecodeError, match='image'):
            decode(kind, bad)


# -- names ---------------------------------------------------------------------------------

@pytest.mark.parametrize('kind', ['mp4', 'webm'])
def test_video_is_not_supported_both_ways(kind):
    with pytest.raises(ValueError, match='not supported'):
        encode(kind, np.zeros((2, 4, 4, 3), np.uint8))
    with pytest.raises(DecodeError, match='not supported'):
        decode(kind, b'\x00\x00\x00\x18ftypmp42')


def test_unknown_types_and_registry():
    with pytest.raises(ValueError, match='unknown type'):
        encode('gif', b'')
    with pytest.raises(DecodeError, match='unknown type'):
        decode('jpg[]', b'')
    assert set(codecs.TYPES) | set(codecs.UNSUPPORTED_TYPES) == set(codecs.ENCODERS) \
        == set(codecs.DECODERS)
