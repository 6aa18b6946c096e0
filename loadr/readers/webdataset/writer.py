"""Writing WebDataset shards (``loadr convert SRC DST --to webdataset``).

``DST`` becomes a directory of ``shard-000000.tar``, ``shard-000001.tar``,
… (``shardlen`` samples each, default :data:`DEFAULT_SHARDLEN`), each with
its sidecar index (:mod:`.index`), readable by the ``webdataset`` package and
by loadr. A datapoint's ``'__key__'`` (a str) names its sample; without one
the sample is named by its number (``000000042``). A key used already in
the same shard, one with a NUL, a ``..`` part or an absolute path, or whose
last part is empty or has a dot is refused (:func:`key_problem`). Every other key becomes
one member ``<key>.<name>``, so the keys are the extensions: name them as
webdataset does (``jpg``, ``png``, ``cls``, ``txt``, ``json``, ``npy``) and
their values come back as they went in. Values are written as:

- bytes: as they are (encoded images stay encoded);
- str: UTF-8; int: its decimal text (webdataset's ``cls``);
- numpy arrays: ``.npy`` bytes;
- anything else JSON can hold: JSON.

Members are written with mtime 0, mode 0444 and no owner, so the same
datapoints give the same bytes.

Example::

    with WebDatasetWriter('out', shardlen=1000) as w:
        w.append({'__key__': 'a', 'jpg': jpeg_bytes, 'cls': 3})
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile

import numpy as np

from ...errors import ConfigError, WriterError
from ...storage import WriteFile
from ..base import Writer, known_options
from ..records import Plan
from .index import BLOCK, SIDECAR_SUFFIX, TarIndex, sidecar_bytes
from .reader import DECODERS, KEY

__all__ = ['WebDatasetWriter', 'DEFAULT_SHARDLEN', 'encode_member', 'key_problem']

DEFAULT_SHARDLEN = 10_000
RECORD = 20 * BLOCK               # tar pads its end to a multiple of this (as tarfile does)
_EXT = re.compile(r'[a-z0-9_][a-z0-9_.\-]*\Z')


def encode_member(value, where: str, path: str, number: int) -> bytes:
    """The bytes of one member for ``value`` (see the module docstring)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode('utf-8')
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value)).encode()
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise WriterError(f'datapoint {number}, key {where!r}: an array of objects cannot '
                              f'be stored', path, number)
        out = io.BytesIO()
        np.lib.format.write_array(out, np.ascontiguousarray(value), allow_pickle=False)
        return out.getvalue()
    try:
        return json.dumps(value, separators=(',', ':')).encode()
    except (TypeError, ValueError) as exc:
        raise WriterError(f'datapoint {number}, key {where!r}: a {type(value).__name__} is '
                          f'neither bytes, str, int, an array nor JSON: {exc}', path,
                          number) from exc


def key_problem(key) -> str | None:
    """Why ``key`` cannot name a sample in a tar (the end of a sentence), or None.

    >>> key_problem('train/000042'), key_problem('../x')
    (None, 'has a ".." part: unpacking the tar would write outside its directory')
    """
    if not isinstance(key, str) or not key:
        return 'must be a non-empty str'
    if '\0' in key:
        return (f'holds a NUL character: a tar member name ends at the first NUL, so the '
                f'sample would be named {key.split(chr(0), 1)[0]!r} in the tar')
    parts = key.replace('\\', '/').split('/')
    if key.startswith(('/', '\\')) or (len(parts[0]) == 2 and parts[0][1] == ':'):
        return 'is an absolute path: unpacking the tar would write outside its directory'
    if '..' in parts:
        return 'has a ".." part: unpacking the tar would write outside its directory'
    if not parts[-1] or '.' in parts[-1]:
        return ('must have a last part, with no "." in it (webdataset splits member names at '
                'the first dot of their last part)')
    return None


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o444
    info.uname = info.gname = ''
    return info.tobuf(tarfile.GNU_FORMAT, 'utf-8', 'surrogateescape')


class WebDatasetWriter(Writer):
    """Writes datapoints as WebDataset shards into a new directory; see the module docstring."""

    format_name = 'webdataset'

    def __init__(self, path: str | os.PathLike, shardlen: int | None = None,
                 storage_options: dict | None = None):
        self.path = os.fspath(path)
        shardlen = DEFAULT_SHARDLEN if shardlen is None else shardlen
        if isinstance(shardlen, bool) or not isinstance(shardlen, int) or shardlen < 1:
            raise WriterError(f'shardlen must be a positive int, not {shardlen!r}', self.path)
        self.shardlen = shardlen
        self.count = 0
        self._tar: WriteFile | None = None          # the shard being written, if any
        self._stage(storage_options)

    def _open_shard(self) -> WriteFile:
        self._name = f'shard-{self.count // self.shardlen:06d}.tar'
        self._tar = tar = self._dir.open_write(self._name)
        self._pos = 0
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._ext_ids: list[int] = []
        self._firsts: list[int] = []
        self._keys: list[bytes] = []
        self._exts: dict[str, int] = {}
        self._shard_keys: dict[str, int] = {}      # the keys of this shard: datapoint numbers
        return tar

    def _close_shard(self, tar: WriteFile) -> None:
        end = self._pos + 2 * BLOCK
        tar.write(bytes(2 * BLOCK + (-end % RECORD)))
        size = end + (-end % RECORD)
        tar.close()
        self._firsts.append(len(self._offsets))
        key_at = np.zeros(len(self._keys) + 1, np.int64)
        np.cumsum([len(k) for k in self._keys], out=key_at[1:])
        index = TarIndex(size, np.array(self._offsets, np.int64),
                         np.array(self._sizes, np.int64), np.array(self._ext_ids, np.uint16),
                         list(self._exts), np.array(self._firsts, np.int64), key_at,
                         b''.join(self._keys))
        self._dir.write_file(self._name + SIDECAR_SUFFIX, sidecar_bytes(index))
        self._tar = None

    def append(self, datapoint) -> int:
        """Write one datapoint as one sample; returns its number."""
        if self.closed:
            raise WriterError('append to a closed writer', self.path)
        number = self.count
        if not isinstance(datapoint, dict):
            raise WriterError(f'datapoint {number} must be a dict, not '
                              f'{type(datapoint).__name__}', self.path, number)
        key = datapoint.get(KEY, f'{number:09d}')
        problem = key_problem(key)
        if problem:
            raise WriterError(f'datapoint {number}: {KEY} {key!r} {problem}', self.path, number)
        members = []
        for ext, value in datapoint.items():
            if ext == KEY:
                continue
            if not isinstance(ext, str) or not _EXT.match(ext):
                raise WriterError(f'datapoint {number}: key {ext!r} cannot be an extension (use '
                                  f'lower-case letters, digits, _ . -)', self.path, number)
            members.append((ext, encode_member(value, ext, self.path, number)))
        if not members:
            raise WriterError(f'datapoint {number} has no value besides {KEY}: a sample needs '
                              f'at least one member', self.path, number)
        tar = self._tar if self._tar is not None else self._open_shard()
        first = self._shard_keys.get(key)
        if first is not None:
            raise WriterError(f'datapoint {number}: {KEY} {key!r} is already the key of datapoint '
                              f'{first} in {self._name}; one tar cannot hold two samples of one '
                              f'key (webdataset and loadr read consecutive ones as one sample, '
                              f'and unpacking the tar writes one over the other): make the keys '
                              f'unique', self.path, number)
        self._shard_keys[key] = number
        self._firsts.append(len(self._offsets))
        self._keys.append(key.encode('utf-8', 'surrogateescape'))
        for ext, data in members:
            head = _header(f'{key}.{ext}', len(data))
            tar.write(head)
            self._offsets.append(self._pos + len(head))
            self._sizes.append(len(data))
            self._ext_ids.append(self._exts.setdefault(ext, len(self._exts)))
            tar.write(data + bytes(-len(data) % BLOCK))
            self._pos += len(head) + len(data) + (-len(data) % BLOCK)
        self.count += 1
        if self.count % self.shardlen == 0:
            self._close_shard(tar)
        return number

    # -- conversion (loadr convert --to webdataset) ----------------------------------

    @classmethod
    def plan(cls, plan: Plan, dst: str, types: dict, **options) -> None:
        bad = [k for k in types if k != KEY and not _EXT.match(k)]
        if bad:
            raise ConfigError(f'key {bad[0]!r} cannot be a webdataset extension (lower-case '
                              f'letters, digits, _ . -); leave it out with --keys',
                              plan.source.path)
        # Say which values will come back as bytes (their key is no decoding extension).
        plan.settings['as_bytes'] = [
            k for k, t in types.items() if k != KEY and t not in ('jpg', 'png', 'bytes')
            and k.rsplit('.', 1)[-1] not in DECODERS]

    @classmethod
    def describe_plan(cls, plan: Plan) -> str:
        note = ''
        if plan.settings.get('as_bytes'):
            note = (f'; {plan.settings["as_bytes"]} will read back as bytes (their names are '
                    f'no webdataset decoding extension: cls, txt, json, npy, ...)')
        return f'webdataset shards, one member per key of {plan.keys}{note}'

    @classmethod
    def from_plan(cls, plan: Plan, dst: str, shardlen: int | None = None,
                  **options) -> WebDatasetWriter:
        return cls(dst, shardlen=shardlen, **known_options(cls, options))

    @classmethod
    def datapoint_for(cls, plan: Plan, index: int, dp):
        return {'data': dp} if plan.source.raw else dp

    def _finish(self) -> None:
        tar = self._tar
        if tar is None and self.count == 0:
            tar = self._open_shard()        # no datapoints: one empty, valid tar
        if tar is not None:
            self._close_shard(tar)

    def _release(self) -> None:
        if self._tar is not None:
            try:
                self._tar.close()
            except OSError:
                pass
            self._tar = None
