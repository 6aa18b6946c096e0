"""The main process interrupted or killed, stale segments, a /dev/shm too small.

Each loader here runs in a real subprocess in its own process group, and the
test does to it what a terminal, an OOM killer or a scheduler would.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import loadr
from loadr.errors import ResourceError
from loadr.loader import LEASED_SLOTS
from loadr.pids import running
from loadr.workers.shm import MARKER, SHM_DIR, free_bytes, owned_dir, owner_of, reclaim_stale

from ..loader_helpers import noisy, slowed, stream_digests, trivial
from .helpers import (
    ROOT,
    STARTED,
    children,
    finish,
    read_json_line,
    segments,
    start_script,
    tracebacks,
    wait_until_gone,
)

pytestmark = pytest.mark.timeout(60)

# A training loop: prints who it is, then iterates until something stops it.
LOOP = '''
    import json, os, sys, time
    import loadr
    from tests.loader_helpers import batch_digest, slowed, trivial

    slow = slowed(0.001)
    method = sys.argv[2] if len(sys.argv) > 2 else None
    loader = loadr.Loader(trivial(300), batch=8, fns=[slow], seed=1, workers=2,
                          start_method=method)
    it = iter(loader)
    digests = [batch_digest(next(it)) for _ in range(3)]
    try:
        print(json.dumps({'pid': os.getpid(), 'workers': loader.worker_pids,
                          'dir': loader._pool._dir}), flush=True)
        while True:
            digests.append(batch_digest(next(it)))
    except KeyboardInterrupt:
        if sys.argv[1] == 'raise':
            raise
        # What a training script does on Ctrl-C: save where it was, then leave.
        print(json.dumps({'state': loader.save(), 'digests': digests}), flush=True)
        loader.close()
'''


def slow(dp, seed):
    return noisy(dp, seed)


@pytest.mark.parametrize('mode', ['catch', 'raise'])
def test_ctrl_c_during_iteration_exits_cleanly(mode):
    proc = start_script(LOOP, mode)
    info = read_json_line(proc)
    assert segments(info['pid']) and os.path.isdir(info['dir'])
    os.killpg(proc.pid, signal.SIGINT)          # Ctrl-C: the terminal signals the whole group
    out, err = finish(proc)
    if mode == 'catch':
        assert proc.returncode == 0, err
        assert tracebacks(err) == 0, err         # the workers ignore SIGINT: not a word
        saved = json.loads(out)
        state, digests = saved['state'], saved['digests']
        assert state['step'] == 8 * len(digests)
        with loadr.Loader(trivial(300), batch=8, fns=[slow], seed=1, workers=0) as ref:
            expected = stream_digests(ref, len(digests) + 5)
        assert digests == expected[:len(digests)]
        # Resumed as a user would: the same pipeline (a state belongs to its loader).
        with loadr.Loader(trivial(300), batch=8, fns=[slowed(0.001)], seed=1,
                          workers=0) as resumed:
            resumed.load(state)
            assert stream_digests(resumed, 5) == expected[len(digests):]
    else:
        assert proc.returncode == -signal.SIGINT, err
        assert tracebacks(err) == 1 and err.rstrip().endswith('KeyboardInterrupt'), err
    wait_until_gone(info['workers'])
    assert segments(info['pid']) == []
    assert not os.path.exists(info['dir'])


# Segments are memfds by default (they go with the last process that holds them);
# LOADR_SHM=devshm makes them files in /dev/shm, which somebody must remove.
BACKENDS = {'memfd': {}, 'devshm': {'LOADR_SHM': 'devshm'}}


@pytest.mark.parametrize('method,backend', [('fork', 'memfd'), ('fork', 'devshm'),
                                            ('forkserver', 'memfd')])
def test_sigkill_of_the_main_process_ends_its_workers_and_their_memory(method, backend):
    # With forkserver the workers' parent is the fork server, not the main process.
    proc = start_script(LOOP, 'raise', method, env=BACKENDS[backend])
    info = read_json_line(proc)
    # 4 slots (prefetch 2 * 2 workers), 2 to lend batches the caller holds, the status
    assert len(segments(info['pid'])) == 4 + LEASED_SLOTS + 1
    os.kill(info['pid'], signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    # Their watchdogs end them (a hang would be a failure here, slowness is not).
    wait_until_gone(info['workers'])
    assert segments(info['pid']) == []           # unlinked by the workers' watchdogs
    assert not os.path.exists(info['dir'])


# Ctrl-C twice: the second lands anywhere in the shutdown the first one started.
TWICE = '''
    import json, os
    import loadr
    from tests.loader_helpers import trivial

    with loadr.Loader(trivial(300), batch=8, seed=1, workers=2) as loader:
        it = iter(loader)
        next(it)
        print(json.dumps({'pid': os.getpid(), 'workers': loader.worker_pids,
                          'dirs': loader._pool._held.dirs}), flush=True)
        while True:
            next(it)
'''


@pytest.mark.parametrize('backend', ['memfd', 'devshm'])
def test_a_double_ctrl_c_leaks_no_shared_memory_and_no_directory(backend):
    # It used to leak about one run in two: a second KeyboardInterrupt inside close(),
    # after the workers had gone and before the segments were unlinked.
    rng = random.Random(8)
    for _ in range(6):
        proc = start_script(TWICE, env=BACKENDS[backend])
        info = read_json_line(proc)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(rng.uniform(0, 0.03))
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        _, err = finish(proc)
        # (A second Ctrl-C that lands while the interpreter shuts down is reported by
        # Python itself, after the traceback, so the text need not end with it.)
        assert proc.returncode == -signal.SIGINT and 'KeyboardInterrupt' in err, err
        wait_until_gone(info['workers'])
        left = [path for path in info['dirs'] if os.path.exists(path)]
        assert left == [], err


def test_forkserver_workers_start_and_give_the_same_batches():
    # The workers' parent check compared os.getppid() with the main process: under
    # forkserver it is the fork server's pid, and no worker ever started.
    data = trivial(200)
    with loadr.Loader(data, batch=8, fns=[noisy], seed=4, workers=0) as ref:
        expected = stream_digests(ref, 30)
    with loadr.Loader(data, batch=8, fns=[noisy], seed=4, workers=2,
                      start_method='forkserver') as loader:
        assert stream_digests(loader, 30) == expected
        assert loader._pool.restarts == 0 and len(loader.worker_pids) == 2


@pytest.mark.parametrize('backend', ['memfd', 'devshm'])
def test_segments_of_a_dead_owner_are_reclaimed_by_the_next_loader(backend):
    # The whole group SIGKILLed at once (an OOM kill of the job): nobody unlinks.
    proc = start_script(LOOP, 'raise', env=BACKENDS[backend])
    info = read_json_line(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    finish(proc)
    wait_until_gone([info['pid'], *info['workers']])
    left = segments(info['pid'])
    if backend == 'memfd':
        assert left == [] and os.path.isdir(info['dir'])    # the kernel took the memory
    else:
        assert len(left) == 4 + LEASED_SLOTS + 1 and os.path.isdir(info['dir'])
    # A segment of a live owner (pid 1 always runs) must survive the reclaim.
    alive_name = 'loadr-1-0badc0de-slot0'
    alive_path = os.path.join(SHM_DIR, alive_name)
    with open(alive_path, 'wb') as f:
        f.write(b'x')
    try:
        with loadr.Loader(trivial(20), batch=4, workers=1) as loader:
            next(iter(loader))
            assert segments(info['pid']) == []
            assert not os.path.exists(info['dir'])     # its socket directory too
            assert os.path.exists(alive_path)
    finally:
        os.unlink(alive_path)


def test_dev_shm_too_small_is_a_clear_error_before_the_first_batch():
    free = free_bytes()
    row = free // 2 + 1                           # two rows already do not fit
    before = set(os.listdir(SHM_DIR))
    workers_before = set(children())
    loader = loadr.Loader([{'x': 0}] * 10, batch=2, workers=2, prefetch=1,
                          spec={'x': ('uint8', (row,))})
    try:
        with pytest.raises(ResourceError) as info:
            next(iter(loader))
        need = 2 * row                            # one slot of two rows (+ alignment)
        message = str(info.value)
        assert 'shared memory' in message and 'free' in message
        need_mib = float(message.split(' MiB')[0].split()[-1])
        assert need_mib >= need / 2 ** 20 - 0.1
        assert loader.worker_pids == []
        assert set(children()) == workers_before  # no worker was started
        assert set(os.listdir(SHM_DIR)) - before == set()
    finally:
        loader.close()



# -- what a loader may reclaim: only what loadr provably made, of owners provably gone ----

def _user_things():
    """Things users make that look like loadr's old names; none may be touched."""
    tmp = tempfile.gettempdir()
    dead = 4_000_000 + os.getpid()               # above any pid_max: no such process
    made = []
    for parent, name in ((tmp, 'loadr-2024-results'), (tmp, f'loadr-{dead}-runs'),
                         (SHM_DIR, 'loadr-1-abc-x'), (SHM_DIR, f'loadr-{dead}-0badc0de-slot0'),
                         (tmp, f'loadr-{dead}-' + 'ab' * 16),       # our name, no marker
                         (SHM_DIR, f'loadr-{dead}-' + 'cd' * 16)):  # our name, a forged marker
        path = os.path.join(parent, name)
        if name.endswith('-x') or name.endswith('slot0'):
            with open(path, 'w') as f:
                f.write('precious')
        else:
            os.mkdir(path)
            with open(os.path.join(path, 'results.csv'), 'w') as f:
                f.write('precious')
        made.append(path)
    # A marker whose token is not the name's: not provably ours.
    with open(os.path.join(made[-1], MARKER), 'w') as f:
        json.dump({'loadr': 1, 'token': 'ef' * 16, 'pid': dead, 'boot': 'x', 'pidns': 'y',
                   'start': 1}, f)
    return made


def test_a_loader_leaves_what_users_made_alone():
    made = _user_things()
    try:
        with loadr.Loader(trivial(20), batch=4, workers=1) as loader:
            next(iter(loader))
        assert reclaim_stale() == []
        for path in made:
            assert os.path.exists(path), path
    finally:
        for path in made:
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)


def test_leftovers_of_another_boot_are_reclaimed_and_of_a_live_owner_kept():
    live = owned_dir(SHM_DIR)                    # ours, this process: alive
    other_boot = owned_dir(tempfile.gettempdir())
    marker = os.path.join(other_boot, MARKER)
    with open(marker) as f:
        record = json.load(f)
    with open(marker, 'w') as f:
        json.dump({**record, 'boot': 'a boot that is over'}, f)
    try:
        assert reclaim_stale() == [other_boot]
        assert os.path.isdir(live) and not os.path.exists(other_boot)
    finally:
        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(other_boot, ignore_errors=True)


# A loader in a pid namespace of its own (a container sharing /tmp and /dev/shm): its
# pids mean nothing here, and the one it has may be free here.
IN_NAMESPACE = '''
    import json, os, sys
    import loadr
    from tests.loader_helpers import batch_digest, trivial

    with loadr.Loader(trivial(100), batch=4, seed=1, workers=1) as loader:
        it = iter(loader)
        next(it)
        print(json.dumps({'pid': os.getpid(), 'dirs': loader._pool._held.dirs}), flush=True)
        sys.stdin.readline()                      # the test reclaims meanwhile
        print(json.dumps({'digest': batch_digest(next(it))}), flush=True)
'''


def test_a_live_loader_of_another_pid_namespace_is_never_reclaimed():
    unshare = shutil.which('unshare')
    probe = subprocess.run([unshare or 'unshare', '--pid', '--fork', '--mount-proc', 'true'],
                           capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip('cannot make a pid namespace here (needs unshare and root or user '
                    'namespaces)')
    # Burn pids inside the namespace so the loader's pid is above 300, then check that
    # no process has that pid here: the old reclaim would have judged it dead.
    code = textwrap.dedent(IN_NAMESPACE)
    shell = ('while [ "$(sh -c \'echo $$\')" -lt 300 ]; do :; done; '
             f'{sys.executable} -c "$0"')
    # LOADR_SHM=devshm: a directory in /dev/shm as well as the one in the temp dir.
    proc = subprocess.Popen([unshare, '--pid', '--fork', '--mount-proc', 'sh', '-c', shell,
                             code], cwd=ROOT, env={**os.environ, 'PYTHONPATH': str(ROOT),
                                                   'LOADR_SHM': 'devshm'},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    STARTED.append(proc)
    info = read_json_line(proc)
    if running(info['pid']):
        pytest.skip(f"pid {info['pid']} of the namespace also runs here: nothing to show")
    assert len(info['dirs']) == 2                  # its sockets', its segments'
    for path in info['dirs']:
        assert owner_of(path) is not None and os.path.isdir(path)
    with loadr.Loader(trivial(20), batch=4, workers=1) as loader:
        next(iter(loader))                         # a loader start reclaims
    assert reclaim_stale() == []
    for path in info['dirs']:
        assert os.path.isdir(path), path
    proc.stdin.write('\n')
    proc.stdin.flush()
    assert 'digest' in read_json_line(proc)        # it still works
    finish(proc)
    assert proc.returncode == 0


# A worker forked second sleeps in an at-fork hook (as a slow start-up under load does):
# it is still starting when the first batch comes and the script ends.
SECOND_WORKER_STARTS_SLOWLY = """
    import os, time
    forks = [0]
    os.register_at_fork(before=lambda: forks.__setitem__(0, forks[0] + 1),
                        after_in_child=lambda: forks[0] == 2 and time.sleep(1))
"""


def run_script(*parts: str, timeout_s: float = 20) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of a script in ``parts``; its processes are killed if
    it hangs."""
    script = ''.join(textwrap.dedent(part) for part in parts)
    proc = subprocess.Popen([sys.executable, '-c', script], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        err = 'hung at exit'
        out = ''
    finally:
        if proc.poll() is None:
            for pid in children(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def test_exit_without_close_with_a_sigterm_handler_that_does_not_exit():
    # Lightning's Trainer installs a SIGTERM handler that does not exit; forked workers
    # inherited it, and multiprocess's exit hook (SIGTERM, then join with no limit)
    # waited forever on them when a script ended with its loader still open. A worker
    # still starting (before it put back SIGTERM's default) swallowed that SIGTERM: the
    # exit hung after "done" (seen once under load; made certain here by a slow start).
    code, out, err = run_script(SECOND_WORKER_STARTS_SLOWLY, """
        import signal
        import loadr
        signal.signal(signal.SIGTERM, lambda *a: None)
        loader = loadr.Loader([{'x': i} for i in range(100)], batch=4, workers=2)
        next(iter(loader))
        print('done', flush=True)
    """)
    assert code == 0 and out.strip() == 'done', err


# The worker forked second stays in an at-fork hook until its SIGTERM has come (held
# pending: a worker blocks it until it has put back the default action), after saying
# that it is there in the file STARTING.
SECOND_WORKER_STARTS_UNTIL_SIGNALLED = """
    import os, signal, time
    forks = [0]

    def starting():
        if forks[0] != 2:
            return
        open(STARTING, 'w').close()
        deadline = time.monotonic() + 30
        while signal.SIGTERM not in signal.sigpending() and time.monotonic() < deadline:
            time.sleep(0.01)

    os.register_at_fork(before=lambda: forks.__setitem__(0, forks[0] + 1),
                        after_in_child=starting)
"""


def test_a_sigterm_while_a_worker_starts_ends_it_despite_the_handler_it_inherits(tmp_path):
    starting = f"STARTING = {str(tmp_path / 'starting')!r}\n"
    code, out, err = run_script(starting, SECOND_WORKER_STARTS_UNTIL_SIGNALLED, """
        import signal
        import loadr
        signal.signal(signal.SIGTERM, lambda *a: None)
        with loadr.Loader([{'x': i} for i in range(100)], batch=4, workers=2) as loader:
            next(iter(loader))
            second = loader._pool.workers[1].process
            deadline = time.monotonic() + 15
            while not os.path.exists(STARTING) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert os.path.exists(STARTING), 'the second worker never started'
            os.kill(second.pid, signal.SIGTERM)      # while it is in the at-fork hook
            second.join(15)
            print(second.exitcode, flush=True)
    """, timeout_s=40)
    assert code == 0 and out.strip() == str(-signal.SIGTERM), (out, err)


def test_exit_without_close_with_a_stopped_worker():
    # multiprocess's exit hook SIGTERMs a stopped worker (it stays stopped) and joins it
    # with no limit; the pools are released before that hook runs, in close()'s order.
    code, out, err = run_script("""
        import os, signal
        import loadr
        loader = loadr.Loader([{'x': i} for i in range(100)], batch=4, workers=2)
        next(iter(loader))
        os.kill(loader.worker_pids[0], signal.SIGSTOP)
        print('done', flush=True)
    """)
    assert code == 0 and out.strip() == 'done', err
