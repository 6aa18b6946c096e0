"""The loader's timeline (loadr.stats.Tracer): valid Trace Event JSON that says what
happened, in real worker processes; never a changed batch.

No wall-clock figure is asserted: a span is compared with the other spans of the same run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import loadr

from ..loader_helpers import batch_digest, noisy, slowed, trivial
from ..test_cli import bag_pipeline, loadr_cmd

pytestmark = pytest.mark.timeout(120)

SLOW_INDEX = 37


def slow_on_one(dp, seed):
    """Sleeps on one datapoint: its task is the long one."""
    if int(dp['label']) == SLOW_INDEX:
        time.sleep(0.3)
    return dp


class DieOnce:
    """SIGKILLs its worker at datapoint ``index``, the first time only (a marker file)."""

    def __init__(self, directory, index: int):
        self.marker, self.index = os.path.join(directory, 'died'), index

    def __call__(self, dp, seed):
        if int(dp['label']) == self.index:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return dp
            os.kill(os.getpid(), signal.SIGKILL)
        return dp


def read_trace(path) -> list[dict]:
    with open(path, encoding='utf-8') as f:
        doc = json.load(f)
    assert doc['otherData']['producer'] == 'loadr'
    return doc['traceEvents']


def check_valid(events: list[dict]) -> None:
    """What every trace must be: Trace Event JSON a viewer opens."""
    assert events
    named = {(e['pid'], e['args']['name']) for e in events
             if e['ph'] == 'M' and e['name'] == 'process_name'}
    for e in events:
        assert {'ph', 'ts', 'pid', 'tid', 'name'} <= set(e), e
        assert isinstance(e['ts'], (int, float)) and isinstance(e['pid'], int) \
            and isinstance(e['tid'], int), e
        assert e['ph'] in ('X', 'i', 'C', 'M'), e
        if e['ph'] == 'X':
            assert isinstance(e['dur'], (int, float)) and e['dur'] >= 0, e
        if e['ph'] == 'C':
            assert e['args'] and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                     for v in e['args'].values()), e
    assert {pid for pid, _ in named} == {e['pid'] for e in events}    # every track named
    # The spans of a track nest: each one ends before the next begins, or holds it whole,
    # to the nanosecond, as a viewer reads them (Perfetto drops a span that overlaps
    # another on its track by any amount).
    def ns(e):
        begin = round(e['ts'] * 1000)
        return begin, begin + round(e['dur'] * 1000)

    by_track: dict = {}
    for e in events:
        if e['ph'] == 'X':
            by_track.setdefault((e['pid'], e['tid']), []).append(e)
    for track in by_track.values():
        open_ends: list[int] = []
        for e in sorted(track, key=lambda e: (ns(e)[0], -ns(e)[1])):
            begin, end = ns(e)
            while open_ends and open_ends[-1] <= begin:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], e
            open_ends.append(end)
    # Stages nest inside their task: within its span, on its track.
    tasks = {}
    for e in events:
        if e.get('cat') == 'worker' and e['name'] == 'task':
            tasks.setdefault((e['pid'], e['tid']), []).append(ns(e))
    for e in events:
        if e.get('cat') == 'stage':
            begin, end = ns(e)
            assert any(b <= begin and end <= t for b, t in tasks[(e['pid'], e['tid'])]), e


def spans(events, name, cat=None) -> list[dict]:
    return [e for e in events if e['ph'] == 'X' and e['name'] == name
            and (cat is None or e.get('cat') == cat)]


def test_a_trace_is_valid_and_its_long_task_is_the_slow_one(tmp_path):
    path = tmp_path / 'run.trace.json'
    with loadr.Loader(trivial(400), batch=8, fns=[slow_on_one, noisy], shuffle=False, seed=2,
                      workers=2, trace=path) as loader:
        it = iter(loader)
        for _ in range(12):
            next(it)
        pids = set(loader.worker_pids)
    events = read_trace(path)
    check_valid(events)
    tasks = spans(events, 'task', 'worker')
    assert {t['pid'] for t in tasks} <= pids and len({t['pid'] for t in tasks}) == 2
    longest = max(tasks, key=lambda t: t['dur'])
    a = longest['args']
    assert a['position'] <= SLOW_INDEX < a['position'] + a['count'], a
    # ... and within it, its fn's stage is the longest of that stage.
    slowest = max(spans(events, 'slow_on_one', 'stage'), key=lambda e: e['dur'])
    assert longest['ts'] <= slowest['ts'] <= longest['ts'] + longest['dur']
    assert slowest['pid'] == longest['pid']
    # The caller's waits and each batch, with the steps in order, and the window's depth.
    batches = [e for e in events if e['ph'] == 'i' and e['name'] == 'batch']
    assert [b['args']['step'] for b in batches] == [8 * i for i in range(12)]
    assert len(spans(events, 'loadr: wait for batch')) == 12
    assert any(e['ph'] == 'C' and e['name'] == 'window' for e in events)
    names = {e['args']['name'] for e in events if e['ph'] == 'M' and e['name'] == 'process_name'}
    assert {'loadr: training process', 'loadr worker 0', 'loadr worker 1'} <= names


@pytest.mark.parametrize('workers', [0, 2])
def test_after_a_resume_the_trace_starts_at_the_resumed_step(tmp_path, workers):
    with loadr.Loader(trivial(400), batch=8, fns=[noisy], seed=5, workers=2) as first:
        it = iter(first)
        for _ in range(5):
            next(it)
        state = first.save()
    path = tmp_path / 'resumed.trace.json'
    with loadr.Loader(trivial(400), batch=8, fns=[noisy], seed=5, workers=workers,
                      trace=path) as loader:
        loader.load(state)
        it = iter(loader)
        for _ in range(3):
            next(it)
    events = read_trace(path)
    check_valid(events)
    steps = [e['args']['step'] for e in events if e['ph'] == 'i' and e['name'] == 'batch']
    assert steps == [state['step'] + 8 * i for i in range(3)]
    positions = [t['args']['position'] for t in spans(events, 'task', 'worker')]
    assert positions and min(positions) == state['step']


def test_a_killed_workers_track_ends_and_its_replacements_begins(tmp_path):
    path = tmp_path / 'killed.trace.json'
    # One worker: once it is killed its replacement makes every task left, so both
    # tracks have spans whatever the machine's timing.
    with loadr.Loader(trivial(400), batch=4, fns=[DieOnce(tmp_path, 60), slowed(0.002)],
                      shuffle=False, seed=1, workers=1, trace=path) as loader:
        it = iter(loader)
        got = [next(it) for _ in range(100)]
        assert loader._pool.restarts == 1
    assert os.path.exists(tmp_path / 'died')
    assert [int(x) for b in got for x in b['label']] == list(range(400))
    events = read_trace(path)
    check_valid(events)
    tracks: dict[str, list[int]] = {}
    for e in events:
        if e['ph'] == 'M' and e['name'] == 'process_name' and e['pid'] != os.getpid():
            tracks.setdefault(e['args']['name'], []).append(e['pid'])
    replaced = [pids for pids in tracks.values() if len(pids) == 2]
    assert len(replaced) == 1, tracks
    tasks = spans(events, 'task', 'worker')

    def times(pid):
        mine = [t for t in tasks if t['pid'] == pid]
        return min(t['ts'] for t in mine), max(t['ts'] + t['dur'] for t in mine)

    (first_start, first_end), (second_start, second_end) = sorted(map(times, replaced[0]))
    assert first_end <= second_start            # one ends, then the other begins
    # The task that killed its worker was made again, by some worker, after the death.
    redone = [t for t in tasks if t['args']['position'] <= 60 < t['args']['position']
              + t['args']['count']]
    assert len(redone) == 1 and redone[0]['ts'] >= first_end


@pytest.mark.parametrize('workers', [0, 2])
def test_traces_never_change_a_batch(tmp_path, workers):
    def digests(trace_at=None, **kw):
        with loadr.Loader(trivial(300), batch=16, fns=[noisy], seed=3, workers=workers,
                          **kw) as loader:
            it = iter(loader)
            out = []
            for i in range(12):
                if i == trace_at:
                    # Begun mid-run: the workers start again with their rings; same stream.
                    loader.trace(tmp_path / 'late.trace.json', batches=4)
                out.append(batch_digest(next(it)))
            return out

    plain = digests()
    assert digests(trace=tmp_path / 'all.trace.json') == plain
    assert digests(trace_at=5) == plain
    check_valid(read_trace(tmp_path / 'all.trace.json'))
    late = read_trace(tmp_path / 'late.trace.json')      # written after its 4th batch
    check_valid(late)
    steps = [e['args']['step'] for e in late if e['ph'] == 'i' and e['name'] == 'batch']
    assert steps == [16 * i for i in range(5, 9)]
    assert spans(late, 'task')          # workers=0: the pipeline's own spans, in this process


def test_a_trace_keeps_the_last_events_of_each_process(tmp_path):
    path = tmp_path / 'ring.trace.json'
    with loadr.Loader(trivial(400), batch=4, fns=[noisy], shuffle=False, workers=1) as loader:
        loader.trace(path, events=6)
        it = iter(loader)
        for _ in range(40):
            next(it)
    events = read_trace(path)
    check_valid(events)
    steps = [e['args']['step'] for e in events if e['ph'] == 'i' and e['name'] == 'batch']
    assert steps == [4 * i for i in range(34, 40)]
    tasks = spans(events, 'task', 'worker')
    assert len(tasks) == 6
    assert max(t['args']['position'] for t in tasks) >= 4 * 39
    with pytest.raises(loadr.LoadrError, match='closed'):
        loader.trace(tmp_path / 'never.json')           # closed: it would never be written


def test_import_loadr_never_imports_torch_or_matplotlib():
    code = ("import sys, loadr, loadr.stats; "
            "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[]'


def test_the_torch_profiler_shows_the_waits_for_a_batch():
    torch = pytest.importorskip('torch')
    from loadr.torch import WAIT_RANGE, DataLoader

    with DataLoader(trivial(64), batch_size=8, fns=[noisy], seed=1, num_workers=1) as dl, \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in dl:
            pass
    ranges = [e for e in prof.events() if e.name == WAIT_RANGE]
    assert len(ranges) >= 8


def test_loadr_run_and_bench_write_a_trace(tmp_path, local_data):
    pipeline = bag_pipeline(tmp_path, local_data, workers=1)
    done = loadr_cmd('run', pipeline, '--steps', 3, '--trace', tmp_path / 'run.json')
    assert done.returncode == 0, done.stderr
    events = read_trace(tmp_path / 'run.json')
    check_valid(events)
    assert len([e for e in events if e['ph'] == 'i' and e['name'] == 'batch']) == 3
    assert {'read', 'decode_jpeg', 'flip', 'select', 'write'} & {
        e['name'] for e in events if e.get('cat') == 'stage'}
    done = loadr_cmd('bench', pipeline, '--workers', '0,1', '--steps', 3, '--warmup', 1,
                     '--trace', tmp_path / 'bench.json')
    assert done.returncode == 0, done.stderr
    events = read_trace(tmp_path / 'bench.json')
    check_valid(events)
    assert any(e['ph'] == 'M' and e['args'].get('name') == 'loadr worker 0' for e in events)


def test_an_agent_s_records_are_shown_on_this_clock_on_tracks_of_their_own(tmp_path):
    # Records as an agent on a host whose clock is 100 s ahead sends them (worker id, then
    # a task record), from a worker whose pid is also one of this host's.
    import numpy as np

    from loadr.stats import Tracer, record_width

    tracer = Tracer(tmp_path / 'agents.trace.json', ['noisy'])
    here = os.getpid()
    row = [0.0, here, 100.5, 100.75, 3, 16, 8, 1, 0.05, 0.05, 0.1]
    assert len(row) == 1 + record_width(1)
    source = {'agent': 1, 'host': 'far', 'pid': 4242, 'clock_offset_s': 100.0,
              'round_trip_s': 0.002, 'lost': 2}
    tracer.remote(source, np.array([row]))
    tracer.remote(source, np.zeros((1, 4)))         # another pipeline's shape: dropped
    tracer.write()
    with open(tmp_path / 'agents.trace.json', encoding='utf-8') as f:
        doc = json.load(f)
    events = doc['traceEvents']
    check_valid(events)
    (task,) = spans(events, 'task', 'worker')
    assert task['ts'] == pytest.approx(0.5e6) and task['dur'] == pytest.approx(0.25e6)
    assert task['args'] == {'task': 3, 'position': 16, 'count': 8, 'made': True}
    assert task['pid'] != here          # the same pid on two hosts: two tracks
    names = {e['pid']: e['args']['name'] for e in events
             if e['ph'] == 'M' and e['name'] == 'process_name'}
    assert names[task['pid']] == 'agent 1 (far) worker 0'
    assert [e['name'] for e in events if e.get('cat') == 'stage' and e['pid'] == task['pid']] \
        == ['read', 'noisy', 'write']
    other = doc['otherData']
    assert other['agents'] == [{'agent': 1, 'pid': 4242, 'host': 'far', 'clock_offset_s': 100.0,
                                'round_trip_s': 0.002, 'records_lost': 2}]
    assert other['records_lost'] == 2 + 1 and 'offset' in other['agent_clocks']
