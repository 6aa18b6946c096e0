"""loadr convert through the format table: any format to any other, and a fourth format
that is one module-sized class plus one row of the table, named nowhere else."""

from __future__ import annotations

import ast
import json
import os

import numpy as np
import pytest

import loadr
from loadr import cli
from loadr.convert import Plan, convert, open_source, plan_conversion
from loadr.errors import ConfigError, FormatError, WriterError
from loadr.readers import Format, Problem, Reader, formats
from loadr.readers.base import Writer, check_index
from loadr.storage import storage_for

# -- a fourth format, written as a format module would be: reader, writer, check, detect ------

class LinesReader(Reader):
    """One ``.lines`` file: a JSON object per line, each line one datapoint."""

    format_name = 'lines'

    def __init__(self, path, storage_options=None):
        self.path = os.fspath(path)
        self._files = storage_for(self.path, storage_options)
        self._lines = self._files.read_all(self.path).decode('utf-8').splitlines()

    def __len__(self):
        return len(self._lines)

    def _get(self, index, mask):
        try:
            dp = json.loads(self._lines[index])
        except ValueError as exc:
            raise FormatError(f'line {index} is not JSON: {exc}', self.path, index) from exc
        return dp if mask is None else {k: dp[k] for k, want in mask.items() if want}

    def available(self, index):
        return {k: True for k in self._get(check_index(index, len(self)), None)}

    @property
    def spec(self):
        return {k: 'json' for k in self[0]} if len(self) else {}

    def _identity_files(self):
        return {self.path: self._files.size(self.path)}

    def details(self):
        return {'lines': len(self)}


class LinesWriter(Writer):
    format_name = 'lines'
    directory = False

    def __init__(self, path, storage_options=None):
        self.path = os.fspath(path)
        self.count = 0
        self._stage(storage_options)

    def append(self, datapoint):
        if self.closed:
            raise WriterError('writer is closed', self.path)
        try:
            line = json.dumps(datapoint, sort_keys=True)
        except TypeError as exc:
            raise WriterError(f'datapoint {self.count}: {exc}', self.path, self.count) from exc
        self._out.write(line.encode() + b'\n')
        self.count += 1
        return self.count - 1

    def _finish(self):
        pass

    @classmethod
    def plan(cls, plan: Plan, dst, types, **options):
        bad = [k for k, t in types.items() if t not in ('int', 'utf8', 'msgpack', 'json')]
        if bad:
            raise ConfigError(f'key {bad[0]!r} ({types[bad[0]]}) is not JSON; leave it out '
                              f'with --keys', plan.source.path)

    @classmethod
    def describe_plan(cls, plan):
        return f'lines of JSON with {plan.keys}'

    @classmethod
    def from_plan(cls, plan, dst, **options):
        return cls(dst)


def lines_check(path):
    try:
        r = LinesReader(path)
    except loadr.errors.LoadrError as exc:
        return [Problem(path, None, exc.message)]
    problems = []
    for i in range(len(r)):
        try:
            r[i]
        except loadr.errors.LoadrError as exc:
            problems.append(Problem(path, i, exc.message))
    return problems


def lines_detect(path):
    return os.fspath(path).endswith('.lines') and storage_for(path).isfile(os.fspath(path))


LINES = Format('lines', lines_detect, LinesReader, LinesWriter, lines_check)


@pytest.fixture
def with_lines(monkeypatch):
    """The table with the fourth format's row added (the one change a new format makes)."""
    monkeypatch.setattr(loadr.readers, 'FORMATS', (*loadr.readers.FORMATS, LINES))
    return LINES


def test_a_fourth_format_is_one_row_of_the_table(with_lines, fixtures, tmp_path, capsys):
    assert [f.name for f in formats()][-1] == 'lines'
    src = tmp_path / 'src.lines'
    src.write_text('{"label": 1, "name": "a"}\n{"label": 2, "name": "b"}\n')
    r = loadr.open(src)
    assert isinstance(r, LinesReader) and r[1] == {'label': 2, 'name': 'b'}
    assert loadr.check(src).ok and loadr.check(src).format == 'lines'
    assert r.identity() == {'format': 'lines', 'datapoints': 2, 'files': {'src.lines': 52}}
    # convert into it and out of it, through the same table
    convert(fixtures / 'bag', tmp_path / 'out.lines', 'lines', keys=['idx', 'name'])
    original = loadr.open(fixtures / 'bag')
    again = loadr.open(tmp_path / 'out.lines')
    assert [again[i] for i in range(len(again))] == [
        {'idx': int(original[i]['idx']), 'name': original[i]['name']}
        for i in range(len(original))]
    with pytest.raises(ConfigError, match="'feat' .* is not JSON"):
        plan_conversion(open_source(fixtures / 'bag'), tmp_path / 'x.lines', 'lines')
    convert(src, tmp_path / 'back', 'bag')
    assert loadr.open(tmp_path / 'back')[0] == {'label': 1, 'name': 'a'}
    # and the command line knows it: inspect, check, convert
    assert cli.main(['inspect', str(src)]) == 0
    assert 'lines: 2' in capsys.readouterr().out
    assert cli.main(['check', str(src)]) == 0
    assert cli.main(['convert', str(src), str(tmp_path / 'c.ffr'), '--to', 'ffrecord']) == 0
    assert loadr.open(tmp_path / 'c.ffr', decode='msgpack')[1] == {'label': 2, 'name': 'b'}


def _format_names_in_code(tree) -> list:
    """String constants naming a built-in format, docstrings left out."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and id(node) not in docstrings
            and node.value in ('gulp', 'bag', 'ffrecord')]


def test_generic_code_names_no_format():
    # convert, check and the inspect/check/convert commands go through the table only.
    root = os.path.dirname(loadr.__file__)
    for name in ('convert/__init__.py', 'readers/records.py', 'check.py'):
        assert _format_names_in_code(ast.parse(open(os.path.join(root, name)).read())) == []
    commands = [node for name in ('inspect.py', 'convert.py')
                for node in ast.parse(open(os.path.join(root, 'cli', name)).read()).body
                if isinstance(node, ast.FunctionDef)
                and node.name in ('cmd_inspect', 'cmd_check', 'cmd_convert')]
    assert len(commands) == 3
    for node in commands:
        assert _format_names_in_code(node) == [], node.name


def test_every_writer_appends_the_datapoints_its_reader_gives(fixtures, tmp_path):
    # The same append(datapoint) shape everywhere: a dataset copied datapoint by
    # datapoint through its own format's writer reads back the same.
    for rel in ('bag', 'gulp', 'ffrecord/single.ffr'):
        source = open_source(fixtures / rel)
        dst = tmp_path / os.path.basename(rel)
        plan = plan_conversion(source, dst, source.format)
        with plan.open(str(dst)) as w:
            for i in range(len(source)):
                raw = source.reader.read_batch([i])[0]
                assert w.append(plan.datapoint(i, raw['data'] if source.raw else raw)) == i
        again = open_source(dst)
        for i in range(len(source)):
            a, b = source.reader.read_batch([i])[0], again.reader.read_batch([i])[0]
            assert a.keys() == b.keys() and all(
                np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k]
                for k in a), (rel, i)


# -- numpy arrays in FFRecord msgpack samples ---------------------------------------------------

def _same(a, b, where):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f'{where}[{k!r}]')
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f'{where}[{i}]')
    else:
        assert a == b, where


@pytest.mark.parametrize('rel', ['bag', 'bag_types'])
def test_bag_with_arrays_to_ffrecord_and_back(fixtures, tmp_path, rel):
    original = loadr.open(fixtures / rel, decode_images=False)
    convert(fixtures / rel, tmp_path / 'a.ffr', 'ffrecord')
    ffr = loadr.open(tmp_path / 'a.ffr', decode='msgpack')
    for i in range(len(original)):
        _same(ffr[i], original[i], f'ffrecord datapoint {i}')
    convert(tmp_path / 'a.ffr', tmp_path / 'back', 'bag')
    back = loadr.open(tmp_path / 'back', decode_images=False)
    for i in range(len(original)):
        _same(back[i], original[i], f'bag again, datapoint {i}')
    assert loadr.check(tmp_path / 'a.ffr').ok and loadr.check(tmp_path / 'back').ok


def test_arrays_are_stored_as_msgpack_numpy_stores_them(tmp_path):
    # {b'nd': True, b'type': dtype.str, b'kind': b'', b'shape': shape, b'data': bytes}:
    # what msgpack_numpy.encode gives, so msgpack-numpy users read these samples as they are.
    arr = np.arange(6, dtype='<f4').reshape(2, 3)
    with loadr.writers.FFRecordWriter(tmp_path / 'x.ffr', 1) as w:
        w.append({'x': arr, 's': np.int16(-3)})
    raw = loadr.open(tmp_path / 'x.ffr').read_one(0)
    plain = __import__('msgpack').unpackb(raw, raw=False)
    assert plain == {'x': {b'nd': True, b'type': '<f4', b'kind': b'', b'shape': [2, 3],
                           b'data': arr.tobytes()},
                     's': {b'nd': False, b'type': '<i2', b'data': np.int16(-3).tobytes()}}
    dp = loadr.open(tmp_path / 'x.ffr', decode='msgpack')[0]
    _same(dp['x'], arr, 'x')
    assert dp['s'] == -3 and dp['s'].dtype == np.int16


def test_convert_help_says_how_arrays_are_stored(capsys):
    with pytest.raises(SystemExit):
        cli.main(['convert', '--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert 'msgpack-numpy' in text and 'shape, data: the C-order bytes' in text


# -- list types survive bag -> ffrecord -> bag; loadr.open reads what convert wrote ------------

def _list_bag(path):
    from .datasets import jpeg
    spec = {'names': 'utf8[]', 'images': 'jpg[]', 'counts': 'int[]', 'thumbs': 'png[]',
            'blobs': 'bytes[]', 'feats': 'array[]', 'label': 'int', 'meta': 'msgpack'}
    with loadr.writers.BagWriter(path, spec) as w:
        for i in range(5):
            # Datapoint 0's lists are empty: their types come from the others.
            w.append({'names': [f'n{i}', 'x'] if i else [],
                      'images': [jpeg(seed=i)] * (i % 3),
                      'counts': [i, -i, 10 ** 12] if i else [],
                      'thumbs': [jpeg((8, 8, 3), seed=i, fmt='PNG')],
                      'blobs': [b'\x00\x01', bytes([i + 1])] if i else [],
                      'feats': [np.arange(3, dtype=np.float32) * i] if i else [],
                      'label': i, 'meta': {'i': i, 'f': [0.5, 1.5]}})
    return spec


def test_bag_list_types_survive_ffrecord_and_back(tmp_path):
    spec = _list_bag(tmp_path / 'bag')
    assert cli.main(['convert', str(tmp_path / 'bag'), str(tmp_path / 'x.ffr'),
                     '--to', 'ffrecord']) == 0
    assert open_source(tmp_path / 'x.ffr').types == spec
    assert cli.main(['convert', str(tmp_path / 'x.ffr'), str(tmp_path / 'back'),
                     '--to', 'bag']) == 0
    back = loadr.open(tmp_path / 'back', decode_images=False)
    assert back.spec == dict(sorted(spec.items()))
    original = loadr.open(tmp_path / 'bag', decode_images=False)
    for i in range(len(original)):
        _same(back[i], original[i], f'datapoint {i}')


def test_types_are_inferred_from_every_sample(tmp_path):
    from loadr.readers.records import join_types

    from .datasets import jpeg
    with loadr.writers.FFRecordWriter(tmp_path / 'x.ffr', 3) as w:
        w.append({'image': jpeg(), 'tags': [], 'score': 1, 'words': ['a']})
        w.append({'image': b'not an image', 'tags': ['t'], 'score': None, 'words': ['']})
        w.append({'image': jpeg(), 'tags': ['u', 'v'], 'score': 2, 'words': ['b']})
    # A JPEG and other bytes: bytes; an empty list then strings: utf8[]; an int and None:
    # msgpack; an empty string in a list (a bag record is never empty): the list whole.
    assert open_source(tmp_path / 'x.ffr').types == {
        'image': 'bytes', 'tags': 'utf8[]', 'score': 'msgpack', 'words': 'msgpack'}
    convert(tmp_path / 'x.ffr', tmp_path / 'bag', 'bag')
    assert [loadr.open(tmp_path / 'bag', decode_images=False)[i]['words'] for i in range(3)] \
        == [['a'], [''], ['b']]
    assert join_types('int[]', 'utf8[]') == 'msgpack'
    assert join_types('jpg[]', 'png[]') == 'bytes[]'
    assert join_types('array', 'int') == 'tree'


def test_open_reads_what_convert_wrote_as_maps(tmp_path):
    spec = _list_bag(tmp_path / 'bag')
    convert(tmp_path / 'bag', tmp_path / 'x.ffr', 'ffrecord')
    reader = loadr.open(tmp_path / 'x.ffr')             # decode='auto' by default here
    assert reader.decode == 'msgpack' and reader.details()['decode'] == 'msgpack'
    assert set(reader[1]) == set(spec) and reader[1]['names'] == ['n1', 'x']
    # 'auto' is a decode like the others: for the class, and in a pipeline.
    assert loadr.readers.FFRecordReader(tmp_path / 'x.ffr', decode='auto').decode == 'msgpack'
    assert loadr.readers.FFRecordReader(tmp_path / 'x.ffr').decode is None     # as before
    config = loadr.config.load_config({'reader': {'path': str(tmp_path / 'x.ffr'),
                                                  'decode': 'auto'}, 'loader': {'batch': 1}})
    assert config.build_reader().decode == 'msgpack'
    # Raw samples stay raw, and never unpickled: 'auto' knows msgpack maps and JSON objects.
    import pickle
    with loadr.writers.FFRecordWriter(tmp_path / 'p.ffr', 1) as w:
        w.write_one(pickle.dumps({'k': 1}))
    assert loadr.open(tmp_path / 'p.ffr')[0] == {'data': pickle.dumps({'k': 1})}
    with loadr.writers.FFRecordWriter(tmp_path / 'j.ffr', 1) as w:
        w.write_one(b'{"k": [1, 2]}')
    assert loadr.open(tmp_path / 'j.ffr')[0] == {'k': [1, 2]}


def test_the_conversion_records_import_no_other_part_of_loadr():
    # Every reader imports loadr.readers.records (Reader.source makes a Source), and
    # loadr.convert imports the readers: the records import nothing of loadr, and no reader
    # imports loadr.convert (tests/test_imports.py), so importing either first works.
    import subprocess
    import sys

    from tests.test_imports import imports
    assert imports()['loadr.readers.records'] == set()
    for first in ('loadr.readers.records', 'loadr.convert', 'loadr.readers'):
        code = (f'import {first}, loadr.convert, loadr.readers; '
                'print(loadr.convert.TARGETS == tuple(f.name for f in loadr.readers.formats()))')
        out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.dirname(loadr.__file__)))
        assert out.stdout.strip() == 'True', out.stderr


def test_every_reader_and_writer_is_found_where_it_is_defined():
    # Readers are pickled to spawned workers by reference (module and name): each class must
    # be importable from the module that defines it, and be the one loadr.readers names.
    import importlib

    import loadr.writers
    for fmt in formats():
        for cls in (fmt.reader, fmt.writer):
            assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls
        assert getattr(loadr.readers, fmt.reader.__name__, fmt.reader) is fmt.reader
        assert getattr(loadr.writers, fmt.writer.__name__, fmt.writer) is fmt.writer
