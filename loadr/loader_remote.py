"""A Loader with remote workers: agents (started by an engine, ``remote=``) beside its own.

The local :class:`~loadr.workers.pool.WorkerPool` (``workers`` processes, 0
too) owns the shared-memory slots; a :class:`~loadr.workers.remote.RemotePool`
of agents writes its rows into the same slots; a
:class:`~loadr.workers.remote.HybridPool` puts both under the one window.
Nothing of the placement reaches the saved state.
"""

from __future__ import annotations

import functools

from .assemble import OBJECT, Assembler
from .stats import WORKER_RECORDS
from .workers.window import LEASED_SLOTS, Window

__all__ = ['LoaderRemote', 'check_engine', 'canary_positions']


def check_engine(remote) -> None:
    """Raise ConfigError unless ``remote`` is an engine (loadr.remote, loadr.ray)."""
    from .errors import ConfigError

    if not all(hasattr(remote, name) for name in ('open', 'launch', 'stop_all')):
        raise ConfigError(f'remote must be an engine such as loadr.ray.Workers(...) or '
                          f'loadr.remote.Subprocesses(...), got {remote!r}')


def canary_positions(n: int) -> list[int]:
    """The stream positions whose datapoints every agent digests at start: the first and
    the last of the first epoch."""
    return sorted({0, n - 1})


class LoaderRemote:
    """The remote half of :class:`loadr.Loader` (a mixin: it reads the loader's settings)."""

    def _remote_window(self, spec: dict):
        from .workers.agent import AgentConfig, canary
        from .workers.pool import WorkerPool
        from .workers.remote import HybridPool, RemotePool
        from .workers.shm import Layout

        engine = self._remote
        engine.open()
        processes = self.workers + engine.agents * engine.cpus
        if self._prefetch_given is None:
            self.prefetch = max(2, 2 * processes)
        fields = {k: (d, s) for k, (d, s) in spec.items() if d != OBJECT}
        layout = Layout(fields, self.batch)
        slots = self.prefetch + (1 if self.ring else LEASED_SLOTS)
        warming, self._warming = self._warming, None
        if warming is not None:         # a reader warming before a fork: done first
            warming.join()
        if self._source is None:
            from .shared import share
            self._source = share(self.reader)
        # Traced: every worker, local or an agent's, keeps a ring of task records.
        traced = WORKER_RECORDS if self._tracer is not None else 0
        local = WorkerPool(self._source, self.fns, spec, layout, self.workers, slots, self.n,
                           self.shuffle, self.on_error, self.start_method, self.timeout,
                           self.order_version, init_fn=self._worker_init_fn,
                           trace_records=traced)
        try:
            order = self._order()
            asm = Assembler(self.reader, self.fns, spec)
            positions = canary_positions(self.n)
            canaries = [canary(asm, order, p) for p in positions]
            # A YAML pipeline's loader has a recipe: the agents rebuild it (loadr.config).
            recipe = getattr(self, 'recipe', None)
            make_config = functools.partial(
                _agent_config, AgentConfig, dict(
                    spec=spec, fields=fields, batch=self.batch, n=self.n, shuffle=self.shuffle,
                    on_error=self.on_error, order_version=self.order_version,
                    processes=engine.cpus, reader=None if recipe else self.reader,
                    fns=[] if recipe else list(self.fns), recipe=recipe,
                    rebuild=getattr(self, 'rebuild', None), seed=self.seed,
                    canaries=positions, timeout=self.timeout, trace_records=traced))
            remote = RemotePool(engine, make_config, local.views, layout, canaries)
        except BaseException:
            local.close()
            raise
        self._pool = HybridPool(local, remote)
        if self._tracer is not None:
            self._tracer.attach(self._pool)
        import weakref
        self._finalizer = weakref.finalize(self, self._pool.close)
        list_keys = [k for k, (d, _) in spec.items() if d == OBJECT]
        self._window = Window(self._pool, self.prefetch, processes, list_keys, self.ring)
        return self._window


def _agent_config(make, fields: dict, index: int, server_secret: bytes, client_public: bytes):
    return make(**fields, server_secret=server_secret, allowed=[client_public],
                name=str(index))
