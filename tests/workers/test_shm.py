"""Batch slots: how they are made, mapped, counted against the budget, and given back.

The rules under test (loadr/workers/shm.py): the main process makes every
segment and gives each back in close(); a memfd's memory goes with the last
process or view that holds it, and a lent view outlives close(); workers map
by spec, checked by inode; the budget decides the slot count, and below one
slot per worker plus one the pool refuses before it makes anything; only
directories that loadr provably made are ever reclaimed.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from loadr.errors import ResourceError
from loadr.pids import me
from loadr.workers import shm
from loadr.workers.pool import WorkerPool
from loadr.workers.protocol import Done, Task
from loadr.workers.shm import (
    MARKER,
    READ_AHEAD_ROOM_BYTES,
    SHM_DIR,
    Layout,
    Segment,
    StatusCells,
    owned_dir,
    owner_of,
    plan_slots,
    reclaim_stale,
    remove_owned,
    shm_budget,
)

from ..faults.helpers import ROOT, children, memfds, wait_until_gone
from ..loader_helpers import trivial

pytestmark = pytest.mark.timeout(60)

needs_memfd = pytest.mark.skipif(not hasattr(os, 'memfd_create'), reason='no memfd_create')


def _mapped(name: str) -> bool:
    """Whether this process maps the memfd named ``name``."""
    with open('/proc/self/maps') as f:
        return any(f'/memfd:{name} ' in line or line.rstrip().endswith(f'/memfd:{name}')
                   or f'/memfd:{name} (deleted)' in line for line in f)


# -- memfd segments --------------------------------------------------------------------------

@needs_memfd
def test_a_memfd_segment_is_private_reserved_and_given_back_by_close():
    # Descriptors of loaders other tests left to the garbage collector are not ours.
    gc.collect()
    before = set(memfds())
    name = f'{os.getpid()}-test-slot'
    seg = Segment.create_memfd(name, 1 << 20)
    info = os.fstat(seg.fd)
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    assert info.st_size == 1 << 20 and info.st_blocks * 512 >= 1 << 20   # reserved up front
    assert seg.path == f'/proc/{os.getpid()}/fd/{seg.fd}' and seg.path in memfds()
    assert _mapped(f'loadr-{name}')
    seg.close()
    assert set(memfds()) <= before and not _mapped(f'loadr-{name}')
    seg.close()                                     # twice is fine


@needs_memfd
def test_a_view_lent_past_close_stays_valid_and_its_memory_goes_with_it():
    gc.collect()
    before = set(memfds())
    name = f'{os.getpid()}-test-lent'
    seg = Segment.create_memfd(name, 4096)
    view = np.frombuffer(seg.buf, dtype=np.uint8)
    view[:4] = [1, 2, 3, 4]
    seg.close()
    assert set(memfds()) <= before                 # no descriptor left behind...
    assert view[:4].tolist() == [1, 2, 3, 4]       # ...and the batch still reads
    assert _mapped(f'loadr-{name}')
    del view
    gc.collect()
    assert not _mapped(f'loadr-{name}')            # the last view took the mapping along


@needs_memfd
def test_a_worker_maps_a_memfd_by_its_spec_inherited_or_through_proc():
    seg = Segment.create_memfd(f'{os.getpid()}-test-spec', 4096)
    try:
        # fork: the inherited descriptor, same inode.
        pid = os.fork()
        if pid == 0:
            try:
                child = Segment.attach(seg.spec)
                child.buf[:3] = b'abc'
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert bytes(np.frombuffer(seg.buf, np.uint8)[:3]) == b'abc'
        # A new program (spawn): no descriptors inherited, /proc/<pid>/fd/<n> opened anew.
        code = ('import json, sys; from loadr.workers.shm import Segment; '
                'spec = json.loads(sys.argv[1]); spec["fd"] = None; '
                's = Segment.attach(spec); s.buf[3:6] = b"xyz"')
        subprocess.run([sys.executable, '-c', code, json.dumps(seg.spec)], check=True,
                       env={**os.environ, 'PYTHONPATH': str(ROOT)})
        assert bytes(np.frombuffer(seg.buf, np.uint8)[:6]) == b'abcxyz'
    finally:
        seg.close()


@needs_memfd
def test_a_spec_whose_segment_is_gone_is_file_not_found_even_if_its_fd_was_reused():
    seg = Segment.create_memfd(f'{os.getpid()}-test-gone', 4096)
    spec = seg.spec
    seg.close()
    with pytest.raises(FileNotFoundError):
        Segment.attach({**spec, 'fd': None})
    other = Segment.create_memfd(f'{os.getpid()}-test-other', 4096)   # likely the same fd
    try:
        with pytest.raises(FileNotFoundError):
            Segment.attach({**spec, 'fd': None})
    finally:
        other.close()


# -- /dev/shm segments -------------------------------------------------------------------------

def test_a_dev_shm_segment_lives_in_an_owned_directory_and_is_removed_with_it():
    home = owned_dir(SHM_DIR)
    try:
        assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
        seg = Segment.create(os.path.join(home, 'slot0'), 8192)
        info = os.stat(seg.path)
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_blocks * 512 >= 8192
        other = Segment.attach(seg.spec)
        other.buf[:2] = b'ok'
        assert seg.buf[:2] == b'ok'
        other.close()
        with pytest.raises(ResourceError):
            Segment.create(seg.path, 8192)          # O_EXCL: never someone else's file
        seg.close()
        seg.unlink()
        assert sorted(os.listdir(home)) == [MARKER]
    finally:
        remove_owned(home)
    assert not os.path.exists(home)


# -- the status segment --------------------------------------------------------------------

def test_the_status_cells_are_the_same_for_the_worker_and_the_pool():
    buf = bytearray(StatusCells.nbytes(3))
    pool_side, worker_side = StatusCells(buf, 3), StatusCells(buf, 3)
    rows = pool_side.progress_rows()
    rows[:] = -1
    worker_side.progress(1)[0], worker_side.progress(1)[1] = 40, 7
    worker_side.heartbeat(2)[0] += 5
    pool_side.cancelled()[0] = 99
    assert rows.tolist() == [[-1, -1], [40, 7], [-1, -1]]
    assert pool_side.heartbeats().tolist() == [0, 0, 5]
    assert worker_side.cancelled()[0] == 99
    pool_side.wants_rows()[:] = 3
    worker_side.wants(1)[0] = 6
    assert pool_side.wants_rows().tolist() == [3, 6, 3]
    assert pool_side.heartbeats().tolist() == [0, 0, 5] and rows[2].tolist() == [-1, -1]
    assert len(buf) == 3 * 16 + 8 + 3 * 8 + 3 * 8


# -- the budget ------------------------------------------------------------------------------

def test_the_budget_decides_the_slot_count_and_refuses_below_one_per_worker_plus_one():
    assert plan_slots(1000, wanted=6, workers=2, budget=(10**9, 'x')) == 6
    assert plan_slots(1000, wanted=6, workers=2, budget=(4500, 'x')) == 4
    # Past the needed slots, room to read ahead: as the budget and READ_AHEAD_ROOM_BYTES hold.
    room = READ_AHEAD_ROOM_BYTES
    assert plan_slots(1000, wanted=20, workers=2, budget=(10**9, 'x'), needed=5) == 20
    assert plan_slots(room // 2, wanted=20, workers=2, budget=(10**12, 'x'), needed=5) == 7
    assert plan_slots(room * 2, wanted=20, workers=2, budget=(10**12, 'x'), needed=5) == 5
    assert plan_slots(1000, wanted=20, workers=2, budget=(8500, 'x'), needed=5) == 8
    assert plan_slots(1000, wanted=6, workers=2, budget=(4500, 'x'), extra_bytes=600) == 3
    with pytest.raises(ResourceError) as info:
        plan_slots(3 * 2**20, wanted=6, workers=2, budget=(8 * 2**20, 'shm_bytes=8388608'))
    message = str(info.value)
    assert message.startswith('the batches need at least 9.0 MiB of shared memory')
    assert 'one batch slot of 3.0 MiB for each of the 2 workers, plus one' in message
    assert 'more than the budget of 8.0 MiB (shm_bytes=8388608)' in message


def test_the_budget_error_adds_up_with_the_status_cells_it_counts():
    # It said "need at least 393216 B, more than the budget of 393216 B": the status
    # segment was charged to the budget but left out of the need.
    with pytest.raises(ResourceError) as info:
        plan_slots(131072, wanted=6, workers=2, budget=(393216, 'shm_bytes=393216'),
                   extra_bytes=192)
    message = str(info.value)
    assert 'need at least 393408 B of shared memory' in message
    assert 'one batch slot of 131072 B for each of the 2 workers, plus one, and 192 B of ' \
        'worker status cells' in message
    assert 'more than the budget of 393216 B (shm_bytes=393216)' in message
    # Where MiB would round the need and the budget to one figure, both are in bytes.
    with pytest.raises(ResourceError) as info:
        plan_slots(3 * 2**20, wanted=6, workers=2, budget=(9 * 2**20, 'x'), extra_bytes=192)
    need, slot, cells, budget = (int(n) for n in re.findall(r'(\d+) B\b', str(info.value)))
    assert need == 3 * slot + cells > budget == 9 * 2**20

def test_the_budget_comes_from_the_argument_the_environment_or_the_memory_free(monkeypatch):
    monkeypatch.delenv('LOADR_SHM_BYTES', raising=False)
    assert shm_budget(12345) == (12345, 'shm_bytes=12345')
    # The budget against the figure its own message names: one reading of the memory
    # free (a second reading, MemAvailable read again, moves with everything else running).
    budget, how = shm_budget()
    assert 'of memory free' in how or how == 'no limit known'
    if how != 'no limit known':
        avail_mib = float(re.search(r'of the ([\d.]+) MiB of memory free', how)[1])
        assert abs(budget / 2**20 - avail_mib * shm.DEFAULT_SHM_FRACTION) <= 0.05
    monkeypatch.setenv('LOADR_SHM_BYTES', '4096')
    assert shm_budget() == (4096, 'LOADR_SHM_BYTES=4096')    # named as the user set it
    assert shm_budget(100) == (100, 'shm_bytes=100')            # the argument wins
    monkeypatch.setenv('LOADR_SHM_BYTES', 'lots')
    with pytest.raises(ResourceError, match='LOADR_SHM_BYTES'):
        shm_budget()
    monkeypatch.delenv('LOADR_SHM_BYTES')
    budget, how = shm_budget(2**62, memfd=False)                # files: no more than is free
    free_mib = float(re.search(r'/dev/shm has ([\d.]+) MiB free', how)[1])
    assert abs(budget / 2**20 - free_mib) <= 0.05


# -- a pool: slots made, used and all given back ------------------------------------------------

SPEC = {'label': (np.dtype('int64'), ()), 'vec': (np.dtype('float32'), (16,))}


@pytest.mark.parametrize('backend', ['memfd', 'devshm'])
def test_a_pool_makes_what_the_budget_holds_and_close_gives_everything_back(monkeypatch,
                                                                          backend):
    if backend == 'devshm':
        monkeypatch.setenv('LOADR_SHM', 'devshm')
    elif not hasattr(os, 'memfd_create'):
        pytest.skip('no memfd_create')
    layout = Layout(SPEC, 8)
    before_children = set(children())
    gc.collect()
    before = set(memfds())
    pool = WorkerPool(trivial(40), [], SPEC, layout, workers=2, slots=6, n=40, shuffle=False,
                      on_error='raise', start_method='fork',
                      shm_bytes=4 * layout.nbytes + StatusCells.nbytes(2))
    try:
        assert pool.slot_count == 4 and len(pool.views) == 4
        held = set(memfds()) - before if backend == 'memfd' else os.listdir(pool._shm_dir)
        assert len(held) == (5 if backend == 'memfd' else 6)   # 4 slots + status (+ marker)
        deadline, events = time.monotonic() + 20, []
        while not pool.can_submit():                # until a worker has said hello
            assert pool.poll(100) == [] and time.monotonic() < deadline
        assert pool.submit(Task(task_id=0, slot=3, row=0, seed=0, start=8, count=8))
        while not events and time.monotonic() < deadline:
            events = pool.poll(100)
        assert events == [Done(0, {}, [])]
        assert pool.views[3]['label'].tolist() == list(range(8, 16))
        pids, dirs = pool.pids, list(pool._held.dirs)
    finally:
        pool.close()
    wait_until_gone(pids)
    assert set(memfds()) <= before and set(children()) <= before_children
    assert not any(os.path.exists(d) for d in dirs)
    pool.close()


def test_a_pool_that_cannot_hold_one_slot_per_worker_plus_one_makes_nothing(monkeypatch):
    layout = Layout(SPEC, 8)
    tmp_before = set(os.listdir(tempfile.gettempdir()))
    with pytest.raises(ResourceError, match='for each of the 3 workers, plus one'):
        WorkerPool(trivial(40), [], SPEC, layout, workers=3, slots=8, n=40, shuffle=False,
                   on_error='raise', start_method='fork', shm_bytes=3 * layout.nbytes)
    # A budget of exactly one slot per worker plus one: the status cells do not fit,
    # and the message's need (which counts them) is more than its budget.
    with pytest.raises(ResourceError, match='of worker status cells') as info:
        WorkerPool(trivial(40), [], SPEC, layout, workers=2, slots=8, n=40, shuffle=False,
                   on_error='raise', start_method='fork', shm_bytes=3 * layout.nbytes)
    need, budget = (int(n) for n in re.search(r'need at least (\d+) B.*budget of (\d+) B',
                                              str(info.value)).groups())
    assert need == 3 * layout.nbytes + StatusCells.nbytes(2) and budget == 3 * layout.nbytes
    assert memfds() == []
    assert not {n for n in set(os.listdir(tempfile.gettempdir())) - tmp_before
                if n.startswith(f'loadr-{os.getpid()}-')}


# -- owned directories: what may be reclaimed ---------------------------------------------------

def _forge(path: str, **changes) -> None:
    with open(os.path.join(path, MARKER)) as f:
        record = json.load(f)
    os.unlink(os.path.join(path, MARKER))
    with open(os.path.join(path, MARKER), 'w') as f:
        json.dump({**record, **changes}, f)


def test_an_owned_directory_is_proven_by_its_name_type_owner_and_marker(tmp_path):
    home = owned_dir(str(tmp_path))
    record = owner_of(home)
    assert record is not None and {k: record[k] for k in me()} == me()
    assert stat.S_IMODE(os.stat(os.path.join(home, MARKER)).st_mode) == 0o600
    name = os.path.basename(home)
    link = tmp_path / (name[:-1] + ('1' if name.endswith('0') else '0'))
    os.symlink(home, link)                          # a link with a name of ours
    assert owner_of(str(link)) is None
    lookalike = tmp_path / 'loadr-2024-results'
    lookalike.mkdir()
    assert owner_of(str(lookalike)) is None
    _forge(home, token='0' * 32)                    # a marker for another name
    assert owner_of(home) is None
    _forge(home, token=os.path.basename(home).rsplit('-', 1)[1], pid=1)
    assert owner_of(home) is None                   # pid of the name and of the marker differ
    _forge(home, pid=os.getpid())
    assert owner_of(home) is not None
    os.unlink(os.path.join(home, MARKER))
    os.symlink('/etc/hostname', os.path.join(home, MARKER))
    assert owner_of(home) is None                   # a marker that is a link


@pytest.mark.skipif(os.geteuid() != 0, reason='needs root to give a directory away')
def test_a_directory_of_another_user_is_never_ours(tmp_path):
    home = owned_dir(str(tmp_path))
    os.chown(home, 65534, 65534)
    assert owner_of(home) is None


def test_reclaim_takes_the_dead_and_the_other_boot_and_leaves_the_living(tmp_path):
    alive, reused, other_boot, other_ns = (owned_dir(str(tmp_path)) for _ in range(4))
    _forge(reused, start=me()['start'] + 1)         # our pid, another start: pid reused
    _forge(other_boot, boot='an earlier boot')
    _forge(other_ns, pidns='pid:[1]', start=1)      # another namespace: cannot judge
    removed = reclaim_stale((str(tmp_path),))
    assert sorted(removed) == sorted([reused, other_boot])
    assert os.path.isdir(alive) and os.path.isdir(other_ns)
    shutil.rmtree(alive)
    shutil.rmtree(other_ns)
