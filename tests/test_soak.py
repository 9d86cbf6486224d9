"""Soak: 1,024 live ranks for 30 s (60 s in `bench/harness.py --long`), followed with detection, stay in real time with flat memory.

Another process appends one record per rank per second (``live_ranks.py``); the collector follows as
``bedside collect --follow`` does, with the detectors after every pass. Once the run has warmed up, the store
stays within a couple of steps of the writer and the process's RSS grows by no more than a bound that
holds nothing per step; at the end every record is in the store once. ``bench/many_files.py --long`` runs the same harness at 4,096 ranks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from live_ranks import follow_live_ranks

pytestmark = pytest.mark.slow(reason="follows 1,024 live ranks in real time for 30 s")

RANKS = int(os.environ.get("BEDSIDE_SOAK_RANKS", "1024"))
SECONDS = int(os.environ.get("BEDSIDE_SOAK_SECONDS", "30"))  # bench/harness.py --long: 60
WARM_UP = 10  # samples (one a second): files created, detectors' windows filled
MAX_LAG_STEPS = 3
MAX_RSS_GROWTH_MIB = 64.0


@pytest.mark.alone(reason="the store's lag behind a real-time writer is what it measures")
def test_live_ranks_are_followed_in_real_time_with_flat_memory(tmp_path: Path) -> None:
    figures = follow_live_ranks(tmp_path / "run", RANKS, SECONDS)
    lag = figures.settled_lag(WARM_UP)
    assert figures.written[-1] == SECONDS
    assert lag and max(lag) <= MAX_LAG_STEPS, f"the store fell behind the writer: lags {figures.lag} steps"
    growth = figures.rss_growth_mib(WARM_UP)
    assert growth <= MAX_RSS_GROWTH_MIB, f"RSS grew {growth:.0f} MiB after warm-up: {figures.rss_mib}"
    assert figures.lag[-1] == 0 and figures.rows == figures.distinct_rows == RANKS * SECONDS
