"""Before worker processes start: how they start, and what a reader warms for them.

How: ``'fork'`` where there is one and nothing makes it unsafe
(:func:`default_start_method`). What: a reader that warms (a remote dataset's
index tables, the records of the first batches) is warmed on a thread in the
main process before the fork (:func:`warm_before_fork`), so that every forked
worker inherits what it read instead of spending round trips on the same reads.

Nothing here imports ZeroMQ or ``multiprocess`` at import time: ``import loadr``
stays light.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

__all__ = ['start_methods', 'default_start_method', 'warm_before_fork', 'first_indices',
           'FIRST_INDICES_MOST']

log = logging.getLogger('loadr')

# The most datapoints whose records the loader reads for its workers before it forks
# them (the first batches': see first_indices).
FIRST_INDICES_MOST = 4096


def start_methods() -> list[str]:
    """The start methods worker processes may use here (``multiprocess``'s)."""
    import multiprocess
    return multiprocess.get_all_start_methods()


def default_start_method() -> str:
    """How workers start when ``start_method`` is not given.

    ``'fork'`` where there is one, like torch's DataLoader on Linux: workers
    start in milliseconds and need no ``__main__`` guard. Not once JAX has
    started its backends: they run threads, a fork of a multithreaded process
    can deadlock (JAX warns at each one), so ``'forkserver'`` (else
    ``'spawn'``), which start workers from a process without those threads.
    Importing JAX alone starts no thread (a library that imports it, such as
    ``loadr.jax``, leaves fork safe).

    >>> default_start_method() in ('fork', 'forkserver', 'spawn')
    True
    """
    methods = start_methods()
    if 'fork' in methods and not _jax_threads():
        return 'fork'
    return 'forkserver' if 'forkserver' in methods else 'spawn'


def _jax_threads() -> bool:
    """Whether JAX runs in this process with its backends (and their threads) started."""
    if sys.modules.get('jax') is None:
        return False
    bridge = sys.modules.get('jax._src.xla_bridge')
    started = getattr(bridge, 'backends_are_initialized', None)
    # A JAX without that function: assume the threads are there (the safe side).
    return True if started is None else bool(started())


def first_indices(schedule, order, workers: int) -> list[int]:
    """The datapoints of the first ``workers + 1`` batches of ``schedule`` (a
    :class:`~loadr.workers.window.Schedule`) in ``order``, at most
    ``FIRST_INDICES_MOST``: what the workers make first."""
    out: list[int] = []
    for j in range(workers + 1):
        plan = schedule.plan(j)
        if plan is None or len(out) + plan.count > FIRST_INDICES_MOST:
            break
        out.extend(order.indices(plan.start, plan.count).tolist())
    return out


def warm_before_fork(warm: Callable[[list], object], indices: list[int]) -> threading.Thread:
    """Start ``warm(indices)`` (a reader's warm hook, :mod:`loadr.sources`) on a thread,
    to be joined before the fork; the pool's modules are imported there too. Warming
    is a hint: what fails is left to the reads to report."""

    def run():
        try:
            warm(indices)
            # The pool's modules (pyzmq: ~20 ms on a first import) while the probe
            # still waits on the network, not after it.
            from . import pool  # noqa: F401
        except Exception as exc:
            log.debug('loadr: warming the reader before the fork failed: %r', exc)
    thread = threading.Thread(target=run, name='loadr-warm', daemon=True)
    thread.start()
    return thread
