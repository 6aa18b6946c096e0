"""A dataset replaced on disk under an open reader: the same error in the main process and in
every worker, never old data in one and new data in the other."""

from __future__ import annotations

import os
import pickle
import shutil
import time

import multiprocess
import numpy as np
import pytest

import loadr
from loadr import storage
from loadr.errors import FormatError
from loadr.storage import local
from loadr.writers import BagWriter, FFRecordWriter, GulpWriter

CHANGED = 'changed since the reader was made'


class Clock:
    """Stands in for the ``time`` module of the local storage, whose ``monotonic()`` says
    when to look at open files again: time there moves only when the test moves it (as
    under trio.testing.MockClock), so the recheck interval passes without a wait."""

    def __init__(self):
        self.now = time.monotonic()         # where the real one was: a deadline set before holds

    def monotonic(self) -> float:
        return self.now


def write(kind: str, path, value: int) -> None:
    frame = np.full((8, 8, 3), value, np.uint8)
    if kind == 'bag':
        with BagWriter(path, {'x': 'int', 'name': 'utf8'}) as w:
            for i in range(6):
                w.append({'x': value + i, 'name': f'v{value}'})
    elif kind == 'gulp':
        with GulpWriter(path, videos_per_chunk=3) as w:
            for i in range(6):
                w.append({'id': f'{value}-{i}', 'meta': {'v': value}, 'frames': [frame]})
    else:
        with FFRecordWriter(path, 6) as w:
            for i in range(6):
                w.append({'x': value + i})


def replace(kind: str, path, value: int) -> None:
    """Write a new version beside, then put it in place of the old (as a re-run would)."""
    new = f'{path}.new'
    write(kind, new, value)
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    os.rename(new, path)


def _read_in_child(blob: bytes, index: int) -> str:
    reader = pickle.loads(blob)
    try:
        return repr(reader[index])
    except FormatError as exc:
        return f'FormatError: {exc}'


@pytest.mark.parametrize('kind', ['bag', 'gulp', 'ffrecord'])
def test_a_replaced_dataset_is_an_error_in_the_main_process_and_in_workers(tmp_path, kind,
                                                                         monkeypatch):
    clock = Clock()
    monkeypatch.setattr(local, 'time', clock)
    path = tmp_path / ('data.ffr' if kind == 'ffrecord' else 'data')
    write(kind, path, 10)
    options = {'decode': 'msgpack'} if kind == 'ffrecord' else {}
    reader = loadr.open(path, **options)
    first = reader[0]
    blob = pickle.dumps(reader)                  # what a worker gets
    replace(kind, path, 50)
    # Workers (spawned or forked) open the files anew: they see the replacement at once.
    for method in ('spawn', 'fork'):
        with multiprocess.get_context(method).Pool(1) as pool:
            got = pool.apply(_read_in_child, (blob, 1))
        assert got.startswith('FormatError') and CHANGED in got, (method, got)
    # The main process holds the old files open, and looks again once the interval is over.
    clock.now += storage.RECHECK_INTERVAL_S + 0.001
    with pytest.raises(FormatError, match=CHANGED) as err:
        reader[1]
    assert err.value.path.startswith(str(path))
    # A reader made now reads the new version, everywhere.
    fresh = loadr.open(path, **options)
    assert repr(fresh[0]) != repr(first)
    assert _read_in_child(pickle.dumps(fresh), 0) == repr(fresh[0])
