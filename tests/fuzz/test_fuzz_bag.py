"""Bag datasets under fuzzing: flipped, cut and lying bag tables, broken refs and specs
(see harness.py), over the plain, the many-typed and the sharded fixture."""

from __future__ import annotations

import pytest

from .conftest import examples
from .harness import Stats, run_fuzz

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]     # CI runs them: -m ''


@pytest.mark.parametrize('name,count', [('bag', 80), ('bag_types', 60), ('bag_sharded', 60)])
def test_mutated_bag_datasets_give_correct_data_or_a_loadr_error(workspace, name, count):
    stats = Stats()
    run_fuzz(workspace(name), examples(count), stats)
    assert stats.inputs >= examples(count)
    assert stats.datapoints_ok and stats.compared
