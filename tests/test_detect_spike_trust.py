"""loss_spike and grad_spike on curves unlike the simulator's: a spike never raises the bar for the next one,
small genuine bumps on long realistic curves are info while catastrophic spikes alarm at their step, and a
spike on its way down is not a divergence (one that comes back resolves)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from foreign_runs import Spike, curve_run
from scipy import signal
from telemetry_frames import replay
from test_detect_spike import DETECTORS, clean_run, detect

from bedside.detectors import detect as library_detect
from bedside.detectors.finding import Finding, Severity
from bedside.detectors.robust import MAD_TO_SIGMA
from bedside.detectors.spike import LossSpikeDetector
from bedside.detectors.telemetry import TelemetryBatch
from bedside.detectors.trend import EARLY_TAIL, GAUSSIAN_UPPER_Q995, MAX_TAIL, TAIL_SLACK, Line, RobustTrend, Score


def spikes_of(found: dict[str, Finding]) -> list[tuple[int, int]]:
    return sorted((f.start_step, f.end_step) for f in found.values())


# -- no self-masking ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "n"), [("gaussian", 400), ("ar1", 400), ("gaussian", 3_000), ("student_t3", 3_000)])
def test_a_spike_does_not_hide_the_next_one(kind: str, n: int) -> None:
    # Before: the first spike's own z (about 50) entered the tail estimate, the factor went 2.0 -> ~570 and
    # the second spike, 40 steps later, was not found.
    frame = clean_run(kind, n, seed=1, sigma=0.01)
    first = n // 2
    frame.loc[frame["step"].isin([first, first + 40]), "loss"] *= 3.0
    found = detect("loss", frame)
    starts = {f.start_step: f for f in found.values()}
    assert {first, first + 40} <= set(starts), spikes_of(found)
    second = starts[first + 40]
    assert second.evidence["tail_factor"] <= MAX_TAIL and second.severity == Severity.WARNING


T3_SIGMA = MAD_TO_SIGMA * 0.7649
"""Student-t(3)'s MAD as sigma: its draws over this are z-scores as the trend reads them."""


def scored(zs: np.ndarray) -> RobustTrend:
    """A baseline whose tail has learned the z-scores ``zs``, each of an admitted point."""
    trend = RobustTrend()
    trend.on_timeline(0, 0)
    for step, z in enumerate(zs.tolist()):
        trend.admit(step, z, Score(Line(0.0, 0.0), 0.0, 1.0, z, 1.0))
    return trend


def test_300_scores_let_a_light_tail_stand_as_measured_and_keep_the_early_bar_for_a_heavy_one() -> None:
    # Before, the factor stayed at EARLY_TAIL or above until 800 scores, whatever they showed: the bar of 8 sigma
    # that a 2x step under 10% noise (6.9 sigma) never passes. Student-t(3) scaled to the same MAD has about
    # 15 times as many z-scores over 3 as normal data: it keeps the early bar in all but a few runs.
    rng = np.random.default_rng(3)
    normal = [scored(rng.standard_normal(300)).tail() for _ in range(40)]
    heavy = [scored(rng.standard_t(3, 300) / T3_SIGMA).tail() for _ in range(40)]
    assert sum(t < EARLY_TAIL for t in normal) >= 36, normal
    assert sum(t >= EARLY_TAIL for t in heavy) >= 36, heavy


def test_the_rate_of_z_scores_over_3_reads_a_heavy_tail_that_the_q99_5_misses() -> None:
    # The q99.5 of 2,000 z-scores is decided by their ten largest: by it alone, these 40 Student-t(3) runs read
    # factors from 2.2 to the cap, 8 of them under 3.3. Their rate of z-scores over 3 (about 2%, 15 times normal
    # data's) calls for 3.3 or more in every run, and normal data's for little over 1.
    rng = np.random.default_rng(11)
    heavy = [scored(rng.standard_t(3, 2_000) / T3_SIGMA).tail() for _ in range(40)]
    normal = [scored(rng.standard_normal(2_000)).tail() for _ in range(20)]
    assert min(heavy) >= 3.3 and max(normal) <= 1.5, (sorted(heavy), normal)


def test_a_point_over_the_bar_joins_the_tail_at_the_bar() -> None:
    # Left out, the points over the bar thinned the tail it is set from, so heavy-tailed noise lowered its own bar;
    # counted at their own z (50 here), one spike would lift the bar out of reach of the next.
    trend = scored(np.random.default_rng(5).standard_normal(800))
    before = trend.tail()
    for _ in range(12):
        trend.exceeded(Score(Line(0.0, 0.0), 0.0, 1.0, 50.0, before), bar=4.0)
    assert before < trend.tail() <= (4.0 / GAUSSIAN_UPPER_Q995 / TAIL_SLACK) ** trend.tail_power < MAX_TAIL


@pytest.mark.parametrize("metric", DETECTORS)
def test_a_three_step_plateau_is_one_episode_over_its_three_steps(metric: str) -> None:
    # Before: "220-220, recovered at 222": the first point's z raised the recovery bar past the next two.
    frame = clean_run("gaussian", 400, seed=1)
    frame.loc[frame["step"].isin([220, 221, 222]), metric] *= 3.0
    [finding] = detect(metric, frame).values()
    assert (finding.start_step, finding.end_step, finding.evidence["recovered_at_step"]) == (220, 222, 224)


def moe_like(n: int, seed: int, *, sigma: float = 0.01) -> pd.DataFrame:
    """Student-t(3) noise with bursts of genuine small spikes (+3-8% every ~30 steps), as mixture-of-experts runs."""
    frame = clean_run("student_t3", n, seed=seed, sigma=sigma)
    rng = np.random.default_rng(seed + 1)
    bumps = np.arange(100, n, 30) + rng.integers(0, 10, len(range(100, n, 30)))
    frame.loc[frame["step"].isin(bumps), "loss"] *= rng.uniform(1.03, 1.08, len(bumps))
    return frame


@pytest.mark.parametrize("seed", (0, 1))
def test_on_a_heavy_tailed_moe_like_run_a_quarter_spike_after_a_big_one_is_found(seed: int) -> None:
    # Before: the +60% spike's z raised the tail factor and the +25% one 200 steps later was missed.
    frame = moe_like(3_000, seed)
    frame.loc[frame["step"] == 1_500, "loss"] *= 1.6
    frame.loc[frame["step"] == 1_700, "loss"] *= 1.25
    found = {f.start_step: f for f in detect("loss", frame).values()}
    assert {1_500, 1_700} <= set(found), sorted(found)
    assert found[1_700].severity == Severity.WARNING


# -- effect size ----------------------------------------------------------------------------------------------


def realistic(n: int, seed: int, *, nu: float, phi: float, sigma: float = 0.01) -> pd.DataFrame:
    """A long power-law loss and gradient norm with warmup, an LR drop at 70%, heavy-tailed AR(1) noise and a
    genuine one-step bump of +3.5-4.5% (about 4 sigma) every ~400 steps that recovers within two steps."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, n + 1)
    warm = np.minimum(1.0, step / 500.0)
    decay = 2.0 + 6.0 * (step * warm + 20.0) ** -0.35 - 0.04 * (step > 0.7 * n)
    frame = clean_run("gaussian", n, seed=seed)
    for metric, base, scale in (("loss", decay, sigma), ("grad_norm", 0.2 + decay / 8, 3 * sigma)):
        innovations = rng.standard_t(nu, n) * math.sqrt((nu - 2) / nu)
        log_noise = scale * signal.lfilter([math.sqrt(1 - phi**2)], [1.0, -phi], innovations)
        starts = np.arange(300, n - 101, 400)
        at = starts + rng.integers(0, 100, len(starts))
        up = rng.uniform(0.035, 0.045, len(at)) * (scale / sigma)
        log_noise[at] += np.log1p(up)
        log_noise[at + 1] += np.log1p(up / 3)
        frame[metric] = base * np.exp(log_noise)
    return frame


CATASTROPHIC = {4_000: 2.0, 9_000: 3.0, 14_000: 5.0}
"""Step: factor of a one-step catastrophic spike (loss; the gradient norm rises with it)."""


@pytest.mark.parametrize(("seed", "nu", "phi"), [(0, 4.0, 0.5), (1, 3.0, 0.8)])
def test_long_realistic_curves_warn_only_on_catastrophic_spikes(seed: int, nu: float, phi: float) -> None:
    # Before: the genuine ~4 sigma bumps of a clean curve were warnings (0.4-0.6 per 10k steps on real runs);
    # now they are info, below min_ratio, and the target is <= 0.1 warnings per 10k clean steps.
    frame = realistic(18_000, seed, nu=nu, phi=phi)
    for step, factor in CATASTROPHIC.items():
        frame.loc[frame["step"] == step, ["loss", "grad_norm"]] *= factor
    for metric in DETECTORS:
        found = detect(metric, frame)
        alarms = {f.start_step: f for f in found.values() if f.severity != Severity.INFO}
        assert set(CATASTROPHIC) <= set(alarms), (metric, sorted(alarms))
        for step, factor in CATASTROPHIC.items():
            assert alarms[step].evidence["onset_step"] == step  # delay 0
            assert alarms[step].severity == (Severity.CRITICAL if factor >= 4 else Severity.WARNING)
        assert len(set(alarms) - set(CATASTROPHIC)) <= 1, (metric, sorted(set(alarms) - set(CATASTROPHIC)))


def test_a_bump_below_min_ratio_is_info_and_the_floor_is_a_setting() -> None:
    frame = clean_run("gaussian", 2_000, seed=5, sigma=0.005)
    frame.loc[frame["step"] == 1_500, "loss"] *= 1.06  # ~12 sigma, 6% up
    [bump] = detect("loss", frame).values()
    assert bump.severity == Severity.INFO and bump.start_step == 1_500 and "bumped" in bump.summary
    [alarm] = replay(LossSpikeDetector(min_ratio=1.05), TelemetryBatch(steps=frame)).values()
    assert alarm.severity == Severity.WARNING and alarm.start_step == 1_500 and "spiked" in alarm.summary


# -- divergence -----------------------------------------------------------------------------------------------


def early_spike(frame: pd.DataFrame, metric: str, onset: int, *, height: float, decay: float) -> None:
    """A spike that rises over 10 steps to ``height`` (log) and falls back with time constant ``decay``."""
    after = frame["step"].to_numpy() - onset
    rise = (after + 1) / 10
    profile = np.where(after < 0, 0.0, np.where(after < 10, rise, np.exp(-(after - 9) / decay)))
    frame[metric] = frame[metric] * np.exp(height * profile)


@pytest.mark.parametrize("metric", DETECTORS)
@pytest.mark.parametrize(("kind", "decay"), [("gaussian", 25.0), ("ar1", 40.0), ("student_t3", 60.0)])
def test_an_early_spike_already_falling_back_is_not_a_divergence(metric: str, kind: str, decay: float) -> None:
    # Before: "critical, diverged" 50 steps after onset, because it was still above the recovery bar.
    frame = clean_run(kind, 1_000, seed=3)
    early_spike(frame, metric, 150, height=1.2, decay=decay)
    found = [f for f in detect(metric, frame).values() if 140 <= f.start_step <= 160]
    assert found, spikes_of(detect(metric, frame))
    for finding in found:
        assert "diverged_at_step" not in finding.evidence and not finding.active, finding.summary
        assert finding.evidence["recovered_at_step"] > 200  # it took longer than diverge_steps to come back


@pytest.mark.parametrize("metric", DETECTORS)
def test_a_divergence_resolves_when_the_series_comes_back_to_its_trend(metric: str) -> None:
    # Before: a diverged finding stayed active until a rewind, whatever the series did.
    frame = clean_run("gaussian", 1_500, seed=4)
    frame.loc[frame["step"].between(700, 899), metric] *= 3.0
    [finding] = detect(metric, frame).values()
    evidence = finding.evidence
    assert evidence["diverged_at_step"] == 750 and finding.severity == Severity.CRITICAL
    assert not finding.active and evidence["recovered_at_step"] == finding.end_step == 901
    assert "back at step 901" in finding.summary and finding.suggested_action.action == "investigate"
    held = detect(metric, frame[frame["step"] < 880])
    assert [f.active for f in held.values()] == [True]


def test_a_growing_divergence_is_still_called_at_diverge_steps() -> None:
    frame = clean_run("ar1", 1_200, seed=6)
    after = (frame["step"] - 700).clip(lower=0)
    frame["loss"] *= np.exp(np.where(frame["step"] >= 700, 0.3 + 0.01 * after, 0.0))
    [finding] = detect("loss", frame).values()
    assert (finding.start_step, finding.evidence["diverged_at_step"], finding.active) == (700, 750, True)


@pytest.mark.parametrize("noise", ["gaussian", "student_t3", "ar1"])
@pytest.mark.parametrize(("metric", "small", "large"), [("loss", 1.08, 1.6), ("grad_norm", 1.3, 2.6)])
def test_a_small_level_shift_is_info_and_a_large_divergence_critical(
    noise: str, metric: str, small: float, large: float
) -> None:
    # A data-mixture switch moves the loss up a few percent for good; before, the first bump on top of it
    # (peak over min_ratio) made the shift "critical, diverged". A divergence is as large as its settled level.
    for shift, severity in ((small, Severity.INFO), (large, Severity.CRITICAL)):
        frame = clean_run(noise, 1_500, seed=9, sigma=0.005)
        frame.loc[frame["step"] >= 800, metric] *= shift
        frame.loc[frame["step"] == 830, metric] *= 1.2 if metric == "loss" else 2.2  # a bump on the new level
        diverged = [f for f in detect(metric, frame).values() if "diverged_at_step" in f.evidence]
        assert len(diverged) == 1 and diverged[0].start_step == 800, (shift, [f.summary for f in diverged])
        finding = diverged[0]
        assert finding.severity == severity and finding.evidence["level_ratio"] == pytest.approx(shift, rel=0.05)
        assert ("shifted to a new level" in finding.summary) is (severity == Severity.INFO)


@pytest.mark.parametrize("model", ["gaussian_ar", "student_ar", "student"])
@pytest.mark.parametrize("steps", [30, 55, 100])
def test_a_short_run_finds_its_spike_before_its_forecast_errors_are_known(model: str, steps: int) -> None:
    # Imported traces of tens of steps: the trend is ready only after ~70 points, so a 3x spike three
    # quarters into a 30-100-step run after a warmup was never judged (0 of 9 in the foreign benchmark).
    at = 3 * steps // 4
    for seed in range(2):
        spiked = curve_run("short", seed, steps, model=model, spikes=(Spike(at, 3.0),))
        alarms = [f for f in library_detect(**spiked.frames).findings if f.severity != Severity.INFO]
        assert {(f.kind, f.start_step) for f in alarms} >= {("loss_spike", at)}, [f.summary for f in alarms]
        clean = curve_run("short", seed, steps, model=model)
        assert [f.summary for f in library_detect(**clean.frames).findings if f.severity != Severity.INFO] == []
