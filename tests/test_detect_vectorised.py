"""Batch detection is vectorised and streaming is not: both must find the same.

The spike detectors score quiet stretches a block at a time (``RobustTrend.lookahead``) and the throughput
detector screens long drains with rolling medians; a live follow feeds them a step at a time. Each series
below (three noise models, falling, warm-up and LR-drop dynamics, short and long runs, spikes, a plateau, a
divergence, NaNs, a rewind, a restart) is replayed whole and one step per update: the findings must be equal,
every number included.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import telemetry_frames as tf

from bedside.detectors.registry import build_detectors
from bedside.detectors.robust import MAD_TO_SIGMA, dense_row_median, mad_sigma, median, row_quantile
from bedside.detectors.telemetry import RunState, TelemetryBatch
from bedside.detectors.trend import RobustTrend

NOISES = ("gaussian", "student_t3", "ar1")
SHAPES = ("power_law", "warmup_cosine", "lr_drop")


def curve(shape: str, steps: np.ndarray) -> np.ndarray:
    """A training loss without noise."""
    if shape == "power_law":
        return 2.0 + 8.0 * (steps + 10.0) ** -0.3
    if shape == "warmup_cosine":
        warm = np.minimum(1.0, steps / 200.0)
        return 2.5 + 5.0 * np.exp(-3.0 * warm * steps / steps[-1]) + 0.2 * np.cos(steps / 400.0)
    return 2.0 + 6.0 * (steps + 10.0) ** -0.25 - 0.3 * (steps > steps[-1] * 0.6)


def loss_run(noise: str, shape: str, n: int, seed: int) -> pd.DataFrame:
    """A loss and gradient norm series with every kind of episode the spike detectors know."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, n + 1)
    loss = curve(shape, step.astype(float)) * np.exp(tf.log_noise(rng, noise, n, 0.02))
    grad = 1.0 * np.exp(tf.log_noise(rng, noise, n, 0.1))
    for at, factor in ((n // 5, 3.0), (n // 5 + 40, 2.5), (n // 2, 1.3)):  # a spike, another soon after, a small one
        loss[at] *= factor
        grad[at - 1] *= 4 * factor
    loss[int(n * 0.6) : int(n * 0.6) + 3] *= 2.0  # a plateau
    if n >= 1000:  # a divergence that comes back
        loss[int(n * 0.7) : int(n * 0.7) + 150] *= np.linspace(1.5, 2.5, 150)
    loss[rng.choice(n, 5, replace=False)] = np.nan
    frame = tf.steps_frame(1.8e9 + step.astype(float), first_step=1)
    return frame.assign(loss=loss, grad_norm=grad)


def rewound(frame: pd.DataFrame, at: int) -> pd.DataFrame:
    """The run rewound to step ``at // 2`` after step ``at``: the later rows replayed on timeline 1."""
    before, after = frame[frame["step"] <= at], frame[frame["step"] > at // 2]
    later = after.assign(timeline=1, time=after["time"] + (at - at // 2) + 1.0, seq=after["seq"] + len(frame))
    return pd.concat([before, later], ignore_index=True)


def restart_events(frame: pd.DataFrame, at: int) -> pd.DataFrame:
    """A checkpoint loaded at step ``at``: the detectors settle after it."""
    time = float(frame.loc[frame["step"] == at, "time"].iloc[0]) - 0.5
    return tf.checkpoint_frame([(0, time, at, "loaded")])


def replay_both(name: str, batch: TelemetryBatch) -> tuple[dict, dict]:
    """The findings of one whole batch, and of one step per update."""
    runs = []
    for parts in (1, len(batch.steps)):
        [detector] = build_detectors(only=[name])
        runs.append(tf.as_json(tf.replay(detector, batch, parts=parts, run=RunState(world_size=1))))
    return runs[0], runs[1]


@pytest.mark.parametrize("name", ["loss_spike", "grad_spike"])
@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize(("shape", "n"), [("power_law", 2000), ("warmup_cosine", 1200), ("lr_drop", 400)])
def test_spikes_found_in_one_batch_are_those_found_a_step_at_a_time(name: str, noise: str, shape: str, n: int) -> None:
    frame = loss_run(noise, shape, n, seed=10 * NOISES.index(noise) + SHAPES.index(shape))
    frame = rewound(frame, int(n * 0.8))
    batch = TelemetryBatch(steps=frame, checkpoints=restart_events(frame, n // 3))
    whole, streamed = replay_both(name, batch)
    assert whole and whole == streamed


def knee_run(noise: str, seed: int) -> pd.DataFrame:
    """A loss held up by a long warm-up, falling 150x around step 380, flat from about 430, then creeping up 6% a
    step from 471: the trend's window still holds the fall, so the level finds the blow-up, past the point where
    batch detection scores blocks at once."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, 701)
    loss = (0.2 + 30 / (1 + np.exp((step - 380) / 12.0))) * np.exp(tf.log_noise(rng, noise, 700, 0.05))
    loss[470:] *= 1.06 ** np.minimum(np.arange(1, 231), 80)
    frame = tf.steps_frame(1.8e9 + step.astype(float), first_step=1)
    return frame.assign(loss=loss, grad_norm=np.exp(tf.log_noise(rng, noise, 700, 0.1)))


@pytest.mark.parametrize("noise", NOISES)
def test_a_rise_found_by_its_level_in_one_batch_is_the_one_found_a_step_at_a_time(noise: str) -> None:
    whole, streamed = replay_both("loss_spike", TelemetryBatch(steps=knee_run(noise, NOISES.index(noise))))
    assert whole == streamed
    [found] = [f for f in whole.values() if f["severity"] == "critical"]
    assert 471 < found["start_step"] < 500 and 430 < found["evidence"]["best_level_step"] < 485, found["summary"]


def throughput_run(noise: str, n: int, seed: int) -> pd.DataFrame:
    """Steps whose duration drops by 30% for a stretch, then comes back, and slows for good at the end."""
    rng = np.random.default_rng(seed)
    duration = 1.0 * np.exp(tf.log_noise(rng, noise, n, 0.05))
    duration[n // 3 : n // 3 + n // 6] *= 1.45
    duration[int(n * 0.85) :] *= 1.3
    frame = tf.steps_frame(1.8e9 + np.cumsum(duration))
    return frame.assign(tokens=np.where(rng.random(n) < 0.01, np.nan, 524_288.0))


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("n", [900, 4000])
def test_throughput_drops_found_in_one_batch_are_those_found_a_step_at_a_time(noise: str, n: int) -> None:
    whole, streamed = replay_both("throughput_drop", TelemetryBatch(steps=throughput_run(noise, n, seed=n)))
    assert whole and whole == streamed


@pytest.mark.parametrize("noise", NOISES)
def test_a_lookahead_scores_each_point_exactly_as_one_at_a_time(noise: str) -> None:
    rng = np.random.default_rng(5)
    ys = np.log(curve("power_law", np.arange(1.0, 2001.0))) + tf.log_noise(rng, noise, 2000, 0.02)
    one, block = RobustTrend(), RobustTrend()
    for trend in (one, block):
        for step in range(400):
            trend.admit(step, ys[step], trend.score(step, ys[step]))
    ahead = block.lookahead(list(range(400, 2000)), ys[400:].tolist())
    assert ahead is not None
    for i, step in enumerate(range(400, 2000)):
        expected, got = one.score(step, ys[step]), ahead.score(i)
        assert (got.line, got.predicted, got.sigma, got.z, got.tail, got.ready) == (
            expected.line,
            expected.predicted,
            expected.sigma,
            expected.z,
            expected.tail,
            expected.ready,
        )
        one.admit(step, ys[step], expected)
        ahead.admit_until(i + 1)


def test_a_lookahead_whose_points_are_not_admitted_in_order_refuses_to_score() -> None:
    trend = RobustTrend()
    for step in range(400):
        trend.admit(step, math.log(2.0 + 0.01 * math.sin(step)), trend.score(step, math.log(2.0)))
    ahead = trend.lookahead([400, 401, 402], [0.7, 0.7, 0.7])
    assert ahead is not None
    with pytest.raises(RuntimeError, match="not admitted in order"):
        ahead.score(1)
    trend.admit(400, 0.7, None)  # behind the lookahead's back
    with pytest.raises(RuntimeError, match="not admitted in order"):
        ahead.admit_until(2)


def test_a_lookahead_waits_for_a_full_baseline() -> None:
    trend = RobustTrend()
    for step in range(99):
        trend.admit(step, 0.7, trend.score(step, 0.7))
    assert trend.lookahead([99], [0.7]) is None


@pytest.mark.parametrize("width", [1, 2, 7, 50, 101, 200])
def test_the_dense_row_median_is_numpys_median_of_each_row(width: int) -> None:
    rng = np.random.default_rng(width)
    for values in (rng.standard_normal((300, width)), rng.integers(0, 4, (300, width)).astype(float)):  # ties too
        assert np.array_equal(dense_row_median(values), np.median(values, axis=1))


@pytest.mark.parametrize("width", [1, 2, 5, 64, 1024])
@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_the_row_quantile_is_numpys_over_the_finite_values_of_each_row(width: int, q: float) -> None:
    rng = np.random.default_rng(width)
    values = rng.standard_t(2, (200, width)) * 10 ** rng.uniform(-3, 3, (200, 1))
    values[rng.random(values.shape) < 0.3] = np.nan
    values[:3] = np.nan  # rows with nothing: NaN
    values[3:6] = np.round(values[3:6])  # ties
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning, match="All-NaN"):
        expected = np.nanquantile(values, q, axis=1)
    np.testing.assert_allclose(row_quantile(values, q)[:, 0], expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("size", [1, 2, 3, 8, 31, 100, 401])
def test_the_one_dimensional_median_and_mad_are_numpys(size: int) -> None:
    """The streaming path's median and MAD scale give numpy's numbers exactly: heavy tails, ties, NaNs."""
    rng = np.random.default_rng(size)
    for _ in range(40):
        values = rng.standard_t(2, size) * 10 ** rng.uniform(-6, 6)
        ties = rng.integers(0, 3, size).astype(float)
        holed = np.where(rng.random(size) < 0.2, np.nan, values)
        for x in (values, ties, holed):
            assert median(x) == np.median(x) or (np.isnan(median(x)) and np.isnan(np.median(x)))
            if not np.isnan(x).all():
                centre = np.nanmedian(x)
                assert mad_sigma(x) == MAD_TO_SIGMA * np.nanmedian(np.abs(x - centre))
