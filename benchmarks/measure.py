"""Measuring one run: wall time, CPU time of the process tree, peak RSS, /dev/shm use.

A :class:`Monitor` samples, from a thread of the benchmark process, the RSS
of this process and of all its descendants (the loader's workers) and the
bytes in use on /dev/shm, and keeps the peaks. CPU time is read from the
whole process tree at the start and end of the timed part.

Notes on what the numbers mean:

- RSS counts every page a process has mapped, shared ones too (libraries
  inherited through fork, shared-memory batch slots), so the workers' sum
  can count a page more than once.
- /dev/shm use is the file system's own count (``statvfs``), so it also sees
  segments that were unlinked while still mapped (torch's way); it is
  machine-wide, so another program using /dev/shm at the same time shows up
  too (the report gives the median over the runs).

Example::

    with Monitor() as mon:
        ...                                  # run the loader
    mon.peak_main_bytes, mon.peak_workers_bytes, mon.peak_shm_bytes
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time

import psutil

__all__ = ['Monitor', 'tree_cpu_s', 'shm_used_bytes', 'machine_info', 'MIB']

MIB = 2**20
SAMPLE_INTERVAL_S = 0.02
SHM_DIR = '/dev/shm'


def shm_used_bytes() -> int:
    """Bytes in use on /dev/shm (0 where there is none)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _tree() -> list[psutil.Process]:
    me = psutil.Process()
    try:
        return [me, *me.children(recursive=True)]
    except psutil.Error:
        return [me]


def tree_cpu_s() -> dict[int, float]:
    """User + system CPU seconds of this process and each live descendant, by pid."""
    out = {}
    for proc in _tree():
        try:
            t = proc.cpu_times()
            out[proc.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def cpu_delta_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two :func:`tree_cpu_s` readings (new processes from 0)."""
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


class Monitor:
    """Peaks of main RSS, workers' summed RSS and /dev/shm use, sampled every 20 ms."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S):
        self.interval_s = interval_s
        self.peak_main_bytes = 0
        self.peak_workers_bytes = 0
        self.shm_base_bytes = shm_used_bytes()
        self.peak_shm_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name='bench-monitor', daemon=True)

    def sample(self) -> None:
        procs = _tree()
        me, children = procs[0], procs[1:]
        try:
            self.peak_main_bytes = max(self.peak_main_bytes, me.memory_info().rss)
        except psutil.Error:
            pass
        workers = 0
        for child in children:
            try:
                workers += child.memory_info().rss
            except psutil.Error:
                pass
        self.peak_workers_bytes = max(self.peak_workers_bytes, workers)
        self.peak_shm_bytes = max(self.peak_shm_bytes, shm_used_bytes() - self.shm_base_bytes)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> Monitor:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _cpu_model() -> str:
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str | None:
    try:
        from importlib import metadata
        return metadata.version(module)
    except Exception:
        return None


def machine_info() -> dict:
    """Cores, CPU model, memory, OS, Python and the versions of every library measured."""
    libs = {name: _version(name) for name in (
        'loadr', 'numpy', 'Pillow', 'pyzmq', 'multiprocess', 'msgpack', 'torch', 'granular',
        'gulpio2', 'grain', 'simplejpeg', 'psutil', 'matplotlib')}
    return {
        'cores': os.cpu_count(),
        'cpu_model': _cpu_model(),
        'memory_gib': round(psutil.virtual_memory().total / 2**30, 1),
        'os': f'{platform.system()} {platform.release()}',
        'python': sys.version.split()[0],
        'libraries': {k: v for k, v in libs.items() if v is not None},
        'load_average': [round(x, 2) for x in os.getloadavg()],
        'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'),
    }
