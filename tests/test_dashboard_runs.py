"""The Runs page under AppTest: every run in the directory, live first, with its last loss, tokens/s and open
incidents; a row opens that run; any metric of the chosen runs side by side, by step, tokens, FLOPs or wall time,
naming the runs a choice leaves out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dashboard_app import (
    FAULTS,
    REWIND,
    assert_rendered,
    chart,
    chart_keys,
    copy_run,
    from_store,
    open_page,
    serve,
    table,
    texts,
)
from streamlit.testing.v1 import AppTest

from bedside.app.dashboard import opening, registry
from bedside.app.dashboard.figures import FADED
from bedside.collectors import RunLogger

BARE = "bare-live"
"""A live one-rank run that reports no loss, tokens or FLOPs: a gradient norm, a user metric and an eval."""


def compare(app: AppTest, metric: str, x: str) -> dict:
    app.selectbox(key="compare_metric").select(metric).run()
    app.radio(key="compare_x").set_value(x).run()
    assert_rendered(app)
    return chart(app, "runs_compare")


def test_the_runs_page_lists_both_runs_with_their_last_loss_tokens_per_s_and_open_incidents(served: Path) -> None:
    app = open_page("runs")
    assert_rendered(app)
    listed = table(app, "name", "status", "last_step", "last_loss", "tokens_per_s", "open_incidents")
    assert sorted(zip(listed["name"], listed["status"], listed["last_step"])) == [
        (FAULTS, "finished", 200),
        (REWIND, "finished", 160),
    ]
    for run in listed.itertuples():
        [last] = from_store(
            served / run.folder, "SELECT loss FROM step_metrics ORDER BY timeline DESC, step DESC LIMIT 1"
        )["loss"]
        assert run.last_loss == pytest.approx(last)
        assert run.tokens_per_s > 0
        [open_now] = from_store(served / run.folder, "SELECT count(*) AS n FROM incidents WHERE status <> 'resolved'")[
            "n"
        ]
        assert run.open_incidents == open_now


def test_the_default_comparison_is_held_out_eval_against_flops_spent_for_the_chosen_runs(served: Path) -> None:
    app = open_page("runs")
    assert sorted(app.multiselect(key="compare").value) == [FAULTS, REWIND]
    assert app.selectbox(key="compare_metric").value == "eval/heldout/excess_loss"
    assert app.radio(key="compare_x").value == "flops"
    overlay = chart(app, "runs_compare")
    assert overlay["layout"]["xaxis"]["type"] == "log"
    for line in overlay["data"]:
        run, timeline = line["legendgroup"], 0 if "abandoned" in line["name"] else None
        evals = from_store(
            served / run,
            "SELECT cum_flops FROM eval_scores WHERE name = 'excess_loss' AND timeline = "
            + ("0" if timeline == 0 else "(SELECT max(timeline) FROM eval_scores)")
            + " ORDER BY cum_flops",
        )
        np.testing.assert_allclose(line["x"], evals["cum_flops"])

    app.multiselect(key="compare").unselect(REWIND).run()
    assert {t["legendgroup"] for t in chart(app, "runs_compare")["data"]} == {FAULTS}


def test_the_picker_offers_train_loss_user_metrics_and_every_eval_the_runs_report(served: Path) -> None:
    app = open_page("runs")
    offered = app.selectbox(key="compare_metric").options
    assert offered[0] == "train/loss"
    assert {"train/mfu", "train/batch", "eval/heldout/accuracy", "eval/heldout/loss"} <= set(offered)
    mfu = compare(app, "train/mfu", "step")
    [faults] = [t for t in mfu["data"] if t["name"] == FAULTS]
    stored = from_store(served / FAULTS, "SELECT step, extra['mfu'] AS mfu FROM step_metrics ORDER BY step")
    np.testing.assert_allclose(faults["y"], stored["mfu"])
    np.testing.assert_allclose(faults["x"], stored["step"])


def test_a_rewound_runs_timelines_are_drawn_apart_the_abandoned_one_faded(served: Path) -> None:
    loss = compare(open_page("runs"), "train/loss", "step")
    rewind = {t["name"]: t for t in loss["data"] if t["legendgroup"] == REWIND}
    assert sorted(rewind) == [REWIND, f"{REWIND} (timeline 0, abandoned)"]
    abandoned, live = rewind[f"{REWIND} (timeline 0, abandoned)"], rewind[REWIND]
    spans = from_store(served / REWIND, "SELECT first_step, last_step FROM timelines ORDER BY timeline")
    assert [(min(t["x"]), max(t["x"])) for t in (abandoned, live)] == list(spans.itertuples(index=False, name=None))
    assert all(np.all(np.diff(t["x"]) > 0) for t in (abandoned, live))  # each a line forward, no zig-zag
    assert (abandoned["opacity"], live.get("opacity", 1.0)) == (FADED, 1.0)


@pytest.mark.parametrize("row", [0, 1])
def test_clicking_a_row_opens_the_overview_of_that_run(served: Path, row: int) -> None:
    app = open_page("runs", run=FAULTS)
    folder = table(app, "folder", "status")["folder"][row]
    app.session_state["runs_table"] = {"selection": {"rows": [row], "columns": []}}
    app.run()  # the first step: no panel, no refresh timer, the component that asks for the next run
    assert [c.value for c in app.caption] == [f"Opening {folder}…"]
    assert not app.title and not app.dataframe
    app.session_state[opening.READY] = True  # what the component's request sets, once the browser has drawn it
    app.run()
    assert_rendered(app)
    assert app.session_state["run"] == folder
    assert app.query_params["run"] == folder
    assert [t.value for t in app.title] == [folder]  # the Overview's title: the run's name
    assert chart_keys(app)[0] == "eval_vs_compute"


@pytest.fixture
def with_bare_live(runs: Path) -> Iterator[Path]:
    """The two sample runs and a live one that reports no loss, tokens or FLOPs (its writer still open)."""
    run = runs.parent / "mixed"
    for name in (FAULTS, REWIND):
        copy_run(name, run)
    log = RunLogger(run / BARE, rank=0, world_size=1, local_rank=0)
    for step in range(1, 31):
        log.step(step, grad_norm=1.0, router_entropy=3.0 - step / 100)
    log.eval(30, {"accuracy": 0.5})
    log.flush()
    serve(run)
    yield run
    registry.close_all()
    log.close()


def test_a_live_run_comes_first_and_what_it_does_not_report_is_missing_not_zero(with_bare_live: Path) -> None:
    app = open_page("runs")
    assert_rendered(app)
    listed = table(app, "folder", "status", "last_loss", "tokens_per_s")
    assert listed["folder"][0] == BARE and listed["status"][0] == "live"
    assert listed[["last_loss", "tokens_per_s"]].iloc[0].isna().all()
    assert listed["tokens_per_s"].iloc[1:].gt(0).all()
    assert app.dataframe[0].proto.placeholder == "–"  # how a missing value is drawn

    app.multiselect(key="compare").set_value([BARE, FAULTS, REWIND]).run()
    assert "train/router_entropy" in app.selectbox(key="compare_metric").options
    compare(app, "train/loss", "step")
    assert f"**{BARE}** reports no train/loss" in texts(app)
    grad = compare(app, "train/grad_norm", "tokens")
    assert f"**{BARE}** reports no tokens for it" in texts(app)
    assert {t["legendgroup"] for t in grad["data"]} == {FAULTS, REWIND}
    accuracy = compare(app, "eval/heldout/accuracy", "step")
    assert BARE in {t["legendgroup"] for t in accuracy["data"]}
    assert "Not drawn" not in texts(app)
