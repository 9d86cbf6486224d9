"""The Runs page's pieces without Streamlit: the runs table (live first, "–" for what a run does not report), the
metric picker and the runs a choice leaves out, the comparison figure, and its two queries on a real store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bedside.app.dashboard.figures import FADED
from bedside.app.dashboard.run_compare import (
    BUCKETS,
    Metric,
    compare_figure,
    default_metric,
    dropped,
    metric_choices,
    runs_table,
    styled,
    summary_row,
)
from bedside.collectors import RunLogger
from bedside.collectors.store import Store

LOSS, MFU, EVAL_LOSS = Metric("train", "", "loss"), Metric("train", "", "mfu"), Metric("eval", "heldout", "loss")
SPIKE_STEP = 3_217


def run_frame(status: str, last_seen: float, **more: object) -> pd.DataFrame:
    return pd.DataFrame([{"name": "x", "status": status, "last_seen": last_seen, "last_step": 10} | more])


def row(
    folder: str, status: str, last_seen: float, *, loss: float | None, tokens_per_s: float | None, detected=True
) -> dict:
    return summary_row(
        folder,
        f"/runs/{folder}",
        run_frame(status, last_seen),
        pd.DataFrame({"tokens_per_s": [tokens_per_s]}),
        pd.DataFrame({"last_loss": [loss]}),
        pd.DataFrame({"severity": ["warning", "critical"], "incidents": [2, 1]}) if detected else None,
    )


def catalog(*rows: tuple[str, str, str, bool, bool]) -> pd.DataFrame:
    columns = ["source", "split", "name", "by_tokens", "by_flops"]
    return pd.DataFrame(list(rows), columns=columns).assign(points=1)


# -- the runs table -----------------------------------------------------------------------------------------------


def test_live_runs_come_first_then_stalled_then_the_rest_each_newest_first() -> None:
    rows = [
        row("old-finished", "finished", 100.0, loss=2.0, tokens_per_s=1e3),
        row("live-older", "live", 500.0, loss=2.0, tokens_per_s=1e3),
        row("crashed-new", "failed", 900.0, loss=2.0, tokens_per_s=1e3),
        row("stalled", "stalled", 300.0, loss=2.0, tokens_per_s=1e3),
        row("live-newer", "live", 800.0, loss=2.0, tokens_per_s=1e3),
    ]
    table = runs_table(rows)
    assert table["folder"].tolist() == ["live-newer", "live-older", "stalled", "crashed-new", "old-finished"]
    assert table["status"].tolist() == ["live", "live", "stalled", "crashed", "finished"]
    assert table["open_incidents"].tolist() == [3] * 5


def test_what_a_run_does_not_report_is_missing_and_reads_as_a_dash_never_zero() -> None:
    known = row("known", "live", 10.0, loss=1.5, tokens_per_s=123_456.0)
    bare = row("bare", "live", 5.0, loss=None, tokens_per_s=None, detected=False)
    empty = summary_row("empty", "/runs/empty", pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), None)
    table = runs_table([known, bare, empty])
    assert table.loc[2, "status"] == "empty"
    assert table.loc[1:, ["last_loss", "tokens_per_s", "open_incidents"]].isna().all().all()
    shown = styled(table).to_string(delimiter="|").splitlines()
    header = shown[0].split("|")
    cells = {line.split("|")[header.index("folder")]: dict(zip(header, line.split("|"))) for line in shown[1:]}
    assert [cells["bare"][c] for c in ("last_loss", "tokens_per_s", "open_incidents")] == ["–", "–", "–"]
    assert [cells["known"][c] for c in ("last_loss", "tokens_per_s", "open_incidents")] == ["1.5", "123 k", "3"]


# -- what can be compared -----------------------------------------------------------------------------------------


def test_the_picker_lists_every_metric_any_chosen_run_reports_train_loss_first_then_evals() -> None:
    catalogs = {
        "a": catalog(("train", "", "mfu", True, True), ("train", "", "loss", True, True)),
        "b": catalog(("eval", "heldout", "loss", True, True), ("train", "", "router_entropy", False, False)),
    }
    choices = metric_choices(catalogs)
    assert list(choices) == ["train/loss", "train/mfu", "train/router_entropy", "eval/heldout/loss"]
    assert choices["eval/heldout/loss"] == EVAL_LOSS
    assert default_metric(choices) == "eval/heldout/loss"
    assert default_metric(metric_choices({"a": catalogs["a"]})) == "train/loss"


def test_the_runs_a_metric_or_an_x_axis_leaves_out_are_named_with_why() -> None:
    catalogs = {
        "full": catalog(("train", "", "loss", True, True), ("train", "", "mfu", True, True)),
        "no-mfu": catalog(("train", "", "loss", True, True)),
        "no-flops": catalog(("train", "", "loss", True, False), ("train", "", "mfu", True, False)),
    }
    assert dropped(catalogs, LOSS, "step") == {}
    assert dropped(catalogs, MFU, "step") == {"no-mfu": "reports no train/mfu"}
    assert dropped(catalogs, MFU, "flops") == {"no-mfu": "reports no train/mfu", "no-flops": "reports no FLOPs for it"}
    assert dropped(catalogs, LOSS, "time") == {}
    assert dropped(catalogs, EVAL_LOSS, "step") == {name: "reports no eval/heldout/loss" for name in catalogs}


# -- the figure ---------------------------------------------------------------------------------------------------


def curve(timeline: int, steps: range, x_per_step: float = 1.0) -> pd.DataFrame:
    step = np.array(list(steps))
    return pd.DataFrame({"timeline": timeline, "step": step, "x": step * x_per_step, "value": 5.0 / step})


def test_each_timeline_of_a_rewound_run_is_a_line_of_its_own_the_abandoned_one_faded_in_the_runs_colour() -> None:
    rewound = pd.concat([curve(0, range(1, 86)), curve(1, range(61, 161))], ignore_index=True)
    fig = compare_figure({"rewound": rewound, "plain": curve(0, range(1, 201))}, LOSS, "step")
    traces = {t.name: t for t in fig.data}
    assert list(traces) == ["rewound (timeline 0, abandoned)", "rewound", "plain"]
    abandoned, live, plain = traces.values()
    assert list(abandoned.x) == list(range(1, 86)) and list(live.x) == list(range(61, 161))  # no zig-zag
    assert (abandoned.opacity, live.opacity, plain.opacity) == (FADED, 1.0, 1.0)
    assert abandoned.line.color == live.line.color != plain.line.color
    assert abandoned.legendgroup == live.legendgroup == "rewound"


def test_a_zoom_is_kept_while_the_data_refreshes_and_let_go_when_the_metric_or_the_x_axis_changes() -> None:
    def revision(data: pd.DataFrame, metric: Metric, x: str) -> str:
        return compare_figure({"a": data}, metric, x).layout.uirevision

    before, after = curve(0, range(1, 101)), curve(0, range(1, 121))
    assert revision(before, LOSS, "step") == revision(after, LOSS, "step")
    assert len({revision(after, LOSS, "step"), revision(after, MFU, "step"), revision(after, LOSS, "tokens")}) == 3


@pytest.mark.parametrize(
    ("x", "x_per_step", "title", "log"),
    [
        ("step", 1.0, "step", False),
        ("tokens", 2048.0, "tokens spent", False),
        ("flops", 1.4e12, "FLOPs spent", True),
        ("time", 90.0, "wall time (h)", False),
        ("time", 0.02, "wall time (s)", False),
    ],
)
def test_the_x_axis_has_its_title_and_unit_and_every_axis_si_ticks(x: str, x_per_step: float, title: str, log: bool):
    fig = compare_figure({"a": curve(0, range(1, 201), x_per_step)}, EVAL_LOSS, x)
    assert fig.layout.xaxis.title.text == title
    assert (fig.layout.xaxis.type == "log") == log
    assert fig.layout.xaxis.exponentformat == fig.layout.yaxis.exponentformat == "SI"
    assert fig.layout.yaxis.title.text == "eval/heldout/loss"
    scale = {"wall time (h)": 3600.0}.get(title, 1.0)
    np.testing.assert_allclose(fig.data[0].x, np.arange(1, 201) * x_per_step / scale)


# -- the queries on a real store ----------------------------------------------------------------------------------


@pytest.fixture
def long_run(run_dir: Path, ingest: Callable[..., Store]) -> Store:
    """One rank, 5,000 steps with a falling loss, one spike, a user metric and tokens but no FLOPs; evals of
    ``loss`` with tokens but no FLOPs."""
    with RunLogger(run_dir, rank=0, world_size=1, local_rank=0) as log:
        for step in range(1, 5_001):
            loss = 50.0 if step == SPIKE_STEP else 2.0 + 8.0 / step
            log.step(step, loss=loss, tokens=1000, router_entropy=1.0 + step / 1e4)
            if step % 1000 == 0:
                log.eval(step, {"loss": 2.5}, cum_tokens=1000 * step)
    return ingest(run_dir)


def series(store: Store, metric: Metric, x: str) -> pd.DataFrame:
    return store.fetch_named("dash_compare_series", metric.params() | {"x": x, "buckets": BUCKETS})


def test_the_catalog_says_what_the_run_reports_and_by_which_axes(long_run: Store) -> None:
    found = long_run.fetch_named("dash_compare_metrics")
    assert found[["source", "split", "name", "points", "by_tokens", "by_flops"]].values.tolist() == [
        ["train", "", "loss", 5000, True, False],
        ["train", "", "router_entropy", 5000, True, False],
        ["train", "", "tokens", 5000, True, False],
        ["eval", "heldout", "loss", 5, True, False],
    ]
    assert long_run.fetch_named("dash_compare_summary")["last_loss"].tolist() == [2.0 + 8.0 / 5000]


def test_a_long_series_is_cut_to_each_buckets_lowest_and_highest_and_keeps_its_spike(long_run: Store) -> None:
    shown = series(long_run, LOSS, "tokens")
    assert len(shown) <= 2 * BUCKETS
    assert shown.loc[shown["step"] == SPIKE_STEP, "value"].tolist() == [50.0]
    assert shown["x"].is_monotonic_increasing
    np.testing.assert_allclose(shown["x"], shown["step"] * 1000.0)  # tokens spent up to the step


def test_a_user_metric_and_an_eval_by_step_and_nothing_by_an_axis_the_run_does_not_report(long_run: Store) -> None:
    user = series(long_run, Metric("train", "", "router_entropy"), "step")
    np.testing.assert_allclose(user["value"], 1.0 + user["step"] / 1e4)
    evals = series(long_run, EVAL_LOSS, "step")
    assert evals[["step", "value"]].values.tolist() == [[s, 2.5] for s in (1000, 2000, 3000, 4000, 5000)]
    assert series(long_run, LOSS, "flops").empty  # no FLOPs reported: not a line at 0
    assert series(long_run, EVAL_LOSS, "flops").empty
    wall = series(long_run, LOSS, "time")
    assert wall["x"].iloc[0] == 0.0 and wall["x"].is_monotonic_increasing
