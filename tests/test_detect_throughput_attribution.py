"""One finding per cause: a slow host's cost to the job's throughput is the straggler finding's evidence, not a
``throughput_drop`` of its own; a drop of the job's own beside it is still found, with the slow host's share
stated; a drop of the job's own alone is found exactly as it would be without the attribution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import telemetry_frames as tf

from bedside.detectors import detect
from bedside.detectors.datasets import NOISE_FAMILIES, SimulatedRun, SimulationConfig, simulate
from bedside.detectors.finding import Finding
from bedside.detectors.frames import telemetry_batch
from bedside.detectors.telemetry import RunState
from bedside.detectors.throughput import SLOWEST_SAID, ThroughputDetector

ONSET, STEPS = 400, 900
SLOW_HOSTS = [
    (per_host, factor, noise, 1 + i % 2, i % 3)
    for i, (per_host, factor, noise) in enumerate(itertools.product((2, 4, 8, 16), (1.3, 2.0, 3.0), NOISE_FAMILIES))
]
"""(ranks per host, slowdown of its compute, noise, pipeline stages, seed): hosts of 2 to 16 ranks, 1.3x to 3x."""


def slow_host_run(per_host: int, pp: int, seed: int, noise: str, *faults: str) -> SimulatedRun:
    """A 32-rank job (more when two hosts would not fit in a stage) with ``faults`` from step ``ONSET``."""
    ranks = max(32, 2 * per_host * pp)
    config = SimulationConfig(
        ranks=ranks, steps=STEPS, seed=seed, noise=noise, ranks_per_host=per_host, pp=pp, inject=faults
    )
    return simulate(config)


def host(factor: float) -> str:
    return f"straggler:host=1,factor={factor},from={ONSET}"


def findings(run: SimulatedRun, **frames: object) -> list[Finding]:
    """The performance findings of ``run`` that start after the warm-up (a slow pipeline stage is structural,
    from the first step), through the library's ``detect``."""
    detection = detect(**{**run.frames(), **frames}, only=["straggler", "throughput_drop"])
    return [f for f in detection.findings if f.start_step > 100]


@pytest.mark.parametrize(("per_host", "factor", "noise", "pp", "seed"), SLOW_HOSTS)
def test_a_slow_host_is_one_finding_that_carries_the_jobs_throughput_loss(
    per_host: int, factor: float, noise: str, pp: int, seed: int
) -> None:
    run = slow_host_run(per_host, pp, seed, noise, host(factor))
    [found] = findings(run)
    ev, ranks = found.evidence, run.labels[0].ranks
    assert found.kind == "straggler" and found.severity.value == "warning" and ev["scope"] == "host"
    assert set(found.ranks) <= set(ranks) and len(found.ranks) >= per_host / 2
    step = run.timing.step_time
    before, after = np.median(step[ONSET - 200 : ONSET - 1]), np.median(step[ONSET:])
    assert ev["throughput_lost"] == pytest.approx(1 - before / after, abs=0.04)
    assert ev["lost_s"] == pytest.approx(np.sum(step[ONSET - 1 :] - before), rel=0.3)
    assert f"{ev['throughput_lost'] * 100:.1f}% of its throughput" in found.summary


@pytest.mark.parametrize(
    ("per_host", "factor", "noise", "pp", "seed"),
    [(h, f, n, pp, s) for h, f, n, pp, s in SLOW_HOSTS if f != 1.3],
)
def test_a_drop_of_the_jobs_own_beside_a_slow_host_is_found_with_its_share(
    per_host: int, factor: float, noise: str, pp: int, seed: int
) -> None:
    """Every rank's work 1/0.7 as long from the slow host's onset: the job's own 30% drop is found, with the
    slow host's share of the drop stated apart."""
    run = slow_host_run(per_host, pp, seed, noise, host(factor), f"throughput_drop:factor=0.7,from={ONSET}")
    [drop] = [f for f in findings(run) if f.kind == "throughput_drop"]
    ev = drop.evidence
    assert drop.severity.value == "warning" and abs(drop.start_step - ONSET) <= 10
    assert 0.25 <= ev["own_drop"] <= 0.35 and ev["slowest_share"] >= SLOWEST_SAID
    assert f"the job's own drop is {ev['own_drop'] * 100:.1f}%" in drop.summary
    assert "straggler" in drop.suggested_action.why


@pytest.mark.parametrize(
    ("factor", "noise", "pp", "seed"),
    [(f, n, 1 + i % 2, i % 3) for i, (f, n) in enumerate(itertools.product((0.85, 0.7, 0.5), NOISE_FAMILIES))],
)
def test_a_drop_of_the_jobs_own_alone_is_found_as_without_the_ranks_phases(
    factor: float, noise: str, pp: int, seed: int
) -> None:
    """No slow rank: the finding is the one made from ``step_time`` alone (no phases, no rank to wait on), every
    number and word, besides the two fields that say so."""
    run = slow_host_run(8, pp, seed, noise, f"throughput_drop:factor={factor},from={ONSET},steps=300")
    rank_steps = run.frames()["rank_steps"].drop(columns=["compute_time", "data_time"])
    with_phases, without = findings(run), findings(run, rank_steps=rank_steps)
    drops = [[f for f in found if f.kind == "throughput_drop"] for found in (with_phases, without)]
    [[ours], [plain]] = drops
    assert ours.evidence["slowest_share"] < SLOWEST_SAID and plain.evidence["slowest_share"] == 0
    assert _unattributed(ours) == _unattributed(plain)


def _unattributed(found: Finding) -> dict:
    found_json = found.to_json()
    found_json["evidence"] = {k: v for k, v in found.evidence.items() if k not in ("slowest_share", "own_drop")}
    return found_json


@pytest.mark.parametrize(
    ("per_host", "noise", "pp", "faults"),
    [
        (8, "student", 1, (host(1.5),)),
        (4, "lognormal", 2, (host(2.0),)),
        (16, "gaussian", 2, (host(2.0), f"throughput_drop:factor=0.7,from={ONSET}")),
        (2, "student", 1, (host(3.0), f"throughput_drop:factor=0.8,from={ONSET + 200}")),
    ],
)
def test_one_batch_and_one_step_at_a_time_attribute_alike(
    per_host: int, noise: str, pp: int, faults: tuple[str, ...]
) -> None:
    """The batch path screens with rolling medians (at the job's pace too), a live follow judges each step."""
    frames = slow_host_run(per_host, pp, 5, noise, *faults).frames()
    batch = telemetry_batch(steps=frames["steps"], rank_steps=frames["rank_steps"])
    replays = []
    for parts in (1, STEPS):
        run = RunState(world_size=frames["world_size"], topology=frames["topology"])
        replays.append(tf.as_json(tf.replay(ThroughputDetector(), batch, parts=parts, run=run)))
    whole, streamed = replays
    assert whole == streamed and len(whole) == len(faults) - 1


def test_a_batch_of_more_steps_than_are_kept_pending_rates_every_step_by_its_ranks() -> None:
    """11,000 steps in one batch: every step's duration and lead come from its ranks' rows, not only the newest
    10,000 (the older ones were rated by the interval between step records, with no lead, and the slow host's
    drop passed for the job's own), as when the run is fed 100 steps at a time."""
    config = SimulationConfig(ranks=32, steps=11_000, seed=7, inject=(host(1.5),))
    frames = simulate(config).frames()
    batch = telemetry_batch(steps=frames["steps"], rank_steps=frames["rank_steps"])
    replays = []
    for parts in (1, 110):
        run = RunState(world_size=32, topology=frames["topology"])
        replays.append(tf.as_json(tf.replay(ThroughputDetector(), batch, parts=parts, run=run)))
    assert replays == [{}, {}]
