"""bad_shard on runs unlike our simulator's: loaders that read each shard over consecutive steps, shards read
in pairs, autocorrelated and heavy-tailed noise, short and long runs, curves of several shapes. A bad shard is
found; the shards that shared its batches are cleared; clean runs open nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from telemetry_frames import log_noise
from test_detect_bad_shard import shard_rows

from bedside.detectors.bad_shard import BadShardDetector
from bedside.detectors.finding import Finding
from bedside.detectors.runner import DetectorRunner
from bedside.detectors.telemetry import TelemetryBatch

SHARDS, STREAMS, SIGMA = 64, 4, 0.02
NOISES = ("gaussian", "student_t3", "ar1", "ar1_strong")
STRONG_AR_IN_STRETCHES = pytest.mark.xfail(
    strict=True,
    reason="AR(1) at 0.9 over shards read in stretches: a stretch's mean z wanders by ~0.9 sd of the noise, and "
    "the serial factor, taken from only ~20 independent shifts of the pattern, misjudges it now and then: measured, "
    "one clean shard of 64 opened in 1 of 2 runs of 5,000 steps (stretches of 100); a bad shard missed in 1 of 2 "
    "runs of 1,500 while a co-reader opened",
)


def sequential_reads(rng: np.random.Generator, n: int, stretch: int) -> list[list[int]]:
    """``STREAMS`` loader workers, each reading its own shuffled order of the shards, one shard for ``stretch``
    consecutive steps (webdataset-like): a step reads one shard per worker."""
    orders = [rng.permutation(SHARDS) for _ in range(STREAMS)]
    return [[int(orders[w][((t + 7 * w) // stretch) % SHARDS]) for w in range(STREAMS)] for t in range(n)]


def paired_reads(rng: np.random.Generator, n: int) -> list[list[int]]:
    """Four pairs of shards per step: shard 2j is read with 2j + 1 in 80% of its batches."""
    reads = []
    for _ in range(n):
        step: set[int] = set()
        for pair in rng.choice(SHARDS // 2, 4, replace=False):
            step |= {int(2 * pair), int(2 * pair + 1) if rng.random() < 0.8 else int(rng.integers(SHARDS))}
        reads.append(sorted(step))
    return reads


def curve(shape: str, step: np.ndarray) -> np.ndarray:
    if shape == "power":
        return 1.5 + 8.0 * (step + 10.0) ** -0.5
    return 2.0 + 1.5 * np.exp(-step / 300) - 0.1 * (1 - np.cos(np.pi * step / len(step)))  # cosine-annealed


def run_frame(noise: str, reads: list[list[int]], seed: int, shape: str, bad: int | None, onset: int) -> pd.DataFrame:
    """Step rows; the steps that read ``bad`` from ``onset`` on have their loss 6 noise sd above the curve."""
    rng = np.random.default_rng(seed)
    n = len(reads)
    step = np.arange(1, n + 1)
    hit = np.array([bad in r for r in reads]) & (step >= onset)
    kind, phi = ("ar1", 0.9) if noise == "ar1_strong" else (noise, 0.6)
    loss = curve(shape, step) * np.exp(log_noise(rng, kind, n, SIGMA, ar_phi=phi) + 6.0 * SIGMA * hit)
    return shard_rows(loss, reads)


def latest_by_shard(frame: pd.DataFrame) -> dict[int, Finding]:
    detector = BadShardDetector()
    latest: dict[int, Finding] = {}
    for finding in detector.update(TelemetryBatch(steps=frame)) + detector.finish():
        latest[finding.evidence["shard"]] = finding
    return latest


def opened(found: dict[int, Finding]) -> set[int]:
    """Shards reported bad and not explained by another."""
    return {shard for shard, f in found.items() if "explained_by" not in f.evidence}


@pytest.mark.parametrize(
    ("noise", "n", "stretch"),
    [(noise, 1_500, 25) for noise in NOISES]
    + [(noise, 5_000, 100) for noise in NOISES[:-1]]
    + [pytest.param("ar1_strong", 5_000, 100, marks=STRONG_AR_IN_STRETCHES)],
)
def test_a_loader_reading_shards_over_consecutive_steps_raises_no_bad_shard(noise: str, n: int, stretch: int) -> None:
    # Each shard's batches are stretches of neighbouring steps, which the noise or the trend's lag make alike:
    # Welch's t over them as if independent flagged up to 8 clean shards per run under AR(1) noise.
    for seed, shape in ((0, "power"), (2, "cosine")):
        reads = sequential_reads(np.random.default_rng(seed), n, stretch)
        assert latest_by_shard(run_frame(noise, reads, seed, shape, None, 0)) == {}, (seed, shape)


@pytest.mark.parametrize("noise", [*NOISES[:-1], pytest.param("ar1_strong", marks=STRONG_AR_IN_STRETCHES)])
def test_a_bad_shard_read_over_consecutive_steps_is_found_and_its_co_readers_cleared(noise: str) -> None:
    # The other workers' shards of the same steps share the bad shard's batches: they may open, but the bad
    # shard explains them. Before, 3 to 10 of them stayed reported per run.
    for seed, shape in ((0, "power"), (2, "cosine")):
        reads = sequential_reads(np.random.default_rng(seed), 1_500, 25)
        bad = reads[750][0]
        found = latest_by_shard(run_frame(noise, reads, seed, shape, bad, 500))
        assert opened(found) == {bad}, (seed, sorted(opened(found)))
        assert found[bad].active and found[bad].suggested_action.args == {"shard": bad}
        for shard, finding in found.items():
            if shard != bad:
                assert finding.evidence["explained_by"] == [bad] and not finding.active


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("n", (400, 3_000))
def test_the_shard_read_with_the_bad_one_most_of_the_time_is_cleared(noise: str, n: int) -> None:
    # Its partner shares 80% of the bad shard's batches, so its own mean z is nearly as high: before, it was
    # reported as bad too, under the bad shard's finding id (the same onset), which hid the bad one.
    for seed in range(2):
        reads = paired_reads(np.random.default_rng(seed), n)
        bad = 2 * (reads[n // 2][0] // 2)
        found = latest_by_shard(run_frame(noise, reads, seed, "power", bad, n // 3))
        assert opened(found) == {bad}, (seed, sorted(opened(found)))
        partner = found.get(bad + 1)
        assert partner is None or (partner.evidence["explained_by"] == [bad] and not partner.active)


@pytest.mark.parametrize("noise", NOISES)
def test_a_short_run_finds_its_bad_shard(noise: str) -> None:
    for seed in range(2):
        rng = np.random.default_rng(seed)
        reads = [sorted(int(s) for s in rng.choice(SHARDS, 8, replace=False)) for _ in range(400)]
        bad = reads[200][0]
        found = latest_by_shard(run_frame(noise, reads, seed, "cosine", bad, 150))
        assert opened(found) == {bad}, (seed, sorted(opened(found)))
        assert 150 <= found[bad].start_step <= 250


def test_the_evidence_states_the_serial_factor_that_divides_welchs_t() -> None:
    reads = sequential_reads(np.random.default_rng(0), 1_500, 25)
    bad = reads[750][0]
    finding = latest_by_shard(run_frame("ar1_strong", reads, 0, "power", bad, 500))[bad]
    ev = finding.evidence
    assert ev["serial_factor"] >= 1.0
    assert ev["t"] == pytest.approx(ev["welch_t"] / ev["serial_factor"])
    assert ev["t"] >= ev["t_alarm"] and finding.score == pytest.approx(ev["peak_t"]) and ev["peak_t"] >= ev["t"] - 1e-3


def test_two_shards_going_bad_at_the_same_step_are_two_findings() -> None:
    # Both are read at the onset step and never together after: before, both findings had the id
    # kind@timeline:onset, and the runner kept only the later one.
    rng = np.random.default_rng(4)
    first, second, onset = 5, 9, 150
    reads = []
    for t in range(1, 801):
        step = {int(s) for s in rng.choice(SHARDS, 8, replace=False)} - {first, second}
        if t == onset:
            step |= {first, second}
        elif rng.random() < 0.25:
            step.add(first if rng.random() < 0.5 else second)
        reads.append(sorted(step))
    frame = run_frame("gaussian", reads, 4, "cosine", first, onset)
    hit = np.array([second in r for r in reads]) & (np.arange(1, 801) >= onset)
    frame.loc[hit, "loss"] *= np.exp(6.0 * SIGMA)
    runner = DetectorRunner([BadShardDetector()])
    runner.update(TelemetryBatch(steps=frame))
    runner.finish()
    ids = sorted(runner.findings)
    assert ids == [f"bad_shard@0:{onset}/shard{first}", f"bad_shard@0:{onset}/shard{second}"]
    assert [runner.findings[i].evidence["shard"] for i in ids] == [first, second]
