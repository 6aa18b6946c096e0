"""grain's transforms around the per-sample fns (its own module: grain is optional).

Defined at module level so that grain's spawned workers can import them.

Example::

    ops = [transform(image_fn, random=True), grain.python.Batch(64)]
"""

from __future__ import annotations

import grain.python as gp

__all__ = ['GrainMap', 'GrainRandomMap', 'transform']


class GrainMap(gp.MapTransform):
    """A plain map: ``fn(element, seed=None)``."""

    def __init__(self, fn):
        self.fn = fn

    def map(self, element):
        return self.fn(element, seed=None)


class GrainRandomMap(gp.RandomMapTransform):
    """A random map: grain's per-record generator is the seed (``default_rng`` takes it as is)."""

    def __init__(self, fn):
        self.fn = fn

    def random_map(self, element, rng):
        return self.fn(element, seed=rng)


def transform(fn, random: bool):
    """The grain transform that calls ``fn``."""
    return GrainRandomMap(fn) if random else GrainMap(fn)
