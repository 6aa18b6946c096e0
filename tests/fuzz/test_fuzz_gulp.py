"""Gulp under fuzzing: flipped, cut, grown and random chunk files, lying .gmeta (see harness.py)."""

from __future__ import annotations

import pytest

from .conftest import examples
from .harness import Stats, run_fuzz

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]     # CI runs them: -m ''


def test_mutated_gulp_directories_give_correct_data_or_a_loadr_error(workspace):
    stats = Stats()
    run_fuzz(workspace('gulp'), examples(200), stats)
    assert stats.inputs >= examples(200)
    assert stats.refused_at_open and stats.datapoints_ok and stats.compared
