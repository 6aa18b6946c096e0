"""Messages that say what is wrong in the user's words, once.

No ``<_io.BytesIO object at 0x…>``, a damaged JPEG called a damaged JPEG
(not "not a JPEG"), the index named once in a worker's error, and one log
line per datapoint replaced under ``on_error='skip'``.
"""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import loadr
import loadr.fns as F
from loadr.codecs import decode_image
from loadr.errors import DecodeError, WorkerError
from loadr.ingest import image_jpeg
from loadr.writers import BagWriter

from .datasets import jpeg

GOOD = jpeg((20, 20, 3))
DAMAGED_HEADER = GOOD[:2] + b'\x00' * 38 + GOOD[40:]       # SOI kept, the header's rest gone
DECODERS = [('decode_image', decode_image), ('ingest', image_jpeg),
            ('decode_jpeg', lambda d: F.decode_jpeg()({'image': d})),
            ('decode_jpeg(size)', lambda d: F.decode_jpeg(size=8)({'image': d}))]


def message(fn, data) -> str:
    with pytest.raises(DecodeError) as info:
        fn(data)
    return str(info.value)


@pytest.mark.parametrize('name,fn', DECODERS, ids=[n for n, _ in DECODERS])
def test_empty_and_foreign_files_say_so_without_internals(name, fn):
    text = message(fn, b'')
    assert 'empty file (0 bytes)' in text and 'BytesIO' not in text and '0x' not in text
    text = message(fn, b'hello, not an image')
    assert "not a" in text and "starting b'hell'" in text and 'BytesIO' not in text


@pytest.mark.parametrize('name,fn', DECODERS, ids=[n for n, _ in DECODERS])
def test_a_jpeg_with_a_damaged_header_is_called_a_damaged_jpeg(name, fn):
    text = message(fn, DAMAGED_HEADER)
    assert 'a damaged JPEG' in text and 'not a JPEG' not in text, text
    text = message(fn, GOOD[:100])
    assert 'a damaged JPEG (100 bytes)' in text, text


def test_another_format_in_a_jpeg_value_is_named():
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buf, 'TIFF')
    assert 'not a JPEG or PNG file: a TIFF file' in message(decode_image, buf.getvalue())


def broken_bag(path, bad=3, n=6):
    with BagWriter(path, {'image': 'jpg', 'idx': 'int'}) as w:
        for i in range(n):
            w.append({'image': DAMAGED_HEADER if i == bad else jpeg((20, 20, 3), seed=i),
                      'idx': i})
    return path


@pytest.mark.parametrize('workers', [0, 1])
def test_a_worker_error_names_the_index_once(tmp_path, workers):
    reader = loadr.open(broken_bag(tmp_path / 'bag'))          # the reader decodes: its error
    with loadr.Loader(reader, batch=2, workers=workers, shuffle=False) as loader:
        with pytest.raises(DecodeError) as info:
            for _ in loader.epoch(0):
                pass
    cause = info.value.__cause__
    assert isinstance(cause, WorkerError) and cause.index == 3
    first = str(cause).split('\n')[0]
    assert len(re.findall(r'index 3\b', first)) == 1, first
    assert 'dataset index 3' in first and str(tmp_path / 'bag' / 'image.bag') in first
    assert str(info.value).count('[index 3]') == 1          # the original, as it was


def test_a_replacement_under_skip_is_logged_once(tmp_path, caplog):
    reader = loadr.open(broken_bag(tmp_path / 'bag'), decode_images=False)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(reader, batch=2, fns=[F.decode_jpeg(size=8)], workers=0,
                          shuffle=False, on_error='skip') as loader:
            batches = list(loader.epoch(0))
    assert len(batches) == 3
    lines = [r.getMessage() for r in caplog.records if 'datapoint 3' in r.getMessage()]
    assert len(lines) == 1, lines
    assert 'replaced' in lines[0] and 'a damaged JPEG' in lines[0]


def test_a_replacement_under_skip_is_logged_once_with_workers(tmp_path):
    broken_bag(tmp_path / 'bag')
    (tmp_path / 'p.yaml').write_text(
        'reader: {path: bag, decode_images: false}\n'
        'fns: [{decode_jpeg: {size: 8}}]\n'
        'loader: {batch: 2, workers: 1, shuffle: false, on_error: skip}\n')
    done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'run', str(tmp_path / 'p.yaml'),
                           '--steps', '3'], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if 'datapoint 3' in ln]
    assert len(lines) == 1, done.stderr
    assert 'replaced datapoints (on_error=skip): 1 of 6' in done.stdout
