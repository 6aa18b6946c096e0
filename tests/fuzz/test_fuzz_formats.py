"""WebDataset shards and Parquet files under fuzzing: flipped, cut, grown and lying tars and
sidecars, damaged Parquet footers and pages (see harness.py)."""

from __future__ import annotations

import pytest

from .conftest import examples
from .harness import Stats, run_fuzz

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]     # CI runs them: -m ''


@pytest.mark.parametrize('name,count', [('webdataset', 120), ('parquet', 80)])
def test_mutated_shards_and_parquet_files_give_correct_data_or_a_loadr_error(workspace, name,
                                                                              count):
    pytest.importorskip('pyarrow' if name == 'parquet' else 'PIL')
    stats = Stats()
    run_fuzz(workspace(name), examples(count), stats)
    assert stats.inputs >= examples(count)
    assert stats.refused_at_open and stats.datapoints_ok and stats.compared
