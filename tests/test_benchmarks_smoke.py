"""The benchmark command runs end to end at its smallest size and writes its table and JSON.

It asserts nothing about speed (the machine is shared; timings belong in
BENCHMARKS.md, not in tests). Skipped without torch or psutil (the ``bench``
extra; the runs here leave the other peers out).
"""

import json
import os
import subprocess
import sys

import pytest

# The benchmarks run as scripts, end to end (CI runs them: -m '').
pytestmark = pytest.mark.slow

pytest.importorskip('torch')
pytest.importorskip('psutil')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_smallest_run_writes_table_and_json(tmp_path):
    out = tmp_path / 'out'
    cmd = [sys.executable, '-m', 'benchmarks', '--scale', '0.01', '--runs', '1',
           '--only', 'trivial', '--peers', 'loadr,torch,limit', '--skip', 'scaling',
           '--no-publish', '--out', str(out), '--tmp', str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    table = (out / 'table.md').read_text()
    assert table == proc.stdout.strip('\n') + '\n' or table.strip() in proc.stdout
    for heading in ('### trivial', '### Targets', '### Resume far away',
                    '### Reader throughput', '### Decode: CPU per sample'):
        assert heading in table
    assert '| loadr |' in table and '| torch |' in table

    results = json.loads((out / 'results.json').read_text())
    assert set(results['workloads']) == {'trivial'}
    for workload in results['workloads'].values():
        assert set(workload['loaders']) == {'loadr', 'torch', 'limit'}
        for name, row in workload['loaders'].items():
            assert row['errors'] == [], (name, row['errors'])
            assert row['summary']['samples_per_s']['median'] > 0
    assert results['resume']['loadr']['correct_batch'] is True
    assert {'os.pread per record (limit)', 'ffrecord read() [crc]', 'bag read_batch()',
            'gulp read_batch()'} <= set(results['readers']['ways'])
    assert results['machine']['cores'] >= 1 and results['machine']['python']
    # The fused decode against the plain Pillow loop, and the decoders, per case
    cases = {c['name']: c for c in results['decode']['cases']}
    assert set(cases) == {'rrc 375x500', 'rrc 1600x1200', 'resize256+center_crop 375x500',
                          'video 8x240x320 rrc 112'}
    for case in cases.values():
        assert {'plain', 'loadr', 'loadr unfused', 'pillow draft'} <= set(case['rows'])
        assert case['stage_names'][0].startswith('decode_jpeg+')
    assert 'decode rrc 375x500: loadr CPU' in table
    # --no-publish leaves the repository's BENCHMARKS.md and plot alone; no plot without scaling.
    assert not (out / 'scaling.png').exists()


def test_worker_list_gives_the_scaling_table_with_the_ceiling(tmp_path):
    out = tmp_path / 'out'
    cmd = [sys.executable, '-m', 'benchmarks', '--scale', '0.01', '--runs', '1',
           '--only', 'images', '--peers', 'loadr,limit', '--workers', '1,2',
           '--skip', 'resume,readers', '--no-publish', '--out', str(out), '--tmp', str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / 'results.json').read_text())
    assert results['config']['workers'] == 2 and results['config']['scaling_workers'] == [1, 2]
    limit = results['workloads']['images']['loaders']['limit']
    assert limit['ceiling'] is True and limit['errors'] == []
    for name in ('loadr', 'limit'):
        assert all(results['scaling']['images'][name][w] > 0 for w in ('1', '2')), name
    table = (out / 'table.md').read_text()
    assert '| limit (2 plain loops at once) |' in table
    assert (out / 'scaling.png').exists() or 'matplotlib' not in results['machine']['libraries']


def test_device_report_runs_its_cpu_parts_and_says_what_it_left_out(tmp_path):
    out = tmp_path / 'out'
    cmd = [sys.executable, '-m', 'benchmarks', '--device-report', '--scale', '0.01', '--runs', '1',
           '--workers', '1,2', '--peers', 'loadr,limit', '--out', str(out), '--tmp', str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / 'device.json').read_text())
    assert res['worker_counts'] == [1, 2]
    for name in ('loadr', 'limit'):          # torch is left out here to keep it short
        assert all(res['scaling']['samples_per_s'][name][w] > 0 for w in ('1', '2')), name
        assert all(res['scaling']['cpu_ms_per_sample'][name][w] > 0 for w in ('1', '2')), name
    assert set(res['second_batch']) == {'loadr'}
    text = (out / 'device.md').read_text()
    assert '| loadr ÷ ceiling |' in text and '| loadr ÷ plain loop |' in text
    prof = res['profile']
    assert prof['workers'] == 2 and prof['samples'] > 0
    assert prof['stages_ms']['image_fn'] > 0 and prof['busy_ms'] >= prof['stages_ms']['image_fn']
    assert "### Where loadr's time goes (W=2" in text and '| main process CPU |' in text
    import torch
    if not torch.cuda.is_available():
        assert res['h2d'] == {'skipped': 'CUDA is not available'} == res['model']
        assert text.count('Not measured: CUDA is not available.') == 2


def test_model_feeding_code_runs_on_the_cpu(tmp_path):
    # The CUDA figure's code path, run on the CPU with the small stand-in model.
    from benchmarks import device, workloads
    data = workloads.make_images(str(tmp_path), 32)
    res = device.feed_model(data, workers=1, batch=8, steps=2, warmup=1, device='cpu',
                            name='stand-in')
    assert res['synthetic_images_per_s'] > 0 and res['loadr_images_per_s'] > 0
    assert res['model'] == 'stand-in' and res['loadr_of_synthetic'] > 0


def test_ramp_prints_the_gaps_of_the_first_batches():
    cmd = [sys.executable, '-m', 'benchmarks.ramp', '--workers', '2', '--ms', '0.2',
           '--batch', '8', '--runs', '1']
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(('loadr ', 'torch '))]
    assert [r[0] for r in rows] == ['loadr', 'torch']
    for r in rows:
        first, second, biggest, last = float(r[1]), r[2], r[3], float(r[4])
        assert second.endswith('u') and biggest.endswith('u')
        assert 0 < first <= last


def test_stats_cost_adds_up_its_parts():
    cmd = [sys.executable, '-m', 'benchmarks.stats_cost', '--batch', '64', '--repeat', '1']
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.strip('|').split('|') for line in proc.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| part')]
    parts = [float(cells[1]) for cells in rows[:-1]]
    total = float(rows[-1][1].split('**')[1])
    assert len(parts) == 4 and all(p >= 0 for p in parts)
    assert abs(sum(parts) - total) < 0.02


def test_paired_bursts_give_each_contender_its_figures(tmp_path):
    # The checkout itself stands in for the older one: imported a second
    # time, as loadr_before, it runs beside loadr in the same process.
    out = tmp_path / 'paired.json'
    cmd = [sys.executable, '-m', 'benchmarks.paired', '--before', ROOT, '--peers', 'torch',
           '--traced', '--bursts', '2', '--burst-batches', '3', '--n', '2048', '--json', str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.strip('|').split('|')[0].strip() for line in proc.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| contender')]
    assert rows == ['loadr', 'before', 'traced', 'torch']
    figures = json.loads(out.read_text())
    assert sorted(figures) == ['before', 'before main', 'loadr', 'loadr main', 'torch',
                               'torch main', 'traced', 'traced main']
    assert all(len(v) == 2 for v in figures.values())


def test_paired_images_give_each_contender_its_figures(tmp_path):
    # The images workload: a bag of JPEGs on disk that 'before' opens with its
    # own package's reader, decoded, cropped and flipped by every contender.
    out = tmp_path / 'paired.json'
    cmd = [sys.executable, '-m', 'benchmarks.paired', '--workload', 'images', '--before', ROOT,
           '--peers', 'torch', '--traced', '--bursts', '2', '--burst-batches', '2', '--n', '256',
           '--json', str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith('images (256 375x500 q90 JPEGs')
    rows = [line.strip('|').split('|')[0].strip() for line in proc.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| contender')]
    assert rows == ['loadr', 'before', 'traced', 'torch']
    figures = json.loads(out.read_text())
    assert sorted(figures) == ['before', 'before main', 'loadr', 'loadr main', 'torch',
                               'torch main', 'traced', 'traced main']
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in figures.values())


def test_trace_picture_draws_a_trace(tmp_path):
    pytest.importorskip('matplotlib')
    import loadr
    trace = tmp_path / 'run.trace.json'
    with loadr.Loader([{'x': i} for i in range(64)], batch=4, workers=1, trace=trace) as loader:
        for _ in zip(range(8), loader):
            pass
    png = tmp_path / 'trace.png'
    cmd = [sys.executable, '-m', 'benchmarks.trace_picture', str(trace), str(png)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_memory_benchmark_prints_its_table():
    cmd = [sys.executable, '-m', 'benchmarks.memory', '--n', '3000', '--workers', '1',
           '--epochs', '2', '--only', 'loadr,loadr-copy', '--json']
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '| loadr |' in proc.stdout and '| loadr-copy |' in proc.stdout
    shared, copied = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shared['shared_bytes'] > 0 and 'shared_bytes' not in copied
    assert len(shared['epoch_uss']) == 2 and all(u > 0 for u in shared['stats_uss'])


def test_formats_benchmark_runs_at_its_smallest(tmp_path):
    pytest.importorskip('webdataset')
    pytest.importorskip('pyarrow')
    out = tmp_path / 'formats.json'
    cmd = [sys.executable, '-m', 'benchmarks.formats', '--images', '96', '--per-shard', '32',
           '--image-kb', '8', '--runs', '1', '--index-shards', '2', '--index-per-shard', '10',
           '--parquet-mb', '2', '--row-group-mb', '1', '--tmp', str(tmp_path), '--json',
           str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results['random_access']['ratio'] > 0
    assert results['shuffled_epoch']['webdataset_samples_per_s'] > 0
    assert 0 < results['index_build']['fraction_read'] < 1
    assert results['parquet']['row_group_reads'] >= results['parquet']['row_groups']
    assert 'of bag' in proc.stdout and 'row group reads' in proc.stdout


def test_decode_loaders_prints_its_table():
    cmd = [sys.executable, '-m', 'benchmarks.decode_loaders', '--workers', '1', '--batches',
           '1', '--runs', '1', '--only', 'center']
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = [line for line in proc.stdout.splitlines() if line.startswith('| resize256')]
    assert len(row) == 1 and row[0].count('|') == 11, proc.stdout
    loadr_fused, unfused, plain = (float(c.replace(',', '')) for c in row[0].split('|')[3:6])
    assert loadr_fused > 0 and unfused > 0 and plain > 0


def test_a_run_rewrites_only_its_section_of_benchmarks_md(tmp_path):
    """BENCHMARKS.md is written by hand: a run replaces what lies between the run
    markers, every other byte kept, and leaves a file without them untouched."""
    from benchmarks.report import RUN_END, RUN_START, write_benchmarks_md
    table = '## Results\n\nCommand: `python -m benchmarks`\n\n### images\n\n| loader |\n'
    bare = tmp_path / 'bare.md'
    bare.write_text('# Benchmarks\n\nhand-written\n')
    assert not write_benchmarks_md({}, table, str(bare))
    assert bare.read_text() == '# Benchmarks\n\nhand-written\n'
    marked = tmp_path / 'marked.md'
    head, tail = '# Benchmarks\n\nintro\n\n', '\n\n### Hand-written topic\n\nfigures\n'
    marked.write_text(head + RUN_START + '\nold tables\n' + RUN_END + tail)
    assert write_benchmarks_md({}, table, str(marked))
    text = marked.read_text()
    assert text.startswith(head + RUN_START + '\n### The full side-by-side run\n')
    assert text.endswith(RUN_END + tail) and 'old tables' not in text
    assert '#### images' in text
    # The repository's own file has its markers.
    root = __import__('pathlib').Path(__file__).resolve().parents[1]
    own = (root / 'BENCHMARKS.md').read_text(encoding='utf-8')
    assert own.count(RUN_START) == 1 and own.count(RUN_END) == 1
