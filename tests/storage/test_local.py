"""The local storage (loadr.storage.local, errors, staging), on real files and processes."""

from __future__ import annotations

import errno
import os
import pickle

import pytest

from loadr import storage
from loadr.assemble import _transient
from loadr.errors import ConfigError, FormatError, ReadError, WriterError
from loadr.readers import Files
from loadr.storage import LocalStorage, mapped, read_error, staging, storage_for, transient


@pytest.fixture
def data(tmp_path):
    path = tmp_path / 'data.bin'
    path.write_bytes(bytes(range(256)) * 4)
    return str(path)


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir('/proc/self/fd')}


def test_files_is_the_local_storage():
    assert Files is LocalStorage
    assert isinstance(storage_for('anything/here'), LocalStorage)


def test_read_and_read_many_give_the_bytes(data):
    s = LocalStorage()
    raw = open(data, 'rb').read()
    assert s.read(data, 10, 5) == raw[10:15]
    assert s.size(data) == len(raw)
    ranges = [(data, 0, 3, None), (data, 1000, 24, 7), (data, 5, 0, 1)]
    assert s.read_many(ranges) == [raw[0:3], raw[1000:1024], b'']
    assert storage.Storage.read_many(s, ranges) == s.read_many(ranges)   # the generic loop


def test_short_read_is_a_format_error_naming_file_and_index(data):
    s = LocalStorage()
    with pytest.raises(FormatError, match='truncated: wanted 100 bytes at offset 1000, got 24') \
            as err:
        s.read(data, 1000, 100, index=4)
    assert (err.value.path, err.value.index) == (data, 4)
    with pytest.raises(FormatError, match='truncated') as err:
        s.read_many([(data, 0, 4, 1), (data, 1020, 10, 9)])
    assert err.value.index == 9
    with pytest.raises(FormatError, match='negative'):
        s.read(data, -1, 4)


def test_a_vanished_file_is_a_read_error_not_transient(tmp_path):
    path = str(tmp_path / 'gone.bin')
    with pytest.raises(ReadError, match='ENOENT') as err:
        LocalStorage().read(path, 0, 4, index=12)
    assert (err.value.path, err.value.index, err.value.errno) == (path, 12, errno.ENOENT)
    assert not transient(err.value) and not _transient(err.value)


def test_a_directory_read_as_a_file_is_a_read_error(tmp_path):
    # The open succeeds and the read fails: the error of the read, mapped.
    with pytest.raises(ReadError, match='EISDIR') as err:
        LocalStorage().read(str(tmp_path), 0, 4, index=3)
    assert err.value.index == 3 and not transient(err.value)


def test_eio_from_a_real_file_is_transient():
    # /proc/self/mem answers a read of an unmapped address (0) with EIO.
    with pytest.raises(ReadError, match='EIO') as err:
        LocalStorage().read('/proc/self/mem', 0, 8, index=5)
    assert err.value.errno == errno.EIO and err.value.transient
    assert transient(err.value) and _transient(err.value)   # the loader's retry policy agrees


def test_transient_marking():
    assert read_error(OSError(errno.EAGAIN, 'again'), 'x', 1).transient
    assert not read_error(OSError(errno.EACCES, 'denied'), 'x', 1).transient
    wrapped = ReadError('cannot read', 'x', 1)
    wrapped.__cause__ = OSError(errno.ETIMEDOUT, 'timed out')
    assert transient(wrapped)                   # judged by the OSError it came from
    assert not transient(ValueError('bad'))
    marked = ReadError('HTTP 503', 'https://host/x', 2)
    marked.transient = True                     # what a remote storage sets
    assert transient(marked)


def test_mapped_turns_os_errors_into_read_errors(tmp_path):
    missing = str(tmp_path / 'missing')
    with pytest.raises(ReadError) as err:
        with mapped(missing, 8):
            os.stat(missing)
    assert (err.value.path, err.value.index) == (missing, 8)
    with pytest.raises(FormatError):            # loadr's own errors pass unchanged
        with mapped(missing, 8):
            raise FormatError('bad', missing, 8)


def test_descriptors_are_cached_once_per_file(data):
    s = LocalStorage()
    before = open_fds()
    for offset in range(0, 100, 10):
        s.read(data, offset, 10)
    s.size(data)
    assert len(open_fds() - before) == 1
    s.close()
    assert open_fds() - before == set()


def test_a_forked_child_opens_its_own_descriptor(data, tmp_path):
    s = LocalStorage()
    s.read(data, 0, 4)
    parent_fd = s.fd(data)
    # The child replaces the file and reads: it must open the path again (and so
    # see the replacement), not read through the parent's descriptor.
    replacement = tmp_path / 'new.bin'
    replacement.write_bytes(b'\0' * 4096)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                # pragma: no cover - the child
        try:
            os.close(r)
            os.replace(replacement, data)
            try:
                s.read(data, 0, 4)
                answer = b'read'
            except FormatError as exc:
                answer = b'changed' if 'changed since the reader was made' in str(exc) else b'?'
            os.write(w, answer)
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 100)
    os.close(r)
    os.waitpid(pid, 0)
    assert answer == b'changed'
    os.fstat(parent_fd)                         # the child closed its copy, not ours
    assert s.fd(data) == parent_fd


def test_pickled_storage_carries_what_it_saw_and_no_descriptor(data, tmp_path):
    s = LocalStorage()
    s.read(data, 0, 4)
    blob = pickle.dumps(s)
    assert len(blob) < 500
    copy = pickle.loads(blob)
    assert copy._fds == {} and copy.read(data, 0, 4) == s.read(data, 0, 4)
    copy.close()
    other = tmp_path / 'other.bin'
    other.write_bytes(b'x' * 10)
    os.replace(other, data)                     # replaced on disk, as a writer does
    with pytest.raises(FormatError, match='changed since the reader was made') as err:
        pickle.loads(blob).read(data, 0, 4, index=3)
    assert (err.value.path, err.value.index) == (data, 3)
    assert s.read(data, 0, 4) == bytes(range(4))   # this process still holds the old file


def test_read_all_checks_identity_and_limits(data):
    s = LocalStorage()
    raw = open(data, 'rb').read()
    assert s.read_all(data) == raw
    assert len(s.read_all(data, max_bytes=10)) == 11     # one more: the caller sees "too large"
    with open(data, 'ab') as f:                         # changed in place: still this file
        f.write(b'more')
    assert s.read_all(data) == raw + b'more'
    os.replace(f.name, data + '.old')                   # moved away, a new file put there
    with open(data, 'wb') as f:
        f.write(raw)
    with pytest.raises(FormatError, match='replaced by another file'):
        s.read_all(data)


def test_listing_and_predicates(tmp_path):
    (tmp_path / 'b').write_bytes(b'')
    (tmp_path / 'a').mkdir()
    s = LocalStorage()
    assert s.list(str(tmp_path)) == ['a', 'b']
    assert s.isdir(str(tmp_path / 'a')) and s.isfile(str(tmp_path / 'b'))
    assert s.exists(str(tmp_path / 'b')) and not s.exists(str(tmp_path / 'c'))
    assert not s.occupied(str(tmp_path / 'a')) and s.occupied(str(tmp_path / 'b'))
    with pytest.raises(ReadError):
        s.list(str(tmp_path / 'c'))


def test_storage_for_urls_and_options(tmp_path):
    with pytest.raises(ConfigError, match='apply to URLs only'):
        storage_for(str(tmp_path), {'anon': True})
    assert storage.is_url('https://host/x') and not storage.is_url(str(tmp_path))


def test_staged_file_appears_only_on_commit(tmp_path):
    target = str(tmp_path / 'out.bin')
    f = LocalStorage().open_write(target)
    f.write(b'abc')
    f.pwrite(b'X', 1)
    assert not os.path.exists(target) and staging.MARK in os.path.basename(f.path)
    f.commit()
    assert open(target, 'rb').read() == b'aXc'
    assert [p.name for p in tmp_path.iterdir()] == ['out.bin']
    with LocalStorage().open_write(target) as g:     # never committed: removed, target kept
        g.write(b'zzz')
    assert open(target, 'rb').read() == b'aXc'
    assert [p.name for p in tmp_path.iterdir()] == ['out.bin']
    h = LocalStorage().open_write(target)
    h.write(b'new')
    with pytest.raises(WriterError, match='appeared'):
        h.commit(overwrite=False)
    assert [p.name for p in tmp_path.iterdir()] == ['out.bin']


def test_staged_dir_commit_and_abort(tmp_path):
    target = str(tmp_path / 'deep' / 'out')
    d = LocalStorage().stage_dir(target, parents=True)
    d.mkdir('000000')
    d.write_file('000000/spec.json', b'{}', sync=True)
    with d.open_write('a.bin') as f:
        f.write(b'a')
    d.commit(sync=True)
    assert sorted(os.listdir(target)) == ['000000', 'a.bin']
    e = LocalStorage().stage_dir(target)
    e.write_file('b.bin', b'b')
    with pytest.raises(WriterError, match='non-empty'):
        e.commit()
    assert sorted(os.listdir(tmp_path / 'deep')) == ['out']     # the staged copy is gone
    f = LocalStorage().stage_dir(str(tmp_path / 'other'))
    f.abort()
    assert sorted(os.listdir(tmp_path)) == ['deep']
