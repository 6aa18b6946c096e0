"""Which fork of the process this is: one counter, bumped in the child of every fork.

A storage notes it beside what one process must not share with another (file
descriptors, fsspec filesystems and their sessions, read-ahead futures) and
compares it before use: cheaper than a ``getpid()`` per read.

>>> from loadr.storage import forks
>>> isinstance(forks.generation, int)
True
"""

from __future__ import annotations

import os

__all__ = ['generation']

generation = 0


def _after_fork() -> None:
    global generation
    generation += 1


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork)
