"""loss_spike and grad_spike on seeded falling curves: quiet when clean, spikes found at their step,
episodes that recover or diverge, rewinds, bad values, and batching that changes nothing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from telemetry_frames import as_json, checkpoint_frame, log_noise, replay

from bedside.detectors.finding import Finding, Severity
from bedside.detectors.spike import GradSpikeDetector, LossSpikeDetector, SpikeDetector
from bedside.detectors.telemetry import STEP_COLUMNS, RunState, TelemetryBatch

SIGMA = 0.02
"""Standard deviation of the step noise, on log scale (2% of the value)."""
NOISES = ("gaussian", "ar1", "student_t3", "lognormal")
LIGHT_TAILS = ("gaussian", "ar1")
DETECTORS = {"loss": LossSpikeDetector, "grad_norm": GradSpikeDetector}
T0 = 1_796_000_000.0


def loss_curve(step: np.ndarray) -> np.ndarray:
    return 1.5 + 8.0 * (step + 10.0) ** -0.5


def grad_curve(step: np.ndarray) -> np.ndarray:
    return 0.3 + 3.0 * (step + 50.0) ** -0.4


def clean_run(
    kind: str, n: int, *, seed: int = 0, first_step: int = 1, timeline: int = 0, sigma: float = SIGMA
) -> pd.DataFrame:
    """Job-level step rows of a falling loss and gradient norm, each with its own noise."""
    rng = np.random.default_rng(seed)
    step = np.arange(first_step, first_step + n)
    return pd.DataFrame(
        {
            "timeline": timeline,
            "step": step,
            "time": T0 + np.arange(n, dtype=float),
            "rank": 0,
            "seq": step,
            "loss": loss_curve(step) * np.exp(log_noise(rng, kind, n, sigma)),
            "grad_norm": grad_curve(step) * np.exp(log_noise(rng, kind, n, sigma)),
            "lr": 3e-4,
            "tokens": 65_536.0,
            "flops": 1e15,
            "shards": None,
        }
    )[list(STEP_COLUMNS)]


def bump(frame: pd.DataFrame, metric: str, steps: list[int], sigmas: list[float] | float, sigma: float = SIGMA) -> None:
    """Raise ``metric`` at ``steps`` by ``sigmas`` standard deviations of the noise (on log scale)."""
    for step, k in zip(steps, np.broadcast_to(sigmas, len(steps))):
        where = frame["step"] == step
        assert where.sum() == 1
        frame.loc[where, metric] *= math.exp(k * sigma)


def detect(metric: str, frame: pd.DataFrame, *, parts: int = 1, run: RunState | None = None) -> dict[str, Finding]:
    return replay(DETECTORS[metric](), TelemetryBatch(steps=frame), parts=parts, run=run)


def feed_in_cuts(detector: SpikeDetector, frame: pd.DataFrame, cuts: list[int]) -> dict[int, list[Finding]]:
    """Feed ``frame`` in pieces that each end at one of ``cuts`` (a step); what each piece returned."""
    returned, start = {}, 0
    for cut in [*cuts, int(frame["step"].max())]:
        end = int(np.searchsorted(frame["step"].to_numpy(), cut, side="right"))
        returned[cut] = detector.update(TelemetryBatch(steps=frame.iloc[start:end]))
        start = end
    return returned


# -- clean curves ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", LIGHT_TAILS)
def test_clean_curves_with_light_tails_stay_quiet_over_10k_steps(kind: str) -> None:
    # Measured with this generator (10k steps per seed, loss and gradient norm each): gaussian 8 alarms in
    # 200k metric-steps (seeds 0-9), AR(1) phi=0.6 5 in 120k (seeds 0-5), all with z just past 4: ~0.4 per
    # 10k steps, against the 0.3 of docs/detectors.md. At most 1 here, per metric.
    frame = clean_run(kind, 10_000, seed=7)
    for metric in DETECTORS:
        assert len(detect(metric, frame)) <= 1, metric


@pytest.mark.parametrize("kind", ("student_t3", "lognormal"))
def test_heavy_tailed_noise_raises_the_bar_instead_of_paging(kind: str) -> None:
    # Measured with this generator (seeds 100-102, 10k steps, loss and gradient norm): Student-t(3) 18
    # alarms in 60k metric-steps (3 per 10k; 2 of them in the first 250 steps, before the tail factor has
    # 100 z-scores), skewed lognormal 1 in 60k. On this 5k-step run: 1 alarm each; with the tail factor
    # switched off (tail_power 0), 43 (Student-t(3)) and 55 (lognormal).
    frame = clean_run(kind, 5_000, seed=3)
    found = detect("loss", frame)
    assert len(found) <= 4
    tails = [f.evidence["tail_factor"] for f in found.values() if f.start_step > 500]
    assert all(t > 1.5 for t in tails), tails
    untailed = replay(_untailed(), TelemetryBatch(steps=frame))
    assert len(untailed) > 5 * max(len(found), 1), (len(untailed), len(found))


def _untailed() -> LossSpikeDetector:
    detector = LossSpikeDetector()
    detector.trend.tail_power = 0.0
    return detector


# -- spikes ---------------------------------------------------------------------------------------------------

SPIKE_SIGMAS = {"gaussian": 8.0, "ar1": 8.0, "student_t3": 20.0, "lognormal": 20.0}
"""Spike size per noise model. Heavy tails raise the threshold to ~16 robust sigma (measured recall at
8 sigma: 5/42 Student-t(3), 6/42 lognormal; at 16 sigma 41/42 each)."""


def spike_steps(rng: np.random.Generator, first: int, n: int) -> list[int]:
    starts = np.arange(first, n - 100, 200)
    return [int(s) for s in starts + rng.integers(0, 60, len(starts))]


@pytest.mark.parametrize("metric", DETECTORS)
@pytest.mark.parametrize("kind", NOISES)
def test_single_step_spikes_are_found_at_their_step(kind: str, metric: str) -> None:
    # Measured (seeds 11-14, both metrics): gaussian 80/80 found at delay 0, AR(1) 79/80 (missed: a spike on
    # a -3.7 sigma AR trough, net z 4.3 against a tail-raised bar of 4.9). Heavy tails at 20 sigma (seed
    # 11): 10/10 per metric with the tail factor of commit c01ced9, but the recall follows the tail
    # factor's tuning closely (a trial retune found 0-6 of 10), so heavy tails are only checked for delay
    # and onset. Spikes start at step 1000, after the tail factor has settled.
    frame = clean_run(kind, 3_000, seed=11)
    at = spike_steps(np.random.default_rng(5), 1_000, 3_000)
    bump(frame, metric, at, SPIKE_SIGMAS[kind])
    detector = DETECTORS[metric]()
    returned = feed_in_cuts(detector, frame, at)
    latest = {f.finding_id: f for found in returned.values() for f in found}
    found_at = {f.start_step for f in latest.values()}
    for step in sorted(found_at & set(at)):
        [opened] = [f for f in returned[step] if f.start_step == step]  # by the piece that ends at the spike
        assert opened.active and opened.evidence["onset_step"] == opened.evidence["peak_step"] == step
        assert opened.evidence["metric"] == metric and opened.kind == DETECTORS[metric].kind
    hits, others = len(found_at & set(at)), sorted(found_at - set(at))
    assert hits >= (0.9 * len(at) if kind in LIGHT_TAILS else 1), f"found {hits}/{len(at)} spikes"
    assert len(others) <= (1 if kind in LIGHT_TAILS else 6), others  # heavy tails: see the test above
    for f in latest.values():
        if f.start_step in at:
            assert not f.active and f.evidence["recovered_at_step"] >= f.start_step + 2


def settle(frame: pd.DataFrame, metric: str, steps: range) -> None:
    """Put ``metric`` exactly on its clean curve at ``steps`` (no noise: nothing elevated there)."""
    where = frame["step"].isin(list(steps))
    frame.loc[where, metric] = (loss_curve if metric == "loss" else grad_curve)(frame.loc[where, "step"])


@pytest.mark.parametrize("metric", DETECTORS)
def test_consecutive_elevated_steps_are_one_episode(metric: str) -> None:
    frame = clean_run("gaussian", 1_000, seed=2)
    bump(frame, metric, [600, 601, 602, 603, 604], [10, 11, 14, 9, 7])  # early in a run the bar is 2x higher
    settle(frame, metric, range(605, 612))
    ongoing = detect(metric, frame[frame["step"] <= 603])
    [open_finding] = ongoing.values()
    assert open_finding.active and (open_finding.start_step, open_finding.evidence["peak_step"]) == (600, 602)
    assert open_finding.suggested_action.action in ("rewind", "investigate")

    [finding] = detect(metric, frame).values()
    evidence = finding.evidence
    assert finding.finding_id == open_finding.finding_id
    assert (finding.start_step, finding.end_step) == (600, 604)
    assert (evidence["onset_step"], evidence["peak_step"], evidence["last_elevated_step"]) == (600, 602, 604)
    assert evidence["recovered_at_step"] == 606 and not finding.active  # recover_steps=2 quiet steps
    assert evidence["ratio_to_baseline"] == pytest.approx(math.exp(14 * SIGMA), rel=4 * SIGMA)
    # 1.32x the trend: an alarm for the loss (from 1.15x), a bump for the gradient norm (from 2x)
    assert finding.severity == (Severity.WARNING if metric == "loss" else Severity.INFO)
    assert finding.suggested_action.action == "investigate"


@pytest.mark.parametrize("metric", DETECTORS)
def test_no_recovery_within_diverge_steps_is_a_critical_divergence(metric: str) -> None:
    frame = clean_run("gaussian", 1_500, seed=4)
    frame.loc[frame["step"] >= 700, metric] *= 1.5 if metric == "loss" else 2.5  # >= 20 sigma and past min_ratio
    run = RunState()
    run.observe(
        TelemetryBatch(
            checkpoints=checkpoint_frame([(0, T0, 500, "saved"), (0, T0, 650, "verified"), (0, T0, 750, "saved")])
        )
    )
    found = detect(metric, frame, run=run)
    [finding] = found.values()
    assert finding.severity == Severity.CRITICAL and finding.active
    assert finding.start_step == 700 and finding.evidence["diverged_at_step"] == finding.end_step == 750
    assert "diverged" in finding.summary
    assert finding.suggested_action.action == "rewind" and finding.suggested_action.args == {"to_step": 650}

    before = detect(metric, frame[frame["step"] < 740])
    [early] = before.values()
    assert early.active and "diverged_at_step" not in early.evidence and early.severity == Severity.WARNING


@pytest.mark.parametrize("back", (50, 300))
def test_a_rewind_repeats_steps_without_a_false_spike(back: int) -> None:
    # Early in the run the loss falls steeply: going back 300 steps raises it by ~16 sigma of this noise.
    sigma = 0.005
    first = clean_run("gaussian", 600, seed=8, sigma=sigma)
    branch = clean_run("gaussian", 900, seed=9, first_step=601 - back, timeline=1, sigma=sigma)
    branch["time"] += 1e4
    frame = pd.concat([first, branch], ignore_index=True)
    for metric in DETECTORS:
        assert detect(metric, frame) == {}, metric


def test_a_rewind_ends_the_open_episode_on_the_abandoned_branch() -> None:
    first = clean_run("gaussian", 800, seed=1)
    bump(first, "loss", list(range(790, 801)), 12.0)  # still elevated when the run is rewound
    branch = clean_run("gaussian", 400, seed=2, first_step=761, timeline=1)
    branch["time"] += 1e4
    found = detect("loss", pd.concat([first, branch], ignore_index=True))
    [finding] = found.values()
    assert (finding.timeline, finding.start_step, finding.active) == (0, 790, False)
    assert "rewind to step 761 on timeline 1" in finding.evidence["ended_by"]
    assert "recovered_at_step" not in finding.evidence


def test_a_rewind_ends_a_divergence_on_the_abandoned_branch() -> None:
    first = clean_run("gaussian", 900, seed=4)
    first.loc[first["step"] >= 700, "loss"] *= 1.5  # diverged at step 750, still high at 900
    branch = clean_run("gaussian", 400, seed=2, first_step=651, timeline=1)
    branch["time"] += 1e4
    [finding] = detect("loss", pd.concat([first, branch], ignore_index=True)).values()
    assert (finding.timeline, finding.start_step, finding.evidence["diverged_at_step"]) == (0, 700, 750)
    assert not finding.active and "rewind to step 651 on timeline 1" in finding.evidence["ended_by"]


# -- bad values and batching ----------------------------------------------------------------------------------


def test_nonfinite_and_nonpositive_values_are_skipped() -> None:
    frame = clean_run("gaussian", 1_200, seed=6)
    bump(frame, "loss", [700, 701, 702], [9, 12, 9])
    bump(frame, "grad_norm", [900], [10])
    bad = {50: np.nan, 400: np.inf, 401: -np.inf, 500: 0.0, 501: -1.0, 701: np.nan, 703: np.nan, 901: np.inf}
    dirty = frame.copy()
    for step, value in bad.items():
        dirty.loc[dirty["step"] == step, ["loss", "grad_norm"]] = value
    kept = frame[~frame["step"].isin(list(bad))]
    for metric in DETECTORS:
        expected = detect(metric, kept)
        assert expected, metric
        assert as_json(detect(metric, dirty)) == as_json(expected), metric
    missing = dirty.astype({"loss": "object"})
    missing.loc[missing["step"] == 300, "loss"] = None
    assert as_json(detect("loss", missing)) == as_json(detect("loss", kept[kept["step"] != 300]))


def mixed_run() -> pd.DataFrame:
    """Spikes, a multi-step episode, a divergence and a rewind, in one run."""
    first = clean_run("ar1", 1_600, seed=12)
    bump(first, "loss", [300, 700, 701, 702], [9, 7, 12, 6])
    bump(first, "grad_norm", [298, 699, 1_200], [10, 9, 11])
    first.loc[first["step"] >= 1_400, ["loss", "grad_norm"]] *= 1.6
    branch = clean_run("student_t3", 800, seed=13, first_step=1_351, timeline=1)
    branch["time"] += 1e4
    bump(branch, "loss", [1_800], [25])
    return pd.concat([first, branch], ignore_index=True)


@pytest.mark.parametrize("parts", (2, 37, 400))
def test_one_batch_or_many_gives_the_same_findings(parts: int) -> None:
    frame = mixed_run()
    for metric in DETECTORS:
        whole = detect(metric, frame)
        assert len(whole) >= 3, metric
        assert as_json(detect(metric, frame, parts=parts)) == as_json(whole), metric
