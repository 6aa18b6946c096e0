"""Parquet files read in place, row by row (needs pyarrow: ``pip install pyarrow``).

``ParquetReader('data/*.parquet')`` (one file, a directory of ``.parquet``
files, a glob, a list; local paths and URLs) numbers the rows of every file,
file after file. Row ``i`` lies in one row group, found from the row-group
offsets of the files' footers (read once, when the reader is made, and
again in each process the reader goes to).

A row group is the smallest thing Parquet reads, so reads go a row group at
a time, and only the ``columns=`` asked for (all by default). What is read
is kept for what comes next:

- In a loader, where the order of the positions ahead is known
  (:meth:`ParquetReader.cache_clock`), a row group that is read leaves
  behind the rows of it that the next ``window_bytes`` worth of positions
  will ask for, and is dropped. A shuffled epoch then reads each row group
  about ``epoch bytes / window_bytes`` times, and a process holds at most
  about ``window_bytes`` of rows plus one row group.
- Read by hand (``r[i]``), the last ``cache_row_groups`` row groups are kept.

A datapoint is ``{column: value}`` as pyarrow gives it in Python (int,
float, str, bytes, list, dict); a null is an error naming file, row and
column unless ``nulls='keep'``. A struct column of the Hugging Face
``Image`` feature (``{'bytes', 'path'}``) becomes the image's bytes, for
``decode_jpeg`` and the other image fns; ``ClassLabel`` names are
:attr:`ParquetReader.classes`. Every file's columns must read as the first
file's (docs/FORMATS.md §7).

Example::

    r = ParquetReader('data/train-*.parquet', columns=['image', 'label'])
    r[0]            # {'image': b'\\xff\\xd8...', 'label': 3}
"""

from __future__ import annotations

import bisect
import collections
import io
import json
import os
from typing import Any

import numpy as np

from ..errors import (
    ConfigError,
    DataError,
    DecodeError,
    FormatError,
    LoadrError,
    SpecError,
    WriterError,
)
from ..storage import storage_for
from .base import Format, Problem, Reader, Writer, check_index, select_keys
from .patterns import dataset_files, expand, names_files

__all__ = ['ParquetReader', 'FORMAT', 'check', 'detect']

SUFFIX = '.parquet'
MAGIC = b'PAR1'
WINDOW_BYTES = 256 << 20             # rows kept for the positions ahead, per process
CACHE_ROW_GROUPS = 2                 # row groups kept when read by hand
NO_PYARROW = ("reading Parquet needs pyarrow: pip install pyarrow (or pip install -e '.[parquet]' "
              "in loadr's checkout)")


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ConfigError(NO_PYARROW) from None
    return pyarrow


class _StorageFile(io.RawIOBase):
    """A read-only file object over a storage, for pyarrow: every read is a storage read."""

    def __init__(self, storage, path: str):
        self.storage, self.path = storage, path
        self.size = storage.size(path)
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else \
            self.size + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, max(0, self.size - self.pos))
        data = self.storage.read(self.path, self.pos, n) if n else b''
        self.pos += n
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _is_hf_image(arrow_type) -> bool:
    pa = _pyarrow()
    return (pa.types.is_struct(arrow_type)
            and {arrow_type.field(k).name for k in range(arrow_type.num_fields)}
            == {'bytes', 'path'})


def _kind(arrow_type):
    """What a value of ``arrow_type`` is in Python once read (``int``, ``str``, ``bytes``, a
    list of ..., a struct of ...): two files may differ in width or encoding, not in this."""
    pa = _pyarrow()
    t = pa.types
    if t.is_dictionary(arrow_type):
        return _kind(arrow_type.value_type)
    if t.is_integer(arrow_type):
        return 'int'
    if t.is_floating(arrow_type):
        return 'float'
    if t.is_boolean(arrow_type):
        return 'bool'
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        return 'str'
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type) \
            or t.is_fixed_size_binary(arrow_type) or _is_hf_image(arrow_type):
        return 'bytes'                  # an Image feature's struct is read as its bytes
    if t.is_list(arrow_type) or t.is_large_list(arrow_type) or t.is_fixed_size_list(arrow_type):
        return ('list', _kind(arrow_type.value_type))
    if t.is_struct(arrow_type):
        return ('struct', tuple((arrow_type.field(k).name, _kind(arrow_type.field(k).type))
                                for k in range(arrow_type.num_fields)))
    return str(arrow_type)


def class_labels(schema) -> dict[str, list[str]]:
    """``{column: [class names]}`` of the Hugging Face ``ClassLabel`` columns of ``schema``
    (from its ``huggingface`` metadata, where ``datasets`` keeps its features); ``{}`` when
    there are none or the metadata cannot be read."""
    raw = (schema.metadata or {}).get(b'huggingface')
    if raw is None:
        return {}
    try:
        features = json.loads(raw)['info']['features']
    except (TypeError, ValueError, KeyError):
        return {}
    if not isinstance(features, dict):
        return {}
    return {name: [str(n) for n in feature['names']] for name, feature in features.items()
            if isinstance(feature, dict) and feature.get('_type') == 'ClassLabel'
            and isinstance(feature.get('names'), list)}


def _bag_type(arrow_type) -> str:
    pa = _pyarrow()
    if pa.types.is_integer(arrow_type):
        return 'int'
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return 'utf8'
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) \
            or _is_hf_image(arrow_type):
        return 'bytes'
    return 'msgpack'


class _File:
    """One Parquet file: its path, first row, row-group offsets (and its handle, per process)."""

    def __init__(self, path: str, base: int, starts: np.ndarray, size: int):
        self.path, self.base, self.starts, self.size = path, base, starts, size
        self.handle: Any = None         # its pyarrow.parquet.ParquetFile, once opened here

    def __getstate__(self):
        return (self.path, self.base, self.starts, self.size)

    def __setstate__(self, state):
        self.path, self.base, self.starts, self.size = state
        self.handle = None


def _open(storage, path: str):
    pq = _pyarrow().parquet
    try:
        return pq.ParquetFile(_StorageFile(storage, path))
    except LoadrError:
        raise
    except Exception as exc:    # noqa: BLE001 - pyarrow's errors for a bad file vary
        raise FormatError(f'not a readable Parquet file: {type(exc).__name__}: {exc}',
                          path) from exc


def list_files(path, storage_options: dict | None = None) -> tuple[str, list[str]]:
    """``(root, files)``: the Parquet files ``path`` names."""
    return dataset_files(path, (SUFFIX,), f'*{SUFFIX}', storage_options)


class ParquetReader(Reader):
    """Parquet files as one dataset of rows; see the module docstring.

    ``columns`` reads only those columns; ``window_bytes`` bounds the rows
    kept for the positions ahead (in a loader), ``cache_row_groups`` the
    row groups kept otherwise. ``storage_options`` go to the storage of URLs.

    Every file must have the first file's columns, each of the same type as
    read (an int column may be int32 in one file and int64 in another, not a
    string); a file that differs is refused when the reader is made, naming
    the file, the column and both types. ``nulls='error'`` (the default)
    refuses a row with a null in a column read, naming file, row and column;
    ``nulls='keep'`` gives ``None`` for it, for fns that handle it.

    The class names of Hugging Face ``ClassLabel`` columns are
    :attr:`class_names` (``{column: [names]}``); :attr:`classes` is the one
    column's list, as :attr:`ImageFolderReader.classes
    <loadr.readers.folder.ImageFolderReader.classes>` is.
    """

    format_name = 'parquet'

    def __init__(self, path, columns: list | None = None, window_bytes: int = WINDOW_BYTES,
                 cache_row_groups: int = CACHE_ROW_GROUPS, nulls: str = 'error',
                 storage_options: dict | None = None):
        _pyarrow()
        if columns is not None and (isinstance(columns, str) or not all(
                isinstance(c, str) for c in columns)):
            raise ConfigError(f'columns must be a list of column names, not {columns!r}')
        if nulls not in ('error', 'keep'):
            raise ConfigError(f"nulls must be 'error' or 'keep', not {nulls!r}")
        self.nulls = nulls
        self.window_bytes = int(window_bytes)
        self.cache_row_groups = max(1, int(cache_row_groups))
        self._root, paths = list_files(path, storage_options)
        self._named = names_files(path, storage_options)
        self.path = self._root if self._named else os.fspath(path)
        self.pattern = list(path) if isinstance(path, (list, tuple)) else os.fspath(path)
        self._files = storage_for(paths[0], storage_options)
        self._parts: list[_File] = []
        base, row_bytes = 0, 0
        schemas: list = []                  # each file's pyarrow schema
        for p in paths:
            pf = _open(self._files, p)
            meta = pf.metadata
            counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            row_bytes += sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
            starts = np.zeros(len(counts) + 1, np.int64)
            np.cumsum(counts, out=starts[1:])
            names = pf.schema_arrow.names
            if schemas and names != schemas[0].names:
                raise FormatError(f'its columns {names} differ from the first file\'s '
                                  f'{schemas[0].names}', p)
            schemas.append(pf.schema_arrow)
            part = _File(p, base, starts, self._files.size(p))
            part.handle = pf
            self._parts.append(part)
            base += int(starts[-1])
        self._n = base
        self.schema = schema = schemas[0]
        self.columns = list(schema.names) if columns is None else list(columns)
        unknown = [c for c in self.columns if c not in schema.names]
        if unknown:
            raise ConfigError(f'columns names {unknown[0]!r}, which the files do not have '
                              f'(they have {schema.names})', self.path)
        self._same_columns(paths, schemas)
        self._images = {c for c in self.columns
                        if any(_is_hf_image(one.field(c).type) for one in schemas)}
        labels = class_labels(schema)
        self.class_names = {c: labels[c] for c in self.columns if c in labels}
        self._row_bytes = max(1, row_bytes // max(1, self._n))
        self._starts = [p.base for p in self._parts]
        self._reset()
        self.row_group_reads = 0            # this process's, for the benchmark

    def _same_columns(self, paths: list[str], schemas: list) -> None:
        """Refuse a file whose columns read give other values than the first file's: another
        type, or other ``ClassLabel`` names (a label would name another class)."""
        first, labels = schemas[0], class_labels(schemas[0])
        for p, schema in zip(paths[1:], schemas[1:]):
            theirs = class_labels(schema)
            for c in self.columns:
                a, b = first.field(c).type, schema.field(c).type
                if _kind(a) != _kind(b):
                    raise FormatError(f'column {c!r} is {b} in this file but {a} in the first '
                                      f'file ({paths[0]}): a column must hold one type in '
                                      f'every file', p)
                if c in labels and c in theirs and labels[c] != theirs[c]:
                    raise FormatError(f'column {c!r} has the ClassLabel names {theirs[c]} in '
                                      f'this file but {labels[c]} in the first file '
                                      f'({paths[0]}): a label would name another class', p)

    @property
    def classes(self) -> list[str] | None:
        """The class names of the one ``ClassLabel`` column read (label ``k`` is
        ``classes[k]``); None when there is none, or more than one (see
        :attr:`class_names`)."""
        return next(iter(self.class_names.values())) if len(self.class_names) == 1 else None

    @property
    def label2idx(self) -> dict | None:
        """``{class name: label}`` of :attr:`classes`, as the image folder reader's."""
        classes = self.classes
        return None if classes is None else {name: k for k, name in enumerate(classes)}

    def _reset(self) -> None:
        self._groups: collections.OrderedDict = collections.OrderedDict()
        self._kept: dict = {}               # index -> row, for the positions ahead
        # (order, start, stop, the indices of positions start .. stop - 1)
        self._window: tuple[Any, int, int, np.ndarray] | None = None

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in ('_groups', '_kept', '_window'):
            state.pop(key, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    def __len__(self) -> int:
        return self._n

    def _identity_files(self) -> dict[str, int]:
        return {p.path: p.size for p in self._parts}

    def _identity_root(self) -> str:
        # Files named by a pattern or a list: the folder that holds them all.
        return self._root if self._named else super()._identity_root()

    def identity(self) -> dict:
        """As :meth:`Reader.identity`, with the columns read when they are not all of them."""
        out = super().identity()
        if self.columns != list(self.schema.names):
            out['columns'] = list(self.columns)
        return out

    # -- rows ------------------------------------------------------------------------

    def where(self, index: int) -> str | None:
        """The Parquet file that holds row ``index``."""
        return self._locate(check_index(index, self._n))[0].path

    def _locate(self, i: int) -> tuple[_File, int, int]:
        part = self._parts[bisect.bisect_right(self._starts, i) - 1]
        local = i - part.base
        group = int(np.searchsorted(part.starts, local, 'right')) - 1
        return part, group, local - int(part.starts[group])

    def _read_group(self, part: _File, group: int, index: int) -> dict:
        """``{column: [values]}`` of one row group (the columns asked for)."""
        key = (part.path, group)
        columns = self._groups.get(key)
        if columns is not None:
            self._groups.move_to_end(key)
            return columns
        if part.handle is None:
            part.handle = _open(self._files, part.path)
        try:
            table = part.handle.read_row_group(group, columns=self.columns)
        except LoadrError:
            raise
        except Exception as exc:   # noqa: BLE001 - pyarrow's errors for bad data vary
            a, b = int(part.starts[group]), int(part.starts[group + 1])
            raise FormatError(f'row group {group} (rows {a}..{b - 1} of this file) cannot be '
                              f'read: {type(exc).__name__}: {exc}', part.path, index) from exc
        self.row_group_reads += 1
        columns = {}
        for name in self.columns:
            values = table.column(name).to_pylist()
            if name in self._images:
                # An image stored by path only stays a dict: its row's read says so.
                values = [v['bytes'] if isinstance(v, dict) and v['bytes'] is not None else v
                          for v in values]
            columns[name] = values
        self._groups[key] = columns
        while len(self._groups) > self.cache_row_groups:
            self._groups.popitem(last=False)
        return columns

    def _row(self, i: int) -> dict:
        row = self._kept.pop(i, None)
        if row is None:
            part, group, at = self._locate(i)
            columns = self._read_group(part, group, i)
            if self._window is not None:
                self._keep_ahead(self._window[3], part, group, columns, i)
            row = {name: values[at] for name, values in columns.items()}
        error = self._row_error(row, i)
        if error is not None:
            raise error
        return row

    def _row_error(self, row: dict, i: int) -> LoadrError | None:
        """The error a read of row ``i`` (global) raises for ``row``, or None: an image stored
        by path only, or a null (``nulls='error'``)."""
        for name in self._images:
            if isinstance(row.get(name), dict):
                return DecodeError(f'column {name!r} holds no image bytes in this row, only the '
                                   f'path {row[name].get("path")!r} (an Image feature stored by '
                                   f'reference): loadr reads images stored in the file',
                                   self._locate(i)[0].path, i)
        if self.nulls == 'error':
            for name, value in row.items():
                if value is None:
                    part, _, _ = self._locate(i)
                    return DataError(f'column {name!r} is null in this row (row {i - part.base} '
                                     f'of this file): nothing to give for it; leave the column '
                                     f'out (columns=[...]), or pass nulls=\'keep\' to get None '
                                     f'and handle it in a fn', part.path, i)
        return None

    def _keep_ahead(self, ahead: np.ndarray, part: _File, group: int, columns: dict,
                    i: int) -> None:
        """Keep the rows of this group that the positions ``ahead`` ask for; drop the group."""
        lo, hi = part.base + int(part.starts[group]), part.base + int(part.starts[group + 1])
        wanted = ahead[(ahead >= lo) & (ahead < hi)]
        for j in np.unique(wanted).tolist():
            if j != i and j not in self._kept:
                self._kept[j] = {name: values[j - lo] for name, values in columns.items()}
        self._groups.pop((part.path, group), None)

    def _get(self, index: int, mask: dict | None) -> dict:
        dp = self._row(index)
        if mask is None:
            return dict(dp)
        return select_keys(dp, mask, 'Parquet columns are read whole', lambda key: SpecError(
            f'no column {key!r} (read: {self.columns})', self._locate(index)[0].path, index))

    # -- the positions ahead (the loader tells) ------------------------------------

    @property
    def caches(self) -> bool:
        """True: the loader tells :meth:`cache_clock` the positions of each batch."""
        return True

    def cache_clock(self, order, start: int, count: int) -> None:
        """The next reads serve positions ``start .. start + count - 1`` of ``order``.

        When they leave the current window, a new one is taken: the indices of
        the next ``window_bytes`` worth of positions; rows kept for the old
        window that the new one does not ask for are dropped.
        """
        window = self._window
        if window is not None and window[0] is order and window[1] <= start and \
                start + count <= window[2]:
            return
        rows = max(count, self.window_bytes // self._row_bytes)
        ahead = np.asarray(order.indices(start, rows), np.int64)
        self._window = (order, start, start + rows, ahead)
        if self._kept:
            keep = set(ahead.tolist())
            self._kept = {i: row for i, row in self._kept.items() if i in keep}

    def cache_flush(self) -> None:
        """Nothing to offer: rows are kept in this process only."""

    def available(self, index: int) -> dict:
        check_index(index, self._n)
        return {c: True for c in self.columns}

    @property
    def spec(self) -> dict:
        """``{column: bag type}`` from the schema (ints, strings, bytes; the rest msgpack)."""
        return {c: _bag_type(self.schema.field(c).type) for c in self.columns}

    def details(self) -> dict:
        out = {'files': len(self._parts),
               'row_groups': sum(len(p.starts) - 1 for p in self._parts),
               'columns': {c: str(self.schema.field(c).type) for c in self.columns}}
        if self.class_names:
            out['classes'] = {c: len(names) for c, names in self.class_names.items()}
        return out

    def __repr__(self) -> str:
        return f'ParquetReader({self.pattern!r}, {self._n} rows)'


class _Sink:
    """The file object pyarrow writes into: a staged file, with the position it needs."""

    closed = False

    def __init__(self, out):
        self.out, self.pos = out, 0

    def write(self, data) -> int:
        data = memoryview(data).cast('B')
        self.out.write(data)
        self.pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self.pos

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True          # the staged file itself is closed by the Writer


# Bag types a Parquet column holds as they are (a list type too, as a list column).
_ARROW_TYPES = {'int': 'int64', 'i64': 'int64', 'u64': 'uint64', 'utf8': 'string',
                'bytes': 'binary', 'jpg': 'binary', 'png': 'binary'}


class ParquetWriter(Writer):
    """Writes datapoints as one Parquet file: a column per key, ``rows_per_group`` rows per
    row group (``loadr convert SRC out.parquet --to parquet --shardlen ROWS``).

    Keys of the types in :data:`_ARROW_TYPES` (and lists of them) are written;
    images as binary columns of their encoded bytes, which :class:`ParquetReader`
    reads back as they were.

    Example::

        with ParquetWriter('out.parquet', {'image': 'jpg', 'label': 'int'}) as w:
            w.append({'image': jpeg_bytes, 'label': 3})
    """

    format_name = 'parquet'
    directory = False
    ROWS_PER_GROUP = 1000

    def __init__(self, path, types: dict, rows_per_group: int | None = None,
                 storage_options: dict | None = None):
        pa = _pyarrow()
        self.path = os.fspath(path)
        fields = []
        for key, type_name in types.items():
            base, is_list = (type_name[:-2], True) if type_name.endswith('[]') else (
                type_name, False)
            if base not in _ARROW_TYPES:
                raise WriterError(f'key {key!r} of type {type_name!r} has no Parquet column type '
                                  f'here (these do: {", ".join(_ARROW_TYPES)}, and lists of '
                                  f'them)', self.path)
            arrow = getattr(pa, _ARROW_TYPES[base])()
            fields.append(pa.field(key, pa.list_(arrow) if is_list else arrow))
        self.schema = pa.schema(fields)
        self.rows_per_group = rows_per_group or self.ROWS_PER_GROUP
        self._rows: list = []
        self._writer: Any = None        # the pyarrow.parquet.ParquetWriter, from the first rows
        self.count = 0
        self._stage(storage_options)

    def append(self, datapoint) -> int:
        """Add one datapoint (a dict with the schema's keys); returns its row number."""
        if self.closed:
            raise WriterError('append to a closed writer', self.path)
        if not isinstance(datapoint, dict) or set(datapoint) != set(self.schema.names):
            raise WriterError(f'datapoint {self.count} must be a dict of the keys '
                              f'{self.schema.names}', self.path, self.count)
        self._rows.append(datapoint)
        self.count += 1
        if len(self._rows) >= self.rows_per_group:
            self._flush()
        return self.count - 1

    def _flush(self) -> None:
        pa, pq = _pyarrow(), _pyarrow().parquet
        first = self.count - len(self._rows)
        try:
            table = pa.Table.from_pylist(self._rows, schema=self.schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise WriterError(f'datapoints {first}..{self.count - 1} do not fit the columns '
                              f'{self.schema}: {exc}', self.path, first) from exc
        if self._writer is None:
            self._writer = pq.ParquetWriter(_Sink(self._file), self.schema)
        self._writer.write_table(table, row_group_size=len(self._rows) or None)
        self._rows = []

    @classmethod
    def plan(cls, plan, dst, types, **options):
        if not dst.endswith(SUFFIX):
            raise ConfigError(f'a parquet output is one file ending in {SUFFIX}', dst)
        bad = [k for k, t in types.items() if t.rstrip('[]') not in _ARROW_TYPES]
        if bad:
            raise ConfigError(f'key {bad[0]!r} ({types[bad[0]]}) has no Parquet column type '
                              f'here (these do: {", ".join(_ARROW_TYPES)}, and lists of them); '
                              f'leave it out with --keys', plan.source.path)
        plan.settings['types'] = dict(types)

    @classmethod
    def describe_plan(cls, plan) -> str:
        return f'parquet, one column per key of {plan.settings["types"]}'

    @classmethod
    def from_plan(cls, plan, dst, shardlen: int | None = None, **options) -> ParquetWriter:
        return cls(dst, plan.settings['types'], rows_per_group=shardlen,
                   **{k: v for k, v in options.items() if k == 'storage_options'})

    @classmethod
    def datapoint_for(cls, plan, index: int, dp):
        return {'data': dp} if plan.source.raw else dp

    def _finish(self) -> None:
        if self._rows or self._writer is None:
            self._flush()
        self._writer.close()
        self._writer = None

    def _release(self) -> None:
        self._writer = None


def detect(path, storage_options=None) -> bool:
    """True for a ``.parquet`` file, a list or pattern of them, or a directory holding them."""
    try:
        if isinstance(path, (list, tuple)):
            return bool(path) and all(os.fspath(p).endswith(SUFFIX) for p in path)
        path = os.fspath(path)
        if names_files(path, storage_options):
            files = expand(path, storage_options)
            return files[0].endswith(SUFFIX) and storage_for(files[0], storage_options).isfile(
                files[0])
        storage = storage_for(path, storage_options)
        if storage.isfile(path):
            return path.endswith(SUFFIX)
        if storage.isdir(path):
            return any(n.endswith(SUFFIX) and not n.startswith('.') for n in storage.list(path))
    except Exception:       # detection never raises, whatever the path is
        return False
    return False


def check(path, storage_options=None) -> list[Problem]:
    """Every row group of every file read whole, and every row checked for what a read of it
    gives: an image stored by path only and a null are problems, as the read raises for them;
    every image is decoded (one of an ``Image`` column that is no JPEG or PNG is a problem:
    the image fns do not decode it). ``storage_options``: the settings of a URL's open."""
    from ..codecs import decode_image, image_kind
    try:
        reader = ParquetReader(path, storage_options=storage_options)
    except LoadrError as exc:
        return [Problem(exc.path or str(path), exc.index, exc.message)]
    problems = []
    for part in reader._parts:
        for group in range(len(part.starts) - 1):
            first = part.base + int(part.starts[group])
            try:
                columns = reader._read_group(part, group, first)
            except LoadrError as exc:
                problems.append(Problem(exc.path or part.path, exc.index, exc.message))
                continue
            count = int(part.starts[group + 1] - part.starts[group])
            for k in range(count):
                row = {name: values[k] for name, values in columns.items()}
                error = reader._row_error(row, first + k)
                if error is not None:
                    problems.append(Problem(error.path or part.path, error.index,
                                            error.message))
                    continue
                for name, value in row.items():
                    if not isinstance(value, bytes):
                        continue
                    kind = image_kind(value)
                    if kind not in ('JPEG', 'PNG'):
                        if name in reader._images:
                            problems.append(Problem(part.path, first + k, (
                                f'column {name!r}: not a JPEG or PNG ({kind or "unknown"}): '
                                f'the image fns will not decode it')))
                        continue
                    try:
                        decode_image(value)
                    except DecodeError as exc:
                        problems.append(Problem(part.path, first + k,
                                                f'column {name!r}: {exc.message}'))
            reader._groups.clear()
    reader.close()
    return problems


FORMAT = Format('parquet', detect, ParquetReader, ParquetWriter, check)
