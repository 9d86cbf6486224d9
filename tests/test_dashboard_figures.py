"""The dashboard's figures and summaries as plain functions of small DataFrames (no Streamlit): min/max downsampling,
the training curves, the eval forecast band, Young/Daly advice and the tiles (the Ranks page's in test_rank_view.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest

from bedside.app.dashboard.curves import eval_vs_compute, training_curves
from bedside.app.dashboard.figures import (
    FADED,
    MAX_POINTS,
    SEVERITY_COLORS,
    downsample_minmax,
    incident_window,
)
from bedside.app.dashboard.summaries import (
    MIN_EVALS_FOR_BAND,
    checkpoint_advice,
    forecast_band,
    headline_metric,
    incidents_on_evals,
    tiles,
)
from bedside.detectors.checkpointing import advise, expected_waste

SPIKE_STEP, DIP_STEP = 54_321, 77_777


def noisy_loss(n: int, seed: int = 0) -> pd.DataFrame:
    """A falling loss over steps 1..n with 1% noise."""
    step = np.arange(1, n + 1)
    loss = (2.0 + 8.0 * step**-0.3) * np.exp(0.01 * np.random.default_rng(seed).standard_normal(n))
    return pd.DataFrame({"step": step, "loss": loss})


# -- downsampling -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_points", [MAX_POINTS, 500, 101])
def test_downsampling_keeps_a_one_step_spike_and_dip_among_100k_points(max_points: int) -> None:
    frame = noisy_loss(100_000)
    frame.loc[frame["step"] == SPIKE_STEP, "loss"] = 50.0
    frame.loc[frame["step"] == DIP_STEP, "loss"] = 0.5
    shown = downsample_minmax(frame, "step", "loss", max_points=max_points)
    assert len(shown) <= max_points
    assert shown.loc[shown["step"] == SPIKE_STEP, "loss"].tolist() == [50.0]
    assert shown.loc[shown["step"] == DIP_STEP, "loss"].tolist() == [0.5]
    assert shown["step"].is_monotonic_increasing
    kept = frame.merge(shown, on=["step", "loss"])  # rows of the series, unchanged
    assert len(kept) == len(shown)


def test_downsampling_keeps_the_rows_that_are_not_finite() -> None:
    frame = noisy_loss(100_000)
    gaps = [10, 20_000, SPIKE_STEP]
    frame.loc[frame["step"].isin(gaps), "loss"] = [np.nan, np.inf, np.nan]
    shown = downsample_minmax(frame, "step", "loss")
    assert len(shown) <= MAX_POINTS
    assert shown.loc[~np.isfinite(shown["loss"]), "step"].tolist() == gaps
    assert shown["loss"].isna().sum() == 2


def test_downsampling_leaves_a_short_series_as_it_is() -> None:
    frame = noisy_loss(MAX_POINTS)
    frame.loc[7, "loss"] = np.nan
    pd.testing.assert_frame_equal(downsample_minmax(frame, "step", "loss"), frame)


def test_downsampling_sorts_by_step_first() -> None:
    frame = noisy_loss(50)
    shuffled = frame.sample(frac=1.0, random_state=1)
    pd.testing.assert_frame_equal(downsample_minmax(shuffled, "step", "loss"), frame)


# -- training curves ----------------------------------------------------------------------------------------------


def two_timelines(abandoned_to: int = 100, rewound_to: int = 60, last: int = 150) -> pd.DataFrame:
    """Timeline 0 over steps 1..abandoned_to, then timeline 1 from a rewind to ``rewound_to`` up to ``last``."""
    frames = []
    for timeline, steps in ((0, np.arange(1, abandoned_to + 1)), (1, np.arange(rewound_to + 1, last + 1))):
        frames.append(
            pd.DataFrame(
                {
                    "timeline": timeline,
                    "step": steps,
                    "time": 1e9 + steps + 1000 * timeline,
                    "loss": 3.0 / np.sqrt(steps) + timeline,
                    "grad_norm": 1.0 + 0.01 * steps,
                    "lr": 3e-4,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


INCIDENTS = pd.DataFrame(
    {
        "title": ["loss spike", "straggler", "non-finite"],
        "timeline": 0,
        "start_step": [30, 40, 80],
        "end_step": [35, 140, 95],
        "severity": ["warning", "warning", "critical"],
        "kinds": [["loss_spike"], ["straggler"], ["nonfinite", "sdc"]],
    }
)
"""Two incidents about the numbers trained, and one about speed (a straggler) that the curves do not shade."""
ACTIONS = pd.DataFrame(
    {
        "action": ["rewind", "quarantine", "skip", "rewind", "rewind"],
        "status": ["applied", "applied", "applied", "rejected", "requested"],
        "step": [60, 60, 120, 130, None],
    }
)


def test_the_dashboard_s_figures_are_drawn_on_the_white_template() -> None:
    fig = training_curves(two_timelines(), INCIDENTS.iloc[:0], ACTIONS.iloc[:0])
    assert fig.layout.template == pio.templates["plotly_white"]


def test_training_curves_draw_each_timeline_of_each_metric_with_the_abandoned_one_faded() -> None:
    steps = two_timelines()
    fig = training_curves(steps, INCIDENTS.iloc[:0], ACTIONS.iloc[:0])
    titles = [fig.layout[f"yaxis{n or ''}"].title.text for n in ("", 2, 3)]
    assert titles == ["train loss (nats/token)", "gradient norm (L2)", "learning rate"]  # one subplot each
    lines = {(trace.yaxis, trace.name): trace for trace in fig.data}
    assert sorted(lines) == sorted((axis, f"timeline {t}") for axis in ("y", "y2", "y3") for t in (0, 1))
    for (axis, name), trace in lines.items():
        timeline = int(name.split()[1])
        assert trace.opacity == (FADED if timeline == 0 else 1.0)
        assert list(trace.x) == steps.loc[steps["timeline"] == timeline, "step"].tolist()
        assert trace.showlegend == (axis == "y")  # one legend entry per timeline
    assert FADED < 1


def test_training_curves_shade_the_incidents_about_the_numbers_and_mark_applied_rewinds_and_skips() -> None:
    fig = training_curves(two_timelines(), INCIDENTS, ACTIONS)
    for axis in ("x", "x2", "x3"):
        shapes = [s for s in fig.layout.shapes if s.xref == axis]
        shaded = [(s.x0, s.x1, s.fillcolor) for s in shapes if s.type == "rect"]
        assert shaded == [(29.5, 35.5, SEVERITY_COLORS["warning"]), (79.5, 95.5, SEVERITY_COLORS["critical"])]
        assert sorted(s.x0 for s in shapes if s.type == "line") == [60, 120]
    marks = sorted((a.x, a.text) for a in fig.layout.annotations if a.xref == "x")
    assert marks == [(60, "rewind"), (120, "skip")]  # not the quarantine, nor what was rejected or not yet applied
    marked = {t.name: list(t.x) for t in fig.data if t.mode == "markers"}
    assert marked == {"warning incident": [30], "critical incident": [80]}  # where each began, in the top panel


def test_training_curves_leave_out_a_metric_the_run_does_not_log() -> None:
    steps = two_timelines().assign(lr=np.nan)
    fig = training_curves(steps, INCIDENTS.iloc[:0], ACTIONS.iloc[:0])
    assert (fig.layout.yaxis.title.text, fig.layout.yaxis2.title.text) == (
        "train loss (nats/token)",
        "gradient norm (L2)",
    )
    assert {trace.yaxis for trace in fig.data} == {"y", "y2"} and "yaxis3" not in fig.layout


def test_training_curves_of_a_long_run_stay_within_max_points_a_line() -> None:
    steps = two_timelines(abandoned_to=30_000, rewound_to=20_000, last=60_000)
    steps.loc[steps["step"] == 45_000, "loss"] = 99.0
    fig = training_curves(steps, INCIDENTS.iloc[:0], ACTIONS.iloc[:0])
    assert max(len(trace.x) for trace in fig.data) <= MAX_POINTS
    [live_loss] = [t for t in fig.data if t.yaxis == "y" and t.name == "timeline 1"]
    assert 99.0 in list(live_loss.y)


# -- eval against compute -----------------------------------------------------------------------------------------


def power_law_evals(n: int, *, timeline: int = 0, name: str = "loss") -> pd.DataFrame:
    """``n`` evals of a clean saturating power law, 1.5 + 4 (C / 1e12)^-0.4, over three decades of compute."""
    compute = np.geomspace(1e12, 1e15, n)
    return pd.DataFrame(
        {
            "timeline": timeline,
            "step": np.arange(1, n + 1) * 100,
            "split": "heldout",
            "name": name,
            "value": 1.5 + 4.0 * (compute / 1e12) ** -0.4,
            "cum_tokens": compute / 1e6,
            "cum_flops": compute,
        }
    )


def test_the_forecast_band_needs_enough_evals() -> None:
    assert forecast_band(power_law_evals(MIN_EVALS_FOR_BAND - 1), "loss") is None
    assert forecast_band(power_law_evals(MIN_EVALS_FOR_BAND), "loss") is not None
    assert forecast_band(power_law_evals(10), "accuracy") is None


def test_the_forecast_band_of_a_clean_power_law_holds_its_points() -> None:
    evals = power_law_evals(12)
    band = forecast_band(evals, "loss")
    assert band["cum_flops"].is_monotonic_increasing
    assert band["cum_flops"].iloc[0] == pytest.approx(1e12) and band["cum_flops"].iloc[-1] == pytest.approx(1.5e15)
    assert ((band["low"] < band["center"]) & (band["center"] < band["high"])).all()
    at = np.log(evals["cum_flops"])
    low, high = (np.interp(at, np.log(band["cum_flops"]), band[edge]) for edge in ("low", "high"))
    assert ((low <= evals["value"]) & (evals["value"] <= high)).all()
    truth = 1.5 + 4.0 * (band["cum_flops"] / 1e12) ** -0.4
    np.testing.assert_allclose(band["center"], truth, rtol=1e-3)  # extrapolated half a step past the last eval too


def test_the_forecast_band_takes_a_rewound_step_from_the_newer_timeline() -> None:
    evals = power_law_evals(8)
    replaced = evals.iloc[[3]].assign(timeline=1, value=evals["value"].iloc[3] * 1.3)
    band = forecast_band(pd.concat([replaced, evals]), "loss")
    clean = forecast_band(evals, "loss")
    assert not np.allclose(band["center"], clean["center"], rtol=1e-3)


def test_eval_against_compute_draws_each_timeline_on_a_log_axis_the_live_one_in_front() -> None:
    evals = pd.concat(
        [
            power_law_evals(4, name="loss"),
            power_law_evals(4, name="accuracy"),
            power_law_evals(3, timeline=1, name="loss"),
        ]
    )
    fig = eval_vs_compute(evals, "loss", forecast_band(power_law_evals(8), "loss"))
    assert fig.layout.xaxis.type == "log"
    lines = {trace.name: trace for trace in fig.data}
    assert set(lines) == {None, "forecast band", "forecast", "timeline 0", "timeline 1"}
    assert (lines["timeline 0"].opacity, lines["timeline 1"].opacity) == (FADED, 1.0)
    assert len(lines["timeline 0"].x) == 4 and len(lines["timeline 1"].x) == 3


def test_incidents_are_placed_on_the_eval_curve_of_their_timeline_where_they_began() -> None:
    evals = pd.DataFrame(
        {
            "timeline": [0, 0, 0, 1, 1],
            "step": [100, 200, 300, 200, 300],
            "name": "loss",
            "value": [3.0, 2.0, 1.8, 2.2, 1.9],
            "cum_flops": [1e12, 2e12, 3e12, 2.5e12, 3.5e12],
        }
    )
    incidents = pd.DataFrame(
        {
            "incident_id": ["a", "b", "c"],
            "timeline": [0, 1, 0],
            "start_step": [150, 250, 50],
            "severity": ["warning", "critical", "info"],
            "title": ["spike", "nan", "early"],
        }
    )
    marks = incidents_on_evals(incidents, evals, "loss")
    assert list(marks["label"]) == ["spike (step 150)", "nan (step 250)"]  # "early" began before the first eval
    assert list(marks["severity"]) == ["warning", "critical"]
    np.testing.assert_allclose(marks["cum_flops"], [1.5e12, 3e12])  # timeline 1 from its rewind at step 200 on
    np.testing.assert_allclose(marks["value"], [2.5, 2.05])

    fig = eval_vs_compute(evals, "loss", None, marks)
    marked = {trace.name: list(trace.x) for trace in fig.data if trace.mode == "markers"}
    assert marked == {"critical incident": [3e12], "warning incident": [1.5e12]}


def test_the_headline_metric_is_excess_loss_then_loss_then_what_there_is() -> None:
    names = lambda *n: pd.DataFrame({"name": list(n)})  # noqa: E731
    assert headline_metric(names("accuracy", "loss", "excess_loss")) == "excess_loss"
    assert headline_metric(names("accuracy", "loss")) == "loss"
    assert headline_metric(names("accuracy", "bleu")) == "accuracy"
    assert headline_metric(names()) is None


# -- checkpoints --------------------------------------------------------------------------------------------------


def test_young_daly_advice_matches_the_formulas_by_hand() -> None:
    advice = advise(2.0, 10_000.0, 0, 1_000.0)  # no interruption yet: one assumed after the span
    assert (advice.mtbf_s, advice.optimal_interval_s) == (10_000.0, pytest.approx(200.0))  # sqrt(2 * 2 * 10000)
    assert advice.optimal_waste == pytest.approx(0.02)  # 2/200 + 200/20000
    assert advice.current_waste == pytest.approx(0.052)  # 2/1000 + 1000/20000

    advice = advise(20.0, 7_200.0, 2, None)
    assert advice.mtbf_s == 3_600.0
    assert advice.optimal_interval_s == pytest.approx(math.sqrt(2 * 20.0 * 3_600.0))
    assert advice.current_waste is None


def test_the_young_daly_interval_minimises_the_expected_waste() -> None:
    optimal = advise(30.0, 86_400.0, 3, None).optimal_interval_s
    best = expected_waste(optimal, 30.0, 28_800.0)
    assert best == pytest.approx(30.0 / optimal + optimal / (2 * 28_800.0))
    assert all(expected_waste(optimal * f, 30.0, 28_800.0) > best for f in (0.5, 0.9, 1.1, 2.0))


def test_advice_needs_a_save_cost_and_a_span() -> None:
    for save_s, span_s in ((0.0, 100.0), (1.0, 0.0)):
        with pytest.raises(ValueError, match="must be > 0"):
            advise(save_s, span_s, 0, None)


def test_checkpoint_advice_takes_the_median_save_the_median_interval_and_the_restarts() -> None:
    checkpoints = pd.DataFrame(
        {
            "step": [100, 200, 300, 400],
            "started_at": [0.0, 1_000.0, 2_000.0, 3_500.0],
            "duration_s": [10.0, 30.0, 20.0, np.nan],
        }
    )  # the last one still saving
    restarts = pd.DataFrame({"started_at": [0.0], "last_at": [7_200.0], "restarts": [2]})
    advice = checkpoint_advice(checkpoints, restarts)
    assert (advice.save_s, advice.mtbf_s, advice.interruptions, advice.current_interval_s) == (
        20.0,
        3_600.0,
        2,
        1_000.0,
    )
    assert advice.optimal_interval_s == pytest.approx(math.sqrt(2 * 20.0 * 3_600.0))
    assert advice.current_waste == pytest.approx(20.0 / 1_000.0 + 1_000.0 / 7_200.0)


def test_no_checkpoint_advice_without_a_saved_checkpoint_or_a_span() -> None:
    saved = pd.DataFrame({"started_at": [0.0], "duration_s": [5.0]})
    span = pd.DataFrame({"started_at": [0.0], "last_at": [100.0], "restarts": [0]})
    assert checkpoint_advice(saved.iloc[:0], span) is None
    assert checkpoint_advice(saved, span.iloc[:0]) is None
    assert checkpoint_advice(saved, span.assign(last_at=0.0)) is None
    assert checkpoint_advice(saved, span).current_interval_s is None  # one save: no interval yet


# -- tiles --------------------------------------------------------------------------------------------------------

RUN = pd.DataFrame({"status": ["live"], "world_size": [8], "peak_flops_per_device": [1e12]})
PROGRESS = pd.DataFrame(
    {
        "step": [1234.0],
        "timeline": [1.0],
        "spent_tokens": [5e9],
        "spent_flops": [3e19],
        "tokens_per_s": [2e5],
        "flops_per_s": [2e12],
    }
)
GOOD_CHECKPOINT = pd.DataFrame({"checkpoint_time": [1_796_000_000.0]})
OPEN = pd.DataFrame({"severity": ["critical", "warning"], "incidents": [1, 3], "acknowledged": [0, 2]})


def test_tiles_compute_mfu_from_the_flops_rate_the_ranks_and_their_peak() -> None:
    t = tiles(RUN, PROGRESS, GOOD_CHECKPOINT, OPEN, now=1_796_000_600.0)
    assert t.mfu == pytest.approx(2e12 / (8 * 1e12))
    assert (t.status, t.step, t.timeline, t.tokens, t.flops, t.tokens_per_s) == ("live", 1234, 1, 5e9, 3e19, 2e5)
    assert t.since_checkpoint_s == pytest.approx(600.0)
    assert (t.open_incidents, t.acknowledged) == ({"critical": 1, "warning": 3}, 2)


@pytest.mark.parametrize(
    "run",
    [RUN.assign(peak_flops_per_device=np.nan), RUN.assign(world_size=0)],
    ids=["no peak in the config", "no ranks"],
)
def test_tiles_leave_mfu_out_when_the_run_does_not_say(run: pd.DataFrame) -> None:
    assert tiles(run, PROGRESS, GOOD_CHECKPOINT, OPEN, now=0.0).mfu is None


def test_tiles_of_a_run_with_nothing_yet() -> None:
    t = tiles(RUN.iloc[:0], PROGRESS.iloc[:0], GOOD_CHECKPOINT.iloc[:0], OPEN.iloc[:0], now=0.0)
    assert (t.status, t.step, t.mfu, t.since_checkpoint_s, t.open_incidents) == ("empty", None, None, None, {})


def test_an_incident_window_over_many_ranks_draws_its_own_ranks_and_a_band_for_the_rest() -> None:
    steps = np.arange(100, 130)
    ranks = pd.DataFrame([{"rank": r, "step": s, "step_time": 1.0 + (r == 7)} for r in range(1024) for s in steps])
    window = pd.DataFrame({"step": steps, "loss": 2.0, "grad_norm": 1.0})
    fig = incident_window(window, ranks, 110, 120, focus=(7,))
    names = [t.name for t in fig.data]
    assert "rank 7" in names and "other 1023 ranks" in names and "their median" in names
    assert len(fig.data) <= 2 + 3 + 1  # loss, grad norm, the band's edges and median, rank 7
    assert len([n for n in names if n and n.startswith("rank ")]) == 1


@pytest.mark.parametrize(("tokens", "unit", "rate"), [(4096.0, "tokens/s", 4096.0), (None, "steps/s", 1.0)])
def test_an_incident_about_speed_shows_the_jobs_throughput_not_its_loss(tokens, unit: str, rate: float) -> None:
    steps = np.arange(100, 130)
    seconds = np.where(steps <= 115, 0.1, 0.3)  # three times slower from step 116
    window = pd.DataFrame({"step": steps, "time": np.cumsum(seconds), "loss": 2.0, "grad_norm": 1.0, "tokens": tokens})
    [trace] = incident_window(window, pd.DataFrame(), 116, 129, about_training=False).data
    assert trace.name == unit
    paced = np.asarray(trace.y, float)
    assert np.isnan(paced[0])
    assert paced[1:16] == pytest.approx([rate / 0.1] * 15) and paced[16:] == pytest.approx([rate / 0.3] * 14)
    assert [t.name for t in incident_window(window, pd.DataFrame(), 116, 129).data] == ["loss", "grad norm"]
