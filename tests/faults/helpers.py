"""What the fault tests share: scripts in their own process group, leak probes, killers.

Every probe reads the real system (``/proc``, ``/dev/shm``); nothing of loadr
is mocked. Scripts run with the repository on ``PYTHONPATH`` and in a new
session, so a test can signal the whole group the way a terminal does.

Example::

    proc = start_script(SCRIPT, 'catch')
    info = read_json_line(proc)                 # what the script printed first
    os.killpg(proc.pid, signal.SIGINT)          # Ctrl-C, as a terminal sends it
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

from loadr.workers.shm import MARKER, PREFIX, SHM_DIR

from ..waiting import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT_TIMEOUT_S = 30


# Every script a test started: the faults conftest kills what is left of them
# after each test, so a failed assertion cannot leave a loader running.
STARTED: list[subprocess.Popen] = []


def start_script(code: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    """Run ``code`` (dedented) in a new Python process in its own session and group,
    with ``env`` added to the environment."""
    env = {**os.environ, 'PYTHONPATH': str(ROOT), **(env or {})}
    proc = subprocess.Popen([sys.executable, '-c', textwrap.dedent(code), *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    STARTED.append(proc)
    return proc


def read_json_line(proc: subprocess.Popen, timeout_s: float = SCRIPT_TIMEOUT_S) -> dict:
    """The next stdout line of ``proc`` as JSON; fails (and kills the group) after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
        if ready:
            line = proc.stdout.readline()
            if line:
                return json.loads(line)
            raise AssertionError(f'script ended early:\n{finish(proc)[1]}')
        if left <= 0:
            kill_group(proc)
            raise AssertionError(f'no line from the script in {timeout_s} s')


def finish(proc: subprocess.Popen, timeout_s: float = SCRIPT_TIMEOUT_S) -> tuple[str, str]:
    """Wait for ``proc``; (stdout, stderr). A script that does not end is killed and fails."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        _, err = proc.communicate()
        raise AssertionError(f'script did not end in {timeout_s} s; stderr:\n{err}') from None


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def tracebacks(stderr: str) -> int:
    """Separate tracebacks in ``stderr`` (a chained exception counts once)."""
    lines = stderr.splitlines()
    count = 0
    for i, line in enumerate(lines):
        if line.startswith('Traceback (most recent call last)'):
            chained = i >= 2 and (lines[i - 2].startswith('During handling of the above')
                                  or lines[i - 2].startswith('The above exception was the'))
            count += not chained
    return count


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until_gone(pids) -> None:
    """Return once every pid is gone; AssertionError naming the survivors if that takes
    as long as only a hang does (:data:`tests.waiting.HANG_S`)."""
    wait_until(lambda: not any(running(p) for p in pids),
               lambda: f'processes {[p for p in pids if running(p)]} to end')


def children(pid: int | None = None) -> list[int]:
    """Live (non-zombie) child processes of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != 'Z':
            found.append(int(entry))
    return found


def owned_dirs(pid: int | None = None, parent: str = SHM_DIR) -> list[str]:
    """Paths of the directories loadr made in ``parent`` for ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return sorted(os.path.join(parent, n) for n in os.listdir(parent)
                  if n.startswith(f'{PREFIX}{pid}-'))


def memfds(pid: int | None = None) -> list[str]:
    """The loadr memfd segments that ``pid`` (default: this process) holds open, as
    ``/proc/<pid>/fd/<n>`` paths."""
    pid = os.getpid() if pid is None else pid
    found = []
    try:
        fds = os.listdir(f'/proc/{pid}/fd')
    except (FileNotFoundError, ProcessLookupError):
        return []
    for fd in fds:
        path = f'/proc/{pid}/fd/{fd}'
        try:
            if os.readlink(path).startswith(f'/memfd:{PREFIX}'):
                found.append(path)
        except OSError:
            pass
    return sorted(found)


def segments(pid: int | None = None) -> list[str]:
    """The shared-memory segments that ``pid`` (default: this process) owns: its memfds
    (``/proc/<pid>/fd/<n>``) and its /dev/shm files, as paths relative to /dev/shm
    (``loadr-<pid>-<token>/slot0``); markers are not segments. Either joins onto SHM_DIR."""
    found = memfds(pid)
    for path in owned_dirs(pid):
        try:
            found += [os.path.join(os.path.basename(path), n) for n in os.listdir(path)
                      if n != MARKER]
        except FileNotFoundError:
            pass
    return sorted(found)


def segment_bytes(pid: int | None = None) -> int:
    """Bytes those segments occupy in /dev/shm (allocated blocks, not apparent size)."""
    total = 0
    for name in segments(pid):
        try:
            total += os.stat(os.path.join(SHM_DIR, name)).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def open_fds() -> int:
    return len(os.listdir('/proc/self/fd'))


def rss_bytes(pid: str | int = 'self') -> int:
    """Resident memory of ``pid``; 0 for a zombie (a just-killed worker has none)."""
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) * 1024
    return 0


class Killer:
    """A thread that SIGKILLs a random ready worker of ``loader`` every few milliseconds.

    Only workers that said hello are shot: killing workers before they start
    is the pool's 'cannot start workers' case, tested on its own. After each
    kill it waits (however long the loaded machine takes) until the pool has
    replaced its victim before it picks the next: a SIGKILL to a worker that
    is dead but not yet reaped still succeeds, and would count a death that
    was never caused. So ``kills`` is the number of live workers killed, each
    one seen by the pool; ``done`` is set once ``max_kills`` have been.

    Example::

        with Killer(loader, seed=1, every_s=(0.02, 0.06), max_kills=20) as killer:
            ...iterate until killer.done.is_set()...
        killer.kills          # how many workers were killed (and replaced)
    """

    def __init__(self, loader, seed: int, every_s: tuple[float, float],
                 max_kills: int | None = None):
        self.loader, self.rng, self.every_s = loader, random.Random(seed), every_s
        self.max_kills = max_kills
        self.kills = 0
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='test-killer', daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(*self.every_s)):
            pool = self.loader._pool
            if pool is None:
                continue
            ready = [w for w in list(pool.workers) if w is not None and w.ready]
            if not ready:
                continue
            victim = self.rng.choice(ready)
            try:
                os.kill(victim.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills += 1
            # The pool replaces a worker from the consumer's thread, as it iterates.
            while pool.workers[victim.wid] is victim and not self._stop.wait(0.002):
                pass
            if self.max_kills is not None and self.kills >= self.max_kills:
                self.done.set()
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
