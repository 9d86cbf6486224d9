"""The Checkpoints page under AppTest, on copies of the sample runs: times and sizes an on-call reads, newest
first, the work at risk, and a Young/Daly estimate that an operator's rewind does not bend."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_app import assert_rendered, chart, copy_run, from_store, open_page, serving, table, texts, tiles

from bedside.app.dashboard.common import age
from bedside.collectors.layout import RunLayout

FAULTS, REWIND = "tiny-faults", "tiny-rewind"
IN_FLIGHT_STEP = 85
"""tiny-rewind's operator rewound at step 85 of timeline 0; here a save had started at that step and was still in
flight (the trainer saves asynchronously), so it never reported an outcome."""


def start_a_save_the_rewind_abandons(run: Path) -> None:
    """Rank 0 records a save_started at step 85 of timeline 0, just before the rewind request it never outlived."""
    path = RunLayout(run).rank_file(0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    [request] = [r for r in lines if r["kind"] == "action" and r["status"] == "requested" and r["action"] == "rewind"]
    started = {"kind": "checkpoint", "time": request["time"] - 1e-4, "rank": 0, "step": IN_FLIGHT_STEP}
    started |= {"timeline": 0, "seq": max(r["seq"] for r in lines) + 1, "event": "save_started"}
    with path.open("a") as out:
        out.write(json.dumps(started) + "\n")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("runs")
    copy_run(FAULTS, folder)
    start_a_save_the_rewind_abandons(copy_run(REWIND, folder))
    yield from serving(folder)


def test_the_table_reads_in_wall_clock_time_and_gib_newest_first(served: Path) -> None:
    app = open_page("checkpoints", run=FAULTS)
    assert_rendered(app)
    shown = table(app, "started", "step", "size_gib", "path")
    saved = from_store(
        served / FAULTS,
        "SELECT step, min(time) AS started, max(bytes) AS bytes, any_value(path) FILTER (WHERE path IS NOT NULL) "
        "AS path FROM checkpoint_events WHERE rank = 0 GROUP BY step ORDER BY step DESC",
    )
    assert list(shown["step"]) == list(saved["step"]) == [200, 150, 100, 50]
    assert list(shown["started"]) == list(pd.to_datetime(saved["started"], unit="s", utc=True))
    np.testing.assert_allclose(shown["size_gib"], saved["bytes"] / 2**30)
    assert list(shown["path"]) == list(saved["path"])
    hovered = [
        path for trace in chart(app, "checkpoint_timeline")["data"] for path in np.asarray(trace["customdata"])[:, 2]
    ]
    assert sorted(hovered) == sorted(saved["path"])  # the full path on hover


def test_nothing_at_risk_reads_zero_not_a_dash(served: Path) -> None:
    shown = tiles(open_page("checkpoints", run=FAULTS))
    assert (shown["Steps at risk"], shown["Time at risk"], shown["FLOPs at risk"]) == ("0", "0 s", "0")


def test_the_expected_waste_is_written_out_in_full(served: Path) -> None:
    app = open_page("checkpoints", run=FAULTS)
    saved = table(app, "started", "save_s")
    [[first, last]] = from_store(served / FAULTS, "SELECT min(time), max(time) FROM steps").values
    save_s, mtbf_s = float(saved["save_s"].median()), last - first
    interval_s = float(np.median(np.diff(sorted(saved["started"].map(pd.Timestamp.timestamp)))))
    optimal_s = math.sqrt(2 * save_s * mtbf_s)
    waste = save_s / interval_s + interval_s / (2 * mtbf_s)
    assert f"at the current interval: **{waste:.1%}**" in texts(app)
    assert f"at the recommended interval {2 * save_s / optimal_s:.1%}." in texts(app)
    [current] = [m for m in app.metric if m.label == "Current interval"]
    assert current.value == age(interval_s) and not current.delta


def test_an_operators_rewind_is_not_an_interruption(served: Path) -> None:
    [[loads]] = from_store(served / REWIND, "SELECT count(*) FROM checkpoint_events WHERE event = 'loaded'").values
    assert loads == 1  # the rewind's load of step 60
    app = open_page("checkpoints", run=REWIND)
    assert_rendered(app)
    assert tiles(app)["Interruptions seen"] == "0"


def test_a_save_a_rewind_abandoned_is_not_saving_forever(served: Path) -> None:
    app = open_page("checkpoints", run=REWIND)
    shown = table(app, "timeline", "step", "state")
    states = {(int(t), int(s)): state for t, s, state in zip(shown["timeline"], shown["step"], shown["state"])}
    assert states[(0, IN_FLIGHT_STEP)] == "abandoned"
    assert "saving" not in states.values()
    assert {state for (timeline, _), state in states.items() if timeline == 1} == {"saved"}
