"""Fuzz fixtures: one writable workspace per fixture and tracemalloc on, per module."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from .harness import TARGETS, Workspace

# CI runs a few hundred inputs per format; LOADR_FUZZ_SCALE=10 runs ten times as many.
SCALE = float(os.environ.get('LOADR_FUZZ_SCALE', '1'))


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


@pytest.fixture(scope='module')
def workspace(tmp_path_factory, fixtures):     # fixtures: skips when they are absent
    made = {}

    def get(name: str) -> Workspace:
        if name not in made:
            made[name] = Workspace(TARGETS[name], tmp_path_factory.mktemp('fuzz'))
        return made[name]
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    yield get
    if not tracing:
        tracemalloc.stop()
