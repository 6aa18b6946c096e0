"""The remote stage's counters (loadr/storage/netstats.py) and their place in loader.stats()."""

from __future__ import annotations

import multiprocess

from loadr.stats import StageClock, Stats, format_table, row_width
from loadr.storage import netstats


def _worker(wait_s: float) -> dict:
    return {'busy': 10.0, 'wait': 0.0, 'read': 6.0, 'samples': 640.0, 'batches': 10.0,
            'net_requests': 100.0, 'net_bytes': 5e6, 'net_request_s': 3.0,
            'net_in_flight': 4.0, 'net_max_in_flight': 12.0, 'net_wait_s': wait_s,
            'net_waits': 20.0, 'net_uncovered': 2.0, 'net_ahead_bytes': 2e6}


def test_the_verdict_names_the_network_when_reads_wait_on_it():
    waiting = Stats(['f'], 10.0, 4.0, 10, 640, workers=[_worker(3.0)], cores=2)
    table = format_table(waiting)
    assert 'round trip 30.0 ms' in table and 'at most 12 in a worker' in table, table
    assert 'waiting on the network 30% of the time: raise max_concurrency' in table, table
    remote = waiting.as_dict()['remote']
    assert remote['requests_per_sample'] == 100 / 640 and remote['uncovered'] == 2
    # Reads that hardly wait on the network: the figures, but no network verdict.
    quiet = format_table(Stats(['f'], 10.0, 4.0, 10, 640, workers=[_worker(0.1)], cores=2))
    assert 'remote: ' in quiet and 'waiting on the network' not in quiet, quiet
    # No remote reads: no remote line.
    assert 'remote' not in format_table(Stats(['f'], 10.0, 4.0, 10, 640, cores=2))


def test_since_keeps_the_levels_and_subtracts_the_counts():
    a = Stats(['f'], 1.0, 0.0, 1, 64, workers=[_worker(1.0)], cores=2)
    later = dict(_worker(2.5), net_requests=160.0, net_in_flight=7.0)
    d = Stats(['f'], 2.0, 0.0, 2, 128, workers=[later], cores=2).since(a)
    assert d.workers[0]['net_requests'] == 60 and d.workers[0]['net_wait_s'] == 1.5
    assert d.workers[0]['net_in_flight'] == 7 and d.workers[0]['net_max_in_flight'] == 12


def _in_child(q):
    q.put(list(netstats.counters()))


def test_counters_are_per_process_and_reach_the_worker_row():
    netstats.waited(0.01, uncovered=True)
    t0 = netstats.started()
    netstats.ended(t0, 1000)
    row = [0.0] * row_width(1)
    clock = StageClock(row, fns=1, inline=True)
    clock.add_fill(read=0.1, write=0.0, fns=[0.1], samples=4, fill_s=0.2)
    totals = clock.totals()
    assert totals['net_requests'] >= 1 and totals['net_uncovered'] >= 1
    assert totals['net_bytes'] >= 1000 and totals['net_in_flight'] == 0
    q = multiprocess.get_context('fork').Queue()
    p = multiprocess.get_context('fork').Process(target=_in_child, args=(q,))
    p.start()
    assert q.get(timeout=30) == [0.0] * len(netstats.FIELDS)     # a new process: zero
    p.join(30)


def test_the_tasks_held_follow_the_round_trip_within_the_buffer_and_the_bounds():
    few, most = netstats.FEWEST_TASKS_AHEAD, netstats.MOST_TASKS_AHEAD
    # Round trips shorter than a task: the first three; longer: one more per task they last.
    assert netstats.tasks_ahead(0.02, 0.04, budget_bytes=0) == few
    assert [netstats.tasks_ahead(rtt, 0.01, budget_bytes=0) for rtt in (0.02, 0.04, 0.06)] \
        == [4, 6, 8]
    assert netstats.tasks_ahead(1.0, 0.01, budget_bytes=0) == most
    # Unknown yet (no request, or no task timed): the first three.
    assert netstats.tasks_ahead(0.0, 0.01) == netstats.tasks_ahead(0.05, 0.0) == few
    # No more than the read-ahead buffer holds beside the task in hand.
    assert netstats.tasks_ahead(1.0, 0.01, task_bytes=8e6, budget_bytes=40e6) == 6
    assert netstats.tasks_ahead(1.0, 0.01, task_bytes=80e6, budget_bytes=40e6) == few


def test_the_round_trip_percentile_is_of_the_latest_requests():
    for _ in range(netstats.RECENT_REQUESTS):
        netstats.ended(netstats.started() - 1.0, 0)         # a second each, long ago
    for _ in range(netstats.RECENT_REQUESTS):
        netstats.ended(netstats.started(), 0)               # then fast ones only
    assert netstats.rtt_p90_s() < 0.5                       # the mean keeps the slow ones
