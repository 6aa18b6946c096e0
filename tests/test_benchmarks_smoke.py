"""The benchmark command runs end to end at its smallest size and writes its table and JSON.

It asserts nothing about speed (the machine is shared; timings belong in
BENCHMARKS.md, not in tests). Skipped where the ``bench`` extra is not
installed (CI installs only ``test``).
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip('torch')
pytest.importorskip('granular')
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
                    '### Reader throughput'):
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
    # --no-publish leaves the repository's BENCHMARKS.md and plot alone; no plot without scaling.
    assert not (out / 'scaling.png').exists()
