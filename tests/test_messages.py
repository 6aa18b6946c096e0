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
import traceback

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


def bad_label(dp, seed=None):
    """A user's fn that fails at one datapoint (module level: workers get it by fork)."""
    if int(dp['idx']) == 4:
        raise ValueError('label out of range')
    return dp


def missing_key(dp, seed=None):
    if int(dp['idx']) == 4:
        return {'nope': dp['nope']}
    return dp


class LabelError(Exception):
    """A user's own exception class: its args are its own business."""


def own_error(dp, seed=None):
    if int(dp['idx']) == 4:
        raise LabelError('nope')
    return dp


def failure(loader) -> BaseException:
    with pytest.raises(Exception) as info:
        for _ in loader.epoch(0):
            pass
    return info.value


def last_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


@pytest.mark.parametrize('workers', [0, 2])
def test_the_last_line_of_a_data_error_names_file_and_index_and_says_skip_exists(
        tmp_path, workers):
    reader = loadr.open(broken_bag(tmp_path / 'bag'))          # the reader decodes: its error
    with loadr.Loader(reader, batch=2, workers=workers, shuffle=False) as loader:
        exc = failure(loader)
    assert type(exc) is DecodeError and exc.index == 3         # the original type, as before
    text = str(exc)
    assert text.startswith(f"{tmp_path / 'bag' / 'image.bag'} [index 3]: "), text
    assert text.count('[index 3]') == 1
    assert text.endswith("Loader(on_error='skip') replaces a datapoint that fails like this "
                         "with another one, and logs it"), text
    assert last_line(exc) == f'loadr.errors.DecodeError: {text}'


@pytest.mark.parametrize('workers', [0, 2])
def test_the_last_line_of_a_fn_error_names_file_and_index_and_says_skip_exists(
        tmp_path, workers):
    reader = loadr.open(broken_bag(tmp_path / 'bag', bad=99), decode_images=False)
    with loadr.Loader(reader, batch=2, fns=[bad_label], workers=workers,
                      shuffle=False) as loader:
        exc = failure(loader)
    assert type(exc) is ValueError
    assert str(exc).startswith(f"label out of range (dataset index 4, in {tmp_path / 'bag'}); "
                               f"if the data and not the code is at fault, Loader(on_error="
                               f"'skip') replaces each datapoint"), str(exc)
    assert last_line(exc) == f'ValueError: {exc}'
    cause = exc.__cause__                                       # the first line, as before
    assert isinstance(cause, WorkerError) and cause.index == 4
    who = 'loadr worker' if workers else 'the main process'
    assert str(cause).startswith(f'builtins.ValueError in {who}')
    assert f"dataset index 4 ({tmp_path / 'bag'})" in str(cause).split('\n')[0]


@pytest.mark.parametrize('fn,kind,line', [(missing_key, KeyError, "KeyError: 'nope'"),
                                           (own_error, LabelError, 'LabelError: nope')],
                         ids=['KeyError', 'own class'])
@pytest.mark.parametrize('workers', [0, 2])
def test_an_error_not_plainly_its_text_gets_the_words_as_a_note(tmp_path, workers, fn, kind,
                                                                line):
    reader = loadr.open(broken_bag(tmp_path / 'bag', bad=99), decode_images=False)
    with loadr.Loader(reader, batch=2, fns=[fn], workers=workers, shuffle=False) as loader:
        exc = failure(loader)
    assert type(exc) is kind and exc.args == ('nope',)          # it stays itself
    shown = traceback.format_exception_only(type(exc), exc)
    assert shown[0].strip().endswith(line)
    assert shown[-1].strip().startswith(f"loadr: (dataset index 4, in {tmp_path / 'bag'}); "
                                        "if the data and not the code"), shown


def test_a_list_of_dicts_names_the_index_alone():
    items = [{'idx': i} for i in range(8)]
    with loadr.Loader(items, batch=2, fns=[bad_label], workers=0, shuffle=False) as loader:
        exc = failure(loader)
    assert str(exc).startswith('label out of range (dataset index 4); if the data'), str(exc)


class Rows:
    """A dataset of the user's own that says where its rows come from."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {'idx': i}

    def where(self, index):
        return f'rows-{index // 4}.csv'


def test_a_dataset_of_ones_own_names_its_file_with_where():
    with loadr.Loader(Rows(), batch=2, fns=[bad_label], workers=0, shuffle=False) as loader:
        exc = failure(loader)
    assert str(exc).startswith('label out of range (dataset index 4, in rows-1.csv); ')


def test_a_replacement_under_skip_names_the_file_too(tmp_path, caplog):
    reader = loadr.open(broken_bag(tmp_path / 'bag'), decode_images=False)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(reader, batch=2, fns=[F.decode_jpeg(size=8)], workers=0,
                          shuffle=False, on_error='skip') as loader:
            list(loader.epoch(0))
    lines = [r.getMessage() for r in caplog.records if 'datapoint 3' in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"loadr: datapoint 3 of {tmp_path / 'bag'} failed and was "
                               "replaced (on_error=skip)"), lines[0]
    assert "Loader(on_error='skip')" not in lines[0]


def test_a_replacement_whose_error_names_its_file_names_it_once(tmp_path, caplog):
    reader = loadr.open(broken_bag(tmp_path / 'bag'))          # the reader's error: its path
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(reader, batch=2, workers=0, shuffle=False,
                          on_error='skip') as loader:
            list(loader.epoch(0))
    lines = [r.getMessage() for r in caplog.records if 'datapoint 3' in r.getMessage()]
    assert len(lines) == 1 and lines[0].count(str(tmp_path / 'bag')) == 1, lines


def four_bad(dp, seed=None):
    if 1 <= int(dp['idx']) <= 4:
        raise ValueError('label out of range')
    return dp


def test_too_many_replacements_name_the_last_one_s_file_and_why(tmp_path):
    reader = loadr.open(broken_bag(tmp_path / 'bag', bad=99), decode_images=False)
    with loadr.Loader(reader, batch=6, fns=[four_bad], workers=0, shuffle=False,
                      on_error='skip', max_error_fraction=0.01) as loader:
        with pytest.raises(loadr.errors.LoadrError) as info:
            for _ in loader.epoch(0):
                pass
    assert info.value.path == str(tmp_path / 'bag') and info.value.index is not None
    assert str(info.value).startswith(f"{tmp_path / 'bag'} [index {info.value.index}]: "), \
        str(info.value)
    assert 'the last, this one: ' in str(info.value)


def test_a_mix_names_the_file_of_its_source(tmp_path):
    bag = loadr.open(broken_bag(tmp_path / 'bag', bad=99), decode_images=False)
    mix = loadr.Mix({'list': [{'idx': -1}] * 3, 'bag': bag})
    assert mix.where(0) is None and mix.where(3 + 4) == str(tmp_path / 'bag')


def test_the_command_line_says_where_once_and_skip_in_a_pipeline_s_words(tmp_path):
    broken_bag(tmp_path / 'bag', bad=99)
    (tmp_path / 'myfns.py').write_text(
        'def bad(dp, seed=None):\n'
        '    if int(dp["idx"]) == 4:\n'
        '        raise ValueError("label out of range")\n'
        '    return dp\n')
    (tmp_path / 'p.yaml').write_text(
        'reader: {path: bag, decode_images: false}\n'
        'fns: [myfns:bad]\n'
        'loader: {batch: 2, workers: 2, shuffle: false}\n')
    done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'run', str(tmp_path / 'p.yaml'),
                           '--steps', '3'], capture_output=True, text=True, timeout=90)
    assert done.returncode != 0
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith('loadr: error: '))
    assert line.startswith(f"loadr: error: ValueError: label out of range (dataset index 4, in "
                           f"{tmp_path / 'bag'}); if the data and not the code is at fault, "
                           "on_error: skip (in the loader section) replaces"), line
    assert line.count('index 4') == 1, line


@pytest.mark.parametrize('pattern,said', [
    ('empty/*.tar', 'the pattern matched no file'),
    ('empty/x-[0-9].parquet', 'the pattern matched no file'),
    ('missing/*.tar', 'the pattern matched no file: its folder {d}/missing cannot be listed'),
    ('empty/s-{{0..3}}.tar', 'the pattern names 4 files, and the first, {d}/empty/s-0.tar, '
                             'does not exist'),
])
def test_a_pattern_that_names_no_file_says_so(tmp_path, pattern, said):
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'empty' / 'notes.txt').write_text('not a shard')
    path = f'{tmp_path}/{pattern}'.format()
    with pytest.raises(loadr.errors.FormatError) as info:
        loadr.open(path)
    assert str(info.value).startswith(f'{path}: {said.format(d=tmp_path)}'), str(info.value)
    assert 'no dataset loadr knows' not in str(info.value)


def test_a_pipeline_whose_pattern_names_no_file_says_so(tmp_path):
    (tmp_path / 'p.yaml').write_text("reader: {path: 'shards/*.tar'}\nloader: {batch: 2}\n")
    (tmp_path / 'shards').mkdir()
    with pytest.raises(loadr.errors.ConfigError) as info:
        loadr.pipeline(tmp_path / 'p.yaml')
    text = str(info.value)
    assert "reader.path 'shards/*.tar' names no file to read (line 1): the pattern matched no " \
        "file" in text and 'set format' not in text, text


def test_files_that_are_no_known_format_still_say_so(tmp_path):
    (tmp_path / 'a.xyz').write_text('?')
    with pytest.raises(loadr.errors.FormatError, match='no dataset loadr knows'):
        loadr.open(f'{tmp_path}/*.xyz')
