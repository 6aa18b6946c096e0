"""Helpers the loader tests share: datasets, hashing, leak checks."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from loadr.workers.shm import PREFIX, SHM_DIR


def trivial(n=1000):
    return [{'label': i, 'vec': np.full(16, i, np.float32)} for i in range(n)]


def noisy(dp, seed):
    rng = np.random.default_rng(seed)
    return {'label': dp['label'], 'vec': dp['vec'] + rng.standard_normal(16).astype(np.float32),
            'seed': np.uint64(seed)}


def salted(dp, seed):
    """``noisy`` plus ``LOADR_TEST_SALT`` from the environment: a datapoint that tells whether
    the process that made it had the variable (a Ray ``runtime_env`` sets it on agents)."""
    out = noisy(dp, seed)
    out['vec'] = out['vec'] + np.float32(float(os.environ.get('LOADR_TEST_SALT', '0')))
    return out


def slowed(delay_s: float):
    """``noisy`` after a sleep of ``delay_s``: batches that take long enough to be caught
    in flight (killed, stopped, interrupted)."""
    def slow(dp, seed):
        time.sleep(delay_s)
        return noisy(dp, seed)
    return slow


def batch_digest(batch) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        h.update(key.encode())
        if isinstance(value, np.ndarray):
            h.update(str(value.dtype).encode() + str(value.shape).encode())
            h.update(np.ascontiguousarray(value).tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def stream_digests(loader, count):
    it = iter(loader)
    return [batch_digest(next(it)) for _ in range(count)]


def our_segments(pid=None):
    """The shared memory ``pid`` holds: its /dev/shm entries and its loadr memfds."""
    pid = os.getpid() if pid is None else pid
    found = [n for n in os.listdir(SHM_DIR) if n.startswith(f'{PREFIX}{pid}-')]
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            if os.readlink(f'/proc/{pid}/fd/{fd}').startswith(f'/memfd:{PREFIX}'):
                found.append(f'/proc/{pid}/fd/{fd}')
        except OSError:
            pass
    return sorted(found)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(')')[-1].split()[0] != 'Z'
    except FileNotFoundError:
        return False
    return True
