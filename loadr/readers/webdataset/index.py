"""The member index of one WebDataset tar, and its sidecar file.

A tar is a sequence of 512-byte headers, each followed by its member's
data padded to a multiple of 512. One streaming pass over the headers
alone (each header says how far to seek to the next) gives, for every
regular member, where its data lies; members are grouped into samples as
the ``webdataset`` package groups them: the key is the path up to the first
dot of the base name, the extension the rest (lower-cased); consecutive
members with the same key are one sample (a second member of one
extension in it is an error, as webdataset's "duplicate file name"); a
member without a dot in its base name, a top-level ``__*__`` member or one
under a top-level ``__*__/`` folder, and anything but a regular file are
skipped. A tar must end with its end-of-archive marker (two zero blocks):
one cut short is an error, never a shorter tar. ustar, GNU (``L`` long
names) and pax (``x`` path and size) headers are read; compressed tars are
refused (their members cannot be reached without reading everything
before them).

The sidecar, ``<tar>.loadr-index`` beside the tar, all little-endian::

    b'LOADRWDI' | u32 version (2) | u32 J | u32 CRC32 of all that follows | J bytes of JSON
        {"tar_size": int, "members": M, "samples": S, "exts": [str, ...], "key_bytes": K}
    i64 offset[M]     where member m's data starts in the tar
    i64 size[M]       its length in bytes
    u16 ext[M]        its extension, as a position in "exts"
    (zero bytes up to a multiple of 8)
    i64 first[S + 1]  sample s is members first[s] .. first[s + 1] - 1
    i64 key_at[S + 1] sample s's key is key_bytes[key_at[s] .. key_at[s + 1]] (UTF-8)
    K bytes           the keys, one after the other

A sidecar whose CRC or ``tar_size`` is not the tar's, that does not hold
together, of another version, or older than its tar (a file's mtime, a
URL's Last-Modified) is ignored and built again. Every read of a member
also checks the tar header just before its data (read with it) against the
index, name and size, which catches the sidecar of another tar of the same
size, and a tar changed or replaced after its index was made, even with the
same size and modification time. Example::

    index = scan(storage_for('a.tar'), 'a.tar')
    index.samples, index.member_range(0)
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import zlib

import numpy as np

from ...errors import FormatError, LoadrError

__all__ = ['TarIndex', 'scan', 'load_sidecar', 'sidecar_bytes', 'SIDECAR_SUFFIX',
           'compressed_kind', 'split_name', 'header_is', 'header_matches', 'header_name',
           'header_size',
           'same_index']

BLOCK = 512
SIDECAR_SUFFIX = '.loadr-index'
MAGIC = b'LOADRWDI'
# 2: written only by scans that found the tar's end-of-archive marker (version 1
# sidecars were also made of truncated tars, so they are made again).
VERSION = 2
# A sidecar's JSON header larger than this is not one of ours.
MAX_SIDECAR_JSON = 1 << 20
# Local reads of a scan: one header block each. Remote ones take this much at once,
# so that the headers of a sample's small members (cls, json, txt) come in one request.
REMOTE_WINDOW_BYTES = 64 << 10

_NAME = re.compile(r'^((?:.*/|)[^.]+)[.]([^/]*)$')     # webdataset's base_plus_ext
_LOST = 'what came after was lost (an interrupted download or copy?): fetch or write it again'
_META = re.compile(r'__[^/]*__($|/)')                  # webdataset's skip_meta: __x__, __x__/...
_COMPRESSED = {b'\x1f\x8b': 'gzip', b'BZh': 'bzip2', b'\xfd7zXZ\x00': 'xz',
               b'\x28\xb5\x2f\xfd': 'zstd'}
_DECOMPRESS = {'gzip': 'gunzip -k FILE.tar.gz', 'bzip2': 'bunzip2 -k FILE.tar.bz2',
               'xz': 'unxz -k FILE.tar.xz', 'zstd': 'unzstd FILE.tar.zst'}


def split_name(name: str) -> tuple[str | None, str | None]:
    """``(key, extension)`` as webdataset splits a member name; ``(None, None)`` if it has no dot.

    >>> split_name('a/b/000123.seg.png'), split_name('README')
    (('a/b/000123', 'seg.png'), (None, None))
    """
    match = _NAME.match(name)
    return (match.group(1), match.group(2)) if match else (None, None)


def compressed_kind(head: bytes) -> str | None:
    """``'gzip'``, ``'bzip2'``, ``'xz'`` or ``'zstd'`` for a file starting with ``head``."""
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            return kind
    return None


def compressed_error(kind: str, path: str) -> FormatError:
    """The error for a compressed tar: why it cannot be read at random, and how to convert."""
    return FormatError(
        f'a {kind}-compressed tar cannot be read at random (a member can only be reached by '
        f'decompressing everything before it); decompress it once, e.g. '
        f'`{_DECOMPRESS[kind]}`, and open the .tar', path)


@dataclasses.dataclass
class TarIndex:
    """Where the members and samples of one tar lie (all numpy arrays; see the module doc)."""

    tar_size: int
    offset: np.ndarray           # int64[M]
    size: np.ndarray             # int64[M]
    ext: np.ndarray              # uint16[M]
    exts: list                   # extension names
    first: np.ndarray            # int64[S + 1]
    key_at: np.ndarray           # int64[S + 1]
    key_bytes: bytes
    bytes_read: int = 0          # by the scan that built it (0 when loaded)
    sidecar: bool = False        # read from, or written to, a sidecar beside the tar

    @property
    def samples(self) -> int:
        return len(self.first) - 1

    @property
    def members(self) -> int:
        return len(self.offset)

    def key(self, sample: int) -> str:
        """Sample ``sample``'s key."""
        a, b = int(self.key_at[sample]), int(self.key_at[sample + 1])
        return self.key_bytes[a:b].decode('utf-8', 'surrogateescape')

    def member_range(self, sample: int) -> range:
        """The members of sample ``sample``."""
        return range(int(self.first[sample]), int(self.first[sample + 1]))

    def span(self, sample: int) -> tuple[int, int]:
        """``(start, end)`` bytes of the tar from the sample's first member data to its last's
        end: one read that holds every member of the sample (and the headers between)."""
        a, b = int(self.first[sample]), int(self.first[sample + 1])
        return int(self.offset[a]), int(self.offset[b - 1] + self.size[b - 1])

    def problem(self) -> str | None:
        """Why the arrays do not hold together (a damaged sidecar), or None."""
        m, s = len(self.offset), len(self.first) - 1
        if len(self.size) != m or len(self.ext) != m or s < 0 or len(self.key_at) != s + 1:
            return 'table lengths disagree'
        if m and ((self.offset < BLOCK).any() or (self.size < 0).any()
                  or (self.offset + self.size > self.tar_size).any()
                  or (np.diff(self.offset) < self.size[:-1]).any()):
            return 'a member lies outside the tar or overlaps the next'
        if m and int(self.ext.max()) >= len(self.exts):
            return 'an extension number outside the table'
        if self.first[0] != 0 or self.first[-1] != m or (np.diff(self.first) <= 0).any():
            return 'sample table is not increasing'
        if self.key_at[0] != 0 or self.key_at[-1] != len(self.key_bytes) or (
                np.diff(self.key_at) < 0).any():
            return 'key table is not increasing'
        return None


# ---------------------------------------------------------------------------
# The scan


def _octal(field: bytes, path: str, at: int, what: str) -> int:
    if field[:1] and field[0] & 0x80:                    # GNU base-256 for large values
        value = int.from_bytes(field[1:], 'big')
        return -value if field[0] & 0x40 else value
    text = field.split(b'\0', 1)[0].strip(b' \0')
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise FormatError(f'the tar header at byte {at} has a bad {what} field {field!r}; '
                          f'not a tar, or a damaged one', path) from None


def _checksum_ok(block: bytes, stored: int) -> bool:
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    signed = unsigned - 2 * sum(b for b in block[:148] + block[156:] if b > 127)
    return stored in (unsigned, signed)


def _pax(data: bytes) -> dict:
    """The records of a pax extended header: ``"%d %s=%s\\n"``."""
    out, pos = {}, 0
    while pos < len(data):
        space = data.find(b' ', pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        record = data[space + 1:pos + length - 1]
        key, _, value = record.partition(b'=')
        out[key.decode('utf-8', 'replace')] = value.decode('utf-8', 'surrogateescape')
        pos += length
    return out


class _Blocks:
    """Reads header blocks from a storage, ``window`` bytes at a time; counts bytes read."""

    def __init__(self, storage, path: str, size: int, window: int):
        self.storage, self.path, self.size, self.window = storage, path, size, window
        self.start, self.data = 0, b''
        self.bytes_read = 0

    def get(self, at: int, length: int) -> bytes:
        if self.start <= at and at + length <= self.start + len(self.data):
            return self.data[at - self.start:at - self.start + length]
        want = min(max(length, self.window), self.size - at)
        if want < length:
            raise FormatError(f'the tar is truncated: it ends at byte {self.size}, inside the '
                              f'header at byte {at}', self.path)
        self.data = self.storage.read(self.path, at, want)
        self.start = at
        self.bytes_read += want
        return self.data[:length]


def scan(storage, path: str, window: int | None = None, progress=None) -> TarIndex:
    """Index ``path`` by reading its headers only; FormatError naming the tar and member.

    ``window`` is the bytes read per request (default: one block locally, 64 KiB
    for a URL). ``progress(bytes)`` is called with the tar bytes passed over.
    """
    size = storage.size(path)
    if window is None:
        window = REMOTE_WINDOW_BYTES if '://' in path else BLOCK
    if size:
        head = storage.read(path, 0, min(size, 8))
        compressed = compressed_kind(head)
        if compressed:
            raise compressed_error(compressed, path)
    blocks = _Blocks(storage, path, size, window)
    offsets: list[int] = []
    sizes: list[int] = []
    ext_ids: list[int] = []
    firsts: list[int] = []
    keys: list[bytes] = []
    exts: dict[str, int] = {}
    current_key: str | None = None
    current_exts: set[str] = set()
    pos, member = 0, 0
    long_name, pax = None, {}
    name, ended = None, False
    while pos + BLOCK <= size:
        block = blocks.get(pos, BLOCK)
        if block == bytes(BLOCK):
            ended = True                                    # the end-of-archive marker
            break
        stored = _octal(block[148:156], path, pos, 'checksum')
        if not _checksum_ok(block, stored):
            raise FormatError(f'member {member} (the header at byte {pos}): header checksum '
                              f'mismatch; not a tar, or a damaged one', path)
        length = _octal(block[124:136], path, pos, 'size')
        kind = block[156:157]
        if kind in (b'x', b'g', b'L', b'K'):
            if length > size - pos - BLOCK or length > (16 << 20):
                raise FormatError(f'the tar is truncated: member {member} (the header at byte '
                                  f'{pos}): an extended header of {length} bytes runs past its '
                                  f'end; {_LOST}', path)
            data = blocks.get(pos + BLOCK, length) if length else b''
            if kind == b'L':
                long_name = data.split(b'\0', 1)[0].decode('utf-8', 'surrogateescape')
            elif kind == b'x':
                pax = _pax(data)
            pos += BLOCK + -(-length // BLOCK) * BLOCK
            continue
        name = long_name
        if 'path' in pax:
            name = pax['path']
        if 'size' in pax:
            try:
                length = int(pax['size'])
            except ValueError:
                raise FormatError(f'member {member} (the header at byte {pos}): bad pax size '
                                  f'{pax["size"]!r}', path) from None
        if name is None:
            name = block[0:100].split(b'\0', 1)[0].decode('utf-8', 'surrogateescape')
            if block[257:262] == b'ustar':
                prefix = block[345:500].split(b'\0', 1)[0].decode('utf-8', 'surrogateescape')
                if prefix:
                    name = f'{prefix}/{name}'
        long_name, pax = None, {}
        start = pos + BLOCK
        regular = kind in (b'0', b'\0', b'7')
        if regular and (length < 0 or start + length > size):
            raise FormatError(f'member {member} ({name!r}): the tar is truncated: its '
                              f'{length} bytes at byte {start} run past the end ({size} bytes); '
                              f'{_LOST}', path)
        member += 1
        pos = start + -(-max(length, 0) // BLOCK) * BLOCK if regular or kind not in (
            b'1', b'2', b'3', b'4', b'5', b'6') else start
        if not regular or ('/' not in name and name.startswith('__') and name.endswith('__')) \
                or _META.match(name):
            continue
        key, ext = split_name(name)
        if key is None or ext is None:      # (both are, or neither)
            continue
        ext = ext.lower()
        if key != current_key:
            firsts.append(len(offsets))
            keys.append(key.encode('utf-8', 'surrogateescape'))
            current_key, current_exts = key, set()
        elif ext in current_exts:
            raise FormatError(f'member {member - 1} ({name!r}): a second {ext!r} in sample '
                              f'{key!r} (webdataset refuses it too: "duplicate file name")',
                              path, len(firsts) - 1)
        current_exts.add(ext)
        offsets.append(start)
        sizes.append(length)
        ext_ids.append(exts.setdefault(ext, len(exts)))
        if progress is not None and member % 256 == 0:
            progress(pos)
    _check_end(blocks, path, pos, size, ended, member, name)
    if progress is not None:
        progress(size)
    firsts.append(len(offsets))
    key_at = np.zeros(len(keys) + 1, np.int64)
    np.cumsum([len(k) for k in keys], out=key_at[1:])
    if len(exts) > 65535:
        raise FormatError(f'more than 65535 different extensions ({len(exts)})', path)
    return TarIndex(size, np.array(offsets, np.int64), np.array(sizes, np.int64),
                    np.array(ext_ids, np.uint16), list(exts), np.array(firsts, np.int64),
                    key_at, b''.join(keys), blocks.bytes_read)


def _check_end(blocks: _Blocks, path: str, pos: int, size: int, ended: bool, members: int,
               last: str | None) -> None:
    """A tar ends with two zero blocks (then zeros up to a multiple of 10240 bytes, which may
    be cut without loss). A file that stops before them lost what came after: an interrupted
    copy or download, which would otherwise read as a shorter tar."""
    if ended and pos + 2 * BLOCK <= size:
        return                  # as tarfile and webdataset, a second block not zero is let be
    after = f'after member {members - 1} ({last!r})' if members else 'before any member'
    if not size:
        why = 'it is empty (0 bytes)'
    elif pos >= size and not ended:
        why = f'it ends at byte {size}, {after}, without the end-of-archive marker ' \
              f'(two 512-byte zero blocks)'
    elif ended or not blocks.get(pos, size - pos).strip(b'\0'):
        why = f'it ends at byte {size}, {after}, inside the end-of-archive marker (two ' \
              f'512-byte zero blocks from byte {pos})'
    else:
        why = f'it ends at byte {size}, inside the header of member {members}'
    raise FormatError(f'the tar is truncated: {why}; {_LOST}', path)


def header_size(block: bytes) -> int | None:
    """The size field of tar header ``block`` (octal, or GNU base-256), or None if unreadable."""
    field = block[124:136]
    if field[:1] and field[0] & 0x80:
        return int.from_bytes(field[1:], 'big')
    text = field.split(b'\0', 1)[0].strip(b' ')
    try:
        return int(text, 8) if text else 0
    except ValueError:
        return None


def header_name(block: bytes) -> str:
    """The name tar header ``block`` holds itself (a long name's first 100 bytes), for messages."""
    name = block[0:100].split(b'\0', 1)[0]
    prefix = block[345:500].split(b'\0', 1)[0] if block[257:262] == b'ustar' else b''
    return (prefix + b'/' + name if prefix else name).decode('utf-8', 'surrogateescape')


# An ustar size field holds up to 8 GiB - 1; a larger member's size is in a pax header.
_MAX_OCTAL_SIZE = 8 ** 11 - 1


def header_is(block: bytes, name: bytes, size: int) -> bool:
    """True if ``block`` holds ``name`` (under 100 bytes) and ``size`` exactly as tarfile and
    GNU tar write them: the fast check of a member's header; :func:`header_matches` knows
    the other forms."""
    n = len(name)
    return n < 100 and block[n] == 0 and block[:n] == name and \
        block[124:135] == b'%011o' % size


def header_matches(block: bytes, key: str, ext: str, size: int) -> bool:
    """True if ``block`` is the tar header of member ``<key>.<ext>`` of ``size`` bytes.

    ``ext`` is the index's, lower-cased (the member's own may be upper case).
    The name field is compared in every form a writer leaves there: the
    whole name; a ustar prefix and name; the first 100 (old GNU: 99) bytes
    of a longer name whose whole is in an extended header before (GNU ``L``,
    pax ``path``); its ASCII form with ``?`` for the rest (what Python's tarfile
    writes beside a pax ``path``). The name and size fields alone: summing the
    checksum in Python cost a fifth of a sample's read, and a stale or
    misplaced index differs in them anyway.
    """
    if len(block) != BLOCK:
        return False
    stored = header_size(block)
    if stored != size and not (size > _MAX_OCTAL_SIZE and stored in (0, None)):
        return False
    field = block[0:100]
    nul = field.find(b'\0')
    got = [field if nul < 0 else field[:nul]]
    if not got[0]:
        return False
    if block[257:262] == b'ustar' and block[345:346] != b'\0':
        got.append(block[345:500].split(b'\0', 1)[0] + b'/' + got[0])
    for encoding, errors in (('utf-8', 'surrogateescape'), ('ascii', 'replace')):
        encoded = key.encode(encoding, errors)
        want = encoded + b'.' + ext.encode(encoding, errors)
        k = len(encoded) + 1
        for form in (want, want[:100], want[:99]):     # GNU's and old GNU's cut
            for name in got:
                # The key exactly; the extension as the index keeps it, lower-cased.
                if len(name) == len(form) and name[:k] == form[:k] and (
                        name[k:] == form[k:] or _lower(name[k:]) == form[k:]):
                    return True
    return False


def _lower(data: bytes) -> bytes:
    return data.decode('utf-8', 'surrogateescape').lower().encode('utf-8', 'surrogateescape')


def same_index(a: TarIndex, b: TarIndex) -> bool:
    """True if ``a`` and ``b`` say the same of their tar (members, samples, keys)."""
    return (a.tar_size == b.tar_size and a.exts == b.exts and a.key_bytes == b.key_bytes and
            all(np.array_equal(getattr(a, f), getattr(b, f))
                for f in ('offset', 'size', 'ext', 'first', 'key_at')))


# ---------------------------------------------------------------------------
# The sidecar


def sidecar_bytes(index: TarIndex) -> bytes:
    """The sidecar file of ``index`` (see the module docstring)."""
    header = json.dumps({'tar_size': index.tar_size, 'members': index.members,
                         'samples': index.samples, 'exts': index.exts,
                         'key_bytes': len(index.key_bytes)}, separators=(',', ':')).encode()
    ext = index.ext.astype('<u2').tobytes()
    pad = b'\0' * (-len(ext) % 8)
    body = b''.join([header, index.offset.astype('<i8').tobytes(),
                     index.size.astype('<i8').tobytes(), ext, pad,
                     index.first.astype('<i8').tobytes(), index.key_at.astype('<i8').tobytes(),
                     index.key_bytes])
    return MAGIC + struct.pack('<III', VERSION, len(header), zlib.crc32(body)) + body


def parse_sidecar(data: bytes, tar_size: int) -> TarIndex | None:
    """The index a sidecar holds, or None if it is not one of ours, is stale or damaged."""
    try:
        if data[:8] != MAGIC:
            return None
        version, j, crc = struct.unpack_from('<III', data, 8)
        if version != VERSION or j > MAX_SIDECAR_JSON or zlib.crc32(data[20:]) != crc:
            return None
        head = json.loads(data[20:20 + j])
        if head['tar_size'] != tar_size:
            return None
        m, s, k, exts = head['members'], head['samples'], head['key_bytes'], head['exts']
        if not (isinstance(m, int) and isinstance(s, int) and isinstance(k, int)
                and isinstance(exts, list) and all(isinstance(e, str) for e in exts)
                and 0 <= m and 0 <= s and 0 <= k):
            return None
        pos = 20 + j
        ext_bytes = 2 * m + (-2 * m % 8)
        if len(data) != pos + 16 * m + ext_bytes + 16 * (s + 1) + k:
            return None
        offset = np.frombuffer(data, '<i8', m, pos)
        size = np.frombuffer(data, '<i8', m, pos + 8 * m)
        ext = np.frombuffer(data, '<u2', m, pos + 16 * m)
        pos += 16 * m + ext_bytes
        first = np.frombuffer(data, '<i8', s + 1, pos)
        key_at = np.frombuffer(data, '<i8', s + 1, pos + 8 * (s + 1))
        keys = data[pos + 16 * (s + 1):]
        index = TarIndex(tar_size, offset.astype(np.int64), size.astype(np.int64),
                         ext.astype(np.uint16), exts, first.astype(np.int64),
                         key_at.astype(np.int64), bytes(keys), sidecar=True)
    except (ValueError, KeyError, TypeError, struct.error):
        return None
    return None if index.problem() else index


def load_sidecar(storage, tar: str, tar_size: int) -> TarIndex | None:
    """The index in ``tar``'s sidecar, or None where there is none (or a stale or bad one)."""
    side = tar + SIDECAR_SUFFIX
    try:
        if not storage.isfile(side):
            return None
        data = storage.read_all(side, max_bytes=1 << 34)
    except LoadrError:
        return None
    return parse_sidecar(data, tar_size)
