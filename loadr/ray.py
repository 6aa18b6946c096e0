"""Remote workers on a Ray cluster: one agent per node, placed by Ray Core.

``Loader(..., remote=loadr.ray.Workers(nodes=4, cpus=16))`` starts one agent
(:mod:`loadr.workers.agent`) on each of 4 nodes as a Ray actor holding 16
CPUs, spread by a placement group (``STRICT_SPREAD``: one bundle a node).
Each agent runs 16 worker processes, and the rows they make travel over
loadr's own ZeroMQ tcp protocol (CURVE, an allow-list of this run's key,
handed out through Ray's calls) straight into the trainer's shared memory:
not through Ray's object store. Ray places and starts the agents; loadr
watches them itself (a closed connection, missed heartbeats), sends a lost
agent's batches to the others, and starts another agent in its place (it
waits there until Ray can place it).

Ray is used as the program set it up: the running Ray (``ray.init`` before),
else ``ray.init(address=address)`` (``'auto'``, ``'host:port'``, or None:
``RAY_ADDRESS``, else a local Ray). ``nodes=None``: one agent on every live
node with ``cpus`` CPUs free. ``resources`` (e.g. ``{'cpu_host': 1}``) go
into each bundle, ``runtime_env`` to each actor (``pip``, ``env_vars``,
``working_dir``: what a host needs to import the fns).

``import loadr`` never imports Ray; ``import loadr.ray`` does not either, until
a :class:`Workers` is made: without Ray installed that raises a ConfigError
saying what to install.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .workers.agent import Agent

__all__ = ['Workers', 'START_TIMEOUT_S']

log = logging.getLogger('loadr')

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
INSTALL = "pip install 'loadr-ml[ray]'"


def _ray():
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f'loadr.ray.Workers needs Ray, which is not installed here: '
                          f'{INSTALL}') from exc
    return ray


class Workers:
    """Agents on Ray nodes (see the module docstring): ``nodes`` of them (None: every node
    with ``cpus`` CPUs), ``cpus`` worker processes each."""

    def __init__(self, nodes: int | None = None, cpus: int = 1, address: str | None = None,
                 resources: dict | None = None, runtime_env: dict | None = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        _ray()
        if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int)
                                  or nodes < 1):
            raise ConfigError(f'nodes must be a whole number >= 1 or None, got {nodes!r}')
        if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
            raise ConfigError(f'cpus must be a whole number >= 1, got {cpus!r}')
        self.nodes, self.cpus, self.address = nodes, cpus, address
        self.resources = dict(resources or {})
        self.runtime_env = runtime_env
        self.start_timeout_s = start_timeout_s
        self.agents = nodes or 0
        self.group: Any = None      # Ray's PlacementGroup, once open

    def open(self) -> None:
        """Join Ray (as the program set it up), count the nodes, reserve one bundle a node."""
        ray = _ray()
        from ray.util.placement_group import placement_group

        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=True)
        if self.nodes is None:
            fits = [n for n in ray.nodes() if n.get('Alive')
                    and n.get('Resources', {}).get('CPU', 0) >= self.cpus]
            if not fits:
                raise ConfigError(f'no Ray node has {self.cpus} CPUs for an agent')
            self.agents = len(fits)
        bundle = {'CPU': self.cpus, **self.resources}
        self.group = placement_group([dict(bundle) for _ in range(self.agents)],
                                     strategy='STRICT_SPREAD')
        ready, _ = ray.wait([self.group.ready()], timeout=self.start_timeout_s)
        if not ready:
            from ray.util.placement_group import remove_placement_group
            remove_placement_group(self.group)
            self.group = None
            raise ConfigError(f'Ray could not place {self.agents} agents of {bundle} on '
                              f'{self.agents} different nodes within '
                              f'{self.start_timeout_s:g} s')

    def launch(self, index: int, config) -> _Actor:
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = dict(num_cpus=self.cpus, max_restarts=0, max_concurrency=4,
                       scheduling_strategy=PlacementGroupSchedulingStrategy(
                           self.group, placement_group_bundle_index=index))
        if self.resources:
            options['resources'] = dict(self.resources)
        if self.runtime_env is not None:
            options['runtime_env'] = self.runtime_env
        actor = ray.remote(AgentActor).options(**options).remote(config)
        return _Actor(index, actor)

    def stop_all(self, handles: list) -> None:
        """Stop every agent's pool (STOP, close), then its actor; then the placement group."""
        ray = _ray()
        # Only agents that started: a call to one Ray has not placed yet would wait for it.
        refs = [h.actor.stop.remote() for h in handles
                if h.info is not None and 'error' not in h.info]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT_S)
        for h in handles:
            h.kill()
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group
            try:
                remove_placement_group(self.group)
            except Exception as exc:    # noqa: BLE001 - Ray gone already: nothing to remove
                log.debug('loadr: removing the placement group: %r', exc)
            self.group = None

    def __repr__(self) -> str:
        return f'loadr.ray.Workers(nodes={self.nodes}, cpus={self.cpus})'


class _Actor:
    """The trainer's handle of one agent actor."""

    def __init__(self, index: int, actor):
        self.index, self.actor = index, actor
        self.started = actor.start.remote()
        self.info: dict | None = None

    def ready(self) -> dict | None:
        ray = _ray()
        if self.info is None:
            done, _ = ray.wait([self.started], timeout=0)
            if not done:
                return None
            try:
                self.info = ray.get(self.started)
            except Exception as exc:    # noqa: BLE001 - the actor could not be made: said
                self.info = {'error': f'{type(exc).__name__}: {exc}', 'host': '(a Ray node)'}
        return self.info

    def alive(self) -> bool:
        return True         # the tcp link says when it is not (ZeroMQ, not Ray's checks)

    def kill(self) -> None:
        try:
            _ray().kill(self.actor, no_restart=True)
        except Exception as exc:    # noqa: BLE001 - already gone
            log.debug('loadr: ray.kill of agent %d: %r', self.index, exc)


class AgentActor:
    """What runs as the Ray actor: an :class:`~loadr.workers.agent.Agent` serving on a thread."""

    def __init__(self, config):
        self.config = config
        self.agent: Agent | None = None
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> dict:
        """Listen on this node's address; the agent's report (or its error, naming the host)."""
        import ray

        from .workers.agent import Agent

        try:
            # Ray starts its workers at nice 15; the agent's workers are the job here.
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:
            pass
        try:
            self.config.bind_host = ray.util.get_node_ip_address()
            self.agent = Agent(self.config)
            info = self.agent.start()
        except BaseException as exc:    # noqa: BLE001 - told to the trainer, which raises
            import traceback
            if self.agent is not None:
                self.agent.close()
            return {'error': f'{type(exc).__module__}.{type(exc).__qualname__}: {exc}',
                    'traceback': traceback.format_exc(), 'host': socket.gethostname()}
        self.thread = threading.Thread(target=self._serve, name='loadr-agent', daemon=True)
        self.thread.start()
        return info

    def _serve(self) -> None:
        agent = self.agent
        if agent is None:       # (start() made it before this thread)
            return
        try:
            agent.serve(self.stopping)
        finally:
            agent.close()

    def stop(self) -> None:
        """Stop the agent's pool and socket before the actor goes."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(STOP_TIMEOUT_S)
        if self.agent is not None:
            self.agent.close()
