"""A timeline of a loader in the Trace Event format (what ui.perfetto.dev and chrome://tracing
open): :class:`Tracer` in the main process, :class:`TaskRing` in each worker.

A worker writes one fixed-size record per task (:data:`RECORD`, then one column per fn)
into a ring of float64 rows beside its stage counters in the pool's status segment:
the same shared memory ``loader.stats()`` reads, so nothing is pickled and no message
is added. The first row of a ring is its header: how many records were ever written.
The main process copies the new records out every few batches it hands out
(:meth:`Tracer.drain`) into a ring of its own per process (:class:`Rows`, one float64
array), of the last ``events`` records, so tracing a month of training holds a fixed
amount of memory: about ``8 * events * (9 + fns)`` bytes per worker process seen.

The times are ``time.perf_counter()``, as the stage counters read them: on Linux that
is ``clock_gettime(CLOCK_MONOTONIC)``, one clock for every process of a host (counted
from boot), so the workers' spans and the main process's waits line up with no
offset to guess. Another host's clock is not comparable.

Remote workers (agents, :mod:`loadr.workers.agent`) keep the same rings in their
host's pool; the agent sends their new records to the trainer over its tcp link (raw
float64 rows, before each reply), and :meth:`Tracer.remote` keeps them, a track per
worker process, grouped by agent. Their times are the agent host's clock, converted to
this one with an offset estimated when the link connects, NTP-style: the trainer
pings, the agent answers with its clock, ``offset = agent_time - (t_send + t_recv) / 2``
from the ping with the shortest round trip (error at most half of it; about 0 on one
host). The trace's ``otherData`` says each agent's offset and round trip.

A task's stages are laid end to end inside its span, in pipeline order (read, each fn,
write), each as long as ``loader.stats()`` counts it for that task: the stage split is
timed on a sample of the rows and scaled to the task's measured time, and the rows of
a batch interleave the stages, so a stage span says how much of the task went there,
not when.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time

import numpy as np

from ._accounting import WORKER_FIELDS

__all__ = ['Tracer', 'TaskRing', 'Rows', 'RECORD', 'WORKER_RECORDS', 'TRACE_EVENTS', 'record_width',
           'ring_rows', 'new_records', 'CLOCK', 'AGENT_CLOCKS']

# One task's record: the worker's pid, when the task came and when its reply was ready
# (perf_counter seconds), the task id, its first stream position, its datapoints,
# whether its batch was made (0: cancelled or failed), then the stage seconds: read,
# write, then one column per fn.
RECORD = ('pid', 'begin', 'end', 'task', 'position', 'count', 'filled', 'read', 'write')
PID, BEGIN, END, TASK, POSITION, COUNT, FILLED, READ, WRITE = range(len(RECORD))
# Records a worker's ring holds between two drains. A worker makes a task's record
# for about every batch handed out (a few more while the window ramps up), so
# draining every DRAIN_EVERY batches leaves room for the tasks in flight too.
WORKER_RECORDS = 256
DRAIN_EVERY = 16
# The read-ahead counters are read at most this often (a copy of every worker's row).
LEVELS_EVERY_S = 0.01
# Events kept per process by default: the last ones.
TRACE_EVENTS = 100_000
CLOCK = time.get_clock_info('perf_counter').implementation
# What the trace's otherData says of remote workers' times.
AGENT_CLOCKS = ("an agent's times are its host's clock minus its clock_offset_s, estimated when "
                "its link connected from the ping with the shortest round trip: offset = "
                "agent_time - (t_send + t_recv) / 2, off by at most round_trip_s / 2")
# Where remote workers' tracks sort: after the local workers, grouped by agent.
_AGENT_SORT = 1000
_IN_FLIGHT = WORKER_FIELDS.index('net_in_flight')
_AHEAD = WORKER_FIELDS.index('net_ahead_bytes')


def record_width(fns: int) -> int:
    """float64 columns of a task record with ``fns`` fns."""
    return len(RECORD) + fns


def ring_rows(records: int = WORKER_RECORDS) -> int:
    """Rows of a worker's ring: its header row, then ``records`` records."""
    return records + 1


def new_records(ring, seen: int) -> tuple:
    """``(rows, written, lost)``: a copy of the records of ``ring`` (a :class:`TaskRing`'s
    array, written to by a running worker) after the first ``seen``, oldest first; how
    many it has ever written; how many of the new ones were overwritten before they could
    be copied (dropped, never misread).

    >>> rows = np.zeros((ring_rows(2), record_width(0)))
    >>> ring = TaskRing(rows, pid=7)
    >>> for t in range(3):
    ...     ring.current = (t, 8 * t, 8); ring.task(t, t + 0.5, (0, 0, [], 8, 1))
    >>> got, written, lost = new_records(rows, 0)
    >>> got[:, TASK].tolist(), written, lost
    ([1.0, 2.0], 3, 1)
    """
    written = int(ring[0, 0])
    if written == seen:
        return ring[1:1].copy(), seen, 0
    records = len(ring) - 1
    first = max(seen, written - records)
    lost = first - seen
    a, b = 1 + first % records, 1 + (written - 1) % records + 1
    rows = ring[a:b].copy() if a < b else np.concatenate([ring[a:], ring[1:b]])
    # Records the worker overwrote while they were copied are dropped, not misread.
    over = int(ring[0, 0]) - records - first
    if over > 0:
        lost += min(over, len(rows))
        rows = rows[over:]
    return rows, written, lost


class TaskRing:
    """The writing end: one record per task into ``rows`` (a float64 array of
    ``ring_rows()`` rows by ``record_width(fns)``, over shared memory in a worker).

    :attr:`current` is the task in hand, ``(task id, position, count)``, set by the
    worker loop; :meth:`task` is called by the stage clock once the task's stages are
    known. The header's count is written after the record, so a reader that sees the
    count sees the record.

    >>> import numpy as np
    >>> rows = np.zeros((ring_rows(4), record_width(1)))
    >>> ring = TaskRing(rows, pid=7)
    >>> ring.current = (3, 640, 64)
    >>> ring.task(1.0, 1.5, (0.1, 0.05, [0.3], 64, 1))
    >>> int(rows[0, 0]), rows[1].tolist()
    (1, [7.0, 1.0, 1.5, 3.0, 640.0, 64.0, 1.0, 0.1, 0.05, 0.3])
    """

    def __init__(self, rows, pid: int | None = None):
        self.rows = rows
        self.records = len(rows) - 1
        self.pid = float(os.getpid() if pid is None else pid)
        self.current: tuple[int, int, int] | None = None

    def task(self, begin: float, end: float, fill) -> None:
        """A task ran from ``begin`` to ``end``; ``fill`` is the stage clock's
        ``(read, write, fns, samples, batches)``."""
        read, write, fns, samples, batches = fill
        task, position, count = self.current if self.current is not None \
            else (-1, -1, samples)
        rows = self.rows
        n = int(rows[0, 0])
        rows[1 + n % self.records] = [self.pid, begin, end, task, position, count, batches,
                                      read, write, *fns]
        rows[0, 0] = n + 1

    def label_last(self, task: int, position: int, count: int) -> None:
        """Name the last record's task, made before it was known (``workers=0``: the
        loader learns which batch it made once it is made)."""
        n = int(self.rows[0, 0])
        if n:
            self.rows[1 + (n - 1) % self.records, TASK:COUNT + 1] = (task, position, count)


class Rows:
    """The last ``capacity`` rows of ``width`` float64 columns, in one array made once.

    >>> kept = Rows(3, 2)
    >>> kept.extend(np.arange(10.0).reshape(5, 2)); kept.append((10.0, 11.0))
    >>> kept.rows().tolist(), kept.count
    ([[6.0, 7.0], [8.0, 9.0], [10.0, 11.0]], 6)
    """

    def __init__(self, capacity: int, width: int):
        # Pages never written are never resident: a short trace costs what it holds.
        self.data = np.empty((capacity, width))
        self.count = 0                  # rows ever added

    def append(self, row) -> None:
        self.data[self.count % len(self.data)] = row
        self.count += 1

    def extend(self, rows) -> None:
        """Add the rows of a 2-D array, oldest first."""
        capacity, n = len(self.data), len(rows)
        if n > capacity:
            self.count += n - capacity
            rows, n = rows[-capacity:], capacity
        self.data[(self.count + np.arange(n)) % capacity] = rows
        self.count += n

    def rows(self):
        """The rows kept, oldest first."""
        capacity = len(self.data)
        if self.count <= capacity:
            return self.data[:self.count]
        at = self.count % capacity
        return np.concatenate([self.data[at:], self.data[:at]])


class Tracer:
    """The main process's side: its own events, the workers' records, the file.

    ``path``: where :meth:`write` puts the trace; ``fn_names``: the stage names;
    ``batches``: stop after this many batches handed out (None: never), then
    :attr:`done` is True; ``events``: what is kept per process (the last ones).
    """

    def __init__(self, path, fn_names: list, batches: int | None = None,
                 events: int = TRACE_EVENTS):
        self.path = os.fspath(path)
        self.fn_names = list(fn_names)
        self.batches = batches
        self.events = int(events)
        self.handed_out = 0
        self.done = False
        self.pid = os.getpid()
        # The training process's batches: asked, handed, step, next step, samples, tasks
        # in flight, batches ready (NaN: no window to ask).
        self.main = Rows(self.events, 7)
        # pid -> its task records (Rows of RECORD); pid -> worker id (None: this process)
        self.tasks: dict[int, Rows] = {}
        self.who: dict[int, int | None] = {}
        self.lost = 0                   # records overwritten in a worker before a drain
        self.tid = threading.get_native_id()
        # worker id -> its latest pid, and its read-ahead levels over time (counters)
        self._pid_of: dict[int, int] = {}
        self.levels = Rows(self.events, 4)      # when, pid, requests in flight, bytes ahead
        self._pool = None
        self._levels_seen = False
        self._levels_at = 0.0
        self._seen: list[int] = []              # records read so far, per worker id
        self._inline: TaskRing | None = None    # workers=0: the ring of this process
        self._inline_seen = 0
        # Remote workers: (agent, agent pid, worker pid) -> its task records; -> (agent,
        # host, worker id); (agent, agent pid) -> what its link says (clock offset, ...).
        self.remote_tasks: dict[tuple, Rows] = {}
        self.remote_who: dict[tuple, tuple] = {}
        self.agents: dict[tuple, dict] = {}

    # -- sources ---------------------------------------------------------

    def attach(self, pool) -> None:
        """Read the records of ``pool``'s workers (its ``trace_rings``) from now on."""
        rings = pool.trace_rings
        self._pool = pool
        self._seen = [int(r[0, 0]) for r in rings]      # what an earlier tracer read
        trace_to = getattr(pool, 'trace_to', None)
        if trace_to is not None:                        # agents: their records come to us
            trace_to(self.remote)

    def inline_ring(self) -> TaskRing:
        """A ring for the pipeline run in this process (``workers=0``)."""
        ring = self._inline = TaskRing(np.zeros((ring_rows(), record_width(len(self.fn_names)))))
        self._inline_seen = 0
        return ring

    @property
    def inline(self) -> TaskRing | None:
        """The ring of the pipeline run in this process, if any (:meth:`inline_ring`)."""
        return self._inline

    def detach(self) -> None:
        """Stop reading the pool (drain first): it is about to close."""
        trace_to = getattr(self._pool, 'trace_to', None)
        if trace_to is not None:
            trace_to(None)
        self._pool = None

    def drain(self) -> None:
        """Copy the records written since the last drain into the per-process rings."""
        pool = self._pool
        rings = getattr(pool, 'trace_rings', None) if pool is not None else None
        if rings is not None:
            seen = self._seen
            for wid, written in enumerate(rings[:, 0, 0].tolist()):
                if written != seen[wid]:
                    seen[wid] = self._take(rings[wid], seen[wid], wid)
            now = time.perf_counter()
            if now - self._levels_at >= LEVELS_EVERY_S:
                self._levels_at = now
                self._read_levels(pool, now)
        if self._inline is not None:
            self._inline_seen = self._take(self._inline.rows, self._inline_seen, None)

    def _take(self, ring, seen: int, wid: int | None) -> int:
        rows, written, lost = new_records(ring, seen)
        self.lost += lost
        if not len(rows):
            return written
        pids = rows[:, PID]
        for pid in {int(p) for p in pids}:          # one, but where a worker was replaced
            kept = self.tasks.get(pid)
            if kept is None:
                kept = self.tasks[pid] = Rows(self.events, rows.shape[1])
                self.who[pid] = wid
            kept.extend(rows[pids == pid] if len(pids) > 1 else rows)
            if wid is not None:
                self._pid_of[wid] = int(pids[-1])
        return written

    def remote(self, source: dict, rows) -> None:
        """Records an agent sent: ``rows`` (float64) are its worker id, then a task record,
        in the agent's clock; ``source`` says which agent (``agent``, ``host``, ``pid``) and
        its clock (``clock_offset_s``: its clock minus ours; ``round_trip_s``), and
        ``lost``, the records it could not send so far."""
        key = (int(source['agent']), int(source['pid']))
        self.agents[key] = dict(source)
        if rows.ndim != 2 or rows.shape[1] != 1 + record_width(len(self.fn_names)):
            self.lost += len(rows)          # another pipeline's records: not ours to show
            return
        # Kept in the agent's clock: the offset is applied when the trace is written, the
        # link's last (best) one to every record, so that pings that improve it mid-run
        # never move one span of a track against the next (they would overlap).
        records = rows[:, 1:]
        wids, pids = rows[:, 0], records[:, PID]
        for wid, pid in {(int(w), int(p)) for w, p in zip(wids.tolist(), pids.tolist())}:
            track = (*key, pid)
            kept = self.remote_tasks.get(track)
            if kept is None:
                kept = self.remote_tasks[track] = Rows(self.events, records.shape[1])
                self.remote_who[track] = (key[0], str(source.get('host', '?')), wid)
            mine = (wids == wid) & (pids == pid)
            kept.extend(records if mine.all() else records[mine])

    def _read_levels(self, pool, now: float) -> None:
        # A remote reader's bytes read ahead and requests in flight, per worker, from the
        # stage counters' row (levels, not counts); none while they stay 0.
        rows = pool.stats_rows()
        for wid, row in enumerate(rows):
            in_flight, ahead = float(row[_IN_FLIGHT]), float(row[_AHEAD])
            pid = self._pid_of.get(wid)
            if pid is not None and (in_flight or ahead or self._levels_seen):
                self._levels_seen = True
                self.levels.append((now, pid, in_flight, ahead))

    # -- the main process ------------------------------------------------

    def handed(self, asked: float, handed: float, step: int, next_step: int, samples: int,
               in_flight: int | None = None, ready: int | None = None) -> None:
        """A batch went to the caller, who asked for it at ``asked``: its wait, the batch,
        the window's depth; every ``DRAIN_EVERY`` batches, the workers' new records."""
        self.main.append((asked, handed, step, next_step, samples,
                          math.nan if in_flight is None else in_flight,
                          math.nan if ready is None else ready))
        self.handed_out += 1
        if self.handed_out % DRAIN_EVERY == 0:
            self.drain()
        if self.batches is not None and self.handed_out >= self.batches:
            self.done = True

    # -- the file --------------------------------------------------------

    def trace_events(self) -> list[dict]:
        """The events so far, as Trace Event dicts (``X`` spans, ``i`` instants, ``C``
        counters, ``M`` names)."""
        us = 1e6
        events = [_meta(self.pid, self.tid, 'process_name', 'loadr: training process'),
                  _meta(self.pid, self.tid, 'process_sort_index', 0, key='sort_index'),
                  _meta(self.pid, self.tid, 'thread_name', 'iterating thread')]
        for asked, handed, step, next_step, samples, in_flight, ready in self.main.rows().tolist():
            step, next_step, samples = int(step), int(next_step), int(samples)
            events.append({'name': 'loadr: wait for batch', 'cat': 'main', 'ph': 'X',
                           'ts': asked * us, 'dur': max(0.0, handed - asked) * us,
                           'pid': self.pid, 'tid': self.tid, 'args': {'step': step}})
            events.append({'name': 'batch', 'cat': 'main', 'ph': 'i', 's': 't',
                           'ts': handed * us, 'pid': self.pid, 'tid': self.tid,
                           'args': {'step': step, 'next_step': next_step,
                                    'samples': samples}})
            if not math.isnan(in_flight):
                events.append({'name': 'window', 'cat': 'main', 'ph': 'C', 'ts': handed * us,
                               'pid': self.pid, 'tid': self.tid,
                               'args': {'tasks in flight': int(in_flight),
                                        'batches ready': int(ready)}})
        for now, pid, in_flight, ahead in self.levels.rows().tolist():
            events.append({'name': 'read ahead', 'cat': 'worker', 'ph': 'C', 'ts': now * us,
                           'pid': int(pid), 'tid': int(pid),
                           'args': {'requests in flight': in_flight, 'bytes ahead': ahead}})
        stages = ['read', *self.fn_names, 'write']
        for pid, records in self.tasks.items():
            wid = self.who[pid]
            if wid is None:
                tid = self.tid          # workers=0: the pipeline runs in the iterating thread
            else:
                tid = pid
                events += [_meta(pid, tid, 'process_name', f'loadr worker {wid}'),
                           _meta(pid, tid, 'process_sort_index', wid + 1, key='sort_index'),
                           _meta(pid, tid, 'thread_name', f'worker {wid} (pid {pid})')]
            events += _task_events(records, pid, tid, stages)
        # Remote workers: a track each, named by agent and host, sorted by agent. A pid of
        # another host may be one of this host's: such a track gets a pid of its own.
        taken = {self.pid, *self.tasks}
        for (agent, agent_pid, pid), records in sorted(self.remote_tasks.items()):
            _, host, wid = self.remote_who[(agent, agent_pid, pid)]
            shown = pid
            while shown in taken:
                shown += 1 << 22            # past Linux's largest pid
            taken.add(shown)
            events += [_meta(shown, shown, 'process_name',
                             f'agent {agent} ({host}) worker {wid}'),
                       _meta(shown, shown, 'process_sort_index',
                             _AGENT_SORT * (agent + 1) + wid, key='sort_index'),
                       _meta(shown, shown, 'thread_name',
                             f'worker {wid} (pid {pid} on {host}, agent pid {agent_pid})')]
            offset = float(self.agents[(agent, agent_pid)].get('clock_offset_s') or 0.0)
            events += _task_events(records, shown, shown, stages, offset)
        return events

    def write(self, path=None) -> str:
        """Write the trace (to ``path``, default the tracer's) as Trace Event JSON; the
        path written."""
        self.drain()
        if self.done:
            # Its last batch is out and the loader lets it go: the agents' records stop
            # coming here, or they would fill its rings for nothing.
            self.detach()
        path = self.path if path is None else os.fspath(path)
        other = {'producer': 'loadr', 'clock': CLOCK,
                 'records_lost': self.lost + sum(int(a.get('lost', 0))
                                                 for a in self.agents.values())}
        if self.agents:
            other['agent_clocks'] = AGENT_CLOCKS
            other['agents'] = [
                {'agent': agent, 'pid': pid, 'host': a.get('host'),
                 'clock_offset_s': a.get('clock_offset_s'), 'round_trip_s': a.get('round_trip_s'),
                 'records_lost': int(a.get('lost', 0))}
                for (agent, pid), a in sorted(self.agents.items())]
        doc = {'traceEvents': self.trace_events(), 'displayTimeUnit': 'ms', 'otherData': other}
        tmp = f'{path}.tmp{os.getpid()}'
        with open(tmp, 'w', encoding='utf-8') as f:
            json.dump(doc, f, separators=(',', ':'))
        os.replace(tmp, path)
        return path


def _task_events(records: Rows, pid: int, tid: int, stages: list,
                 offset_s: float = 0.0) -> list[dict]:
    """A span per task record, its stages laid end to end inside it; ``offset_s``: the
    records' clock minus ours (an agent's), taken off every time.

    Every boundary is a whole nanosecond, and each stage starts exactly where the one
    before it ended: summed float seconds put a stage's end a hair past the next one's
    start, and a viewer drops spans that overlap on one track (Perfetto does).
    """
    events = []
    for row in records.rows().tolist():
        begin = round((row[BEGIN] - offset_s) * 1e9)
        end = max(begin, round((row[END] - offset_s) * 1e9))
        events.append({'name': 'task', 'cat': 'worker', 'ph': 'X', 'ts': begin / 1e3,
                       'dur': (end - begin) / 1e3, 'pid': pid, 'tid': tid,
                       'args': {'task': int(row[TASK]), 'position': int(row[POSITION]),
                                'count': int(row[COUNT]), 'made': bool(row[FILLED])}})
        seconds = [row[READ], *row[len(RECORD):], row[WRITE]]
        at = begin
        for name, s in zip(stages, seconds):
            ns = min(max(0, round(s * 1e9)), end - at)     # inside the task's span
            if ns > 0:
                events.append({'name': name, 'cat': 'stage', 'ph': 'X', 'ts': at / 1e3,
                               'dur': ns / 1e3, 'pid': pid, 'tid': tid})
            at += ns
    return events


def _meta(pid: int, tid: int, name: str, value, key: str = 'name') -> dict:
    return {'name': name, 'ph': 'M', 'ts': 0, 'pid': pid, 'tid': tid, 'args': {key: value}}
