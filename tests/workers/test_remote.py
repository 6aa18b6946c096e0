"""Remote workers through the Ray-free engine (loadr.remote.Subprocesses): agents as
real processes on loopback tcp with CURVE, the same batches for any placement, and the
faults a host can have (killed, stopped, a fn raising, a batch that kills hosts, fns it
cannot import, a stranger at its socket)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import textwrap
import time

import numpy as np
import pytest
import zmq
import zmq.utils.monitor

import loadr
import loadr.remote
from loadr.errors import ConfigError
from loadr.workers.agent import DONE, parse_wire
from loadr.workers.protocol import Task, task

from ..loader_helpers import alive, batch_digest, noisy, slowed, trivial
from ..waiting import HANG_S

N, BATCH, SEED = 50, 8, 3       # 7 batches an epoch, the last of 2 rows


class Poison(ValueError):
    """Raised by a fn on one datapoint, on whatever host makes it."""


def poisoned(dp, seed):
    if dp['label'] == 17:
        raise Poison(f"label {dp['label']} is poisoned")
    return noisy(dp, seed)


def kills_its_host(dp, seed):
    """On datapoint 17, inside an agent's worker: SIGKILL the agent (the whole host's
    share of the work); anywhere else, the plain fn."""
    if dp['label'] == 17:
        try:
            with open(f'/proc/{os.getppid()}/cmdline', 'rb') as f:
                parent = f.read()
        except OSError:
            parent = b''
        if b'loadr.workers.agent' in parent:
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(5)
    return noisy(dp, seed)


def epochs(loader, count=2):
    return [batch_digest(b) for e in range(count) for b in loader.epoch(e)]


def digests(fns=(noisy,), count=2, **kw):
    with loadr.Loader(trivial(N), batch=BATCH, fns=list(fns), seed=SEED, **kw) as loader:
        return epochs(loader, count)


@pytest.fixture(scope='module')
def reference():
    return digests(workers=0)


def agents_of(loader) -> list:
    """(pid, its worker pids) of each live agent."""
    out = []
    for link in loader._pool.remote.links:
        pid = link.info['pid']
        kids = []
        for tid in os.listdir(f'/proc/{pid}/task'):
            with open(f'/proc/{pid}/task/{tid}/children') as f:
                kids += [int(p) for p in f.read().split()]
        out.append((pid, kids))
    return out


def until(check, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.02)


def test_every_placement_makes_the_same_batches(reference):
    assert len(reference) == 14
    assert digests(workers=1) == reference
    assert digests(workers=0, remote=loadr.remote.Subprocesses(agents=1)) == reference
    assert digests(workers=0, remote=loadr.remote.Subprocesses(agents=2)) == reference
    assert digests(workers=1, remote=loadr.remote.Subprocesses(agents=2)) == reference
    # Plain tcp on loopback (the benchmark's CURVE-off measure): the same rows.
    assert digests(workers=0, remote=loadr.remote.Subprocesses(agents=1, curve=False)) \
        == reference


def test_a_killed_agent_s_batches_are_redone_elsewhere():
    ref = digests(fns=[slowed(0.01)], workers=0)
    with loadr.Loader(trivial(N), batch=BATCH, fns=[slowed(0.01)], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=2)) as loader:
        it = loader.epoch(0)
        got = [batch_digest(next(it))]
        (victim, kids), _ = agents_of(loader)
        os.kill(victim, signal.SIGKILL)
        got += [batch_digest(b) for b in it]
        got += [batch_digest(b) for b in loader.epoch(1)]
        assert got == ref
        until(lambda: not any(alive(p) for p in kids))


def test_a_stopped_agent_is_found_by_heartbeats_and_its_batches_redone():
    ref = digests(fns=[slowed(0.01)], workers=0)
    with loadr.Loader(trivial(N), batch=BATCH, fns=[slowed(0.01)], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=2)) as loader:
        it = loader.epoch(0)
        got = [batch_digest(next(it))]
        (victim, _), _ = agents_of(loader)
        os.kill(victim, signal.SIGSTOP)
        try:
            got += [batch_digest(b) for b in it]
            got += [batch_digest(b) for b in loader.epoch(1)]
        finally:
            if alive(victim):
                os.kill(victim, signal.SIGCONT)
        assert got == ref
        until(lambda: not alive(victim))        # killed when it was dropped


def test_a_state_resumes_on_another_placement(reference):
    placements = [dict(workers=0, remote=loadr.remote.Subprocesses(agents=2)),
                  dict(workers=1),
                  dict(workers=1, remote=loadr.remote.Subprocesses(agents=1)),
                  dict(workers=0)]
    for before, after in zip(placements, placements[1:]):
        with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, **before) as a:
            it = a.epoch(0)
            got = [batch_digest(next(it)) for _ in range(3)]
            state = a.save()
        assert 'remote' not in str(state) and 'agent' not in str(state)
        with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, **after) as b:
            b.load(state)
            got += [batch_digest(x) for x in b.epoch(0)]
            got += [batch_digest(x) for x in b.epoch(1)]
        assert got == reference, (before, after)


def test_a_fn_raising_on_a_host_surfaces_with_its_class_and_message():
    with loadr.Loader(trivial(N), batch=BATCH, fns=[poisoned], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=1)) as loader:
        with pytest.raises(Poison, match='label 17 is poisoned') as info:
            epochs(loader)
    assert info.value.loadr_index == 17
    assert 'on host' in str(info.value.__cause__)


def test_a_batch_that_keeps_killing_hosts_fails_naming_its_positions():
    with loadr.Loader(trivial(N), batch=BATCH, fns=[kills_its_host], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=1)) as loader:
        with pytest.raises(loadr.LoadrError, match=r'stream positions \d+\.\.\d+ were in hand '
                                                   r'on 3 remote hosts'):
            epochs(loader, 1)


def test_a_host_that_cannot_import_the_fns_is_named_before_the_first_batch(tmp_path):
    (tmp_path / 'only_here.py').write_text(textwrap.dedent('''
        def fn(dp, seed):
            return dp
    '''))
    sys.path.insert(0, str(tmp_path))
    try:
        import only_here
        env = {k: v for k, v in os.environ.items()}
        with loadr.Loader(trivial(N), batch=BATCH, fns=[only_here.fn], seed=SEED, workers=0,
                          remote=loadr.remote.Subprocesses(agents=1, env=env)) as loader:
            with pytest.raises(loadr.LoadrError, match=r"agent 0 on host \S+ could not start: "
                                                       r".*No module named 'only_here'"):
                next(iter(loader))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop('only_here', None)


def test_close_leaves_no_agent_worker_or_shared_memory():
    with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, workers=1,
                      remote=loadr.remote.Subprocesses(agents=2)) as loader:
        next(iter(loader))
        found = agents_of(loader)
        pids = [p for pid, kids in found for p in (pid, *kids)]
        assert len(pids) == 4 and all(alive(p) for p in pids)
    assert not any(alive(p) for p in pids)
    left = [n for n in os.listdir('/dev/shm') for pid, _ in found if f'-{pid}-' in n]
    assert not left


def test_a_stranger_at_an_agent_s_socket_gets_nothing():
    with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=1)) as loader:
        next(iter(loader))
        link = loader._pool.remote.links[0]
        address = f"tcp://{link.info['address']}:{link.info['port']}"
        ctx = zmq.Context()
        try:
            for curve in (True, False):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                if curve:       # a well-formed client that knows the server's key
                    sock.curve_serverkey = link.server_public
                    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
                # A name of its own: the default (by the socket's fd) can be the closed
                # first socket's, still bound ("Address already in use").
                monitor = sock.get_monitor_socket(addr=f'inproc://stranger-monitor-{curve}')
                sock.connect(address)
                sock.send(task(Task(10**6, 0, 0, SEED, 0, BATCH))[0])
                failed = None
                deadline = time.monotonic() + HANG_S      # only a hang takes this long
                while failed is None and time.monotonic() < deadline:
                    if monitor.poll(100):
                        event = zmq.utils.monitor.recv_monitor_message(monitor)['event']
                        if event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                                     zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                     zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                                     zmq.EVENT_DISCONNECTED):
                            failed = event
                        assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED
                assert failed is not None, 'the handshake was neither refused nor closed'
                assert not sock.poll(200)       # and no reply came
                monitor.close(0)
                sock.close(0)
        finally:
            # Closes every socket (linger 0) even when an assertion left one open, so a
            # failure is reported instead of ctx.term() waiting on it for ever.
            ctx.destroy(linger=0)
        # The run itself goes on.
        assert batch_digest(next(iter(loader))) is not None


def test_remote_must_be_an_engine():
    with pytest.raises(ConfigError, match='remote must be an engine'):
        loadr.Loader(trivial(N), batch=BATCH, remote=object())
    with pytest.raises(ConfigError, match='agents must be'):
        loadr.remote.Subprocesses(agents=0)


def test_the_wire_header_is_refused_when_it_is_not_loadr_s():
    assert parse_wire(b'x' * 14) is None
    assert parse_wire(b'LDRA\x01D' + (7).to_bytes(8, 'little')) == (DONE, 7)
    assert np.dtype('<Q').itemsize == 8


def test_loadr_never_imports_ray_and_says_what_to_install_without_it():
    import subprocess

    code = textwrap.dedent('''
        import sys
        import loadr, loadr.ray
        assert 'ray' not in sys.modules, 'import loadr imported ray'
        sys.modules['ray'] = None           # as if it were not installed
        try:
            loadr.Loader([{'x': 1}], batch=1, workers=0, remote=loadr.ray.Workers(nodes=2))
        except loadr.errors.ConfigError as exc:
            print(exc)
    ''')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'loadr-ml[ray]'" in out.stdout


def test_a_yaml_pipeline_runs_on_agents_that_rebuild_it(tmp_path):
    from ..datasets import write_bag

    write_bag(tmp_path / 'bag', n=21)
    text = textwrap.dedent('''
        reader: {path: bag, decode_images: false}
        fns:
          - decode_jpeg: {key: image, size: [16, 16]}
          - flip
        loader: {batch: 4, seed: 3, workers: 0%s}
    ''')
    (tmp_path / 'local.yaml').write_text(text % '')
    (tmp_path / 'remote.yaml').write_text(
        text % ', remote: {engine: subprocesses, agents: 2, cpus: 1}')
    with loadr.pipeline(tmp_path / 'local.yaml') as loader:
        want = epochs(loader)
    with loadr.pipeline(tmp_path / 'remote.yaml') as loader:
        assert loader.recipe is not None
        got = epochs(loader)
        # What the agents were given: the recipe, none of the reader's or fns' objects.
        config = loader._pool.remote.config_for(0, b'')
        assert config.reader is None and config.fns == [] and config.recipe is not None
    assert got == want and len(want) == 12
    with pytest.raises(ConfigError, match="loader.remote.engine must be 'ray' or"):
        loadr.pipeline(tmp_path / 'local.yaml', loader={'remote': {'engine': 'spark'}})


def test_a_killed_trainer_leaves_no_agent_behind(tmp_path):
    import subprocess

    code = textwrap.dedent('''
        import os, sys, time
        import loadr, loadr.remote
        from tests.loader_helpers import trivial, noisy
        loader = loadr.Loader(trivial(50), batch=8, fns=[noisy], workers=0,
                              remote=loadr.remote.Subprocesses(agents=2))
        next(iter(loader))
        for link in loader._pool.remote.links:
            pid = link.info['pid']
            kids = []
            for tid in os.listdir(f'/proc/{pid}/task'):
                with open(f'/proc/{pid}/task/{tid}/children') as f:
                    kids += f.read().split()
            print(pid, *kids, flush=True)
        time.sleep(600)
    ''')
    trainer = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        pids = [int(p) for _ in range(2) for p in trainer.stdout.readline().split()]
        assert len(pids) == 4 and all(alive(p) for p in pids)
    finally:
        trainer.kill()
        trainer.wait(30)
    until(lambda: not any(alive(p) for p in pids))
    left = [n for n in os.listdir('/dev/shm') for p in pids if f'-{p}-' in n]
    assert not left


def test_stats_has_a_line_per_agent():
    from loadr.stats import format_table

    with loadr.Loader(trivial(N), batch=BATCH, fns=[slowed(0.005)], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=2)) as loader:
        epochs(loader, 1)
        stats = loader.stats()
    agents = stats.as_dict()['agents']
    assert sorted(a['agent'] for a in agents) == [0, 1]
    assert sum(a['rows'] for a in agents) == N         # workers=0: every row from an agent
    assert all(a['deaths'] == 0 and a['rows_per_s'] > 0 for a in agents)
    table = format_table(stats)
    assert 'agent 0 on ' in table and 'agent 1 on ' in table
    # The loop does nothing but wait: the agents are what it waits for.
    assert '100% of the rows came from 2 remote agents while the training step waited' in table


def test_a_fn_of_the_main_script_goes_to_the_agents_with_its_globals(tmp_path):
    import subprocess

    script = tmp_path / 'train.py'
    script.write_text(textwrap.dedent('''
        import numpy as np
        import loadr, loadr.remote
        OFFSET = 1000

        def shift(dp, seed):
            return {'x': np.int64(dp['x'] + OFFSET)}

        if __name__ == '__main__':
            data = [{'x': i} for i in range(20)]
            with loadr.Loader(data, batch=4, fns=[shift], seed=1, workers=0,
                              remote=loadr.remote.Subprocesses(agents=1)) as loader:
                got = [b['x'].tolist() for b in loader.epoch(0)]
            with loadr.Loader(data, batch=4, fns=[shift], seed=1, workers=0) as loader:
                want = [b['x'].tolist() for b in loader.epoch(0)]
            assert got == want, (got, want)
            print('same')
    '''))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and 'same' in out.stdout, out.stderr[-3000:]


def shifted_by_env(dp, seed):
    """``noisy``, shifted by $LOADR_TEST_SHIFT: another host's other package version."""
    out = noisy(dp, seed)
    out['vec'] = out['vec'] + float(os.environ.get('LOADR_TEST_SHIFT', '0'))
    return out


class Files:
    """A dataset of files at ``root``: a host without them cannot read it."""

    def __init__(self, root):
        self.root = str(root)

    def __len__(self):
        return 10

    def __getitem__(self, i):
        # $LOADR_TEST_ROOT: where another host has (not) got them.
        root = os.environ.get('LOADR_TEST_ROOT', self.root)
        with open(os.path.join(root, f'{i}.txt')) as f:
            return {'label': int(f.read()), 'vec': np.zeros(16, np.float32)}


def test_a_host_that_makes_other_datapoints_or_lacks_the_files_is_named(tmp_path):
    env = {**os.environ, 'LOADR_TEST_SHIFT': '1'}
    with loadr.Loader(trivial(N), batch=BATCH, fns=[shifted_by_env], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=1, env=env)) as loader:
        with pytest.raises(loadr.LoadrError, match=r'agent 0 on host \S+ makes other '
                                                   r'datapoints .*canary digests differ'):
            next(iter(loader))
    # The files, here only: the agent's host has no such folder.
    for i in range(10):
        (tmp_path / f'{i}.txt').write_text(str(i))
    env = {**os.environ, 'LOADR_TEST_ROOT': str(tmp_path / 'elsewhere')}
    with loadr.Loader(Files(tmp_path), batch=4, seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=1, env=env)) as loader:
        with pytest.raises(loadr.LoadrError, match=r"agent 0 on host \S+ .*No such file or "
                                                   r"directory: '.*elsewhere/\d\.txt'"):
            next(iter(loader))


def kills_its_worker(dp, seed):
    """On datapoint 17, inside an agent's worker: SIGKILL that worker (a poison sample)."""
    if dp['label'] == 17 and os.environ.get('LOADR_TEST_IN_AGENT'):
        os.kill(os.getpid(), signal.SIGKILL)
    return noisy(dp, seed)


def test_a_poison_sample_on_a_host_is_named_by_its_index():
    env = {**os.environ, 'LOADR_TEST_IN_AGENT': '1'}
    with loadr.Loader(trivial(N), batch=BATCH, fns=[kills_its_worker], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=1, env=env)) as loader:
        with pytest.raises(loadr.LoadrError, match='17') as info:
            epochs(loader, 1)
    assert getattr(info.value, 'index', None) == 17 or 'index 17' in str(info.value)


def test_loadr_run_takes_the_remote_engine_from_the_yaml_or_an_override(tmp_path):
    import subprocess

    from ..datasets import write_bag

    write_bag(tmp_path / 'bag', n=21)
    (tmp_path / 'p.yaml').write_text(textwrap.dedent('''
        reader: {path: bag, decode_images: false}
        fns:
          - decode_jpeg: {key: image, size: [16, 16]}
        loader: {batch: 4, seed: 3, workers: 0}
    '''))

    def run(*more):
        done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'run', str(tmp_path / 'p.yaml'),
                               '--steps', '7', '--digest', *more], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return [line for line in done.stdout.splitlines() if line.startswith('position ')]

    want = run()
    assert len(want) == 7
    assert run('-o', 'loader.remote={engine: subprocesses, agents: 2}') == want


def test_an_agent_answers_a_task_it_cannot_make_with_a_failure():
    from loadr.workers.agent import FAIL, failure_from_wire

    with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=1)) as loader:
        next(iter(loader))
        remote = loader._pool.remote
        link = remote.links[0]
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.curve_serverkey = link.server_public       # this run's own keys
            sock.curve_publickey, sock.curve_secretkey = remote.client_public, \
                remote.client_secret
            sock.connect(f"tcp://{link.info['address']}:{link.info['port']}")
            sock.send(task(Task(10**6, 0, 0, SEED, 0, BATCH + 1))[0])
            assert sock.poll(30_000), 'no answer'
            head, blob = sock.recv_multipart()
            assert parse_wire(head) == (FAIL, 10**6)
            assert 'a task of 9 rows for batches of 8' in failure_from_wire(blob).message
        finally:
            sock.close(0)
            ctx.term()


def labels_as_text(dp, seed):
    """``noisy`` with a list key (a str per datapoint): extras travel as msgpack."""
    return {**noisy(dp, seed), 'name': f"item-{dp['label']}"}


def test_ring_mode_skipped_samples_and_list_keys_come_back_the_same():
    def run(**kw):
        with loadr.Loader(trivial(N), batch=BATCH, fns=[poisoned, labels_as_text], seed=SEED,
                          on_error='skip', **kw) as loader:
            out = epochs(loader)
            return out, loader.errors
    want, errors = run(workers=0)
    assert errors == 2                              # datapoint 17, once an epoch
    assert run(workers=0, ring=True, remote=loadr.remote.Subprocesses(agents=2)) == (want, 2)
    assert run(workers=1, remote=loadr.remote.Subprocesses(agents=1)) == (want, 2)


def covered_once(events, every: bool = True) -> list[dict]:
    """Check that every batch handed out (a trace's 'batch' instants) has its positions in
    exactly one task (made), and return the task spans. A task whose host died after its
    record went out is made again: the same positions twice, never a partial overlap.
    ``every=False``: a trace begun mid-run, whose first batches may have been made before
    it began: in one task at most."""
    from ..stats.test_trace import spans

    tasks = [t for t in spans(events, 'task', 'worker') if t['args']['made']]
    distinct = {(t['args']['position'], t['args']['count']) for t in tasks}
    by_position: dict[int, int] = {}
    for start, count in distinct:
        for p in range(start, start + count):
            by_position[p] = by_position.get(p, 0) + 1
    handed = [p for e in events if e['ph'] == 'i' and e['name'] == 'batch'
              for p in range(e['args']['step'], e['args']['step'] + e['args']['samples'])]
    assert handed and len(set(handed)) == len(handed)
    if every:
        assert {p: by_position.get(p, 0) for p in handed} == {p: 1 for p in handed}
    else:
        assert all(by_position.get(p, 0) <= 1 for p in handed)
        assert any(by_position.get(p, 0) for p in handed)
    return tasks


def test_a_traced_run_has_a_track_per_remote_worker(reference, tmp_path):
    from ..stats.test_trace import check_valid, read_trace

    path = tmp_path / 'remote.trace.json'
    with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, workers=1,
                      remote=loadr.remote.Subprocesses(agents=2, cpus=1), trace=path) as loader:
        assert epochs(loader) == reference      # tracing never changes a batch
        local = set(loader.worker_pids)
        agents = agents_of(loader)
    with open(path, encoding='utf-8') as f:
        other = json.load(f)['otherData']
    events = read_trace(path)
    check_valid(events)
    names = {e['pid']: e['args']['name'] for e in events
             if e['ph'] == 'M' and e['name'] == 'process_name'}
    host = socket.gethostname()
    assert sorted(names.values()) == [f'agent 0 ({host}) worker 0',
                                      f'agent 1 ({host}) worker 0',
                                      'loadr worker 0', 'loadr: training process']
    tasks = covered_once(events)
    # Each track is a worker process: the local one, and the one of each agent.
    remote_pids = {kid for _, kids in agents for kid in kids}
    by_track = {names[t['pid']] for t in tasks}
    assert by_track == set(names.values()) - {'loadr: training process'}
    assert {t['pid'] for t in tasks} <= local | remote_pids
    # Every stage of a remote task, as of a local one.
    stages = {(names[e['pid']].startswith('agent'), e['name']) for e in events
              if e.get('cat') == 'stage'}
    assert {(True, 'noisy'), (False, 'noisy')} <= stages
    # One host: the agents' clocks are this one's, and the offset says so (within its
    # round trip).
    assert other['agent_clocks'] and [a['agent'] for a in other['agents']] == [0, 1]
    for a in other['agents']:
        assert a['host'] == host and abs(a['clock_offset_s']) <= a['round_trip_s']
    # The agents' spans sit inside the run, on this process's clock.
    batches = [e['ts'] for e in events if e['ph'] == 'i' and e['name'] == 'batch']
    first_wait = min(e['ts'] for e in events if e['name'] == 'loadr: wait for batch')
    for t in tasks:
        assert first_wait <= t['ts'] and t['ts'] + t['dur'] <= max(batches) + 1e6


def test_a_trace_begun_mid_run_shows_the_agents_too(reference, tmp_path):
    from ..stats.test_trace import check_valid, read_trace

    with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, workers=1,
                      remote=loadr.remote.Subprocesses(agents=2)) as loader:
        it = loader.epoch(0)
        got = [batch_digest(next(it)) for _ in range(2)]
        # No rings yet: the pools start again with them (agents too); the same stream.
        loader.trace(tmp_path / 'late.trace.json', batches=3)
        got += [batch_digest(next(it)) for _ in range(3)]
        assert loader._pool.remote.trace_sink is None       # written: it takes no more
        started = sorted(pid for pid, _ in agents_of(loader))
        # A second trace finds the rings there: nothing starts again.
        loader.trace(tmp_path / 'later.trace.json')
        got += [batch_digest(b) for b in it]
        got += [batch_digest(b) for b in loader.epoch(1)]
        assert sorted(pid for pid, _ in agents_of(loader)) == started
    assert got == reference
    for name, steps in (('late', [16, 24, 32]), ('later', None)):
        events = read_trace(tmp_path / f'{name}.trace.json')
        check_valid(events)
        handed = [e['args']['step'] for e in events if e['ph'] == 'i' and e['name'] == 'batch']
        if steps is not None:
            assert handed == steps
            covered_once(events)        # the pools started again with the trace
        names = {e['args']['name'] for e in events
                 if e['ph'] == 'M' and e['name'] == 'process_name'}
        assert {n.split(' (')[0] for n in names if n.startswith('agent')} == \
            {'agent 0', 'agent 1'}, names
    covered_once(read_trace(tmp_path / 'later.trace.json'), every=False)


def test_a_traced_run_that_loses_an_agent_still_covers_every_batch(tmp_path):
    from ..stats.test_trace import check_valid, read_trace

    ref = digests(fns=[slowed(0.01)], workers=0)
    path = tmp_path / 'lost.trace.json'
    with loadr.Loader(trivial(N), batch=BATCH, fns=[slowed(0.01)], seed=SEED, workers=0,
                      remote=loadr.remote.Subprocesses(agents=2), trace=path) as loader:
        it = loader.epoch(0)
        got = [batch_digest(next(it))]
        (victim, _), _ = agents_of(loader)
        os.kill(victim, signal.SIGKILL)
        got += [batch_digest(b) for b in it]
        got += [batch_digest(b) for b in loader.epoch(1)]
    assert got == ref
    events = read_trace(path)
    check_valid(events)
    tasks = covered_once(events)
    names = {e['pid']: e['args']['name'] for e in events
             if e['ph'] == 'M' and e['name'] == 'process_name'}
    assert {names[t['pid']].split(' (')[0] for t in tasks} >= {'agent 1'}
