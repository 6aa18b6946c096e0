"""Shared memory that does not depend on /dev/shm, and a budget that shrinks the window.

Docker gives a container 64 MiB of /dev/shm; one batch of 256 images of
224x224x3 is 38.5 MB. The loaders here run in a private mount namespace whose
/dev/shm is a 64 MiB tmpfs (``unshare -m``, as root or with user namespaces).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import loadr
from loadr.errors import ResourceError

from ..loader_helpers import batch_digest, noisy, stream_digests, trivial
from .helpers import ROOT, children

pytestmark = pytest.mark.timeout(120)

SMALL_SHM_MIB = 64


def in_small_shm(argv: list, env: dict | None = None,
                 timeout_s: float = 100) -> subprocess.CompletedProcess:
    """Run ``argv`` with a private /dev/shm of SMALL_SHM_MIB (skip where we cannot)."""
    unshare = shutil.which('unshare')
    mount = f'mount -t tmpfs -o size={SMALL_SHM_MIB}m tmpfs /dev/shm'
    probe = None if unshare is None else subprocess.run(
        [unshare, '-m', 'sh', '-c', mount], capture_output=True)
    if probe is None or probe.returncode != 0:
        rootless = None if unshare is None else subprocess.run(
            [unshare, '-rm', 'sh', '-c', mount], capture_output=True)
        if rootless is None or rootless.returncode != 0:
            pytest.skip('cannot mount a small /dev/shm in a private mount namespace here '
                        '(needs unshare, and root or user namespaces)')
        cmd = [unshare, '-rm']
    else:
        cmd = [unshare, '-m']
    script = f'{mount} && exec "$0" "$@"'
    return subprocess.run([*cmd, 'sh', '-c', script, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s,
                          env={**os.environ, 'PYTHONPATH': str(ROOT), **(env or {})})


BIG_BATCHES = '''
    import json, os
    import numpy as np
    import loadr
    from tests.loader_helpers import batch_digest

    class Images:
        """256 images of 224x224x3 per batch: 38.5 MB, more than half of /dev/shm."""

        def __len__(self):
            return 2048

        def __getitem__(self, i):
            return {'image': np.full((224, 224, 3), i % 251, np.uint8), 'label': i}

    def flip(dp, seed):
        image = dp['image'][:, ::-1] if seed % 2 else dp['image']
        return {'image': np.ascontiguousarray(image), 'label': np.int64(dp['label'])}

    def run(workers):
        with loadr.Loader(Images(), batch=256, fns=[flip], seed=3, workers=workers) as loader:
            it = iter(loader)
            digests = [batch_digest(next(it)) for _ in range(4)]
            inside = sorted(os.listdir('/dev/shm'))
            slots = None if loader._pool is None else loader._pool.slot_count
        return digests, inside, slots

    st = os.statvfs('/dev/shm')
    got, inside, slots = run(8)
    expected, _, _ = run(0)
    print(json.dumps({'shm_mib': st.f_blocks * st.f_frsize / 2**20, 'same': got == expected,
                      'inside': inside, 'slots': slots, 'after': os.listdir('/dev/shm')}))
'''


def test_batches_of_256_images_with_8_workers_run_in_a_64_mib_dev_shm():
    done = in_small_shm([sys.executable, '-c', textwrap.dedent(BIG_BATCHES)])
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info['shm_mib'] == SMALL_SHM_MIB         # it did run in the small one
    assert info['same']                              # the batches of workers=0
    assert info['slots'] == 2 * 8 + 2                # the whole window: memfds, not /dev/shm
    assert info['inside'] == [] and info['after'] == []


def test_with_dev_shm_segments_the_error_says_what_fits_and_how_to_fix_it():
    # The fallback (LOADR_SHM=devshm, for systems without memfd): the same loader
    # cannot have one slot per worker plus one in 64 MiB, and says so before a batch.
    done = in_small_shm([sys.executable, '-c', textwrap.dedent(BIG_BATCHES)],
                        env={'LOADR_SHM': 'devshm'})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith('loadr.errors.ResourceError: '), done.stderr
    assert 'one batch slot of 36.8 MiB for each of the 8 workers, plus one' in last
    assert '/dev/shm has' in last and 'free' in last
    assert 'lower batch or workers, or make /dev/shm larger (docker run --shm-size)' in last


def test_loadr_demo_runs_in_a_64_mib_dev_shm():
    done = in_small_shm([sys.executable, '-m', 'loadr', 'demo'])
    assert done.returncode == 0, done.stderr
    assert 'the same batch' in done.stdout


SPEC = {'label': ('int64', ()), 'vec': ('float32', (16,)), 'seed': ('uint64', ())}


def test_a_budget_below_one_slot_per_worker_plus_one_fails_before_the_first_batch(
        monkeypatch):
    slot = 64 * (16 * 4 + 8 + 8)                 # one batch of 64 rows (+ alignment)
    monkeypatch.setenv('LOADR_SHM_BYTES', str(2 * slot))
    before = set(children())
    loader = loadr.Loader(trivial(200), batch=64, fns=[noisy], workers=2, spec=SPEC)
    try:
        with pytest.raises(ResourceError) as info:
            next(iter(loader))
        message = str(info.value)
        assert 'need at least' in message and 'for each of the 2 workers, plus one' in message
        assert f'budget of {2 * slot} B (LOADR_SHM_BYTES={2 * slot})' in message
        assert loader.worker_pids == [] and set(children()) == before   # nothing started
    finally:
        loader.close()
    # What it advises is something a Loader user can do, and it is enough.
    advice = re.search(r'; lower batch or workers, or set LOADR_SHM_BYTES=(\d+) \(or more\) '
                       r'in the environment$', message)
    assert advice is not None, message
    monkeypatch.setenv('LOADR_SHM_BYTES', advice.group(1))
    with loadr.Loader(trivial(200), batch=64, fns=[noisy], workers=2, spec=SPEC) as loader:
        assert len(next(iter(loader))['label']) == 64


def test_a_budget_below_the_window_shrinks_it_and_the_stream_is_unchanged(monkeypatch,
                                                                          caplog):
    data = trivial(300)
    with loadr.Loader(data, batch=16, fns=[noisy], seed=5, workers=0) as ref:
        expected = stream_digests(ref, 40)
    from loadr.workers.shm import Layout
    slot = Layout({k: (np.dtype(d), s) for k, (d, s) in SPEC.items()}, 16).nbytes
    monkeypatch.setenv('LOADR_SHM_BYTES', str(4 * slot + 100))     # + the status segment
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(data, batch=16, fns=[noisy], seed=5, workers=2, prefetch=4,
                          spec=SPEC) as loader:
            it = iter(loader)
            got = [batch_digest(next(it)) for _ in range(40)]
            assert loader._pool.slot_count == 4 < 4 + 2
    assert got == expected
    assert any('holds 4 of the 6 batch slots' in r.getMessage() for r in caplog.records)
