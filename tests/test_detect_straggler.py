"""The straggler detector on synthetic synchronous jobs: faults it must find, nuisances it must not."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
import telemetry_frames as tf

from bedside.detectors.errors import DetectorConfigError
from bedside.detectors.finding import Finding
from bedside.detectors.registry import build_detectors
from bedside.detectors.straggler import StragglerDetector, cusum_threshold
from bedside.detectors.telemetry import RunState, TelemetryBatch

ONSET = 300


def detect(
    compute: np.ndarray,
    *,
    data: np.ndarray | None = None,
    topology: pd.DataFrame | None = None,
    parts: int = 1,
    **settings,
) -> list[Finding]:
    """Every straggler finding (latest versions) of a synchronous job with these work matrices."""
    batch = TelemetryBatch(rank_steps=tf.rank_step_frame(tf.synchronous(compute, data)))
    run = RunState(world_size=compute.shape[1], topology=tf.topology(0) if topology is None else topology)
    return list(tf.replay(StragglerDetector(**settings), batch, parts=parts, run=run).values())


def warnings_(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.severity.value == "warning"]


def clean(
    seed: int, steps: int, ranks: int, *, base: float = 0.5, kind: str = "gaussian", scale: float = 0.05
) -> np.ndarray:
    return tf.work(np.random.default_rng(seed), steps, ranks, base, kind=kind, scale=scale)


@pytest.mark.parametrize(
    ("kind", "ranks", "base"),
    [(kind, ranks, base) for kind in tf.NOISES for ranks, base in ((4, 0.05), (64, 20.0), (1024, 0.8))],
)
def test_a_ten_percent_straggler_is_named_within_100_steps(kind: str, ranks: int, base: float) -> None:
    compute = clean(1, ONSET + 150, ranks, base=base, kind=kind)
    compute[ONSET - 1 :, 3] *= 1.10
    topology = tf.topology(ranks, per_host=4 if ranks == 4 else 8)
    [found] = detect(compute, topology=topology)
    assert found.ranks == (3,) and found.severity.value == "warning" and found.active
    assert 0 <= found.evidence["alarm_step"] - ONSET <= 100
    assert ONSET - 60 <= found.start_step <= found.evidence["alarm_step"]
    ev = found.evidence
    assert ev["scope"] == "rank" and ev["phase"] == "compute" and 1.04 < ev["slowdown"] < 1.16
    assert 0.03 * base < ev["job_cost_s_per_step"] < 0.2 * base and ev["peers_wait_s_per_step"] > 0
    assert ev["place"] == {"rank": 3, "host": "node-000", "dp": 3, "tp": 0, "pp": 0}
    assert found.suggested_action.action == "evict" and found.suggested_action.args["ranks"] == [3]
    assert "rank 3 (host node-000" in found.summary


def first_alarm(seed: int, kind: str, factor: float, horizon: int, ranks: int = 16) -> tuple[int | None, int]:
    """(steps from onset to the alarm on the slow rank or None, number of findings on other ranks)."""
    rng = np.random.default_rng(seed)
    compute = tf.work(rng, ONSET + horizon, ranks, 0.5, kind=kind, scale=0.05)
    slow = int(rng.integers(ranks))
    compute[ONSET - 1 :, slow] *= factor
    found = warnings_(detect(compute, parts=3))
    right = [f.evidence["alarm_step"] - ONSET for f in found if f.ranks == (slow,)]
    return min(right, default=None), len(found) - len(right)


@pytest.mark.parametrize("kind", tf.NOISES)
@pytest.mark.parametrize(("factor", "horizon", "trials"), [(1.10, 100, 20), (1.05, 1000, 10)])
def test_detection_rate_and_delay(kind: str, factor: float, horizon: int, trials: int) -> None:
    """At 5% per-step noise: the slow rank named within the horizon in at least 95% of the runs, no other."""
    results = [first_alarm(seed, kind, factor, horizon) for seed in range(trials)]
    delays = [d for d, _ in results if d is not None]
    print(
        f"\n{kind} x{factor}: found {len(delays)}/{trials}, delay median {np.median(delays):.0f} "
        f"max {max(delays)} steps"
    )
    assert len(delays) >= 0.95 * trials and sum(w for _, w in results) == 0


@pytest.mark.parametrize(
    ("kind", "ranks", "steps"),
    [
        *((kind, 64, 10_000) for kind in tf.NOISES),
        pytest.param(
            "student_t3",
            1024,
            3_000,
            marks=pytest.mark.slow(reason="3 million rank-steps of heavy-tailed noise: a false-alarm rate needs them"),
        ),
    ],
)
def test_no_false_alarm_on_clean_runs(kind: str, ranks: int, steps: int) -> None:
    """Streams of clean steps in batches: no finding at all (the target is < 0.1 per 10k steps)."""
    rng = np.random.default_rng(7)
    detector = StragglerDetector()
    detector.bind(RunState(world_size=ranks))
    found = []
    for first in range(1, steps, 1000):
        compute = tf.work(rng, 1000, ranks, 0.5, kind=kind, scale=0.05)
        found += detector.update(
            TelemetryBatch(rank_steps=tf.rank_step_frame(tf.synchronous(compute), first_step=first))
        )
    print(f"\n{kind}, {ranks} ranks, {steps} steps: {len(found)} findings")
    assert found == []


def stalls(compute: np.ndarray) -> np.ndarray:
    """Data time of a checkpoint stall every 50 steps on every rank (5 s, 10% jitter between ranks)."""
    data = np.full_like(compute, 0.01)
    rng = np.random.default_rng(3)
    data[::50] = 5.0 * (1 + 0.1 * rng.standard_normal(data[::50].shape))
    return data


def nuisance(name: str) -> tuple[np.ndarray, np.ndarray | None]:
    compute = clean(11, 800, 32, kind="student_t3")
    data = None
    if name == "chip_spread":  # every chip its own speed (1%), little noise: the offsets must be learned well
        rng = np.random.default_rng(12)
        compute = clean(12, 3000, 32, scale=0.015) * np.exp(0.01 * rng.standard_normal(32))
    elif name == "common_mode":
        compute[300:500] *= 1.3
    elif name == "checkpoint_stalls":
        data = stalls(compute)
    elif name == "last_stage_slower":
        compute[:, 24:] *= 1.15
    elif name == "long_sequences":
        hit = np.random.default_rng(5).random(compute.shape) < 0.02
        compute[hit] *= 2.0
    return compute, data


@pytest.mark.parametrize(
    "name", ["chip_spread", "common_mode", "checkpoint_stalls", "last_stage_slower", "long_sequences"]
)
def test_nuisances_do_not_alarm(name: str) -> None:
    compute, data = nuisance(name)
    found = detect(compute, data=data, topology=tf.topology(32, per_host=4, pp=4))
    assert warnings_(found) == []
    if name == "last_stage_slower":
        [info] = found
        assert info.ranks == tuple(range(24, 32)) and info.evidence["pp_stage"] == 3
        assert info.suggested_action.action == "investigate" and not info.active
        assert "pipeline stage 3" in info.summary and info.evidence["slowdown"] > 1.1
    else:
        assert found == []


@pytest.mark.parametrize(
    ("per_host", "pp", "slow", "host"), [(8, 1, range(16, 24), "node-002"), (4, 4, range(20, 24), "node-005")]
)  # half of pipeline stage 2, which spans hosts 4 and 5
def test_a_slow_node_is_one_finding_naming_the_host(per_host: int, pp: int, slow: range, host: str) -> None:
    compute = clean(2, ONSET + 200, 32)
    compute[ONSET - 1 :, slow] *= 1.15
    [found] = detect(compute, topology=tf.topology(32, per_host=per_host, pp=pp))
    assert found.ranks == tuple(slow) and found.evidence["scope"] == "host"
    assert found.suggested_action.action == "evict" and found.suggested_action.args["host"] == host
    assert f"host {host}" in found.summary and "slow node" in found.summary


def test_a_stage_slowing_down_across_hosts_is_imbalance_not_a_sick_worker() -> None:
    compute = clean(4, ONSET + 200, 32)
    compute[ONSET - 1 :, 24:] *= 1.15
    [found] = detect(compute, topology=tf.topology(32, per_host=4, pp=4))
    assert found.ranks == tuple(range(24, 32)) and found.evidence["scope"] == "pp_stage"
    assert found.severity.value == "info" and found.suggested_action.action == "investigate"


def test_a_slow_data_loader_is_named_as_the_data_phase() -> None:
    compute = clean(6, ONSET + 150, 16)
    data = np.full_like(compute, 0.05)
    data[ONSET - 1 :, 2] += 0.1
    [found] = detect(compute, data=data)
    assert found.ranks == (2,) and found.evidence["phase"] == "data"


def test_an_intermittent_straggler_is_found() -> None:
    compute = clean(8, ONSET + 400, 16, kind="lognormal")
    compute[ONSET - 1 :: 5, 7] *= 1.5
    [found] = warnings_(detect(compute))
    assert found.ranks == (7,) and found.evidence["alarm_step"] - ONSET <= 300


def test_a_rank_that_recovers_clears() -> None:
    compute = clean(9, 900, 16)
    compute[ONSET - 1 : 500, 4] *= 1.15
    [found] = detect(compute)
    assert found.ranks == (4,) and not found.active and 500 <= found.end_step <= 600


def test_phases_absent_fall_back_to_step_time() -> None:
    """A foreign run with only step_time (not synchronous): the slow rank's step time."""
    compute = clean(10, ONSET + 150, 8)
    compute[ONSET - 1 :, 1] *= 1.2
    frame = tf.rank_step_frame(tf.synchronous(compute))
    frame["step_time"] = compute.ravel()
    frame[["compute_time", "data_time", "comm_time"]] = np.nan
    [found] = tf.replay(StragglerDetector(), TelemetryBatch(rank_steps=frame), run=RunState()).values()
    assert found.ranks == (1,) and found.evidence["phase"] == "step" and "host" not in found.evidence["place"]


def test_one_batch_or_many_give_the_same_findings() -> None:
    compute = clean(12, 900, 32, kind="lognormal")
    compute[:, 30] *= 1.12  # structural
    compute[ONSET - 1 : 600, 3] *= 1.12  # recovers
    compute[400:, 8:16] *= 1.2  # a slow node, to the end
    topology = tf.topology(32, per_host=8)
    whole = detect(compute, topology=topology)
    assert len(whole) == 3
    for parts, by_time in ((7, False), (5, True)):
        batch = TelemetryBatch(rank_steps=tf.rank_step_frame(tf.synchronous(compute)))
        run = RunState(world_size=32, topology=topology)
        pieces = tf.replay(StragglerDetector(), batch, parts=parts, by_time=by_time, run=run)
        assert tf.as_json(pieces) == tf.as_json({f.finding_id: f for f in whole})


def test_threshold_follows_the_false_alarm_target_and_the_rank_count() -> None:
    assert cusum_threshold(0.25, 4e6) < cusum_threshold(0.25, 1024e6) < cusum_threshold(0.25, 1e11)
    assert round(cusum_threshold(0.25, 1024e6), 1) == 36.2


@pytest.mark.parametrize("settings", [{"k": 0}, {"warmup_steps": 0}, {"reference_size": 4}, {"bogus": 1}])
def test_bad_settings_are_refused(settings: dict) -> None:
    with pytest.raises(DetectorConfigError):
        build_detectors({"straggler": settings}, only=["straggler"])


def test_streaming_cost_at_1024_ranks() -> None:
    """Prints the cost per step of 10-step batches at 1,024 ranks (assembly included); asserts nothing of time."""
    compute = clean(13, 400, 1024)
    frame = tf.rank_step_frame(tf.synchronous(compute))
    batches = TelemetryBatch(rank_steps=frame).split(40)
    detector = StragglerDetector()
    detector.bind(RunState(world_size=1024))
    started = time.perf_counter()
    for batch in batches:
        detector.update(batch)
    per_step = (time.perf_counter() - started) / 400 * 1e3
    print(f"\nstraggler, 1,024 ranks, 10 steps per batch: {per_step:.3f} ms per step")
    assert detector._warm is None


# -- peers first: positions, short traces, ratios, contention --------------------------------------------------


def jitter(seed: int, steps: int, ranks: int, kind: str, scale: float = 0.03) -> np.ndarray:
    """Multiplicative per-step noise: the fixture noises, or AR(1) (a rank slow for tens of steps at a time)."""
    rng = np.random.default_rng(seed)
    if kind == "ar1":
        return np.exp(np.stack([tf.log_noise(rng, "ar1", steps, scale) for _ in range(ranks)], axis=1))
    return tf.noise(rng, kind, (steps, ranks), scale)


def pipeline_topology(ranks: list[int], *, stages: int, per_host: int = 4) -> pd.DataFrame:
    """``tf.topology`` of ``len(ranks)`` ranks in ``stages`` pipeline stages, numbered ``ranks`` (sparse or not)."""
    topology = tf.topology(len(ranks), per_host=per_host, pp=stages)
    topology["rank"] = ranks
    return topology


def detect_trace(compute: np.ndarray, ranks: list[int], topology: pd.DataFrame | None, parts: int = 1) -> list:
    frame = tf.rank_step_frame(tf.synchronous(compute), ranks=ranks)
    empty = tf.topology(0)
    run = RunState(world_size=len(ranks), topology=empty if topology is None else topology)
    return list(tf.replay(StragglerDetector(), TelemetryBatch(rank_steps=frame), parts=parts, run=run).values())


STAGE_FACTORS = np.repeat([1.0, 0.97, 1.03, 1.06], 4)
"""Four pipeline stages of four ranks, each stage its own speed (19-20.7 s per step)."""


@pytest.mark.parametrize("kind", [*tf.NOISES, "ar1"])
@pytest.mark.parametrize(("steps", "sparse", "parts"), [(44, False, 1), (44, True, 3), (30, True, 1), (80, False, 2)])
def test_a_sick_worker_of_a_short_pipeline_trace_is_named_not_structural(
    kind: str, steps: int, sparse: bool, parts: int
) -> None:
    """16 ranks in 4 stages, tens of steps: one rank at 45 s per step against 19-20 s for its stage's three others."""
    ranks = list(range(0, 64, 4)) if sparse else list(range(16))
    compute = 19.5 * STAGE_FACTORS * jitter(steps, steps, 16, kind)
    compute[:, 9] *= 45 / 19.5 / STAGE_FACTORS[9]
    found = detect_trace(compute, ranks, pipeline_topology(ranks, stages=4), parts)
    [sick] = warnings_(found)
    ev = sick.evidence
    assert sick.ranks == (ranks[9],) and ev["scope"] == "rank" and ev["from_start"] and ev["steps_seen"] == steps
    assert 2.1 < ev["peer_ratio"] < 2.5 and ev["peers"] == 3 and ev["peer_ratio_95"][0] > 1.9
    assert ev["place"]["pp"] == 2 and sick.start_step == 1 and sick.active
    assert sick.suggested_action.action == "evict" and sick.suggested_action.args["ranks"] == [ranks[9]]
    assert f"rank {ranks[9]} " in sick.summary and f"x{ev['peer_ratio']:.2f} the work of its 3 peers" in sick.summary
    assert f"{steps} steps seen" in sick.summary and "structural" not in sick.summary
    assert all(f.evidence["scope"] == "structural" and f.evidence["pp_stage"] == 3 for f in found if f is not sick)


@pytest.mark.parametrize("kind", [*tf.NOISES, "ar1"])
@pytest.mark.parametrize(("steps", "sparse"), [(44, True), (300, False), (2000, True)])
def test_a_last_stage_slower_on_every_rank_is_structural_never_an_eviction(kind: str, steps: int, sparse: bool) -> None:
    ranks = list(range(0, 32, 2)) if sparse else list(range(16))
    compute = 0.8 * jitter(steps + 1, steps, 16, kind, scale=0.05)
    compute[:, 12:] *= 1.4
    [found] = detect_trace(compute, ranks, pipeline_topology(ranks, stages=4, per_host=2))
    assert found.ranks == tuple(ranks[12:]) and found.severity.value == "info" and not found.active
    assert found.evidence["scope"] == "structural" and found.evidence["pp_stage"] == 3
    assert found.suggested_action.action == "investigate" and 1.3 < found.evidence["slowdown"] < 1.5
    assert "pipeline stage 3 x1.4" in found.summary or "pipeline stage 3 x1.3" in found.summary


def test_a_sparse_topology_names_a_late_straggler_by_its_own_number() -> None:
    ranks = list(range(0, 128, 8))
    compute = clean(21, ONSET + 150, 16)
    compute[ONSET - 1 :, 5] *= 1.2
    [found] = detect_trace(compute, ranks, pipeline_topology(ranks, stages=2))
    assert found.ranks == (40,) and found.evidence["place"]["rank"] == 40 and not found.evidence["from_start"]
    assert found.evidence["peers"] == 7 and 1.1 < found.evidence["peer_ratio"] < 1.25


def test_without_stages_a_lone_slow_rank_is_sick_and_ranks_slow_together_are_one_position() -> None:
    compute = clean(5, 600, 16)
    compute[:, 5] *= 1.12
    [found] = detect(compute)
    assert found.ranks == (5,) and found.evidence["scope"] == "rank" and found.severity.value == "warning"
    assert found.evidence["from_start"] and 1.08 < found.evidence["peer_ratio"] < 1.16
    compute[:, [2, 3, 7, 11]] *= 1.25  # an undeclared stage (rank 5 now slower, but by another factor)
    found = {f.ranks: f for f in detect(compute)}
    assert set(found) == {(2, 3, 7, 11), (5,)}
    assert found[2, 3, 7, 11].evidence["scope"] == "structural" and found[2, 3, 7, 11].severity.value == "info"
    assert "no stages declared" in found[2, 3, 7, 11].summary


@pytest.mark.parametrize("ranks", [2, 8])
def test_the_summary_states_the_ratio_the_evidence_holds(ranks: int) -> None:
    compute = clean(22, ONSET + 200, ranks, scale=0.08)
    compute[ONSET - 1 :, 1] *= 2.56
    [found] = warnings_(detect(compute))
    ratio = found.evidence["peer_ratio"]
    assert found.ranks == (1,) and 2.0 < ratio < 2.7 and f"x{ratio:.2f} the work of its" in found.summary
    assert "% slower" not in found.summary and f"x{found.evidence['slowdown']:.2f} its own baseline" in found.summary


def contended(seed: int, extra: float) -> np.ndarray:
    """8 ranks; from ONSET the machine is loaded: every rank's work x1.6 and twice as noisy, rank 0 ``extra``."""
    compute = clean(seed, ONSET + 300, 8, scale=0.05)
    load = jitter(seed + 1, 300, 8, "ar1", scale=0.1)
    compute[ONSET:] *= 1.6 * load
    compute[ONSET:, 0] *= extra
    return compute


@pytest.mark.parametrize("seed", range(3))
def test_a_contended_machine_is_said_rather_than_blamed_on_a_rank(seed: int) -> None:
    found = detect(contended(seed, 1.1))
    assert warnings_(found) == []
    for f in found:
        assert f.evidence["contended"] and f.suggested_action.action == "investigate"
        assert "the whole machine is contended" in f.summary and 1.2 < f.evidence["job_slowdown"] < 1.8


def test_a_straggler_far_beyond_the_contention_is_still_named() -> None:
    [found] = warnings_(detect(contended(4, 2.0)))
    assert found.ranks == (0,) and found.severity.value == "warning" and not found.evidence["contended"]


@pytest.mark.parametrize(("ranks", "per_host", "factor"), [(8, 4, 1.4), (16, 8, 1.25), (12, 6, 1.6)])
def test_a_slow_host_holding_half_the_job_is_a_slow_node_not_a_contended_machine(
    ranks: int, per_host: int, factor: float
) -> None:
    """Half the ranks slow moves the job's median as far as their own excess: the other half did not slow."""
    compute = clean(ranks, ONSET + 300, ranks)
    compute[ONSET:, per_host:] *= factor
    [found] = warnings_(detect(compute, topology=tf.topology(ranks, per_host=per_host)))
    assert found.ranks == tuple(range(per_host, ranks)) and found.evidence["scope"] == "host"
    assert not found.evidence["contended"] and "contended" not in found.summary
    assert found.suggested_action.action == "evict" and found.suggested_action.args["host"] == "node-001"


@pytest.mark.parametrize("kind", [*tf.NOISES, "ar1"])
@pytest.mark.parametrize(("ranks", "stages"), [(16, 0), (64, 4), (1024, 4)])
def test_clean_short_traces_get_no_verdict_against_a_rank(kind: str, ranks: int, stages: int) -> None:
    """Runs of 10 to 100 steps, each stage its own speed: a healthy rank is never a sick worker from the start."""
    rk = list(range(ranks))
    topology = pipeline_topology(rk, stages=stages, per_host=8) if stages else None
    for steps in (10, 20, 44, 100):
        for seed in range(3 if ranks < 1024 else 1):
            compute = jitter(seed * 7 + steps, steps, ranks, kind, scale=0.05)
            if stages:
                compute *= np.repeat([1.0, 1.02, 0.99, 1.03], ranks // 4)
            assert warnings_(detect_trace(compute, rk, topology)) == [], (steps, seed)


def waits_for_a_cpu(seed: int, steps: int, ranks: int, base: float) -> np.ndarray:
    """Each rank's wait for a CPU per step on a shared host: stretches of 20 to 60 steps with none and stretches
    in which another process takes 30% to 120% of the rank's own work from it (a time-sliced core), drawn apart
    for each rank."""
    rng = np.random.default_rng(seed)
    waits = np.zeros((steps, ranks))
    for rank in range(ranks):
        step, busy = 0, bool(rng.integers(2))
        while step < steps:
            length = int(rng.integers(20, 61))
            if busy:
                waits[step : step + length, rank] = (
                    base * rng.uniform(0.3, 1.2) * rng.uniform(0.8, 1.2, length)[: steps - step]
                )
            step, busy = step + length, not busy
    return waits


@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("seed", range(3))
def test_a_wait_for_a_cpu_is_the_hosts_and_a_slow_rank_is_found_through_it(seed: int, ranks: int) -> None:
    """Ranks sharing their host's CPUs: each one's compute time swings by up to 2.2x as other processes take
    turns on its core, and ``cpu_wait_time`` says how much. Left out of the work, the swings page nobody and
    rank 1 doubling its own work from step 200 is found where it began; read as work, they are stragglers."""
    steps, base = 300, 0.02
    own = clean(seed, steps, ranks, base=base, scale=0.03)
    own[199:230, 1] *= 2.0
    waits = waits_for_a_cpu(seed + 10, steps, ranks, base)
    frame = tf.rank_step_frame(tf.synchronous(own + waits))
    frame["cpu_wait_time"] = waits[frame["step"] - 1, frame["rank"]]

    def warnings_from(rank_steps: pd.DataFrame) -> list[tuple[tuple[int, ...], bool]]:
        batch = TelemetryBatch(rank_steps=rank_steps)
        found = tf.replay(StragglerDetector(), batch, parts=3, run=RunState(world_size=ranks)).values()
        return [(f.ranks, abs(f.start_step - 200) <= 2) for f in warnings_(list(found))]

    assert warnings_from(frame) == [((1,), True)]
    assert warnings_from(frame.assign(cpu_wait_time=np.nan)) != [((1,), True)]
