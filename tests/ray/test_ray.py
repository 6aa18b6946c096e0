"""Remote workers on a real Ray cluster (loadr.ray.Workers): the same batches as in one
process, also with a node removed mid-epoch or an agent killed, and nothing left behind.

One test runs every step on one cluster: pytest-xdist would hand separate tests to
separate workers, each starting a cluster of its own (~1.2 GB and 10 s each)."""

from __future__ import annotations

import time

import pytest

import loadr
import loadr.ray
from loadr.workers.remote import AgentError

from ..loader_helpers import alive, batch_digest, noisy, salted, slowed, trivial
from .conftest import NODE

pytest.importorskip('ray')

# Some 30 s with the cluster's start: CI runs it (-m ''), the everyday run does not.
pytestmark = pytest.mark.slow

N, BATCH, SEED = 50, 8, 3


def epochs(loader, count=2):
    return [batch_digest(b) for e in range(count) for b in loader.epoch(e)]


def digests(fns=(noisy,), **kw):
    with loadr.Loader(trivial(N), batch=BATCH, fns=list(fns), seed=SEED, **kw) as loader:
        return epochs(loader)


def agent_pids(loader) -> list[int]:
    return [link.info['pid'] for link in loader._pool.remote.links]


def agents_on_ray_nodes_make_the_same_batches(cluster):
    reference = digests(workers=0)
    with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, workers=0,
                      remote=loadr.ray.Workers(cpus=1)) as loader:     # nodes=None: both
        assert epochs(loader) == reference
        pids = agent_pids(loader)
        assert len(pids) == 2
        it = loader.epoch(0)
        head = [batch_digest(next(it)) for _ in range(3)]
        state = loader.save()
    until(lambda: not any(alive(p) for p in pids))  # the agents' pools and actors are gone
    # A state saved with two agents resumes on one agent and a local worker.
    with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, workers=1,
                      remote=loadr.ray.Workers(nodes=1)) as loader:
        loader.load(state)
        assert head + epochs(loader) == reference


def until(check, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.05)


def a_node_removed_mid_epoch_changes_no_batch(cluster):
    c, ray, nodes = cluster
    fns = [slowed(0.01)]
    reference = digests(fns=fns, workers=0)
    with loadr.Loader(trivial(N), batch=BATCH, fns=fns, seed=SEED, workers=0,
                      remote=loadr.ray.Workers(nodes=2)) as loader:
        it = loader.epoch(0)
        got = [batch_digest(next(it))]
        t0 = time.monotonic()
        c.remove_node(nodes[1], allow_graceful=False)
        got.append(batch_digest(next(it)))
        after_loss_s = time.monotonic() - t0
        got += [batch_digest(b) for b in it]
        got += [batch_digest(b) for b in loader.epoch(1)]
    assert got == reference, after_loss_s
    nodes[1] = c.add_node(**NODE)
    c.wait_for_nodes()


def an_agent_killed_through_ray_changes_no_batch_and_leaves_nothing(cluster):
    c, ray, nodes = cluster
    fns = [slowed(0.01)]
    reference = digests(fns=fns, workers=0)
    with loadr.Loader(trivial(N), batch=BATCH, fns=fns, seed=SEED, workers=0,
                      remote=loadr.ray.Workers(nodes=2)) as loader:
        it = loader.epoch(0)
        got = [batch_digest(next(it))]
        link = loader._pool.remote.links[0]
        pid = link.info['pid']
        kids = children(pid)
        assert kids and all(alive(p) for p in kids)
        ray.kill(link.handle.actor)
        got += [batch_digest(b) for b in it]
        got += [batch_digest(b) for b in loader.epoch(1)]
        others = [(p, children(p)) for p in agent_pids(loader)]
    assert got == reference
    gone = [pid, *kids, *[q for p, ks in others for q in (p, *ks)]]
    until(lambda: not any(alive(p) for p in gone))
    import os
    assert not [n for n in os.listdir('/dev/shm') for p in gone if f'-{p}-' in n]


def children(pid: int) -> list[int]:
    import os
    out = []
    for tid in os.listdir(f'/proc/{pid}/task'):
        with open(f'/proc/{pid}/task/{tid}/children') as f:
            out += [int(p) for p in f.read().split()]
    return out


def a_stopped_agent_changes_no_batch_and_is_killed(cluster):
    import os
    import signal
    fns = [slowed(0.01)]
    reference = digests(fns=fns, workers=0)
    with loadr.Loader(trivial(N), batch=BATCH, fns=fns, seed=SEED, workers=0,
                      remote=loadr.ray.Workers(nodes=2)) as loader:
        it = loader.epoch(0)
        got = [batch_digest(next(it))]
        pid = agent_pids(loader)[0]
        os.kill(pid, signal.SIGSTOP)        # Ray never calls a stopped actor dead
        try:
            got += [batch_digest(b) for b in it]
            got += [batch_digest(b) for b in loader.epoch(1)]
        finally:
            if alive(pid):
                until(lambda: not alive(pid), 10)
    assert got == reference


def a_killed_trainer_leaves_no_agent(cluster):
    import os
    import subprocess
    import sys
    import textwrap
    c, ray, nodes = cluster
    code = textwrap.dedent(f'''
        import time
        import ray
        import loadr, loadr.ray
        from tests.loader_helpers import trivial, noisy
        ray.init(address={c.address!r}, log_to_driver=False)
        loader = loadr.Loader(trivial(50), batch=8, fns=[noisy], workers=0,
                              remote=loadr.ray.Workers(nodes=2))
        next(iter(loader))
        print(*[link.info['pid'] for link in loader._pool.remote.links], flush=True)
        time.sleep(600)
    ''')
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    trainer = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE,
                               text=True, cwd=root)
    try:
        pids = [int(p) for p in trainer.stdout.readline().split()]
        assert len(pids) == 2
        gone = [q for p in pids for q in (p, *children(p))]
    finally:
        trainer.kill()
        trainer.wait(30)
    until(lambda: not any(alive(p) for p in gone), 60)
    assert not [n for n in os.listdir('/dev/shm') for p in gone if f'-{p}-' in n]


def resources_and_runtime_env_reach_the_agents(cluster):
    import os
    # The fn reads LOADR_TEST_SALT: the agents have it only through the runtime_env (Ray's
    # workers do not inherit the driver's environment), and the canary check at start
    # refuses agents whose datapoints differ from this process's.
    os.environ['LOADR_TEST_SALT'] = '7'
    try:
        reference = digests(fns=[salted], workers=0)
        with loadr.Loader(trivial(N), batch=BATCH, fns=[salted], seed=SEED, workers=0,
                          remote=loadr.ray.Workers(
                              nodes=2, resources={'loadr_node': 1},
                              runtime_env={'env_vars': {'LOADR_TEST_SALT': '7'}})) as loader:
            assert epochs(loader) == reference
        with pytest.raises(AgentError, match='canary digests differ'):
            with loadr.Loader(trivial(N), batch=BATCH, fns=[salted], seed=SEED, workers=0,
                              remote=loadr.ray.Workers(nodes=1)) as loader:
                next(iter(loader))
    finally:
        del os.environ['LOADR_TEST_SALT']
    # A resource no node has enough of: no placement, said within the start timeout.
    with pytest.raises(loadr.errors.ConfigError, match='could not place'):
        with loadr.Loader(trivial(N), batch=BATCH, fns=[noisy], seed=SEED, workers=0,
                          remote=loadr.ray.Workers(nodes=1, resources={'loadr_node': 2},
                                                   start_timeout_s=2)) as loader:
            next(iter(loader))


@pytest.mark.timeout(300)
def test_remote_workers_on_a_ray_cluster(cluster):
    resources_and_runtime_env_reach_the_agents(cluster)
    agents_on_ray_nodes_make_the_same_batches(cluster)
    a_node_removed_mid_epoch_changes_no_batch(cluster)
    an_agent_killed_through_ray_changes_no_batch_and_leaves_nothing(cluster)
    a_stopped_agent_changes_no_batch_and_is_killed(cluster)
    a_killed_trainer_leaves_no_agent(cluster)
