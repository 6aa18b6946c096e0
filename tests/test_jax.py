"""loadr.jax on CPU: a real 2-process job (jax.distributed, a local coordinator),
2 devices per process, each process loading half of each global batch
(tests/dist/jax_job.py); plus the checks that need one process only.

JAX starts threads when it initialises, and this pytest process forks loader
workers in many later tests: forking a multithreaded process can deadlock.
So nothing here imports jax: the one-process checks (tests/dist/jax_local.py)
and loadr/jax.py's own examples run in a pytest of their own, in a child.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from .conftest import in_ci

# Jobs of several processes and a child pytest (CI runs them: -m '').
pytestmark = pytest.mark.slow

if importlib.util.find_spec('jax') is None:
    if in_ci():
        raise ImportError('jax is not installed, and CI must run these tests')
    pytest.skip('jax is not installed (pip install jax jaxlib)', allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOB = ROOT / 'tests' / 'dist' / 'jax_job.py'
JOB_TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_two_processes_build_global_arrays_from_their_halves_and_resume(tmp_path):
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'JAX_PLATFORMS': 'cpu',
           'XLA_FLAGS': '--xla_force_host_platform_device_count=2', 'OMP_NUM_THREADS': '1'}
    coordinator = f'127.0.0.1:{free_port()}'
    procs = [subprocess.Popen([sys.executable, str(JOB), '--coordinator', coordinator,
                               '--process-id', str(i), '--out', str(tmp_path)],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=JOB_TIMEOUT_S)[0])
    finally:
        for p in procs:                 # one that hangs (its peer died) must not outlive us
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    results = [json.loads((tmp_path / f'process{i}.json').read_text()) for i in range(2)]
    assert [(r['devices'], r['local_devices']) for r in results] == [(4, 2)] * 2
    assert results[0]['state'] == results[1]['state']        # one state for every process
    try:
        import orbax.checkpoint  # noqa: F401
        assert results[0]['checkpoint'] == 'orbax'
    except ImportError:
        assert results[0]['checkpoint'] == 'json'


def test_one_process_checks_and_the_modules_examples_in_a_child_pytest():
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'LOADR_JAX_DOCTESTS': '1'}
    done = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                           '--numprocesses=0', '-m', '',     # one process, every test
                           '--doctest-modules', 'loadr/jax.py', 'tests/dist/jax_local.py'],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert ' passed' in done.stdout and 'failed' not in done.stdout
