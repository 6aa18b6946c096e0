"""A short soak in CI: 2*10^4 samples, workers SIGKILLed and the stream moved along
the way; nothing lost, nothing leaks.

The long one (10^6 samples) is ``benchmarks/soak.py``; both run
:func:`tests.faults.soaking.soak`, which checks every sample it streams.
"""

from __future__ import annotations

import pytest

from loadr.loader import LEASED_SLOTS

from .soaking import growth, soak

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]      # CI runs it: -m ''

RSS_GROWTH_MAX_BYTES = 16 << 20


def test_short_soak_with_kills_keeps_fds_rss_and_shm_flat():
    figures = soak(samples=20_000, batch=64, workers=2, kill_probability=0.025, seed=3,
                   report_every=25, jump_probability=0.03)
    rows = figures['rows']
    assert figures['samples_checked'] >= 20_000
    assert figures['kills'] >= 4 and figures['restarts'] >= figures['kills'] - 1
    assert figures['jumps'] >= 4
    assert growth(rows, 'fds') <= 2, rows
    assert growth(rows, 'rss') <= RSS_GROWTH_MAX_BYTES, rows
    # 4 slots, the ones lent to the caller, the status: the same all along
    assert {r['shm_segments'] for r in rows} == {4 + LEASED_SLOTS + 1}
    assert len({r['shm_bytes'] for r in rows}) == 1
    assert all(r['children'] <= 2 for r in rows), [(r['batch'], r['children']) for r in rows]
    assert figures['after_close']['shm_segments'] == 0
    assert figures['after_close']['children'] == 0
