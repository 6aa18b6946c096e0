"""The trainer's side of remote workers: a pool of agents on other hosts.

:class:`RemotePool` offers the window what a :class:`~loadr.workers.pool.WorkerPool`
does (:class:`~loadr.workers.pools.SlotPool`), over agents
(:mod:`loadr.workers.agent`) that an engine started: one ZeroMQ DEALER a
link, a CURVE client whose server key the engine handed out, and the rows of
each answer copied from its frames straight into the trainer's slots.
:class:`HybridPool` puts local workers and agents under one window, local
first (a trainer's own cores are the cheapest).

Liveness, with no help from the engine's health checks: a socket monitor
sees a link's connection close (a killed host, within a second), ZeroMQ
heartbeats a host that stopped answering (frozen, ``HEARTBEAT_TIMEOUT_MS``).
Either way the link is dropped, the agent killed, its tasks reported
``Lost`` (the window sends them again, to anyone) and a new agent started
(at most ``MAX_RESTARTS`` a run). A task whose hosts died with it
``MAX_HOST_DEATHS`` times fails, naming its positions, instead of walking
through the cluster.

Each link holds up to ``DEPTH_PER_PROCESS`` tasks per process of its agent.

Clocks: when a link connects the trainer pings its agent ``PINGS`` times, one
after the other; from the ping with the shortest round trip, the agent's clock
minus the trainer's is ``agent_time - (t_send + t_recv) / 2`` (NTP's estimate, off
by at most half that round trip). A trace (:meth:`RemotePool.trace_to`) gets the
agents' task records with it and shows them on the trainer's clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import msgpack
import numpy as np
import zmq
import zmq.utils.monitor

from ..errors import LoadrError
from . import protocol
from .agent import (
    CANCEL,
    DONE,
    FAIL,
    FATAL,
    PING,
    PONG,
    TRACE,
    AgentConfig,
    canary,
    failure_from_wire,
    parse_wire,
    wire_header,
)
from .pools import Event

if TYPE_CHECKING:
    from .pool import WorkerPool

__all__ = ['RemotePool', 'HybridPool', 'with_agents', 'Engine', 'AgentHandle', 'AgentError',
           'MAX_HOST_DEATHS', 'MAX_RESTARTS', 'DEPTH_PER_PROCESS', 'START_TIMEOUT_S',
           'HEARTBEAT_IVL_MS', 'HEARTBEAT_TIMEOUT_MS', 'PINGS']

log = logging.getLogger('loadr')

MAX_HOST_DEATHS = 3
DEPTH_PER_PROCESS = 2
START_TIMEOUT_S = 120.0
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 3000
MAX_RESTARTS = 8            # per agent slot, a run
PINGS = 4                   # a link's clock pings: the shortest round trip is kept
_MONITORS = itertools.count()     # the links' monitor endpoints, one name each
_DISCONNECTS = (zmq.EVENT_DISCONNECTED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class AgentHandle(Protocol):
    """One agent as its engine started it."""

    def ready(self) -> dict | None:
        """Its report once it listens (address, port, loadr's version and file, canary
        digests, pid; or ``'error'`` and ``'host'`` if it could not start); None until then."""

    def alive(self) -> bool:
        """False once the engine knows it has gone (the link may know first)."""

    def kill(self) -> None:
        """End it now (it froze, or its link was lost)."""


class Engine(Protocol):
    """What starts agents: :class:`loadr.remote.Subprocesses`, :class:`loadr.ray.Workers`."""

    agents: int     # how many agents, known once open() has run
    cpus: int       # worker processes in each

    def open(self) -> None:
        """Join the cluster (or nothing) and reserve room for ``agents`` agents."""

    def launch(self, index: int, config: AgentConfig) -> AgentHandle:
        """Start agent ``index`` with ``config`` (again, in the same place, after a loss)."""

    def stop_all(self, handles: list) -> None:
        """Stop these agents in order: each one's pool first, then the agent."""


class AgentError(LoadrError):
    """An agent could not start, or is not fit to make this run's batches (names the host)."""


@dataclass
class _Link:
    """One agent as the trainer sees it."""

    index: int                  # which of the engine's agents (its place, kept by a restart)
    handle: AgentHandle
    info: dict
    sock: zmq.Socket
    monitor: zmq.Socket         # the socket's monitor: its connection's events
    depth: int
    server_public: bytes
    # task id -> (header, sent at)
    tasks: dict[int, tuple[protocol.Task, float]] = field(default_factory=dict)
    connected: bool = False
    rows: int = 0
    bytes: int = 0
    round_trip_s: float = 0.0   # summed over answered tasks
    answered: int = 0
    # The agent's clock minus ours (perf_counter seconds) and the round trip of the
    # ping it comes from; None until a ping has come back.
    clock_offset_s: float | None = None
    ping_s: float | None = None
    pings: int = 0              # pings sent
    ping_sent: float = 0.0      # when the last one went

    @property
    def name(self) -> str:
        return f"agent {self.index} on {self.info.get('host', '?')}"


class RemotePool:
    """Agents started by ``engine``, writing into ``views`` (see the module docstring).

    ``config`` is what every agent is given (:class:`~loadr.workers.agent.AgentConfig`),
    but for its keys and its name (:meth:`config_for`); ``canaries`` are the digests the
    agents' must match (in the order of ``config.canaries``). Raises :class:`AgentError`
    naming the host when an agent cannot start or differs.
    """

    def __init__(self, engine: Engine, config: AgentConfig, views: list, layout,
                 canaries: list, start_timeout_s: float = START_TIMEOUT_S):
        self.engine = engine
        self.config = config
        self.views = views
        self.layout = layout
        self.slot_count = len(views)
        self.canaries = list(canaries)
        self.closed = False
        self.links: list[_Link] = []
        self.starting: dict[int, tuple] = {}    # index -> (handle, config, started at)
        self.restarts: dict[int, int] = {}
        self.deaths: dict[int, int] = {}        # task id -> hosts that died holding it
        self.agent_deaths = 0
        self.deaths_at: dict[int, int] = {}     # agent index -> its agents lost
        self.cancelled = -1
        # Whether the agents are all there is (no local workers): when the last is lost
        # and none can be started again, nothing can be made.
        self.alone = True
        self.ctx = zmq.Context(1)
        self.client_public, self.client_secret = zmq.curve_keypair()
        self.keys = list(layout.fields)
        self.row_bytes = {k: int(np.dtype(d).itemsize * int(np.prod(s, dtype=np.int64)))
                          for k, (d, s, _) in layout.fields.items()}
        self.poller_for: zmq.Poller | None = None      # made by poll(), over waits_on()
        # trace_to(): where agents' records go
        self.trace_sink: Callable[[dict, np.ndarray], object] | None = None
        try:
            for index in range(engine.agents):
                self._launch(index)
            deadline = time.monotonic() + start_timeout_s
            while self.starting:
                if time.monotonic() > deadline:
                    names = ', '.join(str(i) for i in sorted(self.starting))
                    raise AgentError(f'agents {names} did not start within '
                                     f'{start_timeout_s:g} s')
                self._check_starting(strict=True)
                if self.starting:
                    time.sleep(0.02)
        except BaseException:
            self.close()
            raise

    # -- agents ------------------------------------------------------------------

    def config_for(self, index: int, server_secret: bytes) -> AgentConfig:
        """Agent ``index``'s config: :attr:`config` with its CURVE secret key, this
        trainer's public key as the one admitted, and its name."""
        return dataclasses.replace(self.config, server_secret=server_secret,
                                   allowed=[self.client_public], name=str(index))

    def _launch(self, index: int) -> None:
        server_public, server_secret = zmq.curve_keypair()
        handle = self.engine.launch(index, self.config_for(index, server_secret))
        self.starting[index] = (handle, server_public, time.monotonic())

    def _check_starting(self, strict: bool) -> None:
        """Connect the agents that have said where they listen. ``strict`` (at start): an
        agent that failed or differs raises; later it is logged and started again."""
        for index, (handle, server_public, _) in list(self.starting.items()):
            try:
                info = handle.ready()
                if info is None:
                    continue
                del self.starting[index]
                self._check_fit(index, info)
            except AgentError as exc:
                self.starting.pop(index, None)
                handle.kill()
                if strict:
                    raise
                log.warning('loadr: %s', exc)
                self._restart(index)
                continue
            self._connect(index, handle, info, server_public)

    def _check_fit(self, index: int, info: dict) -> None:
        loadr = sys.modules[__name__.partition('.')[0]]     # the package this process runs
        host = info.get('host', '?')
        where = f'agent {index} on host {host}'
        if 'error' in info:
            raise AgentError(f"{where} could not start: {info['error']}\n\n"
                             f"Agent traceback:\n{info.get('traceback', '')}")
        if info.get('loadr') != loadr.__version__ or info.get('protocol') != \
                protocol.VERSION:
            raise AgentError(f"{where} runs loadr {info.get('loadr')} (protocol "
                             f"{info.get('protocol')}, from {info.get('file')}), this process "
                             f"loadr {loadr.__version__} (protocol {protocol.VERSION}): "
                             f"install the same version on every host")
        theirs = list(info.get('canaries', []))
        if theirs != self.canaries:
            errors = [c for c in theirs if c.startswith('error ') and c not in self.canaries]
            why = f': there, {errors[0][6:]}' if errors else ''
            raise AgentError(f'{where} makes other datapoints than this process from the same '
                             f'positions (canary digests differ){why}; the hosts must run the '
                             f'same fns and packages, and read the data by URL or from a '
                             f'shared path')

    def _connect(self, index: int, handle, info: dict, server_public: bytes) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if getattr(self.engine, 'curve', True):
            sock.curve_serverkey = server_public
            sock.curve_publickey = self.client_public
            sock.curve_secretkey = self.client_secret
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
        # A lost link is dropped, never reconnected: a new agent comes as a new link.
        sock.setsockopt(zmq.RECONNECT_IVL, -1)
        # A name of its own: pyzmq's default (inproc://monitor.s-<fd>) is taken again by a
        # new link whose socket got a lost link's fd before that monitor's endpoint was
        # released ("Address already in use").
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                                          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                                          | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                          | zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                                          addr=f'inproc://loadr.link-monitor.{next(_MONITORS)}')
        sock.connect(f"tcp://{info['address']}:{info['port']}")
        depth = DEPTH_PER_PROCESS * max(1, int(self.engine.cpus))
        link = _Link(index, handle, info, sock, monitor, depth, server_public)
        self.links.append(link)
        self.poller_for = None
        self._ping(link)        # queued before any task: its answer comes before any record

    def _ping(self, link: _Link) -> None:
        link.pings += 1
        link.ping_sent = time.perf_counter()
        try:
            link.sock.send(wire_header(PING, link.pings), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _pong(self, link: _Link, seq: int, frames: list) -> None:
        received = time.perf_counter()
        if seq != link.pings or len(frames) != 1 or len(frames[0].buffer) != 8:
            return          # a stale or odd answer: not timed
        rtt = received - link.ping_sent
        if link.ping_s is None or rtt < link.ping_s:
            theirs = float(np.frombuffer(frames[0].buffer, dtype='<f8')[0])
            link.ping_s = rtt
            link.clock_offset_s = theirs - (link.ping_sent + received) / 2
        if link.pings < PINGS:
            self._ping(link)

    def _trace(self, link: _Link, lost: int, frames: list) -> None:
        width = int(link.info.get('trace_width') or 0)
        if len(frames) != 1 or not width:
            raise _BadReply('trace records without a trace')
        buf = frames[0].buffer
        if len(buf) % (8 * width):
            raise _BadReply(f'{len(buf)} bytes of trace records of {width} columns')
        sink = self.trace_sink
        if sink is not None:
            rows = np.frombuffer(buf, dtype='<f8').reshape(-1, width)
            sink({'agent': link.index, 'host': link.info.get('host', '?'),
                  'pid': link.info.get('pid', 0), 'clock_offset_s': link.clock_offset_s,
                  'round_trip_s': link.ping_s, 'lost': lost}, rows)

    def trace_to(self, sink) -> None:
        """From now on give the task records the agents send to ``sink(source, rows)``
        (:meth:`loadr.stats.Tracer.remote`); None: drop them."""
        self.trace_sink = sink

    def _restart(self, index: int) -> None:
        self.restarts[index] = self.restarts.get(index, 0) + 1
        if self.restarts[index] > MAX_RESTARTS:
            log.warning('loadr: agent %d was started %d times; not again', index,
                        MAX_RESTARTS)
            return
        try:
            self._launch(index)
        except Exception as exc:    # noqa: BLE001 - the others go on; the run with them
            log.warning('loadr: agent %d could not be started again: %s', index, exc)

    def _lose(self, link: _Link, why: str) -> list:
        """Drop ``link``: kill its agent, report its tasks lost (or failed, past the bound),
        start another agent in its place."""
        self.links.remove(link)
        self.poller_for = None
        link.sock.close(0)
        link.monitor.close(0)
        self.agent_deaths += 1
        self.deaths_at[link.index] = self.deaths_at.get(link.index, 0) + 1
        try:
            link.handle.kill()
        except Exception as exc:    # noqa: BLE001 - it is gone either way
            log.debug('loadr: killing %s: %r', link.name, exc)
        log.warning('loadr: %s %s; %s', link.name, why,
                    'its batches are redone elsewhere' if link.tasks else 'starting another')
        events: list[Event] = []
        for tid, (header, _) in link.tasks.items():
            deaths = self.deaths[tid] = self.deaths.get(tid, 0) + 1
            if deaths >= MAX_HOST_DEATHS:
                last = header.start + header.count - 1
                message = (f'stream positions {header.start}..{last} were in hand on '
                           f'{deaths} remote hosts that died or froze (the last: {link.name}, '
                           f'{why}); not sent to another one')
                events.append(protocol.Failed(tid, protocol.Failure(
                    'loadr.errors.WorkerError', message, '', None, header.start, None)))
            else:
                events.append(protocol.Lost(tid))
        self._restart(link.index)
        return events

    # -- the window's interface ------------------------------------------------------

    def can_submit(self) -> bool:
        return any(len(link.tasks) < link.depth for link in self.links)

    def submit(self, task: protocol.Task) -> bool:
        """Send ``task`` to the least busy agent with room; False if none has room."""
        room = [link for link in self.links if len(link.tasks) < link.depth]
        if not room:
            return False
        link = min(room, key=lambda k: len(k.tasks) / k.depth)
        try:
            link.sock.send(protocol.task(task)[0], zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        link.tasks[task.task_id] = (task, time.monotonic())
        return True

    def cancel(self, upto: int) -> None:
        """Every task up to ``upto`` is stale: the agents answer them empty."""
        if self.closed:
            return
        self.cancelled = max(self.cancelled, upto)
        for link in self.links:
            try:
                link.sock.send(wire_header(CANCEL, upto), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def waits_on(self) -> list:
        """The sockets :meth:`poll` waits on."""
        return [s for link in self.links for s in (link.sock, link.monitor)]

    def poll(self, timeout_ms: int) -> list:
        """Wait up to ``timeout_ms``; the events (protocol.Done, Failed, Lost, Fatal)."""
        if self.starting:
            self._check_starting(strict=False)
            if self.starting and timeout_ms > 50:
                timeout_ms = 50     # look at the agents being started again soon
        poller = self.poller_for
        if poller is None:
            poller = zmq.Poller()
            for s in self.waits_on():
                poller.register(s, zmq.POLLIN)
            self.poller_for = poller
        if self.links:
            poller.poll(timeout_ms)
        elif timeout_ms:
            time.sleep(timeout_ms / 1000)
        return self.take()

    def take(self) -> list:
        """The events waiting now (no wait)."""
        events = []
        for link in list(self.links):
            lost = None
            while True:
                try:
                    msg = link.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    events += self._receive(link, msg)
                except _BadReply as exc:
                    lost = f'sent a reply that is not loadr\'s ({exc})'
                    break
            while lost is None:
                try:
                    event = zmq.utils.monitor.recv_monitor_message(link.monitor, zmq.NOBLOCK)
                except zmq.Again:
                    break
                if event['event'] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    link.connected = True
                elif event['event'] in _DISCONNECTS:
                    lost = ('stopped answering' if event['event'] == zmq.EVENT_DISCONNECTED
                            else 'refused this run\'s key')
            if lost is None and not link.handle.alive():
                lost = 'has exited'
            if lost is not None:
                events += self._lose(link, lost)
        if self.alone and not self.links and not self.starting and not self.closed:
            self.closed_for = 'every agent was lost and none could be started again'
            events.append(protocol.Fatal(protocol.Failure(
                'loadr.errors.WorkerError', f'no remote worker left: {self.closed_for} '
                f'(see the warnings above)', '', None, None, None)))
        return events

    def _receive(self, link: _Link, msg: list) -> list:
        wire = parse_wire(msg[0].bytes)
        if wire is None:
            raise _BadReply('unknown header')
        kind, tid = wire
        if kind == PONG:
            self._pong(link, tid, msg[1:])
            return []
        if kind == TRACE:
            self._trace(link, tid, msg[1:])
            return []
        if kind == FATAL:
            failure = failure_from_wire(msg[1].bytes)
            failure.message = f'{link.name}: {failure.message}'
            return [protocol.Fatal(failure)]
        entry = link.tasks.pop(tid, None)
        if entry is None:
            return []
        header, sent = entry
        link.answered += 1
        link.round_trip_s += time.monotonic() - sent
        self.deaths.pop(tid, None)
        if kind == FAIL:
            return [protocol.Failed(tid, failure_from_wire(msg[1].bytes))]
        if kind != DONE:
            raise _BadReply(f'kind {kind!r}')
        if len(msg) == 1:
            if tid <= self.cancelled:
                return [protocol.Done(tid, {}, [])]
            raise _BadReply('no rows for a live task')
        if len(msg) != 2 + len(self.keys):
            raise _BadReply(f'{len(msg) - 2} row frames for {len(self.keys)} keys')
        count, row = header.count, header.row
        views = self.views[header.slot]
        for key, frame in zip(self.keys, msg[2:]):
            buf = frame.buffer
            if len(buf) != count * self.row_bytes[key]:
                raise _BadReply(f'{len(buf)} bytes for {count} rows of {key!r}')
            dst = views[key][row:row + count]
            dst[...] = np.frombuffer(buf, dtype=dst.dtype).reshape(dst.shape)
            link.bytes += len(buf)
        link.rows += count
        extras, replaced = msgpack.unpackb(msg[1].bytes, raw=False, strict_map_key=False)
        return [protocol.Done(tid, extras, [tuple(r) for r in replaced])]

    # -- what the Loader reads ------------------------------------------------------

    def agent_rows(self) -> list[dict]:
        """One dict per live agent: host, rows, bytes, tasks in flight, round trip."""
        return [{'agent': link.index, 'host': link.info.get('host'),
                 'rows': link.rows, 'bytes': link.bytes, 'in_flight': len(link.tasks),
                 'round_trip_s': link.round_trip_s / link.answered if link.answered else None,
                 'deaths': self.deaths_at.get(link.index, 0)}
                for link in self.links]

    @property
    def processes(self) -> int:
        return self.engine.agents * int(self.engine.cpus)

    def close(self) -> None:
        """Stop the agents (their pools first), close the sockets; safe twice."""
        if self.closed:
            return
        self.closed = True
        handles = [link.handle for link in self.links] + \
            [h for h, _, _ in self.starting.values()]
        for link in self.links:
            link.sock.close(0)
            link.monitor.close(0)
        self.links, self.starting = [], {}
        try:
            self.engine.stop_all(handles)
        finally:
            self.ctx.term()


def with_agents(local: WorkerPool, engine: Engine, config: AgentConfig, asm,
                order) -> HybridPool:
    """``local`` and the agents ``engine`` starts (each given ``config``, see
    :meth:`RemotePool.config_for`), writing into ``local``'s slots, under one
    :class:`HybridPool`.

    Every agent digests the datapoints at the stream positions ``config.canaries``
    at start, and must find what ``asm`` (an :class:`~loadr.assemble.Assembler` of
    the same reader, fns and spec) makes of them here in ``order``: else it is
    refused (:class:`AgentError`, naming its host). ``local`` stays the caller's
    to close if this raises.
    """
    canaries = [canary(asm, order, p) for p in config.canaries]
    return HybridPool(local, RemotePool(engine, config, local.views, local.layout, canaries))


class _BadReply(Exception):
    pass


class HybridPool:
    """Local workers (a :class:`~loadr.workers.pool.WorkerPool`, whose slots both share)
    and agents under one window: a task goes to a local worker when one has room, else
    to an agent."""

    def __init__(self, local: WorkerPool, remote: RemotePool):
        self.local, self.remote = local, remote
        remote.alone = not local.pids
        self.slot_count = local.slot_count
        self.views = local.views
        self.layout = local.layout
        self.closed = False
        # What poll() waits on, and the poller made for it (kept while it is the same).
        self.poller_for: tuple[list, zmq.Poller] | None = None

    def fresh_views(self, slot: int):
        return self.local.fresh_views(slot)

    def slot_buffers(self) -> list:
        return self.local.slot_buffers()

    def can_submit(self) -> bool:
        return self.local.can_submit() or self.remote.can_submit()

    def submit(self, task: protocol.Task) -> bool:
        if self.local.can_submit() and self.local.submit(task):
            return True
        return self.remote.submit(task)

    def cancel(self, upto: int) -> None:
        self.local.cancel(upto)
        self.remote.cancel(upto)

    @property
    def trace_rings(self):
        """The local workers' trace rings (None when not tracing; the agents' records come
        through :meth:`trace_to`)."""
        return self.local.trace_rings

    def trace_to(self, sink) -> None:
        """Where the agents' task records go (:meth:`RemotePool.trace_to`)."""
        self.remote.trace_to(sink)

    def poll(self, timeout_ms: int) -> list:
        handles = self.local.waits_on() + self.remote.waits_on()
        if self.remote.starting:
            timeout_ms = min(timeout_ms, 50)
        held = self.poller_for
        if held is None or held[0] != handles:
            poller = zmq.Poller()
            for h in handles:
                poller.register(h, zmq.POLLIN)
            self.poller_for = held = (handles, poller)
        held[1].poll(timeout_ms)
        return self.local.poll(0) + self.remote.poll(0)

    @property
    def pids(self) -> list[int]:
        return self.local.pids

    def stats_rows(self) -> np.ndarray:
        return self.local.stats_rows()

    def private_memory(self, max_age_s: float = 1.0) -> dict[int, int]:
        return self.local.private_memory(max_age_s)

    def agent_rows(self) -> list[dict]:
        return self.remote.agent_rows()

    def close(self) -> None:
        """The agents first, then the local workers and the slots; safe twice."""
        self.closed = True
        try:
            self.remote.close()
        finally:
            self.local.close()


if TYPE_CHECKING:
    from .pools import Pool

    def _offer_pool(hybrid: HybridPool, local: WorkerPool) -> tuple[Pool, Pool]:
        """Never run: mypy checks here that both pools are what the Loader takes (pools.py)."""
        return hybrid, local
