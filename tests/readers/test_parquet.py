"""Parquet in place: rows by row-group offsets, columns, HF images, row groups kept ahead."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

import loadr
from loadr import fns
from loadr.convert import convert
from loadr.errors import ConfigError, FormatError
from loadr.readers.parquet import ParquetReader, check

from ..loader_helpers import stream_digests
from .common import assert_equal, check_reader_contract

pa = pytest.importorskip('pyarrow')
pq = pytest.importorskip('pyarrow.parquet')
pytestmark = pytest.mark.timeout(60)


def jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (10, 12, 3), np.uint8)).save(out, 'JPEG')
    return out.getvalue()


def rows(first: int, n: int) -> list[dict]:
    return [{'image': {'bytes': jpeg(k), 'path': f'{k}.jpg'}, 'label': k % 5,
             'text': f'row {k}', 'score': k / 2} for k in range(first, first + n)]


def write(path, first: int, n: int, group: int) -> None:
    pq.write_table(pa.Table.from_pylist(rows(first, n)), path, row_group_size=group)


@pytest.fixture
def data(tmp_path):
    root = tmp_path / 'data'
    root.mkdir()
    write(root / 'train-0.parquet', 0, 23, 5)
    write(root / 'train-1.parquet', 23, 17, 4)
    return root


def test_rows_of_every_file_in_order_with_hf_images_as_bytes(data):
    r = loadr.open(str(data / '*.parquet'))
    assert isinstance(r, ParquetReader) and len(r) == 40
    for k in (0, 4, 5, 22, 23, 39):
        assert r[k] == {'image': jpeg(k), 'label': k % 5, 'text': f'row {k}', 'score': k / 2}
    assert r.spec == {'image': 'bytes', 'label': 'int', 'text': 'utf8', 'score': 'msgpack'}
    assert loadr.open(data).identity() == r.identity()
    check_reader_contract(r)


def test_columns_reads_only_those(data):
    r = loadr.open(data, columns=['label', 'image'])
    assert r[7] == {'label': 2, 'image': jpeg(7)} and r.spec == {'label': 'int', 'image': 'bytes'}
    assert r.identity()['columns'] == ['label', 'image']
    with pytest.raises(ConfigError, match="'nope'"):
        loadr.open(data, columns=['nope'])


def test_a_shuffled_epoch_in_a_loader_reads_each_row_group_about_once(data):
    r = loadr.open(data, columns=['label'])
    with loadr.Loader(r, batch=4, seed=1, workers=0) as loader:   # reads in this process
        it = iter(loader)
        for _ in range(10):                  # one epoch: 40 rows
            next(it)
    reads = r.row_group_reads
    assert reads > 0
    groups = 5 + 5                           # 23 rows by 5, 17 rows by 4
    assert reads <= groups, reads
    by_hand = loadr.open(data, columns=['label'], cache_row_groups=1)
    order = np.random.default_rng(0).permutation(40)
    for k in order:
        by_hand[int(k)]
    assert by_hand.row_group_reads > groups          # what the window saves


def test_same_batches_as_the_data_converted_to_bag_for_any_worker_count(data, tmp_path):
    convert(str(data), tmp_path / 'bag', 'bag', keys=['image', 'label'])
    pipeline = [fns.select(keys=['image', 'label']), fns.decode_jpeg(key='image', size=(8, 8))]
    streams = []
    for reader in (loadr.open(data, columns=['image', 'label']),
                   loadr.open(tmp_path / 'bag', decode_images=False)):
        for workers in (0, 2):
            with loadr.Loader(reader, batch=4, fns=pipeline, seed=3,
                              workers=workers) as loader:
                streams.append(stream_digests(loader, 15))
    assert streams[0] == streams[1] == streams[2] == streams[3]


def test_a_damaged_file_gives_a_loadr_error_naming_it(data, tmp_path):
    raw = (data / 'train-1.parquet').read_bytes()
    cut = tmp_path / 'cut.parquet'
    cut.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(FormatError) as err:
        loadr.open(cut)
    assert err.value.path == str(cut)
    assert not loadr.check(cut).ok
    # A footer intact but a column chunk damaged: the row group's rows name file and row.
    bad = tmp_path / 'bad.parquet'
    pq.write_table(pa.Table.from_pylist(rows(0, 8)), bad, row_group_size=4,
                   compression='snappy')
    meta = pq.read_metadata(bad)
    chunk = meta.row_group(1).column(0)
    start = chunk.data_page_offset
    body = bytearray(bad.read_bytes())
    body[start:start + 64] = os.urandom(64)
    bad.write_bytes(bytes(body))
    r = loadr.open(bad)
    assert r[0]['label'] == 0
    with pytest.raises(FormatError) as err:
        r[5]
    assert err.value.path == str(bad) and err.value.index == 5
    problems = check(bad)
    assert problems and problems[0].path == str(bad)


def test_without_pyarrow_the_error_says_what_to_install(monkeypatch, data):
    import sys
    monkeypatch.setitem(sys.modules, 'pyarrow', None)
    with pytest.raises(ConfigError, match='pip install pyarrow'):
        ParquetReader(data)


def test_one_file_and_a_list(data):
    one = loadr.open(data / 'train-1.parquet')
    assert len(one) == 17 and one[0]['label'] == 23 % 5
    both = loadr.open([str(data / 'train-1.parquet'), str(data / 'train-0.parquet')])
    assert_equal(both[17], loadr.open(data)[0])


def test_an_image_stored_by_path_only_names_file_and_row(tmp_path):
    table = rows(0, 3)
    table[1]['image'] = {'bytes': None, 'path': 'elsewhere/1.jpg'}
    pq.write_table(pa.Table.from_pylist(table), tmp_path / 'p.parquet')
    r = loadr.open(tmp_path / 'p.parquet')
    assert r[0]['image'] == jpeg(0) and r[2]['image'] == jpeg(2)
    with pytest.raises(loadr.errors.DecodeError, match='elsewhere/1.jpg') as err:
        r[1]
    assert (err.value.path, err.value.index) == (str(tmp_path / 'p.parquet'), 1)


def test_the_writer_writes_what_the_reader_reads_back(tmp_path):
    from loadr.readers.parquet import ParquetWriter
    want = [{'image': jpeg(k), 'label': k, 'name': f'n{k}', 'tags': list(range(k % 3))}
            for k in range(10)]
    with ParquetWriter(tmp_path / 'w.parquet', {'image': 'jpg', 'label': 'int', 'name': 'utf8',
                                                'tags': 'int[]'}, rows_per_group=4) as w:
        for dp in want:
            w.append(dp)
    r = loadr.open(tmp_path / 'w.parquet')
    assert [r[k] for k in range(10)] == want and r.details()['row_groups'] == 3
    assert pq.read_table(tmp_path / 'w.parquet').num_rows == 10       # pyarrow reads it
    with pytest.raises(loadr.errors.WriterError):
        with ParquetWriter(tmp_path / 'x.parquet', {'label': 'int'}) as w:
            w.append({'label': 'not an int'})
    assert not (tmp_path / 'x.parquet').exists()                    # nothing half-written


def test_a_file_whose_column_types_differ_is_refused_naming_file_column_and_types(data):
    # A label written as a string in the second file: the batch would fail much later.
    other = rows(40, 3)
    for row in other:
        row['label'] = str(row['label'])
    pq.write_table(pa.Table.from_pylist(other), data / 'train-2.parquet')
    with pytest.raises(FormatError) as err:
        loadr.open(data)
    assert err.value.path == str(data / 'train-2.parquet')
    assert "'label'" in err.value.message and 'string' in err.value.message \
        and 'int64' in err.value.message and 'train-0.parquet' in err.value.message
    assert loadr.open(data, columns=['image', 'text'])[40]['text'] == 'row 40'  # not read
    assert not loadr.check(data).ok


def test_an_image_column_of_another_struct_in_a_later_file_is_refused(data):
    other = [{'image': {'path': f'{k}.jpg'}, 'label': k, 'text': 't', 'score': 0.5}
             for k in range(3)]
    pq.write_table(pa.Table.from_pylist(other), data / 'train-2.parquet')
    with pytest.raises(FormatError, match="'image'") as err:
        loadr.open(data)
    assert err.value.path == str(data / 'train-2.parquet')


def test_widths_and_image_encodings_that_read_the_same_are_accepted(tmp_path):
    # int32 here, int64 there; an Image feature here, plain bytes there: the same values.
    pq.write_table(pa.table({'image': pa.array([{'bytes': jpeg(0), 'path': None}]),
                             'label': pa.array([1], pa.int32())}), tmp_path / 'a.parquet')
    pq.write_table(pa.table({'image': pa.array([jpeg(1)], pa.binary()),
                             'label': pa.array([2], pa.int64())}), tmp_path / 'b.parquet')
    r = loadr.open(tmp_path)
    assert [r[0], r[1]] == [{'image': jpeg(0), 'label': 1}, {'image': jpeg(1), 'label': 2}]
    pq.write_table(pa.table({'image': pa.array([jpeg(1)], pa.binary()),
                             'label': pa.array([2], pa.int64())}), tmp_path / 'a.parquet')
    pq.write_table(pa.table({'image': pa.array([{'bytes': jpeg(0), 'path': None}]),
                             'label': pa.array([1], pa.int32())}), tmp_path / 'b.parquet')
    r = loadr.open(tmp_path)        # the Image feature in the second file only
    assert [r[0], r[1]] == [{'image': jpeg(1), 'label': 2}, {'image': jpeg(0), 'label': 1}]


def test_a_null_names_file_row_and_column_and_says_null(data):
    table = rows(40, 4)
    table[2]['label'] = None
    pq.write_table(pa.Table.from_pylist(table), data / 'train-2.parquet')
    r = loadr.open(data)
    assert r[41]['label'] == 41 % 5
    with pytest.raises(loadr.errors.DataError, match="'label' is null") as err:
        r[42]
    assert (err.value.path, err.value.index) == (str(data / 'train-2.parquet'), 42)
    assert 'row 2 of this file' in err.value.message
    assert loadr.open(data, nulls='keep')[42]['label'] is None
    assert loadr.open(data, columns=['text'])[42] == {'text': 'row 42'}
    problems = check(data)
    assert [(p.path, p.index) for p in problems] == [(str(data / 'train-2.parquet'), 42)]
    assert 'null' in problems[0].message
    with loadr.Loader(loadr.open(data, columns=['label']), batch=4, seed=0, workers=0,
                      shuffle=False) as loader:
        with pytest.raises(loadr.errors.LoadrError) as err:
            for _ in zip(range(11), loader):        # positions 0..43
                pass
        assert 'null' in str(err.value) and 'train-2.parquet' in str(err.value)
    with pytest.raises(ConfigError, match='nulls'):
        loadr.open(data, nulls='zero')


HF_FEATURES = {'info': {'features': {
    'image': {'_type': 'Image'},
    'label': {'names': ['cat', 'dog', 'eel', 'fox', 'gnu'], '_type': 'ClassLabel'},
    'text': {'dtype': 'string', '_type': 'Value'},
    'score': {'dtype': 'float64', '_type': 'Value'}}}}


def write_hf(path, first: int, n: int, features=HF_FEATURES) -> None:
    """As ``datasets`` writes a split: its features in the schema's ``huggingface`` metadata."""
    import json
    table = pa.Table.from_pylist(rows(first, n))
    table = table.replace_schema_metadata({b'huggingface': json.dumps(features).encode()})
    pq.write_table(table, path, row_group_size=5)


def test_hugging_face_class_label_names_are_the_classes(tmp_path):
    import copy
    write_hf(tmp_path / 'train-0.parquet', 0, 6)
    write_hf(tmp_path / 'train-1.parquet', 6, 6)
    r = loadr.open(tmp_path)
    names = ['cat', 'dog', 'eel', 'fox', 'gnu']
    assert r.classes == names and r.class_names == {'label': names}
    assert r.label2idx == {'cat': 0, 'dog': 1, 'eel': 2, 'fox': 3, 'gnu': 4}
    assert r.classes[r[7]['label']] == 'eel'
    assert r.details()['classes'] == {'label': 5}
    assert loadr.open(tmp_path, columns=['image']).classes is None
    assert loadr.open(tmp_path / 'train-0.parquet').classes == names
    # Another file with other names: a label would name another class there.
    other = copy.deepcopy(HF_FEATURES)
    other['info']['features']['label']['names'] = ['dog', 'cat', 'eel', 'fox', 'gnu']
    write_hf(tmp_path / 'train-1.parquet', 6, 6, other)
    with pytest.raises(FormatError, match='ClassLabel') as err:
        loadr.open(tmp_path)
    assert err.value.path == str(tmp_path / 'train-1.parquet')
    plain = tmp_path / 'plain'
    plain.mkdir()
    write(plain / 'p.parquet', 0, 3, 3)
    assert loadr.open(plain).classes is None and loadr.open(plain).class_names == {}


def test_check_names_an_image_feature_value_the_image_fns_cannot_decode(tmp_path):
    out = io.BytesIO()
    Image.new('RGB', (4, 4)).save(out, 'BMP')
    table = rows(0, 3)
    table[1]['image'] = {'bytes': out.getvalue(), 'path': '1.bmp'}
    pq.write_table(pa.Table.from_pylist(table), tmp_path / 'p.parquet')
    problems = check(tmp_path / 'p.parquet')
    assert [(p.path, p.index) for p in problems] == [(str(tmp_path / 'p.parquet'), 1)]
    assert "'image'" in problems[0].message and 'BMP' in problems[0].message
