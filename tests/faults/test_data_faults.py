"""Faults that come with the data: I/O errors (transient or not), a damaged sample, a bad fn.

The retry policy under test is ``loadr.assemble.READ_RETRY_DELAYS_S``: an
``OSError`` whose errno is transient (EIO, EAGAIN, EINTR, ETIMEDOUT, ESTALE;
also as the ``__cause__`` of a ReadError) is retried after each delay, then
raised with the index; any other error is raised at once.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time

import numpy as np
import pytest

import loadr
from loadr.assemble import READ_RETRY_DELAYS_S
from loadr.errors import ChecksumError, LoadrError, ReadError, WorkerError

from ..loader_helpers import batch_digest, stream_digests, trivial

pytestmark = pytest.mark.timeout(60)

ATTEMPTS_WHEN_ALWAYS_FAILING = 1 + len(READ_RETRY_DELAYS_S)


class FailingReader:
    """trivial() data where reading ``bad`` fails ``times`` times with ``errno_``.

    Attempts are counted with files, so the count holds across worker processes.
    """

    def __init__(self, directory, bad: int, times: float, errno_: int, wrap: bool = False):
        self.data, self.directory = trivial(40), str(directory)
        self.bad, self.times, self.errno, self.wrap = bad, times, errno_, wrap

    def __len__(self):
        return len(self.data)

    def attempts(self) -> int:
        return len(os.listdir(self.directory))

    def __getitem__(self, i):
        if i == self.bad:
            attempt = self.attempts() + 1
            open(os.path.join(self.directory, f'attempt-{attempt}'), 'w').close()
            if attempt <= self.times:
                exc = OSError(self.errno, os.strerror(self.errno))
                if self.wrap:       # what loadr's readers raise: a ReadError from the OSError
                    raise ReadError('cannot read', '/data/x.bag', i) from exc
                raise exc
        return self.data[i]


class BatchFailingReader(FailingReader):
    """The same behind a batch read, as loadr's own readers have."""

    def read_batch(self, indices):
        return [self[i] for i in indices]


@pytest.mark.parametrize('workers', [0, 2])
@pytest.mark.parametrize('cls', [FailingReader, BatchFailingReader])
@pytest.mark.parametrize('wrap', [False, True])
def test_a_transient_eio_is_retried_and_the_stream_is_unchanged(tmp_path, workers, cls, wrap,
                                                                caplog):
    with loadr.Loader(trivial(40), batch=8, seed=2, shuffle=False, workers=0) as ref:
        expected = stream_digests(ref, 5)
    reader = cls(tmp_path, bad=13, times=1, errno_=errno.EIO, wrap=wrap)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(reader, batch=8, seed=2, shuffle=False, workers=workers) as loader:
            assert stream_digests(loader, 5) == expected
    # One failed attempt, then a read that worked: a retry, or for a failed batch read
    # the one-by-one read that follows it. (Workers prefetch past the 5 batches asked
    # for, into the next epoch, which reads index 13 once more.)
    assert reader.attempts() == 2 if workers == 0 else reader.attempts() >= 2
    if workers == 0 and cls is FailingReader:     # logged where the retry ran
        assert any('transient read error at index 13' in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize('workers', [0, 2])
def test_an_eio_that_persists_is_raised_with_the_index_after_the_retries(tmp_path, workers):
    reader = FailingReader(tmp_path, bad=13, times=float('inf'), errno_=errno.EIO)
    with loadr.Loader(reader, batch=8, seed=2, shuffle=False, workers=workers) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(OSError) as info:
            next(it)
    assert info.value.errno == errno.EIO
    assert reader.attempts() == ATTEMPTS_WHEN_ALWAYS_FAILING
    cause = info.value.__cause__
    assert isinstance(cause, WorkerError) and cause.index == 13 and cause.position == 13
    assert 'dataset index 13' in str(cause) and 'Input/output error' in str(cause)


@pytest.mark.parametrize('errno_', [errno.EACCES, errno.ENOENT])
def test_an_error_that_is_not_transient_is_not_retried(tmp_path, errno_):
    reader = FailingReader(tmp_path, bad=3, times=float('inf'), errno_=errno_, wrap=True)
    with loadr.Loader(reader, batch=8, seed=2, shuffle=False, workers=0) as loader:
        with pytest.raises(ReadError) as info:
            next(iter(loader))
    assert reader.attempts() == 1
    assert (info.value.path, info.value.index) == ('/data/x.bag', 3)


def _damaged_ffrecord(fixtures, tmp_path, manifest, bad: int):
    path = tmp_path / 'single.ffr'
    shutil.copy(fixtures / 'ffrecord' / 'single.ffr', path)
    os.chmod(path, 0o644)
    sample = manifest['datasets']['ffrecord_single']['samples'][bad]
    with open(path, 'r+b') as f:
        f.seek(sample['offset'] + sample['length'] // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))
    return path


def _label(dp, seed):
    return {'label': np.int64(dp['label']), 'size': np.int64(len(dp['image']))}


@pytest.mark.parametrize('workers', [0, 2])
def test_a_damaged_sample_raises_its_checksum_error_naming_file_and_index(fixtures, manifest,
                                                                          tmp_path, workers):
    path = _damaged_ffrecord(fixtures, tmp_path, manifest, bad=7)
    reader = loadr.open(path, decode='msgpack')
    with loadr.Loader(reader, batch=5, fns=[_label], shuffle=False, workers=workers) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(ChecksumError) as info:
            next(it)
    assert (info.value.path, info.value.index) == (str(path), 7)
    assert isinstance(info.value.__cause__, WorkerError) and info.value.__cause__.position == 7


def test_skip_replaces_a_damaged_sample_the_same_way_for_any_worker_count(fixtures, manifest,
                                                                          tmp_path, caplog):
    path = _damaged_ffrecord(fixtures, tmp_path, manifest, bad=7)
    reader = loadr.open(path, decode='msgpack')
    clean = loadr.open(fixtures / 'ffrecord' / 'single.ffr', decode='msgpack')
    runs, logged = [], []
    for workers in (0, 2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger='loadr'):
            with loadr.Loader(reader, batch=5, fns=[_label], seed=6, workers=workers,
                              on_error='skip', max_error_fraction=0.2) as loader:
                batches = [next(it) for it in [iter(loader)] for _ in range(12)]   # 3 epochs
                assert (loader.errors, loader.samples) == (3, 60)
        runs.append([batch_digest(b) for b in batches])
        logged.append([r.getMessage() for r in caplog.records
                       if 'failed and was replaced' in r.getMessage()])
    assert runs[0] == runs[1]
    # Each replacement logged in the main process, naming the index, once per occurrence.
    # ... with its position and the reason, for every worker count alike.
    assert logged[0] == logged[1]
    assert [m.split(': position')[0] for m in logged[1]] == \
        ['loadr: datapoint 7 failed and was replaced (on_error=skip)'] * 3
    assert all('ChecksumError' in m for m in logged[1])
    # The stand-in is the documented, deterministic one: the first readable alternative.
    alt = (7 + 0x9E3779B1) % 20
    labels = np.concatenate([b['label'] for b in batches])
    sizes = np.concatenate([b['size'] for b in batches])
    order = loadr.Loader(reader, batch=5, seed=6, workers=0)._order()
    positions = [p for p in range(60) if order.index_at(p) == 7]
    assert len(positions) == 3
    for p in positions:
        assert labels[p] == clean[alt]['label'] and sizes[p] == len(clean[alt]['image'])
    # Past the fraction it stops, naming the last failed index.
    with loadr.Loader(reader, batch=5, fns=[_label], seed=6, workers=2, on_error='skip',
                      max_error_fraction=0.01) as loader:
        with pytest.raises(LoadrError, match='max_error_fraction') as info:
            stream_digests(loader, 40)
        assert info.value.index == 7


@pytest.mark.parametrize('workers', [0, 2])
def test_an_exception_in_a_fn_leaves_the_workers_and_the_loader_usable(workers):
    data = trivial(40)

    def picky(dp, seed):
        if dp['label'] == 21:
            raise ZeroDivisionError('fn failed on purpose')
        return dp

    with loadr.Loader(data, batch=8, fns=[picky], shuffle=False, workers=workers) as loader:
        it = iter(loader)
        next(it)
        pids = loader.worker_pids
        with pytest.raises(ZeroDivisionError) as info:
            for _ in range(3):
                next(it)
        assert info.value.__cause__.index == 21
        assert loader.worker_pids == pids            # an exception is not a crash
        loader.load({'step': 24, 'seed': 0})
        assert next(iter(loader))['label'].tolist() == list(range(24, 32))


def test_an_error_is_raised_at_its_own_batch_never_before_earlier_ones():
    # Batch 1 fails at once while batch 0 is still being made: the failure must wait
    # for its turn, so batch 0 is handed out and the error comes with batch 1 (it used
    # to preempt batch 0 whenever its reply arrived first: a timing-dependent stream).
    def uneven(dp, seed):
        if dp['label'] < 5:
            time.sleep(0.05)
        if dp['label'] == 6:
            raise ValueError('sample 6 is bad')
        return dp

    for _ in range(3):
        with loadr.Loader(trivial(20), batch=5, fns=[uneven], shuffle=False,
                          workers=2) as loader:
            it = iter(loader)
            assert next(it)['label'].tolist() == [0, 1, 2, 3, 4]
            with pytest.raises(ValueError, match='sample 6 is bad'):
                next(it)
            assert loader.save()['step'] == 5


class KwOnlyError(Exception):
    """Does not survive a pickle round trip: unpickling calls KwOnlyError('code 3')."""

    def __init__(self, *, code):
        super().__init__(f'code {code}')
        self.code = code


class LockedError(ValueError):
    """Cannot be pickled at all: it holds a lock."""

    def __init__(self, message, path):
        super().__init__(message)
        self.path, self.lock = path, threading.Lock()


def _raise_at_17(kind):
    def fn(dp, seed):
        if dp['label'] == 17:
            raise KwOnlyError(code=3) if kind == 'kw' else LockedError('no luck', '/x.bag')
        return dp
    return fn


@pytest.mark.parametrize('kind,cls', [('kw', KwOnlyError), ('locked', LockedError)])
@pytest.mark.parametrize('workers', [0, 2])
def test_an_exception_that_does_not_pickle_is_raised_as_its_own_type(workers, kind, cls):
    # except MyError: must catch the same thing for every worker count (it used to be a
    # bare WorkerError with workers > 0, without loadr_index).
    with loadr.Loader(trivial(40), batch=8, fns=[_raise_at_17(kind)], shuffle=False,
                      workers=workers) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(cls) as info:
            for _ in range(3):
                next(it)
    err = info.value
    assert err.loadr_index == 17 and err.loadr_position == 17
    assert str(err) == ('code 3' if kind == 'kw' else 'no luck')
    if kind == 'kw':
        assert err.code == 3
    else:
        assert err.path == '/x.bag'
    cause = err.__cause__
    assert isinstance(cause, WorkerError) and cause.index == 17
