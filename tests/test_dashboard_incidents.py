"""The Incidents page under AppTest, for triage: the order an on-call works in, when each fault began, ranks and
batches as ranges, the data each step of the window read, and evidence charts with axis titles."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_app import assert_rendered, chart, copy_run, from_store, open_page, serving, table, texts

from bedside.app.dashboard.common import age
from bedside.app.simulation import SimulationConfig, simulate_run

FAULTS, WIDE = "tiny-faults", "wide-straggler"
WORLD = 32
SLOW = range(20, WORLD)
"""A simulated 32-rank run whose ranks 20-31 (a host and a half) compute twice as slowly from step 60."""
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("runs")
    copy_run(FAULTS, folder)
    simulate_run(
        SimulationConfig(
            ranks=WORLD,
            steps=200,
            ranks_per_host=8,
            nuisances=False,
            inject=(f"straggler:ranks={SLOW[0]}-{SLOW[-1]},factor=2,from=60",),
        ),
        folder / WIDE,
    )
    yield from serving(folder)


def test_incidents_are_listed_critical_first_then_newest_onset(served: Path) -> None:
    app = open_page("incidents", run=FAULTS)
    assert_rendered(app)
    listed = table(app, "severity", "status", "onset", "id")
    order = [
        (s == "resolved", SEVERITY_ORDER[v], -t.timestamp())
        for s, v, t in listed[["status", "severity", "onset"]].values
    ]
    assert order == sorted(order)
    assert {"critical", "warning"} <= set(listed["severity"]) and listed["severity"][0] == "critical"
    assert app.selectbox(key="incident").value == listed["id"][0]  # the page opens the top of the list


def test_the_onset_is_the_wall_clock_time_of_the_first_step_and_the_age_counts_from_it(served: Path) -> None:
    before = time.time()
    app = open_page("incidents", run=FAULTS)
    after = time.time()
    listed = table(app, "onset", "age", "id")
    found = from_store(
        served / FAULTS,
        "SELECT i.incident_id, s.time FROM incidents i JOIN steps s ON s.timeline = i.timeline "
        "AND s.step = i.start_step",
    ).set_index("incident_id")["time"]
    [[detected]] = from_store(served / FAULTS, "SELECT min(epoch(opened_at)) FROM incidents").values
    for incident_id, onset, shown_age in listed[["id", "onset", "age"]].values:
        assert onset == pd.to_datetime(found[incident_id], unit="s", utc=True)
        assert shown_age in {age(before - found[incident_id]), age(after - found[incident_id])}
        assert found[incident_id] < detected  # the store was built after the run: detection time would mislead


def test_an_incident_over_many_ranks_reads_them_as_ranges(served: Path) -> None:
    app = open_page("incidents", run=WIDE)
    assert_rendered(app)
    listed = table(app, "incident", "ranks", "steps", "id")  # the id lists ranks one by one, as alerts carry it
    [straggler] = [row for row in listed.itertuples() if row.id.startswith("straggler@")]
    assert straggler.id.startswith(f"straggler@0:{straggler.steps.split('-')[0]}/r{SLOW[0]}-{SLOW[0] + 1}-")
    assert straggler.incident == f"{straggler.id.split('/r')[0]}/r{SLOW[0]}-{SLOW[-1]}"
    assert straggler.ranks == f"{SLOW[0]}-{SLOW[-1]}"
    app.selectbox(key="incident").set_value(straggler.id).run()
    assert f"{straggler.incident}: " in app.selectbox(key="incident").format_func(straggler.id)
    findings = table(app, "kind", "ranks", "evidence")
    spans = [[int(n) for n in text.split("-")] for text in findings["ranks"]]  # "24-31": a range, not a list
    assert {r for span in spans for r in range(span[0], span[-1] + 1)} == set(SLOW)
    assert ", ".join(map(str, SLOW)) not in texts(app)


def test_the_evidence_window_shows_the_batches_and_shards_read_in_it(served: Path) -> None:
    app = open_page("incidents", run=FAULTS)
    [spike] = [i for i in table(app, "id")["id"] if i.startswith("loss_spike@")]
    app.selectbox(key="incident").set_value(spike).run()
    assert_rendered(app)
    [[timeline, start, end]] = from_store(
        served / FAULTS, "SELECT timeline, start_step, end_step FROM incidents WHERE incident_id = ?", spike
    ).values
    read = from_store(
        served / FAULTS,
        "SELECT step, CAST(extra['batch'] AS BIGINT) AS batch, CAST(shards AS BIGINT[]) AS shards FROM steps "
        "WHERE timeline = ? AND step BETWEEN ? AND ?",
        int(timeline),
        int(start) - 30,
        int(end) + 30,
    )
    inside = read[read["step"].between(start, end)]
    batches = inside["batch"].astype(int)
    assert list(batches) == list(range(batches.min(), batches.max() + 1))
    assert f"batches {batches.min()}-{batches.max()}" in texts(app)
    shards = table(app, "shard", "incident_steps", "other_steps")
    for shard in shards.itertuples():
        assert shard.incident_steps == sum(shard.shard in list(s) for s in inside["shards"])
        assert shard.other_steps == sum(shard.shard in list(s) for s in read["shards"]) - shard.incident_steps
    lift = shards["share_incident"] - shards["share_other"]
    assert list(lift) == sorted(lift, reverse=True)


def test_the_evidence_charts_have_axis_titles_and_whole_step_ticks(served: Path) -> None:
    app = open_page("incidents", run=WIDE)
    [straggler] = [i for i in table(app, "id")["id"] if i.startswith("straggler@")]
    app.selectbox(key="incident").set_value(straggler).run()
    layout = chart(app, "incident_evidence")["layout"]
    titles = {name: axis.get("title", {}).get("text") for name, axis in layout.items() if name[1:5] == "axis"}
    # a straggler is about speed: the job's throughput above, each rank's compute time below
    assert titles["yaxis"] == "tokens/s" and titles["yaxis2"] is None
    assert titles["yaxis3"] == "compute time (s)" and "step" in titles.values()
    assert {layout[a]["tickformat"] for a in layout if a.startswith("xaxis")} == {"d"}
    assert np.all([layout[a]["tickformat"] == ".3~g" for a in layout if a.startswith("yaxis")])


def test_the_straggler_evidence_plots_each_rank_s_compute_time_where_the_slow_ranks_stand_out(served: Path) -> None:
    """A synchronous job's step time is the same on every rank: only compute time shows the straggler."""
    app = open_page("incidents", run=WIDE)
    [straggler] = [i for i in table(app, "id")["id"] if i.startswith("straggler@")]
    app.selectbox(key="incident").set_value(straggler).run()
    assert_rendered(app)
    [[first, last]] = from_store(
        served / WIDE, "SELECT start_step - 30, end_step + 30 FROM incidents WHERE incident_id = ?", straggler
    ).values
    times = from_store(
        served / WIDE,
        "SELECT rank, step, compute_time, step_time FROM rank_step_metrics WHERE step BETWEEN ? AND ? "
        "ORDER BY rank, step",
        int(first),
        int(last),
    )
    drawn = {t.get("name"): t for t in chart(app, "incident_evidence")["data"]}
    for rank in SLOW:
        mine = times[times["rank"] == rank]
        np.testing.assert_allclose(drawn[f"rank {rank}"]["y"], mine["compute_time"])
    others = times[~times["rank"].isin(SLOW)].groupby("step")["compute_time"].median()
    np.testing.assert_allclose(drawn["their median"]["y"], others)
    slow = times[times["rank"].isin(SLOW) & (times["step"] >= 70)]["compute_time"].median()
    assert slow > 1.5 * others[others.index >= 70].median()  # twice as slow, where step time would not show it
