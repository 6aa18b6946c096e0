"""The Loader's settings: how workers start (:func:`default_start_method`), the
limits of its whole-number settings and the checks that name a bad one
(``_whole``, ``_real``), and the check of a given ``spec``."""

from __future__ import annotations

import sys

import numpy as np

from .errors import ConfigError


def _start_methods() -> list[str]:
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
    methods = _start_methods()
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


# The largest values the Loader's whole-number settings may take: past these a
# setting is a typo, not a plan (a slot is a batch of shared memory, a worker
# a process), and each is far below where a count would overflow.
MAX_BATCH = 2**31 - 1
MAX_WORKERS = 4096
MAX_PREFETCH = 65536


def _whole(name: str, value, lo: int, hi: int | None = None, also: str = '') -> int:
    """``value`` as an int in ``[lo, hi]``, else a ConfigError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ConfigError(f'{name} must be an int >= {lo}{also}, got {value!r}')
    if hi is not None and value > hi:
        raise ConfigError(f'{name} must be at most {hi}, got {value!r}')
    return int(value)


def _real(name: str, value, lo: float, hi: float | None = None, above: bool = False,
          none: str = '') -> float:
    """``value`` as a finite float in its range (``> lo`` if ``above``), else a ConfigError
    naming the setting: NaN and infinity pass no comparison, so they are refused first."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer,
                                                             np.floating))
    if ok:
        try:
            value = float(value)
        except OverflowError:               # an int past float's range
            ok = False
    if ok and np.isfinite(value) and (value > lo if above else value >= lo) \
            and (hi is None or value <= hi):
        return value
    where = f'> {lo:g}' if above else f'>= {lo:g}'
    if hi is not None:
        where = f'in [{lo:g}, {hi:g}]'
    raise ConfigError(f'{name} must be a finite number {where}{none}, got {value!r}')


def _normalize_spec(spec: dict) -> dict:
    out = {}
    for key, value in spec.items():
        try:
            dtype, shape = value
            out[key] = (np.dtype(dtype), tuple(int(s) for s in shape))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f'spec[{key!r}] must be (dtype, shape), got {value!r}') from exc
    return out
