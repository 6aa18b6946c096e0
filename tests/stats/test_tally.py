"""The Loader's side of the accounting (loadr.stats.Tally) and the auto calibration's
measuring (loadr.stats.Calibration), apart from a loader."""

from __future__ import annotations

import numpy as np

from loadr.stats import AUTO_BATCHES, WORKER_FIELDS, Calibration, Stats, Tally, row_width


def test_a_tally_adds_the_rows_of_closed_pools_by_worker_id():
    tally = Tally(fns=1)
    width = row_width(1)
    assert tally.rows().shape == (0, width)
    tally.keep(np.full((2, width), 1.0))            # a pool of 2 workers closed
    tally.keep(np.full((3, width), 2.0))            # then one of 3
    live = np.full((1, width), 4.0)                 # the running pool has 1
    rows = tally.rows(live)
    assert rows[:, 0].tolist() == [7.0, 3.0, 2.0]
    tally.inline()[:] = 8.0                         # and work done in this process
    assert tally.rows()[:, 0].tolist() == [11.0, 3.0, 2.0]


def test_a_tally_snapshot_counts_the_caller_s_waits_from_the_first_ask():
    tally = Tally(fns=0)
    assert tally.stats(None, [], samples=0, inline=True).elapsed_s == 0.0
    tally.asked(0.0)
    tally.asked(5.0)                                # only the first ask starts the clock
    tally.handed(0.5)
    tally.handed(0.125)
    tally.end()
    stats = tally.stats(None, [], samples=16, inline=True)
    assert (stats.batches, stats.samples, stats.main_wait_s, stats.first_batch_s) == \
        (2, 16, 0.625, 0.5)
    assert stats.elapsed_s == tally.t_end           # the clock stopped at end()


def snapshot(batches: int) -> Stats:
    worker = dict.fromkeys(WORKER_FIELDS, 0.0)
    worker.update(busy=batches * 0.01, batches=batches, samples=batches * 8, fns=[])
    return Stats([], elapsed_s=batches * 0.01, main_wait_s=0.0, batches=batches,
                 samples=batches * 8, workers=[worker], cores=2)


def test_a_calibration_measures_from_the_first_batch_and_settles_only_the_auto_settings():
    calibration = Calibration(workers=True, prefetch=False)
    assert calibration.measured(snapshot(1), []) is None        # the start, left out
    assert calibration.measured(snapshot(AUTO_BATCHES), []) is None
    seen = calibration.measured(snapshot(AUTO_BATCHES + 1), [])
    assert seen is not None and seen.batches == AUTO_BATCHES
    workers, prefetch, why = calibration.settle(seen, batch=8, workers=3, prefetch=5,
                                                max_prefetch=None)
    assert prefetch == 5 and 1 <= workers and why
