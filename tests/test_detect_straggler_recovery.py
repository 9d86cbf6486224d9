"""A slow host that recovers clears its one finding, however long it was slow, and leaves nothing behind.

Each step's common level is the median over the ranks in control, so a slow host moves neither it, nor the healthy
ranks' offsets, nor the pooled reference of their residuals. Before, it moved all three: once a host slow for 1,000
steps of a 32-rank job recovered, every healthy rank looked slow, the host's own finding never cleared, and a dozen
x1.00 warnings followed on healthy ranks and hosts (with two pipeline stages, after a slow spell of 50 steps)."""

from __future__ import annotations

import numpy as np
import pytest
import telemetry_frames as tf

from bedside.detectors import detect
from bedside.detectors.datasets import SimulatedRun, SimulationConfig, simulate
from bedside.detectors.finding import Finding
from bedside.detectors.frames import telemetry_batch
from bedside.detectors.straggler import StragglerDetector, in_control_residuals
from bedside.detectors.telemetry import RunState

ONSET, AFTER = 300, 300
CLEAR_WITHIN = 100
"""Steps from the first healthy step to the clearing: the recovery CUSUM gains ``k`` less the ranks' mean score a
step, 0.25 on average once they are back, so it passes ``clear_h`` = 8 after 32 steps on average; for one rank's
scores (the noisiest mean) 100 steps is beyond the 99.9th percentile of that first passage."""
SLOW_HOSTS = [
    # (ranks, ranks per host, slowdown, steps slow (None: to the end), noise, pipeline stages, seed)
    (32, 8, 1.5, 1000, "gaussian", 1, 2),
    (16, 2, 3.0, 3000, "student", 1, 3),
    (16, 4, 1.3, 50, "lognormal", 2, 4),
    (32, 16, 2.0, 1000, "lognormal", 2, 5),
    (64, 8, 1.3, 200, "student", 2, 6),
    (64, 2, 2.0, 1000, "gaussian", 1, 7),
    (32, 4, 3.0, 200, "gaussian", 2, 8),
    (16, 8, 1.5, 1000, "student", 2, 9),
    (64, 16, 3.0, 50, "lognormal", 1, 10),
    (32, 8, 2.0, None, "student", 2, 11),
]


def slow_host_run(
    ranks: int, per_host: int, factor: float, slow: int | None, noise: str, pp: int, seed: int
) -> SimulatedRun:
    """Host 1 ``factor`` times slower from ``ONSET``, for ``slow`` steps (to the end when None), then ``AFTER``
    healthy steps; more ranks than asked when a pipeline stage would not span two hosts (a host that is a whole
    stage is the stage's pace, not a straggler)."""
    spec = f"straggler:host=1,factor={factor},from={ONSET}" + (f",steps={slow}" if slow else "")
    steps = ONSET + (slow or 600) + AFTER
    config = SimulationConfig(
        ranks=max(ranks, 2 * per_host * pp),
        steps=steps,
        seed=seed,
        noise=noise,
        ranks_per_host=per_host,
        pp=pp,
        inject=(spec,),
    )
    return simulate(config)


def performance_findings(run: SimulatedRun) -> list[Finding]:
    """The straggler and throughput findings past the warm-up (a slower pipeline stage is structural from the first
    step), through the library's ``detect``."""
    detection = detect(**run.frames(), only=["straggler", "throughput_drop"])
    return [f for f in detection.findings if f.start_step > 100]


@pytest.mark.parametrize(("ranks", "per_host", "factor", "slow", "noise", "pp", "seed"), SLOW_HOSTS)
def test_a_slow_host_is_one_finding_that_clears_once_it_recovers(
    ranks: int, per_host: int, factor: float, slow: int | None, noise: str, pp: int, seed: int
) -> None:
    run = slow_host_run(ranks, per_host, factor, slow, noise, pp, seed)
    [found] = performance_findings(run)
    ev, healthy_from = found.evidence, ONSET + slow if slow else None
    assert found.kind == "straggler" and found.severity.value == "warning" and ev["scope"] == "host"
    assert found.ranks == run.labels[0].ranks and abs(found.start_step - ONSET) <= 5
    if healthy_from is None:
        assert found.active and ev["recovered_step"] is None
        return
    assert not found.active and 0 <= found.end_step - healthy_from <= CLEAR_WITHIN
    assert 0 <= ev["recovered_step"] - healthy_from <= found.end_step - healthy_from
    assert f"back to its baseline from step {ev['recovered_step']}" in found.summary


def test_the_reported_run_clears_and_names_nobody_else() -> None:
    """``bedside simulate --ranks 32 --steps 2600 --seed 2 --inject straggler:host=1,factor=1.5,from=1000,steps=1000``:
    one finding, host 1 from step 1000, cleared shortly after 2000 (before: 11 more warnings, x1.00 to x1.01)."""
    config = SimulationConfig(
        ranks=32, steps=2600, seed=2, inject=("straggler:host=1,factor=1.5,from=1000,steps=1000",)
    )
    [found] = [f for f in detect(**simulate(config).frames(), only=["straggler"]).findings]
    assert found.ranks == tuple(range(8, 16)) and found.start_step == 1000 and not found.active
    assert 2000 <= found.evidence["recovered_step"] <= found.end_step <= 2000 + CLEAR_WITHIN


def test_a_recovering_host_streams_as_it_does_in_one_batch() -> None:
    frames = slow_host_run(32, 4, 2.0, 400, "student", 2, 12).frames()
    batch = telemetry_batch(steps=frames["steps"], rank_steps=frames["rank_steps"])
    replays = []
    for parts in (1, 9):
        run = RunState(world_size=frames["world_size"], topology=frames["topology"])
        replays.append(tf.as_json(tf.replay(StragglerDetector(), batch, parts=parts, run=run)))
    whole, streamed = replays
    [host] = [f for f in whole.values() if f["severity"] == "warning"]
    assert whole == streamed and not host["active"] and host["evidence"]["recovered_step"] >= ONSET + 400


def test_a_residual_is_taken_against_the_ranks_in_control_and_itself() -> None:
    """Against a brute-force median: the control values' for a rank in control, theirs and its own for one out
    (NaN: not seen; no rank in control: every rank seen is)."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        own = np.where(rng.random(7) < 0.2, np.nan, rng.standard_normal(7))
        control = rng.random(7) < 0.5
        seen = ~np.isnan(own)
        inside = control & seen if (control & seen).any() else seen
        expected = [
            x - np.median(own[inside] if inside[i] else np.append(own[inside], x)) if seen[i] else np.nan
            for i, x in enumerate(own)
        ]
        np.testing.assert_allclose(in_control_residuals(own, control), expected)
