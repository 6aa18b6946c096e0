"""Writers SIGKILLed mid-write and mid-close: nothing opens as a complete dataset;
a re-run completes it.

The writer runs in a forked child that reports each item it wrote through a
pipe; the test SIGKILLs it at a chosen item or right as ``close()`` starts.
No cleanup code of the writer runs (that is what SIGKILL means).
"""

from __future__ import annotations

import io
import os
import select
import signal
import time

import numpy as np
import pytest
from PIL import Image

import loadr
from loadr.errors import LoadrError
from loadr.storage import staging
from loadr.writers import BagWriter, FFRecordWriter, GulpWriter

pytestmark = pytest.mark.timeout(60)

ITEMS = 60
KINDS = ['ffrecord', 'bag', 'gulp']


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(buf, format='JPEG')
    return buf.getvalue()


def target(tmp_path, kind: str):
    return tmp_path / ('out.ffr' if kind == 'ffrecord' else 'out')


def write_dataset(kind: str, path, report) -> None:
    """Write ITEMS items of ``kind`` to ``path``, calling ``report(event)`` as it goes."""
    if kind == 'ffrecord':
        writer = FFRecordWriter(path, ITEMS)

        def add(i):
            writer.write_one(b'sample %06d ' % i * 50)
    elif kind == 'bag':
        writer = BagWriter(path, {'name': 'utf8', 'v': 'array', 'x': 'int'}, shardlen=25)

        def add(i):
            writer.append({'x': i, 'name': f'n{i}', 'v': np.full(4, i, np.int32)})
    else:
        writer = GulpWriter(path, videos_per_chunk=10)

        def add(i):
            writer.append(f'v{i}', {'i': i}, [_jpeg(i), _jpeg(i + 1)])
    for i in range(ITEMS):
        add(i)
        report(f'{i}')
        time.sleep(0.0005)
    report('closing')
    writer.close()
    report('done')


def run_writer(kind: str, path, kill_at: str | None) -> bool:
    """Fork a child that writes; SIGKILL it once it reports ``kill_at``. True if it finished."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child: write, never return
        code = 1
        try:
            os.close(r)
            write_dataset(kind, path, lambda event: os.write(w, event.encode() + b'\n'))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    events, buf = [], b''
    deadline = time.monotonic() + 30
    try:
        while kill_at not in events and time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], 1.0)
            if ready:
                chunk = os.read(r, 4096)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b'\n')
                events += [line.decode() for line in lines]
        if kill_at is not None:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if kill_at is None:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, events[-3:]
        return True
    if kill_at == 'closing' and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return True                                    # close() won the race to the kill
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return False


def complete(kind: str, path) -> None:
    """Open ``path`` and check every item is there, as written."""
    if kind == 'ffrecord':
        r = loadr.open(path)
        assert [r[i]['data'] for i in range(len(r))] == [b'sample %06d ' % i * 50
                                                         for i in range(ITEMS)]
    elif kind == 'bag':
        r = loadr.open(path)
        assert r.shards == 3 and len(r) == ITEMS
        for i in (0, 24, 25, ITEMS - 1):
            dp = r[i]
            assert (dp['x'], dp['name'], dp['v'].tolist()) == (i, f'n{i}', [i] * 4)
    else:
        r = loadr.open(path, decode_images=False)
        assert r.ids == [f'v{i}' for i in range(ITEMS)]
        assert r[ITEMS - 1]['frames'] == [_jpeg(ITEMS - 1), _jpeg(ITEMS)]
        assert r[ITEMS - 1]['meta'] == {'i': ITEMS - 1}


def nothing_opens(kind: str, tmp_path, while_closing: bool = False) -> None:
    """The target is absent, its directory does not open, and every leftover is hidden
    and does not open either; killed inside close(), a leftover may hold it all, whole."""
    out = target(tmp_path, kind)
    assert not os.path.lexists(out)
    with pytest.raises(LoadrError):
        loadr.open(out)
    with pytest.raises(LoadrError):
        loadr.open(tmp_path)
    for leftover in tmp_path.iterdir():
        assert leftover.name.startswith('.'), leftover
        try:
            loadr.open(leftover)
        except LoadrError:
            continue
        if not while_closing:
            raise AssertionError(f'{leftover} opens as a dataset after a kill mid-write')
        complete(kind, leftover)


@pytest.mark.parametrize('kind', KINDS)
def test_a_killed_writer_leaves_nothing_that_opens_and_a_rerun_completes(tmp_path, kind):
    for kill_at in (str(ITEMS // 3), str(2 * ITEMS // 3)):
        assert not run_writer(kind, target(tmp_path, kind), kill_at)
        nothing_opens(kind, tmp_path)
    # Killed the moment close() starts: either nothing, or all of it (the rename is atomic).
    run_writer(kind, target(tmp_path, kind), 'closing')
    if os.path.lexists(target(tmp_path, kind)):
        complete(kind, target(tmp_path, kind))
        os.rename(target(tmp_path, kind), tmp_path / '.finished-before-the-kill')
    else:
        nothing_opens(kind, tmp_path, while_closing=True)
    # The same command again, with the leftovers of three killed runs beside it:
    # it completes, and clears them away.
    assert run_writer(kind, target(tmp_path, kind), None)
    complete(kind, target(tmp_path, kind))
    assert [p.name for p in tmp_path.iterdir() if staging.MARK in p.name] == []
