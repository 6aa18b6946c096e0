"""The remote stage's counters: requests in flight, round-trip time, bytes
ahead, and the time reads waited on the network.

One set of counters per process (a worker's are its own: they start at zero
in each new process). :class:`~loadr.storage.remote.RemoteStorage` counts
into them; the worker's stage clock copies them into its row of shared
counters once per batch (:func:`publish`, called by :mod:`loadr.stats`),
so the main process's :meth:`loadr.Loader.stats` sees every worker's.

A read *waits on the network* when the bytes it needs are not there yet:
its read-ahead request is still out (:func:`waited`), or no read ahead
covered it and it fetched them itself (an uncovered round trip). That
time, over the workers' busy time, is the share the verdict names. Only the
reader's own waits count: a thread that reads ahead for it
(:func:`reading_ahead`) waits while the reader works, and the reader's wait
for that thread's job is counted where the reader makes it.

How far a worker reads ahead follows what it must hide (:func:`tasks_ahead`):
the round trip (:func:`rtt_p90_s`, over the latest requests) against the
time a task takes it; the worker asks the pool for that many tasks.
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time

__all__ = ['FIELDS', 'started', 'ended', 'waited', 'ahead', 'publish', 'summary', 'lines',
           'verdict', 'rtt_s', 'rtt_p90_s', 'wait_s', 'fetched_bytes',
           'set_ahead_budget', 'ahead_budget', 'counters', 'reading_ahead', 'tasks_ahead',
           'holding', 'read_whole', 'no_range_advice', 'FEWEST_TASKS_AHEAD',
           'MOST_TASKS_AHEAD']

# The remote stage's counters in a worker's row of loadr.stats (after its own fields).
FIELDS = ('net_requests', 'net_bytes', 'net_request_s', 'net_in_flight', 'net_max_in_flight',
          'net_wait_s', 'net_waits', 'net_uncovered', 'net_ahead_bytes', 'net_tasks_ahead',
          'net_whole_reads')
# Levels, not counts: Stats.since keeps the latest value of these.
LEVELS = ('net_in_flight', 'net_max_in_flight', 'net_ahead_bytes', 'net_tasks_ahead')
# Counted from the clock's start (publish's ``since``), not the process's: a loader with
# workers=0 runs in a process that other loaders' reads went through before.
PER_CLOCK = ('net_whole_reads',)
_REQUESTS, _BYTES, _REQUEST_S, _IN_FLIGHT, _MAX_IN_FLIGHT, _WAIT_S, _WAITS, _UNCOVERED, \
    _AHEAD, _TASKS_AHEAD, _WHOLE_READS = range(len(FIELDS))

# A wait on the network shorter than this is not counted as one (a future that
# finished while its reader was being woken).
WAIT_FLOOR_S = 0.0005
# Above this share of the workers' busy time spent waiting on the network, the
# verdict says the network is the bottleneck.
NETWORK_BOUND_SHARE = 0.1
# The tasks a reading-ahead worker holds (in hand, queued, read ahead): at least
# one in hand, one queued and one whose reads start a task early; at most this
# many (each is a batch slot of shared memory).
FEWEST_TASKS_AHEAD, MOST_TASKS_AHEAD = 3, 8
# Request times kept for the round trip's 90th percentile: the latest ones, so
# that the depth follows a server that slows down or speeds up.
RECENT_REQUESTS = 64

_pid = None
_values: list = []
_recent: collections.deque = collections.deque(maxlen=RECENT_REQUESTS)    # seconds a request
_budget = 0                         # bytes: the largest read-ahead buffer of this process
_thread = threading.local()         # .ahead: this thread reads ahead (its waits are not reads')


def counters() -> list:
    """This process's counters (:data:`FIELDS`, in order), zero in a new process."""
    global _pid, _values, _recent, _budget
    if _pid != os.getpid():
        _pid, _values = os.getpid(), [0.0] * len(FIELDS)
        _recent = collections.deque(maxlen=RECENT_REQUESTS)
        _budget = 0
    return _values


def read_whole() -> None:
    """A range was cut from a file read whole, its server ignoring Range: the verdict
    then never asks for more workers, which would download more."""
    counters()[_WHOLE_READS] += 1


def started() -> float:
    """A request goes out: its start time, for :func:`ended`."""
    c = counters()
    c[_IN_FLIGHT] += 1
    if c[_IN_FLIGHT] > c[_MAX_IN_FLIGHT]:
        c[_MAX_IN_FLIGHT] = c[_IN_FLIGHT]
    return time.perf_counter()


def ended(t0: float, nbytes: int) -> None:
    """The request started at ``t0`` is answered (or failed) with ``nbytes`` bytes."""
    c = counters()
    spent = time.perf_counter() - t0
    c[_IN_FLIGHT] -= 1
    c[_REQUESTS] += 1
    c[_BYTES] += nbytes
    c[_REQUEST_S] += spent
    _recent.append(spent)


def waited(seconds: float, uncovered: bool = False) -> None:
    """A read waited ``seconds`` for its bytes; ``uncovered``: no read ahead held them."""
    if getattr(_thread, 'ahead', False):
        return
    c = counters()
    if uncovered:
        c[_UNCOVERED] += 1
    if seconds >= WAIT_FLOOR_S or uncovered:
        c[_WAIT_S] += seconds
        c[_WAITS] += 1


def reading_ahead() -> None:
    """This thread reads ahead for a reader (an executor's ``initializer``): its waits
    are not counted, since the reader works meanwhile; the reader counts its own
    wait for the thread's job with :func:`waited`."""
    _thread.ahead = True


def ahead(nbytes: int) -> None:
    """The read-ahead buffer now holds ``nbytes`` (asked or received, not yet read)."""
    counters()[_AHEAD] = nbytes


def rtt_s() -> float:
    """This process's mean time a request took so far (0.0 before any)."""
    c = counters()
    return c[_REQUEST_S] / c[_REQUESTS] if c[_REQUESTS] else 0.0


def fetched_bytes() -> float:
    """This process's bytes received so far (:func:`ended`)."""
    return counters()[_BYTES]


def wait_s() -> float:
    """This process's time spent waiting on the network so far (:func:`waited`)."""
    return counters()[_WAIT_S]


def rtt_p90_s() -> float:
    """The 90th percentile of this process's latest requests' times (0.0 before any)."""
    counters()
    if not _recent:
        return 0.0
    times = sorted(_recent)
    return times[(9 * (len(times) - 1)) // 10]


def tasks_ahead(rtt_s: float, task_s: float, task_bytes: float = 0.0,
                budget_bytes: float | None = None) -> int:
    """The tasks a reading-ahead worker holds to hide round trips of ``rtt_s`` when a
    task takes it ``task_s``: the one in hand, the next, and as many more as the
    round trip lasts tasks (their reads start that much earlier), within
    [:data:`FEWEST_TASKS_AHEAD`, :data:`MOST_TASKS_AHEAD`]. The one place that decides it.

    No more than the read-ahead buffer holds (``budget_bytes``, this process's
    ``readahead_bytes`` by default) of tasks fetching ``task_bytes`` each beside
    the one in hand: past it, the buffer would drop the spans needed soonest.

    >>> tasks_ahead(0.02, 0.04), tasks_ahead(0.05, 0.036), tasks_ahead(0.2, 0.01)
    (3, 4, 8)
    >>> tasks_ahead(0.2, 0.01, task_bytes=10e6, budget_bytes=50e6)
    6
    """
    if not task_s > 0 or not rtt_s > 0:
        return FEWEST_TASKS_AHEAD
    need = 2 + math.ceil(rtt_s / task_s)
    budget = ahead_budget() if budget_bytes is None else budget_bytes
    if task_bytes > 0 and budget > 0:
        need = min(need, 1 + int(budget // task_bytes))
    return max(FEWEST_TASKS_AHEAD, min(MOST_TASKS_AHEAD, need))


def set_ahead_budget(nbytes: int) -> None:
    """A read-ahead buffer of ``nbytes`` was made in this process (the largest counts)."""
    global _budget
    counters()
    _budget = max(_budget, nbytes)


def ahead_budget() -> int:
    """The largest read-ahead buffer made in this process, in bytes (0: none)."""
    counters()
    return _budget


def holding(tasks: int) -> None:
    """This worker now asks for ``tasks`` tasks at once (:func:`tasks_ahead`)."""
    counters()[_TASKS_AHEAD] = tasks


def publish(row, at: int, since: list | None = None) -> None:
    """Copy this process's counters into ``row[at:at + len(FIELDS)]`` (a worker's row);
    those of :data:`PER_CLOCK` less their value in ``since`` (:func:`counters` copied
    when the clock started)."""
    c = counters()
    for k, v in enumerate(c):
        row[at + k] = v - since[k] if since is not None and FIELDS[k] in PER_CLOCK else v


def summary(workers: list, samples: int) -> dict | None:
    """The remote stage over the workers' dicts (with :data:`FIELDS`); None where no
    request was made."""
    total = {f: sum(w.get(f, 0.0) for w in workers) for f in FIELDS}
    if not total['net_requests'] and not total['net_waits']:
        return None
    busy = sum(w.get('busy', 0.0) for w in workers)
    requests = total['net_requests']
    return {
        'requests': int(requests),
        'requests_per_sample': requests / samples if samples else 0.0,
        'bytes': int(total['net_bytes']),
        'rtt_s': total['net_request_s'] / requests if requests else 0.0,
        'in_flight': int(total['net_in_flight']),
        'max_in_flight': int(max((w.get('net_max_in_flight', 0.0) for w in workers),
                                 default=0.0)),
        'bytes_ahead': int(total['net_ahead_bytes']),
        'tasks_ahead': int(max((w.get('net_tasks_ahead', 0.0) for w in workers), default=0.0)),
        'wait_s': total['net_wait_s'],
        'waits': int(total['net_waits']),
        'uncovered': int(total['net_uncovered']),
        'wait_share': total['net_wait_s'] / busy if busy > 0 else 0.0,
        'whole_reads': int(total['net_whole_reads']),
    }


def lines(remote: dict | None) -> list[str]:
    """The remote stage as lines of :func:`loadr.stats.format_table`."""
    if not remote:
        return []
    return [f"remote: {remote['requests']} requests ({remote['requests_per_sample']:.2f} a "
            f"sample), {remote['bytes'] / 1e6:.1f} MB, round trip {1e3 * remote['rtt_s']:.1f} "
            f"ms, in flight {remote['in_flight']} (at most {remote['max_in_flight']} in a "
            f"worker), {remote['bytes_ahead'] / 1e6:.1f} MB ahead{_tasks(remote)}; reads "
            f"waited on the network {remote['wait_s']:.2f} s ({100 * remote['wait_share']:.0f}% "
            f"of worker time, {remote['waits']} waits, {remote['uncovered']} not read ahead)"]


def _tasks(remote: dict) -> str:
    n = remote.get('tasks_ahead', 0)
    return f" (up to {n} tasks held)" if n else ''


def no_range_advice(remote: dict | None) -> str | None:
    """What to do when a server ignores Range (its files are read whole by every
    process: more workers download more), else None."""
    if not remote or not remote.get('whole_reads'):
        return None
    return ('the server ignores Range requests: each process reads every file whole, '
            'so more workers would only download more; serve the data from a server '
            'that answers Range (nginx, S3) or copy it to a local disk')


def verdict(remote: dict | None) -> str | None:
    """A verdict line when the network is the bottleneck, else None."""
    if no_range_advice(remote):
        return None         # said by the verdict itself (loadr.stats)
    if not remote or remote['wait_share'] < NETWORK_BOUND_SHARE:
        return None
    return (f"waiting on the network {100 * remote['wait_share']:.0f}% of the time: raise "
            f"max_concurrency or readahead_bytes (round trip {1e3 * remote['rtt_s']:.0f} ms, "
            f"at most {remote['max_in_flight']} requests in flight)")
