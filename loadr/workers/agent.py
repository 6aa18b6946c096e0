"""An agent: what runs on another host, a WorkerPool behind a tcp socket.

An engine (:mod:`loadr.remote`, :mod:`loadr.ray`) starts one agent per host
and hands it an :class:`AgentConfig` over its own control plane (a pipe, or
Ray's authenticated calls): the pipeline (reader, fns, spec, order), how many
worker processes to run, and the keys of this run. The agent starts a local
:class:`~loadr.workers.pool.WorkerPool` with its own shared-memory slots, so
crash redo, poison naming, frozen-worker detection and deadlines work on
that host as they do on one machine, and serves the trainer over ZeroMQ tcp:

    trainer -> agent   TASK    protocol.task(header): the trainer's task id,
                               slot, row, seed, start, count, flags
                       CANCEL  wire header(upto): tasks up to this id are stale
                       PING    wire header(n): what is the time on your clock?
    agent -> trainer   DONE    wire header(task id) + msgpack (extras, replaced)
                               + one raw frame per array key: the task's rows
                       FAIL    wire header(task id) + msgpack failure (a Portrait)
                       FATAL   wire header + msgpack failure: no worker can start
                       PONG    wire header(n) + float64: time.perf_counter() here, at once
                       TRACE   wire header(records this agent lost so far) + one raw
                               float64 frame: rows of (worker id, task record), the
                               workers' new trace records (loadr.stats.TaskRing)

When the trainer traces (``AgentConfig.trace_records``), the pool's workers keep
their rings of task records as local workers do, and the agent sends what is new
before each reply (so a task's record comes before its rows) and every
``TRACE_EVERY_S`` besides. The trainer converts the times to its own clock with
the offset its PINGs measured when the link connected.

Trust: the socket is a CURVE server whose ZAP handler admits only the
trainer's key of this run (``allowed``); a connection with any other key,
or none, is refused before a byte of data moves. Nothing read from tcp is
unpickled, on either side: task headers are structs, extras and failures
msgpack (an exception travels as its :class:`~loadr.workers.protocol.Portrait`).

:func:`main` is the process an engine starts with ``python -m
loadr.workers.agent`` (:mod:`loadr.remote`): its config comes on stdin, its
address goes out on stdout as one line, and it ends when stdin closes (the
trainer is gone) or is told to stop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from . import protocol

if TYPE_CHECKING:       # imported where used: an engine imports this module without them
    import zmq
    from zmq.auth.thread import ThreadAuthenticator

    from .pool import WorkerPool
    from .pools import Event

__all__ = ['AgentConfig', 'Agent', 'WIRE_VERSION', 'CANCEL', 'DONE', 'FAIL', 'FATAL',
           'wire_header', 'parse_wire', 'failure_to_wire', 'failure_from_wire',
           'datapoint_digest', 'canary', 'READY_MARK', 'main', 'PING', 'PONG', 'TRACE',
           'TRACE_EVERY_S']

log = logging.getLogger('loadr')

WIRE_VERSION = 1
CANCEL, DONE, FAIL, FATAL = b'C', b'D', b'F', b'X'
PING, PONG, TRACE = b'P', b'O', b'T'
# Trace records waiting for no reply go out at least this often.
TRACE_EVERY_S = 0.25
_CLOCK = struct.Struct('<d')
_WIRE = struct.Struct('<4sBcQ')         # magic, version, kind, task id (or upto)
_MAGIC = b'LDRA'
# The line an agent process prints once it listens (then its JSON): see main().
READY_MARK = 'LOADR-AGENT-READY '
POLL_MS = 200


def wire_header(kind: bytes, task_id: int = 0) -> bytes:
    """The first frame of an agent-protocol message."""
    return _WIRE.pack(_MAGIC, WIRE_VERSION, kind, task_id)


def parse_wire(frame) -> tuple[bytes, int] | None:
    """``(kind, task id)`` of an agent-protocol header; None if ``frame`` is not one."""
    if len(frame) != _WIRE.size:
        return None
    magic, version, kind, task_id = _WIRE.unpack(frame)
    if magic != _MAGIC or version != WIRE_VERSION:
        return None
    return kind, task_id


def _packable(value):
    """What msgpack is given for a value it has no type for: plain data or its repr."""
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)


def failure_to_wire(failure: protocol.Failure, where: str) -> bytes:
    """A worker's failure as msgpack (its pickled exception is left out: the portrait
    carries the class, args and attributes). ``where`` (the host) goes in front of its
    traceback."""
    p = failure.portrait
    portrait = None if p is None else [p.module, p.qualname, list(p.args), p.state,
                                       None if p.oserror is None else list(p.oserror)]
    return msgpack.packb(
        {'type_name': failure.type_name, 'message': failure.message,
         'traceback': f'(on {where})\n{failure.traceback}', 'index': failure.index,
         'position': failure.position, 'worker': failure.worker, 'portrait': portrait},
        default=_packable, use_bin_type=True)


def failure_from_wire(blob: bytes) -> protocol.Failure:
    """The :class:`~loadr.workers.protocol.Failure` of :func:`failure_to_wire`'s bytes."""
    d = msgpack.unpackb(blob, raw=False, use_list=False, strict_map_key=False)
    portrait = None
    if d.get('portrait') is not None:
        module, qualname, args, state, oserror = d['portrait']
        portrait = protocol.Portrait(str(module), str(qualname), tuple(args), dict(state),
                                     None if oserror is None else tuple(oserror))
    return protocol.Failure(str(d['type_name']), str(d['message']), str(d['traceback']),
                            d['index'], d['position'], d['worker'], None, portrait)


def datapoint_digest(dp) -> str:
    """A digest of one datapoint after the fns: arrays by dtype, shape and bytes, other
    values by repr (the canaries an agent and the trainer compare at start)."""
    h = hashlib.sha256()
    items = dp.items() if isinstance(dp, dict) else enumerate(dp)
    for key, value in sorted(items, key=lambda kv: str(kv[0])):
        h.update(str(key).encode())
        if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, '__array__'):
            a = np.ascontiguousarray(np.asarray(value))
            h.update(f'{a.dtype}{a.shape}'.encode())
            h.update(a.tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


@dataclass
class AgentConfig:
    """What an agent needs: the pipeline, its processes, and this run's keys.

    ``recipe`` (a YAML pipeline's text and its folder) replaces ``reader`` and
    ``fns``: the agent rebuilds the pipeline itself, and nothing of the user's
    is pickled. ``canaries`` are stream positions whose datapoints the agent
    digests at start, for the trainer to compare with its own.
    """

    spec: dict
    fields: dict                # array key -> (dtype, shape): the rows sent back
    batch: int
    n: int
    shuffle: bool
    on_error: str
    order_version: int | None
    processes: int
    server_secret: bytes        # this agent's CURVE secret key (z85)
    allowed: list               # the trainers' CURVE public keys (z85) admitted
    reader: object = None
    fns: list = field(default_factory=list)
    recipe: tuple | None = None  # (the YAML's mapping, its folder, ...): rebuilt here, by
    rebuild: Callable[..., Any] | None = None   # loadr.config._remote_section.rebuild
    seed: int = 0
    canaries: list = field(default_factory=list)
    bind_host: str = '127.0.0.1'
    start_method: str = 'fork'
    timeout: float | None = None
    steady_memory: bool | None = None
    name: str = ''              # how the trainer names this agent (for logs)
    # False: plain tcp, on loopback only (Subprocesses(curve=False), to measure CURVE's cost).
    curve: bool = True
    # Records in each worker's trace ring (loadr.stats.TaskRing), sent to the trainer
    # as TRACE messages; 0: the trainer does not trace.
    trace_records: int = 0


def _pipeline(config: AgentConfig):
    """``(reader, fns)``: from the config, or rebuilt from the YAML recipe (by
    ``config.rebuild``, loadr's own function, which the config names by reference)."""
    if config.recipe is None:
        return config.reader, list(config.fns)
    assert config.rebuild is not None, 'a recipe comes with the function that rebuilds it'
    return config.rebuild(*config.recipe)


class Agent:
    """One host's share of the work: a local WorkerPool behind a CURVE ROUTER socket.

    ``start()`` makes the pool and the socket and says where it listens;
    ``serve(stop)`` answers the trainer until ``stop`` is set; ``close()`` stops
    the pool first (its workers and shared memory) and the socket last.
    """

    def __init__(self, config: AgentConfig):
        self.config = config
        # Made by start(): serving needs them, close() gives them back.
        self.pool: WorkerPool | None = None
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self.auth: ThreadAuthenticator | None = None
        self.closed = False
        self.started_at = time.monotonic()

    def start(self) -> dict:
        """Make the pool and the socket; what the engine reports to the trainer (the
        address, loadr's version and file, the canaries' digests)."""
        import zmq
        import zmq.auth.thread

        from ..assemble import Assembler
        from ..order import ORDER_VERSION, order_for
        from .pool import WorkerPool
        from .shm import Layout

        c = self.config
        reader, fns = _pipeline(c)
        layout = Layout(dict(c.fields), c.batch)
        slots = 2 * c.processes + 1
        self.pool = pool = WorkerPool(reader, fns, c.spec, layout, c.processes, slots, c.n,
                                      c.shuffle, c.on_error, c.start_method, c.timeout,
                                      c.order_version, c.steady_memory,
                                      trace_records=c.trace_records)
        # The records of each worker's ring sent so far, and those overwritten unsent.
        self.trace_seen = [0] * c.processes
        self.trace_lost = 0
        self.trace_peer: bytes | None = None
        self.trace_at = time.monotonic()
        # The canaries after the fork: files they open are this process's alone.
        # None: the default, as the workers take it (worker.Steps).
        order = order_for(reader, c.seed, c.shuffle,
                          ORDER_VERSION if c.order_version is None else c.order_version)
        asm = Assembler(reader, fns, c.spec)
        canaries = [canary(asm, order, p) for p in c.canaries]
        self.free = list(range(pool.slot_count))
        self.ctx = ctx = zmq.Context(1)
        if c.curve:
            self.auth = auth = zmq.auth.thread.ThreadAuthenticator(ctx, log=log)
            auth.start()
            allowed = {bytes(k) for k in c.allowed}
            auth.configure_curve_callback('*', _AllowList(allowed))
        elif c.bind_host != '127.0.0.1':
            raise ValueError('an agent speaks plain tcp (curve=False) on loopback only')
        self.sock = sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if c.curve:
            sock.curve_server = True
            sock.curve_secretkey = c.server_secret
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        port = sock.bind_to_random_port(f'tcp://{c.bind_host}')
        # local id -> (peer, header, local slot)
        self.tasks: dict[int, tuple[bytes, protocol.Task, int]] = {}
        self.queue: list[tuple[bytes, protocol.Task]] = []     # not in a worker yet
        self.resend: list[int] = []             # local ids whose worker died
        self.next_id = 0
        self.cancelled = -1                     # the trainer's stale task ids: up to this
        from ..stats import record_width

        return {'host': socket.gethostname(), 'address': c.bind_host, 'port': port,
                'loadr': _loadr().__version__, 'file': _loadr().__file__,
                'protocol': protocol.VERSION, 'wire': WIRE_VERSION, 'pid': os.getpid(),
                'canaries': canaries,
                # Columns of a TRACE row (the worker id, then a task record); 0: no trace.
                'trace_width': 1 + record_width(len(fns)) if c.trace_records else 0}

    # -- serving ---------------------------------------------------------------

    def serve(self, stop: threading.Event) -> None:
        """Answer the trainer until ``stop`` is set."""
        import zmq

        sock, pool = self.sock, self.pool
        assert sock is not None and pool is not None, 'start() first'
        held: tuple | None = None
        poller = zmq.Poller()           # replaced below at once: held is None
        while not stop.is_set() and not pool.closed:
            handles = tuple(pool.waits_on())
            if handles != held:
                poller, held = zmq.Poller(), handles
                poller.register(sock, zmq.POLLIN)
                for h in handles:
                    poller.register(h, zmq.POLLIN)
            poller.poll(POLL_MS)
            while True:
                try:
                    msg = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._take(msg)
            for event in pool.poll(0):
                self._on_event(event)
            self._fill()
            if self.trace_peer is not None and \
                    time.monotonic() - self.trace_at >= TRACE_EVERY_S:
                self._send_trace(self.trace_peer)

    def _take(self, msg: list) -> None:
        if len(msg) < 2:
            return
        peer, head = msg[0], msg[1]
        wire = parse_wire(head)
        if wire is not None:
            if wire[0] == PING:         # answered at once: the trainer times the round trip
                self._send(peer, [wire_header(PONG, wire[1]),
                                  _CLOCK.pack(time.perf_counter())])
            elif wire[0] == CANCEL:
                self.cancelled = max(self.cancelled, wire[1])
                if self.next_id:
                    self._pool().cancel(self.next_id - 1)
                # Tasks not in a worker yet are answered now, empty.
                keep = []
                for p, h in self.queue:
                    if h.task_id <= self.cancelled:
                        self._send(p, [wire_header(DONE, h.task_id)])
                    else:
                        keep.append((p, h))
                self.queue = keep
            return
        try:
            _, header = protocol.parse(head)
        except ValueError:
            return
        if not isinstance(header, protocol.Task):     # what parse() makes of a TASK
            return
        if 0 < header.count <= self.config.batch:
            self.queue.append((peer, header))
            if self._pool().trace_rings is not None:
                self.trace_peer = peer
        else:       # answered, so that the trainer does not wait for it
            failure = protocol.Failure.capture(
                ValueError(f'a task of {header.count} rows for batches of '
                           f'{self.config.batch}'), None, header.start, None)
            self._send(peer, [wire_header(FAIL, header.task_id),
                              failure_to_wire(failure, self._where())])

    def _fill(self) -> None:
        pool = self._pool()
        while self.resend and pool.can_submit():
            lid = self.resend[0]
            peer, header, slot = self.tasks[lid]
            if not pool.submit(protocol.Task(lid, slot, 0, header.seed, header.start,
                                             header.count, header.flags)):
                break
            self.resend.pop(0)
        while self.queue and self.free and pool.can_submit():
            peer, header = self.queue[0]
            lid, slot = self.next_id, self.free[-1]
            if not pool.submit(protocol.Task(lid, slot, 0, header.seed, header.start,
                                             header.count, header.flags)):
                break
            self.queue.pop(0)
            self.free.pop()
            self.next_id += 1
            self.tasks[lid] = (peer, header, slot)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, protocol.Fatal):
            for peer in {p for p, _, _ in self.tasks.values()} | {p for p, _ in self.queue}:
                self._send(peer, [wire_header(FATAL), failure_to_wire(event.failure,
                                                                      self._where())])
            return
        entry = self.tasks.get(event.task_id)
        if entry is None:
            return
        peer, header, slot = entry
        if isinstance(event, protocol.Lost):
            self.resend.append(event.task_id)       # redone here: the host still runs
            return
        del self.tasks[event.task_id]
        if self._pool().trace_rings is not None:
            self._send_trace(peer)          # its record first: the trainer has it with the rows
        try:
            if isinstance(event, protocol.Failed):
                self._send(peer, [wire_header(FAIL, header.task_id),
                                  failure_to_wire(event.failure, self._where())])
            elif header.task_id <= self.cancelled:
                self._send(peer, [wire_header(DONE, header.task_id)])
            else:
                self._send_rows(peer, header, slot, event)
        finally:
            self.free.append(slot)

    def _send_rows(self, peer: bytes, header: protocol.Task, slot: int,
                   event: protocol.Done) -> None:
        try:
            meta = msgpack.packb([event.extras, [list(r) for r in event.replaced]],
                                 use_bin_type=True)
        except (TypeError, ValueError) as exc:
            failure = protocol.Failure.capture(
                TypeError(f'a list value of this batch cannot travel to the trainer as '
                          f'msgpack (remote workers carry list keys as plain data): {exc}'),
                None, header.start, None)
            self._send(peer, [wire_header(FAIL, header.task_id),
                              failure_to_wire(failure, self._where())])
            return
        views = self._pool().views[slot]
        # Copied into ZeroMQ's messages: the slot is reused as soon as this returns.
        frames = [wire_header(DONE, header.task_id), meta]
        frames += [np.ascontiguousarray(views[k][:header.count]).data for k in self.config.fields]
        self._send(peer, frames)

    def _send_trace(self, peer: bytes) -> None:
        """Send the trace records the workers wrote since the last time (if any)."""
        from ..stats import new_records

        self.trace_at = time.monotonic()
        rings, seen = self._pool().trace_rings, self.trace_seen
        assert rings is not None            # sent only when the workers trace
        blocks = []
        for wid, written in enumerate(rings[:, 0, 0].tolist()):
            if written != seen[wid]:
                rows, seen[wid], lost = new_records(rings[wid], seen[wid])
                self.trace_lost += lost
                if len(rows):
                    blocks.append(np.column_stack([np.full(len(rows), float(wid)), rows]))
        if blocks:
            block = np.ascontiguousarray(np.concatenate(blocks), dtype=np.float64)
            if not self._send(peer, [wire_header(TRACE, self.trace_lost), block.data]):
                self.trace_lost += len(block)       # counted in the next one that goes

    def _send(self, peer: bytes, frames: list) -> bool:
        import zmq

        assert self.sock is not None, 'start() first'
        try:
            self.sock.send_multipart([peer, *frames], zmq.NOBLOCK, copy=True)
        except zmq.ZMQError as exc:
            log.debug('loadr agent: a reply could not go out: %r', exc)
            return False
        return True

    def _pool(self) -> WorkerPool:
        """The pool start() made (the agent serves only once started)."""
        assert self.pool is not None, 'start() first'
        return self.pool

    def _where(self) -> str:
        return f'host {socket.gethostname()}, agent {self.config.name or os.getpid()}'

    # -- stopping ----------------------------------------------------------------

    def close(self) -> None:
        """The pool first (its workers and shared memory), then the socket; safe twice."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.pool is not None:
                self.pool.close()
        finally:
            if self.sock is not None:
                self.sock.close(0)
            if self.auth is not None:
                self.auth.stop()
            if self.ctx is not None:
                self.ctx.term()


def canary(asm, order, position: int) -> str:
    """The digest of the datapoint at ``position``, or the name of what it raised (the
    trainer makes the same, and compares)."""
    try:
        return datapoint_digest(asm.datapoint(order.index_at(position),
                                              order.seeds(position, 1)[0]))
    except Exception as exc:    # noqa: BLE001 - compared as it is: the same error, the same
        return f'error {type(exc).__module__}.{type(exc).__qualname__}: {exc}'


def _loadr():
    """The loadr package this process runs (its version and file go into the report)."""
    return sys.modules['loadr']     # imported: this module is inside it (also as __main__)


class _AllowList:
    """ZAP's CURVE check: only this run's trainer keys get in."""

    def __init__(self, allowed: set):
        self.allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        import zmq.utils.z85

        return zmq.utils.z85.encode(key) in self.allowed or key in self.allowed


def _read_config(stream) -> AgentConfig:
    """The config an engine wrote on our stdin: its length, then its pickled bytes.

    A pipe from the process that started us (like multiprocess's spawn), not tcp.
    """
    import dill  # type: ignore[import-untyped]  # dill ships neither types nor stubs

    size = struct.unpack('<Q', stream.read(8))[0]
    return dill.loads(stream.read(size))


def main() -> None:
    """``python -m loadr.workers.agent``: read the config on stdin, listen, print where
    (one line: READY_MARK + JSON, or an error), serve until stdin closes."""
    stdin = sys.stdin.buffer
    out = sys.stdout
    agent = None
    try:
        config = _read_config(stdin)
        agent = Agent(config)
        info = agent.start()
    except BaseException as exc:    # noqa: BLE001 - told to the trainer, which raises it
        import traceback

        out.write(READY_MARK + json.dumps({
            'error': f'{type(exc).__module__}.{type(exc).__qualname__}: {exc}',
            'traceback': traceback.format_exc(), 'host': socket.gethostname()}) + '\n')
        out.flush()
        if agent is not None:
            agent.close()
        return
    out.write(READY_MARK + json.dumps(info) + '\n')
    out.flush()
    stop = threading.Event()
    # The pipe is watched on a descriptor of its own, and sys.stdin is /dev/null: a thread
    # blocked in sys.stdin.read() holds its lock, and a worker forked meanwhile (a
    # replacement) would hang closing its copy of sys.stdin at start.
    pipe = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)

    def watch_stdin():
        # EOF: the trainer closed us, or died (fate-sharing with no engine's help).
        try:
            while os.read(pipe, 4096):
                pass
        finally:
            stop.set()

    threading.Thread(target=watch_stdin, name='loadr-agent-stdin', daemon=True).start()
    try:
        agent.serve(stop)
    finally:
        agent.close()


if __name__ == '__main__':
    main()
