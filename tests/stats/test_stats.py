"""Where a loader's time goes: per-stage counters of real workers, the verdict,
the stats hooks, workers='auto' / prefetch='auto', and the CLI's --profile and --stats-file.

The machine is shared and loaded: checks are relative (shares of a worker's own
time, generous fractions), never a wall-clock speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import loadr
from loadr.stats import Stats, cores

from ..loader_helpers import batch_digest, noisy, trivial

pytestmark = pytest.mark.timeout(120)


def light(dp, seed):
    return {'label': dp['label'], 'vec': dp['vec'] * 2}


def sleepy(dp, seed):
    """The deliberately slow stage: 2 ms a datapoint."""
    time.sleep(0.002)
    return dp


def take(loader, count, pause_s=0.0):
    """``count`` batches' digests; ``pause_s`` after each is the caller's training step
    (work the accounting must tell apart from waiting, not a wait for some state)."""
    it = iter(loader)
    out = []
    for _ in range(count):
        out.append(batch_digest(next(it)))
        if pause_s:
            time.sleep(pause_s)
    return out


def staged(w: dict) -> float:
    return w['read'] + sum(w['fns']) + w['write']


def test_stage_totals_add_up_to_the_workers_busy_time():
    with loadr.Loader(trivial(800), batch=32, fns=[light, sleepy], workers=2) as loader:
        take(loader, 8)
        stats = loader.stats()
    assert len(stats.workers) == 2 and stats.batches == 8 and stats.samples == 256
    for w in stats.workers:
        assert w['batches'] > 0 and w['busy'] > 0
        # Timed stage by stage (every row of an expensive pipeline), read, the fns and
        # write account for the worker's busy time but for the task's messages and loop
        # ('other', derived: the stages add up to busy by construction).
        assert 0.95 * w['busy'] <= staged(w) <= w['busy'], w
        assert w['other'] == pytest.approx(w['busy'] - staged(w))
        assert w['cpu'] < w['busy']             # sleeping is no CPU time
    assert sum(w['samples'] for w in stats.workers) >= 256


def test_a_slow_fn_is_named_by_the_verdict_and_carries_the_worker_time():
    with loadr.Loader(trivial(400), batch=8, fns=[light, sleepy], workers=1) as loader:
        take(loader, 10)
        stats = loader.stats()
    stages = stats.stages()
    busy = sum(t for k, t in stages.items() if k != 'wait')
    assert stages['sleepy'] > 0.8 * busy, stages
    assert stages['light'] < 0.2 * busy
    verdict = stats.verdict()
    assert verdict.startswith('input-bound') and 'sleepy is' in verdict, verdict
    table = loadr.stats.format_table(stats)
    assert 'sleepy' in table and verdict in table


def test_the_main_process_wait_is_counted():
    # A training step far slower than the pipeline: the loader is not the bottleneck.
    with loadr.Loader(trivial(400), batch=8, fns=[light], workers=2) as loader:
        take(loader, 8, pause_s=0.2)
        stats = loader.stats()
    # The caller's 8 steps are in the elapsed time and none of them in the wait.
    assert stats.elapsed_s - stats.main_wait_s >= 8 * 0.2
    assert 0 <= stats.main_wait_s < stats.elapsed_s
    assert stats.first_batch_s <= stats.main_wait_s
    assert stats.wait_fraction < 0.5
    assert stats.verdict().startswith('not the bottleneck'), stats.verdict()
    # And the other way round: a caller that never pauses waits for a slow pipeline.
    with loadr.Loader(trivial(400), batch=8, fns=[sleepy], workers=1) as loader:
        take(loader, 6)
        stats = loader.stats()
    assert stats.wait_fraction > 0.5 and stats.verdict().startswith('input-bound')


def test_stats_survive_a_killed_worker():
    with loadr.Loader(trivial(2000), batch=8, fns=[light, sleepy], workers=2) as loader:
        it = iter(loader)
        for _ in range(6):
            next(it)
        before = loader.stats()
        victim = loader.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        for _ in range(12):
            next(it)
        assert victim not in loader.worker_pids
        after = loader.stats()
    assert len(after.workers) == 2
    for b, a in zip(before.workers, after.workers):
        # The replacement adds to its predecessor's row: nothing counted goes away.
        for key in ('busy', 'batches', 'samples', 'read', 'write'):
            assert a[key] >= b[key], (key, b, a)
    assert after.workers[0]['batches'] > before.workers[0]['batches'] or \
        after.workers[1]['batches'] > before.workers[1]['batches']
    assert after.batches == 18


def test_workers_0_keeps_the_same_counters_in_this_process():
    with loadr.Loader(trivial(200), batch=8, fns=[light, sleepy], workers=0) as loader:
        take(loader, 5)
        stats = loader.stats()
    assert stats.inline and len(stats.workers) == 1
    w = stats.workers[0]
    assert w['batches'] == 5 and w['samples'] == 40 and w['wait'] == 0
    assert 0.95 * w['busy'] <= staged(w) <= 1.05 * w['busy'], w
    # Here the pipeline runs while the caller waits for its batch.
    assert stats.main_wait_s >= 0.9 * w['busy']
    assert 'sleepy is' in stats.verdict() and 'workers=' in stats.verdict()


def test_stats_every_calls_back_and_as_dict_is_json():
    seen = []
    with loadr.Loader(trivial(200), batch=4, fns=[light], workers=1, stats_every=3,
                      on_stats=seen.append) as loader:
        take(loader, 10)
        last = loader.stats()
    assert [s.batches for s in seen] == [3, 6, 9]
    assert all(isinstance(s, Stats) for s in seen)
    line = json.loads(json.dumps(last.as_dict()))
    assert line['batches'] == 10 and line['samples'] == 40
    assert set(line['stages_s']) == {'read', 'light', 'write', 'other', 'wait'}
    assert line['workers'][0]['fns'].keys() == {'light'}
    assert line['samples_per_s'] > 0 and isinstance(line['verdict'], str)


def test_stats_after_close_keep_the_last_counts():
    loader = loadr.Loader(trivial(200), batch=4, fns=[light], workers=1)
    take(loader, 4)
    loader.close()
    stats = loader.stats()
    assert stats.batches == 4 and stats.workers[0]['samples'] >= 16


def test_auto_settles_to_a_valid_setting_and_leaves_the_stream_as_it_is():
    data = trivial(3000)
    with loadr.Loader(data, batch=16, fns=[noisy], seed=5, workers=2, prefetch=4) as loader:
        reference = take(loader, 60)
    with loadr.Loader(data, batch=16, fns=[noisy], seed=5, workers='auto',
                      prefetch='auto') as loader:
        assert loader.settled is None
        got = take(loader, 60)
        settled = loader.settled
        stats = loader.stats()
    assert got == reference
    assert settled is not None, 'auto did not settle within 60 batches'
    assert 1 <= settled['workers'] <= 4 * cores() and settled['prefetch'] >= 1
    assert settled['workers'] == loader.workers and settled['prefetch'] == loader.prefetch
    assert settled['why']
    assert stats.batches == 60


def test_auto_with_a_slow_consumer_takes_few_workers():
    data = trivial(3000)
    with loadr.Loader(data, batch=8, fns=[light], seed=1, workers='auto') as loader:
        take(loader, 24, pause_s=0.02)
        assert loader.settled is not None and loader.settled['workers'] == 1


def spin(dp, seed):
    """Pure CPU, short: about 0.1 ms a datapoint, no I/O at all."""
    x = 0
    for i in range(2000):
        x += i * i
    return {'label': dp['label'], 'vec': dp['vec'] + (x & 1)}


def test_auto_with_a_pure_cpu_fn_settles_on_at_most_the_cores_and_does_not_claim_io():
    # The workers' CPU time was read every 50 ms at most: over a calibration shorter
    # than that it read as 0, and 8 workers on 2 cores were "blocked on I/O 100%".
    with loadr.Loader(trivial(3000), batch=8, fns=[spin], seed=2, workers='auto') as loader:
        take(loader, 40)
        settled = loader.settled
    assert settled is not None, 'auto did not settle within 40 batches'
    assert 1 <= settled['workers'] <= (os.cpu_count() or 1), settled
    assert 'I/O' not in settled['why'] and 'CPU-bound' in settled['why'], settled


def test_a_short_run_of_a_pure_cpu_fn_is_not_read_as_waiting_on_io():
    # The busy time since a worker last read its CPU clock counted as blocked on I/O.
    with loadr.Loader(trivial(3000), batch=8, fns=[spin], seed=2, workers=1) as loader:
        take(loader, 6)
        stats = loader.stats()
    assert stats.io_share < loadr.stats.IO_BOUND_SHARE, stats.as_dict()
    assert 'I/O' not in stats.verdict()


def test_the_verdict_leaves_a_waiting_caller_s_core_to_a_worker():
    # `loadr bench --workers 1,2` said "the 2 cores are all in use" at 1 worker while its
    # table showed 2 workers faster: a caller that only waits does not need a core.
    w = dict(busy=1.0, wait=0.0, read=0.1, write=0.1, batches=100, samples=800, cpu=0.95,
             sampled=1.0, fns=[0.8])
    waiting = Stats(['spin'], elapsed_s=1.0, main_wait_s=0.99, batches=100, samples=800,
                    workers=[w], cores=2)
    assert waiting.verdict().endswith('spin is 80% of worker time; 1 more worker would help')
    working = Stats(['spin'], elapsed_s=1.0, main_wait_s=0.3, batches=100, samples=800,
                    workers=[w], cores=2)
    assert 'the 2 cores are all in use' in working.verdict()
    both = Stats(['spin'], elapsed_s=1.0, main_wait_s=0.99, batches=100, samples=800,
                 workers=[w, w], cores=2)
    assert 'the 2 cores are all in use' in both.verdict()
    # A core free by count but busy with other processes' work: the worker waited for one.
    queued = Stats(['spin'], elapsed_s=1.0, main_wait_s=0.99, batches=100, samples=800,
                   workers=[dict(w, cpu=0.6, runq=0.4)], cores=2)
    assert queued.verdict().endswith('the 2 cores are all in use (the workers waited for one '
                                     '40% of the time they were ready to run): make spin '
                                     'cheaper or add cores')


def test_cpu_time_not_read_yet_is_not_counted_as_io():
    unread = dict(busy=0.04, cpu=0.0, runq=0.0, sampled=0.0, batches=5, samples=40)
    assert Stats(['f'], 0.05, 0.04, 5, 40, [unread], cores=2).io_share == 0.0
    read = dict(unread, cpu=0.01, sampled=0.02)            # half of what was read: blocked
    assert Stats(['f'], 0.05, 0.04, 5, 40, [read], cores=2).io_share == 0.5

def test_auto_is_refused_where_it_means_nothing():
    with pytest.raises(loadr.errors.ConfigError, match='workers'):
        loadr.Loader(trivial(10), batch=2, workers='many')
    with pytest.raises(loadr.errors.ConfigError, match='prefetch'):
        loadr.Loader(trivial(10), batch=2, workers=1, prefetch='lots')


# ---------------------------------------------------------------------------
# the command line


def pipeline(tmp_path, data, workers=1):
    rel = os.path.relpath(data / 'bag', tmp_path)
    path = tmp_path / 'p.yaml'
    path.write_text(f'reader: {{path: {rel}, decode_images: false}}\n'
                    f'fns:\n'
                    f'  - decode_jpeg: {{size: [32, 32]}}\n'
                    f'  - flip\n'
                    f'  - select: [image, idx]\n'
                    f'loader: {{batch: 2, workers: {workers}, seed: 1}}\n')
    return path


def cli(*args, **kwargs):
    return subprocess.run([sys.executable, '-m', 'loadr.cli', *map(str, args)],
                          capture_output=True, text=True, timeout=90, **kwargs)


def test_run_profile_prints_the_table_and_the_verdict(tmp_path, local_data):
    path = pipeline(tmp_path, local_data)
    done = cli('run', path, '--steps', 20, '--profile')
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for stage in ('read', 'decode_jpeg', 'flip', 'select', 'write', 'other', 'wait'):
        assert f'\n{stage} ' in out, out
    assert '1 workers, 20 batches, 40 samples' in out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith(('input-bound', 'not the bottleneck')), out


def test_run_stats_file_writes_json_lines(tmp_path, local_data):
    path = pipeline(tmp_path, local_data, workers=0)
    stats_file = tmp_path / 'stats.jsonl'
    done = cli('run', path, '--steps', 12, '--stats-file', stats_file, '--stats-every', 5)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in stats_file.read_text().splitlines()]
    assert [line['batches'] for line in lines] == [5, 10, 12]     # every 5, and the end
    assert lines[-1]['samples'] == 24 and 'decode_jpeg' in lines[-1]['stages_s']
    done = cli('run', path, '--steps', 10, '--stats-file', stats_file, '--stats-every', 5)
    lines = [json.loads(line) for line in stats_file.read_text().splitlines()]
    assert [line['batches'] for line in lines] == [5, 10, 12, 5, 10]     # appended, once each


def test_run_profile_on_ctrl_c(tmp_path, local_data):
    path = pipeline(tmp_path, local_data, workers=1)
    proc = subprocess.Popen([sys.executable, '-m', 'loadr.cli', 'run', str(path), '--steps',
                             '1000000', '--digest', '--profile'], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(5):
            proc.stdout.readline()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert 'decode_jpeg' in err and ('input-bound' in err or 'not the bottleneck' in err), err


def test_bench_prints_a_table_and_verdict_per_worker_count(tmp_path, local_data):
    path = pipeline(tmp_path, local_data)
    done = cli('bench', path, '--workers', '0,1', '--steps', 5, '--warmup', 1)
    assert done.returncode == 0, done.stderr
    assert 'workers=0:' in done.stdout and 'workers=1:' in done.stdout
    assert done.stdout.count('decode_jpeg') >= 2
    assert done.stdout.count('input-bound') + done.stdout.count('not the bottleneck') >= 2


def test_stats_take_little_time_per_batch():
    # Not a speed assertion: the counters must not be read per sample. One
    # stats() snapshot of a live pool is a copy of a few rows.
    with loadr.Loader(trivial(100), batch=4, workers=1) as loader:
        take(loader, 2)
        rows = loader._pool.stats_rows()
    assert rows.shape == (1, len(loadr.stats.WORKER_FIELDS)) and np.all(rows >= 0)
