"""A dataset that opened its file before the workers were forked.

Every forked worker shares such a file (one file offset): their seek + read
pairs interleave and return another record's bytes. The pool says so when it
starts the workers, and every error of a worker carries a note naming the
file; a dataset that opens its file once per process gets neither.
"""

from __future__ import annotations

import logging
import os
import struct
import tarfile

import pytest

import loadr
from loadr.workers.inherited import open_files

pytestmark = pytest.mark.timeout(60)

RECORD = struct.Struct('<II')       # (index, index ^ MAGIC): a record that checks itself
MAGIC = 0x5A5A5A5A


def write_records(path, n: int) -> None:
    with open(path, 'wb') as f:
        for i in range(n):
            f.write(RECORD.pack(i, i ^ MAGIC))


def check(raw: bytes, i: int, path) -> dict:
    index, check_word = RECORD.unpack(raw)
    if index != i or check_word != i ^ MAGIC:
        raise ValueError(f'{path}: record {i} is damaged (read {raw.hex()})')
    return {'x': index}


class OpenedInInit:
    """The natural wrapper: the file opened once, in __init__ (before any fork)."""

    def __init__(self, path, n: int, bad: int | None = None):
        self.path, self.n, self.bad = path, n, bad
        self.f = open(path, 'rb')

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f'{self.path}: record {i} is damaged')
        self.f.seek(i * RECORD.size)
        return check(self.f.read(RECORD.size), i, self.path)


class OpenedPerProcess(OpenedInInit):
    """README's way: the file opened on the first read of each process."""

    def __init__(self, path, n: int, bad: int | None = None):
        self.path, self.n, self.bad = path, n, bad
        self._file, self._pid = None, None

    @property
    def f(self):
        if self._pid != os.getpid():
            self._file, self._pid = open(self.path, 'rb'), os.getpid()
        return self._file


def test_open_files_finds_a_file_held_by_the_dataset_and_nothing_in_loadr_readers(tmp_path,
                                                                                 local_data):
    path = tmp_path / 'records.bin'
    write_records(path, 4)
    dataset = OpenedInInit(path, 4)
    assert open_files(dataset) == [f'dataset.f ({path})']
    assert open_files({'train': [dataset]}) == [f"dataset['train'][0].f ({path})"]
    dataset.f.close()
    assert open_files(dataset) == []
    lazy = OpenedPerProcess(path, 4)
    lazy[0]                                       # opened here, with the pid it was opened in
    assert open_files(lazy) == []
    with tarfile.open(tmp_path / 'shard.tar', 'w') as tar:     # the WebDataset wrapper's way
        tar.add(path, 'records.bin')
    holder = type('Shard', (), {})()
    holder.tar = tarfile.open(tmp_path / 'shard.tar')
    assert open_files(holder) == [f"dataset.tar.fileobj ({tmp_path / 'shard.tar'})"]
    holder.pid = os.getpid()                      # it says whose file it is: believed
    assert open_files(holder) == []
    holder.tar.close()
    for name in ('bag', 'gulp', 'ffrecord/multi'):
        reader = loadr.open(local_data / name)
        reader[0]                                 # its files opened in this process
        assert open_files(reader) == [], name     # loadr's storage reopens them after a fork


def test_workers_over_a_file_opened_before_the_fork_are_warned_and_their_errors_say_why(
        tmp_path, caplog):
    path = tmp_path / 'records.bin'
    write_records(path, 64)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(OpenedInInit(path, 64, bad=40), batch=4, workers=2,
                          start_method='fork') as loader:
            with pytest.raises(ValueError, match='damaged') as info:
                for _ in loader:
                    pass
    warned = [r.getMessage() for r in caplog.records if 'opened before the workers' in
              r.getMessage()]
    assert len(warned) == 1 and f'dataset.f ({path})' in warned[0], warned
    notes = getattr(info.value, '__notes__', [])
    assert any('opened before the workers started' in n and str(path) in n and
               'Your own data' in n for n in notes), notes


def test_a_dataset_that_opens_its_file_once_per_process_gets_no_warning(tmp_path, caplog):
    path = tmp_path / 'records.bin'
    write_records(path, 64)
    dataset = OpenedPerProcess(path, 64, bad=40)
    assert dataset[3] == {'x': 3}                 # read once here: a file of this process
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(dataset, batch=4, workers=2, start_method='fork') as loader:
            with pytest.raises(ValueError, match='damaged') as info:
                for _ in loader:
                    pass
    assert not [r for r in caplog.records if 'opened before the workers' in r.getMessage()]
    assert not getattr(info.value, '__notes__', [])
