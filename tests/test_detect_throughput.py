"""The throughput detector: sustained drops found, stalls, swings and warm-up ignored."""

from __future__ import annotations

import re

import numpy as np
import pytest
import telemetry_frames as tf

from bedside.detectors.errors import DetectorConfigError
from bedside.detectors.finding import Finding
from bedside.detectors.registry import build_detectors
from bedside.detectors.telemetry import RunState, TelemetryBatch
from bedside.detectors.throughput import ThroughputDetector

STEPS, RANKS = 3000, 8


def job(
    kind: str = "student_t3",
    *,
    base: float = 0.5,
    seed: int = 0,
    drop: tuple[int, int, float] | None = None,
    nuisances: bool = True,
) -> dict[str, np.ndarray]:
    """A synchronous job's timings: noisy; optionally slower by ``factor`` from ``first`` to ``last`` step.

    The nuisances: compilation makes the first 10 steps 5 times slower, a sequence-length warm-up
    makes the first 100 faster (from half the time), a 2% daily swing, a 20 s checkpoint pause
    every 100 steps and a 5 s data stall inside every 250th step.
    """
    compute = tf.work(np.random.default_rng(seed), STEPS, RANKS, base, kind=kind, scale=0.05)
    pause = np.zeros(STEPS)
    data = np.full_like(compute, 0.01 * base)
    if nuisances:
        compute[:100] *= np.linspace(0.5, 1.0, 100)[:, None]
        compute[:10] *= 5.0
        compute *= 1 + 0.02 * np.sin(2 * np.pi * np.arange(STEPS) / 2000)[:, None]
        pause[100::100] = 20.0
        data[250::250] += 5.0
    if drop is not None:
        first, last, factor = drop
        compute[first - 1 : last] *= factor
    return tf.synchronous(compute, data, pause_s=pause)


def batch_of(timing: dict[str, np.ndarray], *, tokens: float = 524_288.0, rank_steps: bool = True) -> TelemetryBatch:
    steps = tf.steps_frame(timing["end"], tokens=tokens)
    return TelemetryBatch(steps=steps, **({"rank_steps": tf.rank_step_frame(timing)} if rank_steps else {}))


def detect(batch: TelemetryBatch, parts: int = 1, by_time: bool = False) -> list[Finding]:
    found = tf.replay(ThroughputDetector(), batch, parts=parts, by_time=by_time, run=RunState(world_size=RANKS))
    return sorted(found.values(), key=lambda f: f.start_step)


@pytest.mark.parametrize("kind", tf.NOISES)
@pytest.mark.parametrize("rank_steps", [True, False], ids=["median_step_time", "step_intervals"])
def test_stalls_swings_and_warm_up_do_not_alarm(kind: str, rank_steps: bool) -> None:
    assert detect(batch_of(job(kind), rank_steps=rank_steps)) == []


@pytest.mark.parametrize("kind", tf.NOISES)
@pytest.mark.parametrize(
    ("base", "tokens", "rank_steps", "severity"), [(0.05, 4096.0, True, "info"), (20.0, 4e6, False, "warning")]
)
def test_a_sustained_drop_is_found_and_clears(
    kind: str, base: float, tokens: float, rank_steps: bool, severity: str
) -> None:
    # 20% slower for 300 steps: 3 s lost at 50 ms a step pages nobody, 20 minutes at 20 s a step does
    timing = job(kind, base=base, drop=(1500, 1800, 1.2))
    [found] = detect(batch_of(timing, tokens=tokens, rank_steps=rank_steps))
    ev = found.evidence
    assert ev["lost_s"] == pytest.approx(300 * 0.2 * base, rel=0.3)
    assert found.severity.value == severity and found.ranks == () and not found.active
    assert 1480 <= found.start_step <= 1520 and ev["alarm_step"] - 1500 <= 50
    assert 1800 <= found.end_step <= 1860 and ev["largest_drop"] >= 0.1 and ev["unit"] == "tokens/s"
    assert ev["baseline_per_s"] == pytest.approx(tokens / np.median(timing["step_time"][1000:1500]), rel=0.05)
    assert ev["duration_from"] == ("median rank step_time" if rank_steps else "interval between step records")
    assert "since step" in found.summary and found.suggested_action.action == "investigate"


def test_a_drop_that_lasts_stays_active() -> None:
    [found] = detect(batch_of(job(drop=(2000, STEPS, 1.25))))
    assert found.active and found.end_step == STEPS and 0.12 < found.evidence["drop"] < 0.25


@pytest.mark.parametrize("kind", tf.NOISES)
def test_a_tiny_job_slowed_by_contention_is_told_not_paged(kind: str) -> None:
    # Steps of 2 ms that took 8 ms for 150 steps while other processes took the cores: under a second lost.
    compute = tf.work(np.random.default_rng(5), 1200, 2, 0.002, kind=kind, scale=0.05)
    compute[699:850] *= 4.0
    [found] = detect(batch_of(tf.synchronous(compute, np.full_like(compute, 1e-5))))
    assert found.severity.value == "info" and 0.5 < found.evidence["lost_s"] < 1.5
    assert re.search(r"; [01]\.\d s of wall time lost \(it pages from 60\.0 s\)$", found.summary), found.summary


def test_the_same_share_lost_on_long_steps_pages_once_it_has_cost_a_minute() -> None:
    # 25% slower from step 2000 at 0.5 s a step: 0.125 s a step, a minute lost within about 500 steps.
    timing = job(drop=(2000, STEPS, 1.25))
    batch = batch_of(timing)
    first = [f for f in detect(TelemetryBatch(steps=batch.steps.iloc[:2100], rank_steps=batch.rank_steps))]
    assert [f.severity.value for f in first] == ["info"]
    [found] = detect(batch)
    assert found.severity.value == "warning" and found.evidence["lost_s"] > 60
    assert "min of wall time lost" in found.summary and "pages from" not in found.summary


@pytest.mark.parametrize("kind", tf.NOISES)
def test_a_drop_made_of_the_ranks_wait_for_a_cpu_is_the_environment_and_never_pages(kind: str) -> None:
    """0.5 s steps 60% slower from step 2000, where other processes took the cores: the median rank's recorded wait
    for a CPU rose by as much, so the drop is told as the environment (info) however much time it costs; the
    same drop without that record pages, and a drop of the job's own beside a small wait still pages."""
    timing = job(kind, drop=(2000, STEPS, 1.6))
    frame = tf.rank_step_frame(timing)
    waits = np.zeros_like(timing["compute_time"])
    waits[1999:] = timing["compute_time"][1999:] * (0.6 / 1.6)
    steps = tf.steps_frame(timing["end"], tokens=524_288.0)

    def found_with(wait: np.ndarray | None) -> Finding:
        rank_steps = frame if wait is None else frame.assign(cpu_wait_time=wait[frame["step"] - 1, frame["rank"]])
        [found] = detect(TelemetryBatch(steps=steps, rank_steps=rank_steps))
        return found

    told = found_with(waits)
    assert told.severity.value == "info" and told.evidence["contended"] and told.evidence["lost_s"] > 60
    assert "other processes took the cores (the environment, not the job)" in told.summary
    assert "what else runs on the job's hosts" in told.suggested_action.why
    assert found_with(None).severity.value == "warning"
    assert found_with(waits / 10).severity.value == "warning"


def test_a_small_drop_is_not_a_finding() -> None:
    assert detect(batch_of(job(drop=(1500, 2500, 1.06)))) == []


def test_without_tokens_the_rate_is_steps_per_second() -> None:
    [found] = detect(batch_of(job(drop=(1500, 1800, 1.2)), tokens=np.nan, rank_steps=False))
    assert found.evidence["unit"] == "steps/s" and "steps/s" in found.summary


def test_one_batch_or_many_give_the_same_findings() -> None:
    batch = batch_of(job("lognormal", drop=(1500, 1800, 1.2)))
    whole = tf.as_json({f.finding_id: f for f in detect(batch)})
    assert len(whole) == 1
    for parts, by_time in ((11, False), (6, True)):
        assert tf.as_json({f.finding_id: f for f in detect(batch, parts, by_time)}) == whole


@pytest.mark.parametrize("settings", [{"window": 0}, {"min_drop": 1.5}, {"z": 0}, {"bogus": 1}])
def test_bad_settings_are_refused(settings: dict) -> None:
    with pytest.raises(DetectorConfigError):
        build_detectors({"throughput_drop": settings}, only=["throughput_drop"])


def test_the_old_name_is_taken_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match="'throughput' is now named 'throughput_drop'"):
        [detector] = build_detectors({"throughput": {"window": 20}}, only=["throughput"])
    assert isinstance(detector, ThroughputDetector) and detector.window == 20


RATE = r"([0-9.]+(?:e[+-]?\d+)?)"
SUMMARY = re.compile(
    rf"throughput down ([0-9.]+)% from its baseline since step (\d+) \({RATE} vs {RATE} tokens/s at step (\d+)\)"
    rf"(?:; now {RATE} tokens/s, ([0-9.]+)% (below|above) it)?; ([0-9.]+) (s|min) of wall time lost"
    r"(?: \(it pages from 60\.0 s\))?$"
)


def summary_numbers(found: Finding) -> dict[str, float]:
    match = SUMMARY.match(found.summary)
    assert match, found.summary
    peak, start, lowest, baseline, at, now, now_pct, side, lost, unit = match.groups()
    numbers = {"peak": float(peak), "start": int(start), "lowest": float(lowest), "baseline": float(baseline)}
    numbers |= {"at": int(at), "lost_s": float(lost) * (60 if unit == "min" else 1)}
    if now is not None:
        numbers |= {"now": float(now), "now_pct": float(now_pct) * (1 if side == "below" else -1)}
    return numbers


@pytest.mark.parametrize("kind", tf.NOISES)
def test_the_summary_gives_the_deepest_drop_with_its_rates_and_the_rate_now(kind: str) -> None:
    """30% slower from step 1500 to 1700, then 12% slower to the end: the finding says the deepest drop
    (about 23%) with the rates at that moment, and the rate now (about 11% down) apart."""
    compute = tf.work(np.random.default_rng(1), STEPS, RANKS, 0.5, kind=kind, scale=0.05)
    compute[1499:1700] *= 1.3
    compute[1700:] *= 1.12
    timing = tf.synchronous(compute, np.full_like(compute, 0.005))
    [found] = detect(batch_of(timing))
    ev, got = found.evidence, summary_numbers(found)
    assert found.active and got["start"] == found.start_step and 1500 <= got["at"] <= 1760
    assert got["peak"] == pytest.approx(100 * (1 - got["lowest"] / got["baseline"]), abs=0.06)
    assert got["peak"] == pytest.approx(100 * ev["largest_drop"], abs=0.05) and 20 < got["peak"] < 26
    assert got["lowest"] == pytest.approx(ev["lowest_per_s"], rel=1e-3) and got["at"] == ev["lowest_step"]
    assert got["baseline"] == pytest.approx(ev["baseline_per_s"], rel=1e-3)
    assert got["now"] == pytest.approx(ev["current_per_s"], rel=1e-3) and 8 < got["now_pct"] < 14
    assert got["now_pct"] == pytest.approx(100 * (1 - got["now"] / got["baseline"]), abs=0.06)
    assert got["now_pct"] == pytest.approx(100 * ev["drop"], abs=0.05)


def test_a_steady_drop_states_one_moment() -> None:
    """A drop that holds at one level: the deepest and the current rate agree, and the summary says it once."""
    [found] = detect(batch_of(job(drop=(2000, STEPS, 1.25))))
    got = summary_numbers(found)
    assert got["peak"] == pytest.approx(100 * (1 - got["lowest"] / got["baseline"]), abs=0.06)
    assert "now" not in got or abs(got["now_pct"] - got["peak"]) >= 0.1
