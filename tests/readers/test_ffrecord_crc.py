"""FFRecord's CRC-32: ISA-L's where installed (faster), zlib's otherwise; the values are zlib's."""

from __future__ import annotations

import importlib.util
import zlib

import numpy as np
import pytest

from loadr.errors import ChecksumError
from loadr.readers import ffrecord
from loadr.readers.ffrecord import FFRecordReader, FFRecordWriter

SIZES = [0, 1, 2, 3, 7, 15, 16, 17, 63, 255, 1000, 4095, 4096, 4097, 65537, 1 << 20]


def buffers():
    rng = np.random.default_rng(0)
    return [rng.bytes(n) for n in SIZES]


def test_crc32_gives_zlibs_values():
    for data in buffers():
        assert ffrecord.crc32(data) == zlib.crc32(data), len(data)
        assert ffrecord.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:]), len(data)
        # chained, as the header checksum and check() use it
        for start in (0, 1, 0xFFFFFFFF, zlib.crc32(b'head')):
            assert ffrecord.crc32(data, start) == zlib.crc32(data, start), (len(data), start)


def test_isal_is_used_where_installed_and_agrees_with_zlib():
    if importlib.util.find_spec('isal') is None:
        pytest.skip('isal is not installed here: ffrecord uses zlib.crc32')
    from isal import isal_zlib
    assert ffrecord.crc32 is isal_zlib.crc32
    rng = np.random.default_rng(1)
    for n in [*SIZES, *rng.integers(0, 9000, 200).tolist()]:
        data = rng.bytes(n)
        assert isal_zlib.crc32(data) == zlib.crc32(data), n


def test_random_batches_read_the_samples_and_name_a_bad_one(tmp_path):
    rng = np.random.default_rng(2)
    samples = [rng.bytes(int(n)) for n in rng.integers(0, 5000, 300)]
    path = tmp_path / 'x.ffr'
    with FFRecordWriter(path, len(samples)) as w:
        for s in samples:
            w.write_one(s)
    r = FFRecordReader(path)
    for _ in range(20):            # repeats and neighbours included: sorted and merged
        batch = rng.integers(0, len(samples), 64).tolist()
        assert r.read(batch) == [samples[i] for i in batch]
    # Few repeats and neighbours (a random batch of a large dataset): read as asked.
    spaced = rng.permutation(np.arange(0, len(samples), 7)).tolist()
    for batch in (spaced, spaced + spaced[:2], [spaced[0], spaced[0] + 1, *spaced[1:]]):
        assert r.read(batch) == [samples[i] for i in batch]
    bad = 150
    where = r.locate(bad)
    with open(path, 'r+b') as f:
        f.seek(where['offset'] + where['length'] // 2)
        byte = f.read(1)
        f.seek(where['offset'] + where['length'] // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    for batch in ([3, 77, bad, 260], [bad], [bad - 1, bad, bad + 1], [200, bad, 9, bad],
                  [*spaced, bad, bad]):
        with pytest.raises(ChecksumError) as err:
            r.read(batch)
        assert err.value.index == bad and err.value.path == str(path)
    assert r.read([3, 77, 260]) == [samples[3], samples[77], samples[260]]
