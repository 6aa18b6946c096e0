"""Remote workers without a cluster: agents as processes on this host.

``Loader(..., remote=loadr.remote.Subprocesses(agents=2, cpus=1))`` starts
``agents`` agent processes (``python -m loadr.workers.agent``), each running
``cpus`` worker processes, and has them make batches beside (or, with
``workers=0``, instead of) the loader's own workers, over the same tcp
protocol (CURVE, an allow-list of this run's key) that agents on other hosts
speak through :mod:`loadr.ray`. For tests, and for trying remote workers
without a cluster: the batches are the same to the byte.

An engine is what starts, kills and stops agents
(:class:`~loadr.workers.remote.Engine`, a Protocol); it offers:

- ``agents``, ``cpus``: how many agents and worker processes each, known once
  ``open()`` has run;
- ``launch(index, config)``: start agent ``index`` with an
  :class:`~loadr.workers.agent.AgentConfig`; a handle with ``ready()`` (the
  agent's address and checks as a dict, None while it starts; an ``'error'``
  key if it could not), ``alive()`` and ``kill()``;
- ``stop_all(handles)``: stop the agents in order (their pools first).

Example::

    import loadr.remote
    loader = loadr.Loader(reader, batch=64, fns=fns, workers=0,
                          remote=loadr.remote.Subprocesses(agents=2, cpus=2))
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
from typing import IO

from .errors import ConfigError

__all__ = ['Subprocesses', 'STOP_TIMEOUT_S']

STOP_TIMEOUT_S = 10.0


class _Process:
    """An agent process: its config goes in on stdin, its address comes out on stdout."""

    def __init__(self, index: int, config, env: dict | None):
        import dill

        # recurse: a fn of the main script goes with the globals it uses (its module is
        # not the agent's __main__).
        blob = dill.dumps(config, recurse=True)
        self.index = index
        self.info: dict | None = None
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, '-m', 'loadr.workers.agent'], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env, start_new_session=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None     # both PIPE
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout
        self.stdin.write(struct.pack('<Q', len(blob)) + blob)
        self.stdin.flush()
        self.done = threading.Event()
        threading.Thread(target=self._read, name=f'loadr-agent-{index}-out',
                         daemon=True).start()

    def _read(self) -> None:
        from .workers.agent import READY_MARK

        try:
            for raw in self.stdout:
                line = raw.decode(errors='replace')
                if self.info is None and line.startswith(READY_MARK):
                    self.info = json.loads(line[len(READY_MARK):])
                    self.done.set()
                elif line.strip():
                    # What the user's code printed on the agent: shown here, not lost.
                    sys.stderr.write(f'[agent {self.index}] {line}')
        finally:
            self.done.set()

    def ready(self) -> dict | None:
        if self.info is not None:
            return self.info
        if self.done.is_set() or self.proc.poll() is not None:
            self.done.wait(1.0)
            if self.info is not None:
                return self.info
            return {'error': f'the agent process exited with code {self.proc.poll()} before '
                             f'it listened', 'host': os.uname().nodename}
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(STOP_TIMEOUT_S)
        self._close_pipes()

    def stop(self) -> None:
        """Close stdin: the agent stops its pool, then leaves."""
        try:
            self.stdin.close()
        except OSError:
            pass

    def _close_pipes(self) -> None:
        for f in (self.stdin, self.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass


class Subprocesses:
    """``agents`` agent processes on this host, ``cpus`` worker processes each.

    ``env``: the agents' environment (default: this process's), e.g. to give
    them another ``PYTHONPATH``, as another host would have. ``curve=False``:
    plain tcp on loopback, no keys (any process of this host could connect):
    only to measure what CURVE costs (``benchmarks.remote_workers``).
    """

    def __init__(self, agents: int = 2, cpus: int = 1, env: dict | None = None,
                 curve: bool = True):
        for name, value in (('agents', agents), ('cpus', cpus)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f'{name} must be a whole number >= 1, got {value!r}')
        self.agents, self.cpus = agents, cpus
        self.env = None if env is None else dict(env)
        self.curve = bool(curve)
        self.bind_host = '127.0.0.1'

    def open(self) -> None:
        """Nothing to connect to: the agents are started here."""

    def launch(self, index: int, config) -> _Process:
        config.bind_host = self.bind_host
        config.curve = self.curve
        return _Process(index, config, self.env)

    def stop_all(self, handles: list) -> None:
        """Ask every agent to stop (stdin closed), wait, then kill what is left."""
        for h in handles:
            h.stop()
        for h in handles:
            try:
                h.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            h.kill()

    def __repr__(self) -> str:
        return f'Subprocesses(agents={self.agents}, cpus={self.cpus})'
