"""Steps assembled across ranks: the same matrices however the rows arrive, and one assembly shared by every
cross-rank detector under a runner that finds what each finds fed alone."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bedside.detectors.crossrank import CrossRankDetector, StepAssembler, StepMatrix
from bedside.detectors.datasets import SimulationConfig, simulate
from bedside.detectors.finding import Finding
from bedside.detectors.registry import build_detectors
from bedside.detectors.runner import DetectorRunner
from bedside.detectors.telemetry import RunState, TelemetryBatch

METRICS = ("compute_time", "local_grad_norm")


def rank_rows(
    seed: int, *, steps: int, ranks: np.ndarray, step0: int = 0, timelines: int = 2, rewrites: float = 0.2
) -> pd.DataFrame:
    """Rows of every (timeline, step, rank) as per-rank files read unevenly give them: each rank's rows in order,
    each rank up to 3 steps behind the others, a timeline's rows before the next one's, a share ``rewrites`` of
    the rows written twice (the newest counts)."""
    rng = np.random.default_rng(seed)
    t, s, r = np.meshgrid(np.arange(timelines), step0 + np.arange(steps), ranks, indexing="ij")
    rows = pd.DataFrame({"timeline": t.ravel(), "step": s.ravel(), "rank": r.ravel()})
    again = rows.sample(frac=rewrites, random_state=seed)
    rows = pd.concat([rows, again]).sort_index(kind="stable").reset_index(drop=True)  # a rewrite right after
    for name in METRICS:
        rows[name] = rng.lognormal(size=len(rows))
    rows.loc[rng.random(len(rows)) < 0.05, "compute_time"] = np.nan  # reported as NaN: present, no value
    behind = dict(zip(ranks.tolist(), rng.uniform(0, 3, len(ranks))))
    arrival = rows.groupby(["timeline", "rank"]).cumcount() + rows["rank"].map(behind)
    return rows.iloc[np.lexsort((arrival.to_numpy(), rows["timeline"].to_numpy()))].reset_index(drop=True)


def reference(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """What the matrices must hold, by pandas: the newest row of each (timeline, step, rank), pivoted."""
    newest = rows.drop_duplicates(["timeline", "step", "rank"], keep="last").set_index(["timeline", "step", "rank"])
    return {name: newest[name].unstack("rank").sort_index() for name in METRICS}


def released(assembler: StepAssembler, batches: list[pd.DataFrame], run: RunState) -> list[StepMatrix]:
    out = [assembler.add(TelemetryBatch(rank_steps=batch), run) for batch in batches] + [assembler.flush(run)]
    return [m for m in out if m is not None]


def as_frames(matrices: list[StepMatrix]) -> dict[str, pd.DataFrame]:
    frames = {}
    for name in METRICS:
        parts = [
            pd.DataFrame(
                m.values[name],
                index=pd.MultiIndex.from_arrays([m.timelines, m.steps], names=["timeline", "step"]),
                columns=pd.Index(m.ranks, name="rank"),
            )
            for m in matrices
        ]
        frames[name] = pd.concat(parts).sort_index(axis=1)
    return frames


@pytest.mark.parametrize(
    "ranks, step0",
    [
        (np.arange(6), 0),
        (np.array([0, 4, 8, 12]), 0),  # sparse numbering, as real traces have
        (np.array([3, 2**21 + 5]), 0),  # a rank past the one-key sort's range
        (np.arange(3), 2**25),  # steps past it
    ],
    ids=["dense", "sparse", "huge-rank", "huge-step"],
)
@pytest.mark.parametrize("parts", [1, 3, 17])
def test_the_matrices_hold_the_newest_row_of_each_step_and_rank_however_rows_arrive(
    ranks: np.ndarray, step0: int, parts: int
) -> None:
    # A rewrite read after its step was released comes too late to count: rewrites only in one batch.
    rows = rank_rows(parts, steps=30, ranks=ranks, step0=step0, rewrites=0.2 if parts == 1 else 0.0)
    batches = [rows.iloc[a:b] for a, b in zip(*(np.linspace(0, len(rows), parts + 1).astype(int)[k:] for k in (0, 1)))]
    matrices = released(StepAssembler(METRICS, lag=5), batches, RunState(world_size=len(ranks)))
    keys = [(int(t), int(s)) for m in matrices for t, s in zip(m.timelines, m.steps)]
    assert keys == sorted(set(keys)), "steps are released once each, in (timeline, step) order"
    got, want = as_frames(matrices), reference(rows)
    for name in METRICS:
        pd.testing.assert_frame_equal(got[name], want[name], check_names=False, check_dtype=False)
    for m in matrices:
        assert m.present.all(), "every rank reported every step, some of them a NaN"


def test_a_step_waits_for_a_missing_rank_until_it_is_hopeless_and_the_gap_is_not_a_row() -> None:
    rows = rank_rows(0, steps=40, ranks=np.arange(4), timelines=1)
    rows = rows[~((rows["rank"] == 2) & (rows["step"] == 10))]  # rank 2 never reported step 10
    assembler, run = StepAssembler(METRICS, lag=20), RunState(world_size=4)
    early = assembler.add(TelemetryBatch(rank_steps=rows[rows["step"] < 25]), run)
    assert early is not None and early.steps.max() == 9, "step 10 waits while only 15 newer steps exist"
    late = assembler.add(TelemetryBatch(rank_steps=rows[rows["step"] >= 25]), run)
    assert late is not None and late.steps[0] == 10 and late.steps.max() == 39
    gap = late.present[0, list(late.ranks).index(2)]
    assert not gap and np.isnan(late.values["compute_time"][0, 2])
    backlog = RunState(world_size=4, caught_up=False)
    held = StepAssembler(METRICS, lag=20)
    assert held.add(TelemetryBatch(rank_steps=rows), backlog).steps.max() == 9, (
        "with a backlog, the missing row may just be unread"
    )


CONFIGS = {
    "8 ranks on 2 hosts, every cross-rank fault": SimulationConfig(
        ranks=8,
        steps=400,
        seed=4,
        ranks_per_host=4,
        inject=(
            "nan:rank=1,step=150",
            "straggler:host=1,factor=1.4,from=120,steps=40",
            "sdc_grad:rank=2,step=200,scale_log2=10",
            "param_corrupt:rank=5,step=90",
            "throughput_drop:from=300,factor=0.7",
            "hang:rank=6,step=390",
        ),
    ),
    "12 ranks x 3 stages, student noise": SimulationConfig(
        ranks=12,
        steps=320,
        seed=8,
        pp=3,
        ranks_per_host=4,
        noise="student",
        inject=(
            "straggler:rank=7,from=1",
            "nan:rank=4,step=60",
            "sdc_grad:rank=9,step=90,scale_log2=10",
            "throughput_drop:from=220,factor=0.6",
        ),
    ),
}


def frames_of(config: SimulationConfig) -> tuple[TelemetryBatch, dict]:
    frames = simulate(config).frames()
    batch = TelemetryBatch(**{name: frames[name] for name in ("steps", "rank_steps", "evals", "checkpoints", "events")})
    return batch, {"world_size": frames["world_size"], "topology": frames["topology"]}


def keyed(findings: list[Finding]) -> dict[str, Finding]:
    return {f.finding_id: f for f in findings}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("parts", [1, 7])
def test_one_assembly_under_the_runner_finds_what_each_cross_rank_detector_finds_alone(
    config: SimulationConfig, parts: int
) -> None:
    whole, run = frames_of(config)
    batches = whole.split(parts)
    runner = DetectorRunner(build_detectors(), RunState(**run))
    for batch in batches:
        runner.update(batch)
    runner.finish()
    crossrank = [d for d in build_detectors() if isinstance(d, CrossRankDetector)]
    assert {d.name for d in crossrank} >= {"nonfinite", "sdc", "straggler", "throughput_drop"}
    for detector in crossrank:
        state = RunState(**run)
        detector.bind(state)
        alone: dict[str, Finding] = {}
        for batch in batches:
            state.observe(batch)
            alone.update(keyed(detector.update(batch)))
        alone.update(keyed(detector.finish()))
        shared = {i: f for i, f in runner.findings.items() if f.detector == detector.name}
        assert shared == alone, detector.name
        assert shared, f"{detector.name} found nothing to compare"


def test_a_rank_that_stopped_reporting_is_missing_from_its_steps_not_non_finite() -> None:
    whole, run = frames_of(CONFIGS["8 ranks on 2 hosts, every cross-rank fault"])  # rank 6 hangs at step 390
    runner = DetectorRunner(build_detectors(only=["nonfinite"]), RunState(**run))
    runner.update(whole)
    runner.finish()
    assert {(f.start_step, f.ranks) for f in runner.findings.values()} == {(150, ()), (150, (1,))}
