"""Curves an on-call can read: one colour per timeline in every panel and the legend, markers for one-step
incidents and non-finite values, y-axis titles with units, log-y and smoothing, the throughput and step-time
panels, an eval chart whose range the forecast band cannot squash, readable big numbers, the data's age and the
open-incidents tile's link; on small frames, on the served sample runs and on a run that reports only its loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_app import FAULTS, REWIND, assert_rendered, chart, from_store, open_page, serve, texts, tiles
from test_dashboard_figures import ACTIONS, power_law_evals, two_timelines

from bedside.app.dashboard import registry
from bedside.app.dashboard.common import as_of, clock, number
from bedside.app.dashboard.curves import (
    RAW_FADED,
    TIMELINE_COLORS,
    eval_vs_compute,
    smoothed,
    timeline_color,
    training_curves,
)
from bedside.app.dashboard.figures import FADED, SEVERITY_COLORS
from bedside.collectors import RunLogger

NO_INCIDENTS = pd.DataFrame(columns=["title", "timeline", "start_step", "end_step", "severity", "kinds"])
NO_ACTIONS = ACTIONS.iloc[:0]
PANEL_TITLES = [
    "train loss (nats/token)",
    "gradient norm (L2)",
    "learning rate",
    "throughput (tokens/s)",
    "step time (s)",
]


def paced(steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with the columns ``dash_steps`` adds: the pace of each step and the metrics that were not finite."""
    step_s = steps.groupby("timeline")["time"].diff()
    return steps.assign(tokens=2048.0, step_s=step_s, tokens_per_s=2048.0 / step_s, nonfinite=[[]] * len(steps))


def lines_of(fig, axis: str) -> dict[str, object]:
    return {t.name: t for t in fig.data if t.yaxis == axis and t.mode == "lines"}


def axes_of(fig) -> list[str]:
    return sorted({t.yaxis for t in fig.data}, key=lambda a: int(a[1:] or 1))


# -- one colour per timeline --------------------------------------------------------------------------------------


def test_each_timeline_has_one_colour_in_every_panel_the_legend_and_the_eval_chart() -> None:
    steps = paced(pd.concat([two_timelines(), two_timelines().query("timeline == 1").assign(timeline=2)]))
    fig = training_curves(steps, NO_INCIDENTS, NO_ACTIONS)
    assert len(axes_of(fig)) == 5
    for axis in axes_of(fig):
        lines = lines_of(fig, axis)
        assert {name: line.line.color for name, line in lines.items()} == {
            f"timeline {t}": TIMELINE_COLORS[t] for t in (0, 1, 2)
        }
        assert {line.legendgroup for line in lines.values()} == {"timeline 0", "timeline 1", "timeline 2"}
    legend = [t for t in fig.data if t.showlegend is not False]
    assert sorted(t.name for t in legend) == ["timeline 0", "timeline 1", "timeline 2"]  # one entry each, for all
    assert len(set(TIMELINE_COLORS)) == len(TIMELINE_COLORS)
    assert not set(TIMELINE_COLORS) & set(SEVERITY_COLORS.values())

    evals = pd.concat([power_law_evals(4), power_law_evals(3, timeline=2)])
    drawn = {t.name: t.line.color for t in eval_vs_compute(evals, "loss").data}
    assert drawn == {"timeline 0": timeline_color(0), "timeline 2": timeline_color(2)}


# -- markers ------------------------------------------------------------------------------------------------------


def test_a_one_step_incident_on_a_3000_step_axis_is_marked_where_it_began() -> None:
    steps = paced(two_timelines(abandoned_to=3000, rewound_to=3000, last=3000))
    incidents = pd.DataFrame(
        {
            "title": ["Loss spike", "Straggler"],
            "timeline": 0,
            "start_step": [1234, 2000],
            "end_step": [1234, 2100],
            "severity": ["critical", "warning"],
            "kinds": [["loss_spike"], ["straggler"]],
        }
    )
    fig = training_curves(steps, incidents, NO_ACTIONS)
    marks = {t.yaxis: t for t in fig.data if t.mode == "markers"}
    assert sorted(marks) == ["y", "y4"]  # the spike on the loss, the straggler (about speed) on the throughput
    mark = marks["y"]
    assert (mark.name, list(mark.x), mark.marker.color) == ("critical incident", [1234], SEVERITY_COLORS["critical"])
    assert mark.y[0] == pytest.approx(steps.loc[steps["step"] == 1234, "loss"].item())
    assert list(mark.text) == ["Loss spike (step 1234)"]
    assert (marks["y4"].name, list(marks["y4"].x), list(marks["y4"].text)) == (
        "warning incident",
        [2000],
        ["Straggler (step 2000-2100)"],
    )
    shaded = {(s.xref, s.x0) for s in fig.layout.shapes}
    assert shaded == {(x, 1233.5) for x in ("x", "x2", "x3")} | {(x, 1999.5) for x in ("x4", "x5")}


def test_non_finite_values_are_marked_on_their_panel_and_a_value_not_reported_is_not() -> None:
    steps = paced(two_timelines(abandoned_to=3000, rewound_to=3000, last=3000))
    at = steps.set_index("step").index
    steps.loc[at == 500, ["loss", "grad_norm"]] = np.nan
    steps.loc[at == 700, "grad_norm"] = np.inf
    steps.loc[at == 900, "lr"] = np.nan  # NULL in the store: not reported
    steps["nonfinite"] = [
        ["loss", "grad_norm"] if s == 500 else ["grad_norm"] if s == 700 else [] for s in steps["step"]
    ]
    fig = training_curves(steps, NO_INCIDENTS, NO_ACTIONS)
    marks = {t.yaxis: t for t in fig.data if t.name == "non-finite value"}
    assert sorted(marks) == ["y", "y2"]
    assert list(marks["y"].x) == [500] and list(marks["y2"].x) == [500, 700]
    before = steps.set_index("step")
    assert marks["y"].y[0] == pytest.approx(before.loc[499, "loss"])  # at the last finite value
    assert list(marks["y2"].y) == pytest.approx([before.loc[499, "grad_norm"], before.loc[699, "grad_norm"]])
    assert [m.showlegend for m in marks.values()] == [True, False]
    assert "inf" in marks["y2"].text[1]
    line = lines_of(fig, "y2")["timeline 0"]
    assert np.isnan(np.asarray(line.y, dtype=float)[list(line.x).index(700)])  # a gap, not an infinite point


# -- axes, toggles, panels ----------------------------------------------------------------------------------------


def test_every_panel_has_a_y_title_with_units_and_log_y_applies_to_the_training_numbers_only() -> None:
    steps = paced(two_timelines())
    fig = training_curves(steps, NO_INCIDENTS, NO_ACTIONS, log_y=True)
    layout = fig.layout
    axes = [f"yaxis{n}" if n > 1 else "yaxis" for n in range(1, 6)]
    assert [layout[a].title.text for a in axes] == PANEL_TITLES
    assert [layout[a].type for a in axes] == ["log", "log", "log", "linear", "linear"]
    plain = training_curves(steps, NO_INCIDENTS, NO_ACTIONS).layout
    assert {plain[a].type for a in axes} == {"linear"}


def test_smoothing_is_tensorboard_s_debiased_ema_that_skips_what_is_not_finite() -> None:
    values = pd.Series([10.0, 8.0, np.nan, 6.0, np.inf, 4.0, 5.0])
    weight, last, n, expected = 0.6, 0.0, 0, []
    for value in values:  # tensorboard/plugins/scalar's smoothing, written out
        if not np.isfinite(value):
            expected.append(np.nan)
            continue
        last, n = last * weight + (1 - weight) * value, n + 1
        expected.append(last / (1 - weight**n))
    np.testing.assert_allclose(smoothed(values, weight), expected)
    np.testing.assert_allclose(smoothed(values, 0.0), values.where(np.isfinite(values)))


def test_smoothed_curves_keep_the_raw_line_faint_behind_and_leave_the_learning_rate_alone() -> None:
    steps = paced(two_timelines())
    fig = training_curves(steps, NO_INCIDENTS, NO_ACTIONS, smoothing=0.9)
    for axis in axes_of(fig):
        lines = lines_of(fig, axis)
        if axis == "y3":  # the learning rate follows its schedule: nothing to smooth
            assert sorted(lines) == ["timeline 0", "timeline 1"]
            continue
        assert sorted(lines) == ["timeline 0", "timeline 0 raw", "timeline 1", "timeline 1 raw"]
        assert (lines["timeline 0 raw"].opacity, lines["timeline 1 raw"].opacity) == (FADED * RAW_FADED, RAW_FADED)
        assert not lines["timeline 1 raw"].showlegend
        live = steps[steps["timeline"] == 1]
        column = {"y": "loss", "y2": "grad_norm", "y4": "tokens_per_s", "y5": "step_s"}[axis]
        np.testing.assert_allclose(lines["timeline 1"].y, smoothed(live[column], 0.9))
        np.testing.assert_allclose(lines["timeline 1 raw"].y, live[column])


# -- eval against compute -----------------------------------------------------------------------------------------


def test_the_forecast_band_cannot_squash_the_evals_after_a_rewind() -> None:
    evals = pd.concat([power_law_evals(8), power_law_evals(3, timeline=1).assign(value=lambda e: e["value"] * 1.1)])
    grid = np.geomspace(1e12, 1.5e15, 40)
    band = pd.DataFrame({"cum_flops": grid, "center": 2.0, "low": -50.0, "high": 80.0})  # widened by the new branch
    fig = eval_vs_compute(evals, "loss", band)
    assert fig.layout.yaxis.title.text == "held-out loss (nats/token)"  # the unit of the format's loss
    assert eval_vs_compute(evals.assign(name="bleu"), "bleu").layout.yaxis.title.text == "held-out bleu"
    low, high = fig.layout.yaxis.range
    values = evals["value"]
    assert low < values.min() and high > values.max()
    assert high - low < 1.2 * (values.max() - values.min())  # the data's span and a margin, not the band's
    edges = {t.name: t for t in fig.data if t.name in ("forecast band", None)}
    for trace in edges.values():
        assert low <= min(trace.y) and max(trace.y) <= high  # clipped: autoscaling cannot squash the curves either


# -- numbers ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (5.28e20, "528 EFLOP"),
        (3.1e22, "31 ZFLOP"),
        (4.5e24, "4.5 YFLOP"),
        (7e27, "7 RFLOP"),
        (1.2e31, "12 QFLOP"),
        (4.2e35, "4.2e+35 FLOP"),
        (999.96e3, "1 MFLOP"),
        (1.36e11, "136 GFLOP"),
        (12.0, "12 FLOP"),
        (None, "–"),
    ],
)
def test_numbers_read_with_si_prefixes_up_to_quetta_then_scientific(value: float | None, shown: str) -> None:
    assert number(value, "FLOP") == shown


# -- on the served sample runs ------------------------------------------------------------------------------------


def test_the_overview_marks_the_sample_run_s_non_finite_steps(served: Path) -> None:
    figure = chart(open_page("overview", run=FAULTS), "training_curves")
    bad = from_store(
        served / FAULTS,
        "SELECT step, NOT isfinite(loss) AS loss, NOT isfinite(grad_norm) AS grad_norm FROM step_metrics "
        "WHERE NOT (isfinite(loss) AND isfinite(grad_norm)) ORDER BY step",
    )
    assert len(bad) >= 2  # a NaN loss and an infinite gradient norm
    marks = {t["yaxis"]: list(t["x"]) for t in figure["data"] if t.get("name") == "non-finite value"}
    assert marks == {"y": bad.loc[bad["loss"], "step"].tolist(), "y2": bad.loc[bad["grad_norm"], "step"].tolist()}


def test_the_sample_run_s_straggler_is_shaded_and_marked_on_the_pace_panels_only(served: Path) -> None:
    figure = chart(open_page("overview", run=FAULTS), "training_curves")
    [[start, severity]] = from_store(
        served / FAULTS, "SELECT start_step, severity FROM incidents WHERE kinds = ['straggler']"
    ).values
    shaded = {s["xref"] for s in figure["layout"]["shapes"] if s["type"] == "rect" and s["x0"] == start - 0.5}
    assert shaded == {"x4", "x5"}  # throughput and step time
    [mark] = [t for t in figure["data"] if t["yaxis"] == "y4" and t.get("mode") == "markers"]
    assert (list(mark["x"]), mark["name"]) == ([start], f"{severity} incident")


def test_the_throughput_and_step_time_panels_come_from_the_step_records(served: Path) -> None:
    figure = chart(open_page("overview", run=REWIND), "training_curves")
    layout = figure["layout"]
    titles = [layout[a]["title"]["text"] for a in sorted(layout, key=str) if a.startswith("yaxis")]
    assert sorted(titles) == sorted(PANEL_TITLES)
    steps = from_store(served / REWIND, "SELECT timeline, step, time, tokens FROM step_metrics ORDER BY timeline, step")
    for timeline, mine in steps.groupby("timeline"):
        step_s = mine["time"].diff() / mine["step"].diff()
        drawn = {
            layout[f"yaxis{t['yaxis'][1:]}"]["title"]["text"]: t
            for t in figure["data"]
            if t.get("name") == f"timeline {timeline}"
        }
        np.testing.assert_allclose(drawn["step time (s)"]["y"].astype(float), step_s, equal_nan=True)
        np.testing.assert_allclose(
            drawn["throughput (tokens/s)"]["y"].astype(float), mine["tokens"] / step_s, equal_nan=True
        )


def test_the_log_y_and_smoothing_toggles_redraw_the_training_curves(served: Path) -> None:
    app = open_page("overview", run=REWIND)
    assert chart(app, "training_curves")["layout"]["yaxis"].get("type", "linear") == "linear"
    app.toggle(key="curves_log_y").set_value(True).run()
    app.slider(key="curves_smoothing").set_value(0.8).run()
    assert_rendered(app)
    figure = chart(app, "training_curves")
    assert figure["layout"]["yaxis"]["type"] == "log"
    raw = [t for t in figure["data"] if t.get("name", "").endswith(" raw")]
    assert {t["name"] for t in raw} == {"timeline 0 raw", "timeline 1 raw"}


def test_the_overview_says_how_old_its_data_is(served: Path) -> None:
    app = open_page("overview", run=FAULTS)
    [[newest]] = from_store(served / FAULTS, "SELECT epoch(last_seen) FROM run").values
    [shown] = [c.value for c in app.caption if c.value.startswith("Data as of")]
    assert shown.startswith(f"Data as of {clock(newest)} (") and shown.endswith(" ago)")
    assert as_of(None, 0.0) == "No records yet."


def test_the_open_incidents_tile_links_to_the_incidents_page_and_counts_the_acknowledged(served: Path) -> None:
    open_ones = from_store(
        served / FAULTS, "SELECT incident_id, severity FROM incidents WHERE status = 'open' ORDER BY incident_id"
    )
    registry.desk().data(served / FAULTS).acknowledge(open_ones["incident_id"][0], operator="ana", note="on it")
    app = open_page("overview", run=FAULTS)
    assert_rendered(app)
    [link] = app.get("page_link")
    counts = open_ones["severity"].value_counts()
    severities = ", ".join(f"{counts[s]} {s}" for s in ("critical", "warning", "info") if s in counts)
    assert (link.proto.page, link.proto.query_string) == ("incidents", f"run={FAULTS}")
    assert link.proto.label == f"{severities} · 1 acknowledged"
    assert tiles(app)["Open incidents"] == str(len(open_ones))  # acknowledged is still unresolved


# -- a run that reports only its loss -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    """A one-rank run that logs its loss and nothing else: no tokens, FLOPs, LR, gradient norm, ranks or evals."""
    run = tmp_path_factory.mktemp("bare") / "bare"
    with RunLogger(run, name="bare", rank=0, world_size=1) as log:
        for step in range(1, 41):
            log.step(step, loss=3.0 / step**0.5)
    return run


def test_a_run_that_reports_only_its_loss_shows_dashes_and_still_draws(bare: Path) -> None:
    serve(bare)
    app = open_page("overview")
    assert_rendered(app)
    shown = tiles(app)
    assert [shown[t] for t in ("Tokens", "FLOPs spent", "Tokens/s", "MFU")] == ["–"] * 4  # not 0
    layout = chart(app, "training_curves")["layout"]
    assert [layout[a]["title"]["text"] for a in ("yaxis", "yaxis2")] == ["train loss (nats/token)", "step time (s)"]
    assert "yaxis3" not in layout
    assert "No held-out evals yet" in texts(app)
