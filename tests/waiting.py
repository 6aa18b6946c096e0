"""Waiting in tests for something to happen, never for some time to pass.

A test that needs a state (processes gone, a file removed, a thread blocked)
polls for it with :func:`wait_until`, which returns as soon as it holds and
fails only after :data:`HANG_S`: far longer than any run takes on a loaded
machine, so a failure means a hang, never slowness.

Example::

    wait_until(lambda: not os.path.exists(path), f'{path} removed')
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ['HANG_S', 'POLL_S', 'wait_until']

# Only a true hang takes this long: what a test waits for happens in well under a
# second on a quiet machine, and in a few seconds on one shared by many jobs.
HANG_S = 30.0
# How often the condition is looked at again.
POLL_S = 0.01

T = TypeVar('T')


def wait_until(condition: Callable[[], T], what: str | Callable[[], str],
               timeout_s: float = HANG_S) -> T:
    """``condition()``'s first true value, asked every :data:`POLL_S`; AssertionError
    saying ``what`` was awaited (a string, or a callable for one made at the failure:
    the state that was left) once ``timeout_s`` has gone by without it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f'still waiting after {timeout_s:g} s for {said}')
        time.sleep(POLL_S)
