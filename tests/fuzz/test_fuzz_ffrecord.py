"""FFRecord under fuzzing: flipped, cut, grown, lying and random files (see harness.py)."""

from __future__ import annotations

import pytest

from .conftest import examples
from .harness import Stats, run_fuzz

# A mutation that zeroes the metadata CRC makes an "old-version" file, which warns by design.
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow,     # CI runs them: -m ''
              pytest.mark.filterwarnings('ignore:.*old-version FFRecord file')]


@pytest.mark.parametrize('name,count', [('ffrecord', 150), ('ffrecord_multi', 100)])
def test_mutated_ffrecord_files_give_correct_data_or_a_loadr_error(workspace, name, count):
    stats = Stats()
    run_fuzz(workspace(name), examples(count), stats)
    assert stats.inputs >= examples(count)
    # The inputs reached both outcomes, and CRC-checked reads compared data.
    assert stats.refused_at_open and stats.datapoints_ok and stats.compared
