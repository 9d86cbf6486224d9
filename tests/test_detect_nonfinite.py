"""The nonfinite detector: NaN and Inf in job and per-rank metrics, found at their step, on seeded synthetic runs."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from telemetry_frames import (
    NOISES,
    T0,
    as_json,
    checkpoint_frame,
    noise,
    rank_step_frame,
    replay,
    steps_frame,
    synchronous,
    work,
)

from bedside.detectors.finding import Severity
from bedside.detectors.nonfinite import JOB_METRICS, RANK_METRICS, NonFiniteDetector
from bedside.detectors.telemetry import RANK_STEP_COLUMNS, STEP_COLUMNS, RunState, TelemetryBatch

SAMPLE_RUN = Path(__file__).resolve().parents[1] / "sample_runs" / "tiny-faults"
BAD = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}
ENCODED = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def clean_run(
    rng: np.random.Generator,
    steps: int,
    ranks: int,
    *,
    kind: str = "student_t3",
    first_step: int = 1,
    timeline: int = 0,
) -> TelemetryBatch:
    """A run whose every value is finite, with heavy-tailed variation in each metric."""
    timing = synchronous(work(rng, steps, ranks, 0.3, kind=kind, scale=0.2))
    per_rank = rank_step_frame(timing, first_step=first_step, timeline=timeline)
    per_rank["local_grad_norm"] = noise(rng, kind, (len(per_rank),), 0.5)
    job = steps_frame(timing["end"], first_step=first_step, timeline=timeline)
    for name in JOB_METRICS:
        job[name] = job[name] * noise(rng, kind, (steps,), 0.5)
    return TelemetryBatch(steps=job, rank_steps=per_rank)


def poison(
    batch: TelemetryBatch, name: str, step: int, value: float, rank: int | None = None, timeline: int = 0
) -> None:
    """Make ``name`` non-finite at ``step``: the job's value, or rank ``rank``'s."""
    frame = batch.steps if rank is None else batch.rank_steps
    where = (frame["step"] == step) & (frame["timeline"] == timeline)
    if rank is not None:
        where &= frame["rank"] == rank
    assert where.sum() == 1
    frame.loc[where, name] = value


def detect(batch: TelemetryBatch, ranks: int, *, parts: int = 1, run: RunState | None = None) -> list:
    found = replay(NonFiniteDetector(), batch, parts=parts, run=run or RunState(world_size=ranks))
    return sorted(found.values(), key=lambda f: (f.timeline, f.start_step, f.ranks))


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("name", JOB_METRICS)
def test_a_nonfinite_job_metric_is_found_at_its_step(name: str, value: str) -> None:
    batch = clean_run(np.random.default_rng(0), 40, 4)
    poison(batch, name, 17, BAD[value])
    [finding] = detect(batch, 4)
    assert (finding.start_step, finding.end_step, finding.ranks, finding.active) == (17, 17, (), False)
    assert finding.severity == Severity.CRITICAL and finding.kind == "nonfinite"
    assert finding.evidence["onset"]["values"] == {"job": {name: ENCODED[value]}}
    last = finding.evidence["last_finite"]["job"][name]
    assert last["step"] == 16 and last["value"] == batch.steps.loc[batch.steps["step"] == 16, name].item()


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("name", RANK_METRICS)
def test_a_nonfinite_rank_metric_names_the_rank(name: str, value: str) -> None:
    batch = clean_run(np.random.default_rng(1), 40, 4)
    poison(batch, name, 17, BAD[value], rank=2)
    [finding] = detect(batch, 4, parts=7)
    assert (finding.start_step, finding.ranks, finding.severity) == (17, (2,), Severity.CRITICAL)
    assert finding.evidence["onset"]["values"] == {"2": {name: ENCODED[value]}}
    assert finding.evidence["last_finite"]["2"][name]["step"] == 16


@pytest.mark.parametrize("ranks", [4, 64, 1024])
@pytest.mark.parametrize("kind", NOISES)
def test_every_injection_is_found_at_its_step_and_nothing_else(kind: str, ranks: int) -> None:
    rng = np.random.default_rng(ranks)
    batch = clean_run(rng, 100, ranks, kind=kind)
    truth = set()
    for step in range(5, 100, 4):
        if rng.random() < 0.5:
            poison(batch, str(rng.choice(JOB_METRICS)), step, BAD[str(rng.choice(list(BAD)))])
            truth.add((step, ()))
        else:
            rank = int(rng.integers(ranks))
            poison(batch, str(rng.choice(RANK_METRICS)), step, BAD[str(rng.choice(list(BAD)))], rank=rank)
            truth.add((step, (rank,)))
    found = {(f.start_step, f.ranks) for f in detect(batch, ranks, parts=5)}
    assert found == truth


def test_the_job_finding_does_not_wait_for_the_ranks_rows() -> None:
    batch = clean_run(np.random.default_rng(2), 40, 4)
    poison(batch, "loss", 17, np.nan)
    poison(batch, "local_grad_norm", 17, np.nan, rank=1)
    rows, job = batch.rank_steps, batch.steps
    first = (rows["step"] <= 20) & ((rows["rank"] != 1) | (rows["step"] < 17))  # rank 1's file lags 4 steps
    detector = NonFiniteDetector()
    detector.bind(RunState(world_size=4))
    early = detector.update(TelemetryBatch(steps=job[job["step"] <= 20], rank_steps=rows[first]))
    assert [(f.start_step, f.ranks) for f in early] == [(17, ())]
    later = detector.update(TelemetryBatch(steps=job[job["step"] > 20], rank_steps=rows[~first]))
    assert [(f.start_step, f.ranks, f.summary) for f in later] == [
        (17, (1,), "non-finite local_grad_norm on rank 1 at step 17")
    ]


def test_consecutive_nonfinite_steps_are_one_finding_active_while_they_last() -> None:
    batch = clean_run(np.random.default_rng(3), 40, 4)
    for step in range(20, 25):
        poison(batch, "grad_norm", step, np.inf)
    poison(batch, "loss", 22, np.nan)
    detector, versions = NonFiniteDetector(), []
    detector.bind(RunState(world_size=4))
    for piece in batch.split(40):
        versions += detector.update(piece)
    assert len({f.finding_id for f in versions}) == 1
    assert [(f.end_step, f.active) for f in versions] == [
        (20, True),
        (21, True),
        (22, True),
        (23, True),
        (24, True),
        (24, False),
    ]
    final = versions[-1]
    assert final.evidence["nonfinite_steps"] == 5 and final.score == 5.0
    assert final.evidence["metrics"] == ["grad_norm", "loss"]  # the loss at step 22 too, not the onset's alone
    assert final.summary == "non-finite grad_norm, loss on the job at steps 20-24"


def test_rewind_to_the_newest_good_checkpoint_before_the_onset() -> None:
    batch = clean_run(np.random.default_rng(4), 40, 4)
    batch.checkpoints = checkpoint_frame(
        [(0, T0 + 10, 10, "saved"), (0, T0 + 15, 15, "save_failed"), (0, T0 + 25, 25, "saved")]
    )
    poison(batch, "loss", 20, np.nan)
    [finding] = detect(batch, 4)
    assert finding.suggested_action.action == "rewind" and finding.suggested_action.args == {"to_step": 10}
    batch.checkpoints = batch.checkpoints.iloc[:0]
    [finding] = detect(batch, 4)
    assert finding.suggested_action.action == "investigate"


@pytest.mark.parametrize("parts", [1, 4])
def test_a_rewind_never_goes_to_a_checkpoint_found_corrupt(parts: int) -> None:
    """Before, the checkpoint of step 15 still counted as good after the trainer reported it corrupt (by path, at
    the step it had reached, as it does): the suggestion rewound to it."""
    batch = clean_run(np.random.default_rng(4), 40, 4)
    at = batch.steps.set_index("step")["time"]
    batch.checkpoints = checkpoint_frame(
        [(0, at[10], 10, "saved"), (0, at[15], 15, "saved"), (0, at[18], 18, "corrupt")]
    )
    batch.checkpoints["path"] = [
        "checkpoints/step-00000010-t0",
        "checkpoints/step-00000015-t0",
        "checkpoints/step-00000015-t0",
    ]
    poison(batch, "loss", 20, np.nan)
    found = replay(NonFiniteDetector(), batch, parts=parts, by_time=True, run=RunState(world_size=4))
    [finding] = found.values()
    assert finding.suggested_action.action == "rewind" and finding.suggested_action.args == {"to_step": 10}


def test_a_metric_that_is_never_reported_stays_quiet() -> None:
    batch = clean_run(np.random.default_rng(5), 40, 4)
    batch.steps["lr"] = np.nan
    batch.rank_steps["local_grad_norm"] = np.nan
    assert detect(batch, 4) == []
    poison(batch, "loss", 30, np.nan)
    assert [(f.start_step, f.ranks) for f in detect(batch, 4)] == [(30, ())]


def test_a_rewind_repeats_step_numbers_on_a_new_timeline() -> None:
    rng = np.random.default_rng(6)
    old, new = clean_run(rng, 30, 4), clean_run(rng, 30, 4, first_step=21, timeline=1)
    poison(old, "loss", 28, np.nan)
    poison(old, "loss", 29, np.nan)
    poison(old, "loss", 30, np.nan)
    poison(new, "local_grad_norm", 28, np.inf, rank=3, timeline=1)
    batch = TelemetryBatch(
        steps=pd.concat([old.steps, new.steps], ignore_index=True),
        rank_steps=pd.concat([old.rank_steps, new.rank_steps], ignore_index=True),
    )
    before, after = detect(batch, 4, parts=6)
    assert (before.timeline, before.start_step, before.end_step, before.active) == (0, 28, 30, False)
    assert (after.timeline, after.start_step, after.ranks) == (1, 28, (3,))


def test_many_nonfinite_ranks_are_named_and_counted() -> None:
    batch = clean_run(np.random.default_rng(7), 30, 64)
    for rank in range(10, 42):
        poison(batch, "local_grad_norm", 12, np.nan, rank=rank)
    [finding] = detect(batch, 64)
    assert finding.ranks == tuple(range(10, 42)) and finding.evidence["onset"]["count"] == 32
    assert len(finding.evidence["onset"]["values"]) == 8
    assert finding.summary == (
        "non-finite local_grad_norm on ranks 10, 11, 12, 13, 14, 15, 16, 17 and 24 more at step 12"
    )


def recorded(run: Path) -> tuple[TelemetryBatch, list[dict]]:
    """A recorded run's step and rank_step records as frames (metric strings such as "NaN" read as floats),
    and its ground truth."""
    lines = [
        json.loads(line)
        for path in sorted((run / "telemetry").glob("rank-*.jsonl"))
        for line in path.read_text().splitlines()
    ]

    def frame(kind: str, columns: tuple[str, ...]) -> pd.DataFrame:
        rows = [
            {**r, **{k: np.nan if v is None else float(v) for k, v in r["metrics"].items()}}
            for r in lines
            if r["kind"] == kind
        ]
        return pd.DataFrame(rows).reindex(columns=list(columns))

    truth = [
        json.loads(line) for path in (run / "ground_truth").glob("*.jsonl") for line in path.read_text().splitlines()
    ]
    return TelemetryBatch(steps=frame("step", STEP_COLUMNS), rank_steps=frame("rank_step", RANK_STEP_COLUMNS)), truth


def test_the_recorded_runs_nan_and_bit_flip_are_found_with_their_ranks() -> None:
    batch, truth = recorded(SAMPLE_RUN)
    faults = sorted((t["step"], tuple(t["target_ranks"])) for t in truth if t["fault"] in ("nan", "grad_bitflip"))
    assert faults == [(150, (1,)), (185, (0,))]
    found = detect(batch, 2, parts=4)
    assert sorted((f.start_step, f.ranks) for f in found) == sorted(faults + [(150, ()), (185, ())])
    assert {f.summary for f in found} >= {
        "non-finite local_grad_norm on rank 1 at step 150",
        "non-finite grad_norm, loss on the job at step 185",
    }


@pytest.mark.parametrize("parts", [3, 17, 90])
def test_batching_does_not_change_the_findings(parts: int) -> None:
    batch = clean_run(np.random.default_rng(8), 90, 16)
    for step in (10, 11, 12):
        poison(batch, "loss", step, np.nan)
    poison(batch, "local_grad_norm", 11, np.inf, rank=5)
    poison(batch, "comm_time", 40, np.nan, rank=9)
    poison(batch, "compute_time", 40, -np.inf, rank=2)
    poison(batch, "lr", 89, np.inf)
    run = RunState(world_size=16, good_checkpoints={0: [5]})
    whole = replay(NonFiniteDetector(), batch, run=run)
    assert sorted((f.start_step, f.ranks) for f in whole.values()) == [(10, ()), (11, (5,)), (40, (2, 9)), (89, ())]
    split = replay(NonFiniteDetector(), batch, parts=parts, run=RunState(world_size=16, good_checkpoints={0: [5]}))
    assert as_json(split) == as_json(whole)


def test_streaming_cost_per_step_at_1024_ranks() -> None:
    """Prints the cost of feeding one step (1,024 rank rows and the job row) per update; no timing assert."""
    steps = 200
    batch = clean_run(np.random.default_rng(9), steps, 1024)
    detector = NonFiniteDetector()
    detector.bind(RunState(world_size=1024))
    pieces = batch.split(steps)
    started = time.perf_counter()
    found = [f for piece in pieces for f in detector.update(piece)]
    print(f"nonfinite streaming cost: {(time.perf_counter() - started) / steps * 1e3:.2f} ms per step at 1024 ranks")
    assert found == []


SUMMARY = re.compile(
    r"non-finite ([a-z_, ]+) on ranks? ([0-9, ]+) at steps? (\d+)(?:-(\d+))?(?: \((\d+) ranks? at step (\d+)\))?$"
)


@pytest.mark.parametrize("parts", [1, 7])
def test_a_spreading_episode_says_its_onset_and_its_latest_step(parts: int) -> None:
    """NaN on rank 3 at step 10, then the step time too and on every rank from 11 to 14: the summary names
    the onset's rank, the whole span, every metric seen and the ranks at the latest step, as the evidence."""
    batch = clean_run(np.random.default_rng(9), 30, 8)
    poison(batch, "local_grad_norm", 10, np.nan, rank=3)
    for step in range(11, 15):
        for rank in range(8):
            poison(batch, "local_grad_norm", step, np.nan, rank=rank)
        poison(batch, "step_time", 14, np.inf, rank=5)
    [finding] = detect(batch, 8, parts=parts)
    match = SUMMARY.match(finding.summary)
    assert match, finding.summary
    metrics, ranks, start, end, latest, at = match.groups()
    ev = finding.evidence
    assert metrics.split(", ") == ev["metrics"] == ["local_grad_norm", "step_time"]
    assert [int(r) for r in ranks.split(", ")] == list(finding.ranks) == [3]
    assert (int(start), int(end)) == (finding.start_step, finding.end_step) == (10, 14)
    assert (int(latest), int(at)) == (ev["latest"]["count"], ev["latest"]["step"]) == (8, 14)
    assert ev["onset"]["count"] == 1 and ev["nonfinite_steps"] == 5
