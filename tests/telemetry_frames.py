"""Seeded synthetic telemetry for detector tests: frames built directly, with the truth known.

Timing follows a synchronous data-parallel job: every rank loads data and computes, then
all ranks meet in the gradient all-reduce, so each step lasts as long as the slowest
rank's work (the simulator's ``compose_timing``). A slow rank shows a longer ``compute_time`` (or ``data_time``), its peers
show the wait as a longer ``comm_time``, and ``step_time`` is the same on every rank.
Tests apply their faults to the work matrices (``compute[t, r] *= 1.1``) before
``rank_step_frame`` turns them into rows, so the ground truth is the test's own edit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from functools import cache

import numpy as np
import pandas as pd
from scipy import signal

from bedside.detectors.datasets.traces import compose_timing
from bedside.detectors.detector import Detector
from bedside.detectors.finding import Finding
from bedside.detectors.telemetry import (
    ACTION_COLUMNS,
    CHECKPOINT_COLUMNS,
    EVAL_COLUMNS,
    EVENT_COLUMNS,
    FILED_COLUMNS,
    RANK_STEP_COLUMNS,
    STEP_COLUMNS,
    RunState,
    TelemetryBatch,
)

NOISES = ("gaussian", "student_t3", "lognormal")
T0 = 1_796_000_000.0
FAULTY_RANKS, FAULTY_STEPS, FAULTY_SHARDS = 8, 1200, 16
"""The shape of ``faulty_run``."""


def noise(rng: np.random.Generator, kind: str, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Multiplicative factors with median 1 whose spread is ``scale``: symmetric, heavy-tailed or right-skewed."""
    if kind == "gaussian":
        eps = rng.standard_normal(shape)
    elif kind == "student_t3":
        eps = rng.standard_t(3, shape)
    elif kind == "lognormal":
        eps = np.expm1(rng.standard_normal(shape))  # long right tail: occasional long delays
    else:
        raise ValueError(f"unknown noise {kind!r} (known: {', '.join(NOISES)})")
    return np.maximum(1.0 + scale * eps, 0.05)


def log_noise(rng: np.random.Generator, kind: str, n: int, sigma: float, *, ar_phi: float = 0.6) -> np.ndarray:
    """Noise on log scale with standard deviation ``sigma``: normal, AR(1), Student-t(3) or right-skewed lognormal."""
    if kind == "gaussian":
        eps = rng.standard_normal(n)
    elif kind == "ar1":
        eps = signal.lfilter([math.sqrt(1 - ar_phi**2)], [1.0, -ar_phi], rng.standard_normal(n))
    elif kind == "student_t3":
        eps = rng.standard_t(3, n) / math.sqrt(3.0)
    elif kind == "lognormal":
        shape = 0.5
        x = rng.lognormal(0.0, shape, n)
        eps = (x - math.exp(shape**2 / 2)) / math.sqrt((math.exp(shape**2) - 1) * math.exp(shape**2))
    else:
        raise ValueError(f"unknown noise {kind!r}")
    return sigma * eps


def work(
    rng: np.random.Generator, steps: int, ranks: int, base_s: float, *, kind: str = "gaussian", scale: float = 0.03
) -> np.ndarray:
    """A steps x ranks matrix of per-rank seconds of work around ``base_s``."""
    return base_s * noise(rng, kind, (steps, ranks), scale)


def synchronous(
    compute: np.ndarray,
    data: np.ndarray | None = None,
    *,
    comm_s: float | None = None,
    optimizer_s: float | None = None,
    pause_s: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per-rank phase times and per-step wall times of a synchronous job from its work matrices.

    ``pause_s[t]`` is time spent between step ``t - 1`` and step ``t`` outside any phase
    (a checkpoint save, an eval): it shows in the wall interval, never in ``step_time``.
    """
    data = np.full_like(compute, 0.02 * np.nanmedian(compute)) if data is None else data
    comm_s = 0.1 * float(np.nanmedian(compute)) if comm_s is None else comm_s
    optimizer_s = 0.05 * float(np.nanmedian(compute)) if optimizer_s is None else optimizer_s
    timing = compose_timing(data.T, compute.T, np.full_like(compute.T, optimizer_s), np.full(len(compute), comm_s))
    pause = np.zeros(len(compute)) if pause_s is None else pause_s
    return {
        "data_time": data,
        "compute_time": compute,
        "comm_time": timing.comm.T,
        "optimizer_time": timing.optimizer.T,
        "step_time": np.repeat(timing.step_time[:, None], compute.shape[1], 1),
        "end": T0 + np.cumsum(timing.step_time + pause),
    }


def asynchronous(compute: np.ndarray, *, pause_s: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Phase times of ranks that never wait for each other: each rank's steps end on its own clock.

    ``pause_s[t, r]``: time rank ``r`` spends outside any step before step ``t`` (a stall, a hang).
    """
    pause = np.zeros_like(compute) if pause_s is None else pause_s
    zero = np.zeros_like(compute)
    return {
        "data_time": zero,
        "compute_time": compute,
        "comm_time": zero,
        "optimizer_time": zero,
        "step_time": compute.copy(),
        "end": T0 + np.cumsum(compute + pause, axis=0),
    }


def rank_step_frame(
    timing: dict[str, np.ndarray], *, first_step: int = 1, timeline: int = 0, ranks: Iterable[int] | None = None
) -> pd.DataFrame:
    """``rank_steps`` rows of ``synchronous`` or ``asynchronous`` timings, in time order (ranks interleaved,
    as a live run arrives)."""
    steps, width = timing["compute_time"].shape
    ranks = np.arange(width) if ranks is None else np.asarray(list(ranks))
    step_no = np.repeat(np.arange(first_step, first_step + steps), width)
    end = timing["end"] if timing["end"].ndim == 2 else timing["end"][:, None]
    frame = pd.DataFrame(
        {
            "timeline": timeline,
            "step": step_no,
            "time": np.broadcast_to(end, (steps, width)).ravel(),
            "rank": np.tile(ranks, steps),
            "seq": step_no - first_step,
            **{
                name: timing[name].ravel()
                for name in ("step_time", "data_time", "compute_time", "comm_time", "optimizer_time")
            },
            "local_grad_norm": 1.0,
            "cpu_wait_time": np.nan,
            "param_checksum": None,
        }
    )
    return in_time_order(frame[list(RANK_STEP_COLUMNS)])


def steps_frame(
    end: np.ndarray, *, tokens: float | np.ndarray = 524_288.0, first_step: int = 1, timeline: int = 0
) -> pd.DataFrame:
    """Job-level ``steps`` rows written by rank 0 at the times ``end``."""
    count = len(end)
    step_no = np.arange(first_step, first_step + count)
    frame = pd.DataFrame(
        {
            "timeline": timeline,
            "step": step_no,
            "time": end,
            "rank": 0,
            "seq": step_no,
            "loss": 2.0,
            "grad_norm": 1.0,
            "lr": 3e-4,
            "tokens": np.broadcast_to(tokens, count),
            "flops": 1e15,
            "shards": None,
        }
    )
    return frame[list(STEP_COLUMNS)]


def event_frame(rows: Iterable[tuple[int, float, int, str]], *, timeline: int = 0) -> pd.DataFrame:
    """``events`` rows from (rank, time, step, kind) tuples (heartbeat, run_end, ...)."""
    frame = pd.DataFrame(list(rows), columns=["rank", "time", "step", "kind"])
    frame["timeline"], frame["seq"] = timeline, 0
    return frame[list(EVENT_COLUMNS)].astype({"rank": "int64", "step": "int64", "time": "float64"})


def heartbeats(rank: int, start: float, stop: float, every_s: float, step: int) -> list[tuple[int, float, int, str]]:
    """A rank's heartbeat events every ``every_s`` seconds in (start, stop]."""
    return [(rank, t, step, "heartbeat") for t in np.arange(start + every_s, stop + 1e-9, every_s)]


def run_ends(frame: pd.DataFrame, status_s: float = 0.1) -> list[tuple[int, float, int, str]]:
    """A ``run_end`` event for each rank of ``frame``, ``status_s`` after its last record there."""
    last = frame.sort_values("time").groupby("rank").tail(1)
    return [
        (int(r), float(t) + status_s, int(s), "run_end") for r, t, s in zip(last["rank"], last["time"], last["step"])
    ]


def checkpoint_frame(rows: Iterable[tuple[int, float, int, str]], *, timeline: int = 0) -> pd.DataFrame:
    """``checkpoints`` rows from (rank, time, step, event) tuples."""
    frame = pd.DataFrame(list(rows), columns=["rank", "time", "step", "event"])
    frame["timeline"], frame["duration_s"], frame["path"], frame["message"] = timeline, np.nan, None, None
    return frame[list(CHECKPOINT_COLUMNS)]


def eval_frame(rows: Iterable[tuple[float, int]], *, timeline: int = 0) -> pd.DataFrame:
    """``evals`` rows (one held-out loss) from (time, step) tuples."""
    frame = pd.DataFrame(list(rows), columns=["time", "step"])
    frame = frame.assign(
        timeline=timeline, split="heldout", name="loss", value=2.0, cum_tokens=np.nan, cum_flops=np.nan
    )
    return frame[list(EVAL_COLUMNS)]


def topology(world: int, *, per_host: int = 8, pp: int = 1) -> pd.DataFrame:
    """Hosts of ``per_host`` consecutive ranks; ``pp`` pipeline stages, the outermost mesh dimension."""
    rank = np.arange(world)
    per_stage = world // pp
    return pd.DataFrame(
        {
            "rank": rank,
            "host": [f"node-{r // per_host:03d}" for r in rank],
            "local_rank": rank % per_host,
            "dp": rank % per_stage,
            "tp": 0,
            "pp": rank // per_stage,
        }
    )


def in_time_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in time order (stable), as a live run's records arrive."""
    return frame.sort_values("time", kind="stable").reset_index(drop=True)


def replay(
    detector: Detector,
    batch: TelemetryBatch,
    *,
    parts: int = 1,
    by_time: bool = False,
    run: RunState | None = None,
    finish: bool = True,
) -> dict[str, Finding]:
    """Feed ``batch`` in ``parts`` consecutive pieces (``TelemetryBatch.split_by_time`` or ``split``), as the
    runner does; the latest version of each finding."""
    run = run or RunState()
    detector.bind(run)
    latest: dict[str, Finding] = {}
    for piece in batch.split_by_time(parts) if by_time else batch.split(parts):
        run.observe(piece)
        latest.update({f.finding_id: f for f in detector.update(piece)})
    if finish:
        latest.update({f.finding_id: f for f in detector.finish()})
    return latest


def as_json(findings: dict[str, Finding]) -> dict[str, dict]:
    """Findings by id as ``bedside detect --json`` prints them, plus ``active``: to compare two replays."""
    return {key: {**f.to_json(), "active": f.active} for key, f in sorted(findings.items())}


@cache
def faulty_run(*, seed: int = 3, rewind_at: int | None = None, faults: bool = True) -> TelemetryBatch:
    """A synchronous 8-rank job of 1,200 steps with one fault for each detector: a loss and gradient spike at
    600, a bad shard from 300, a NaN loss at 900, rank 5 slower from 400 (the whole job with it: the straggler's
    loss) and every rank 25% slower from 450 to 650 (the job's own throughput drop), rank 6's gradient 2^12 too
    large at 700, rank 3 stopped after step 1050, evals that stall from 800, a corrupt
    checkpoint at 1000. With ``rewind_at``, the job goes back to the checkpoint before that step on timeline 1
    and runs 300 more steps; ``faults`` False leaves the faults out."""
    rng = np.random.default_rng(seed)
    first = _faulty_segment(rng, np.arange(1, FAULTY_STEPS + 1), timeline=0, t0=T0, faults=faults)
    if rewind_at is None:
        return first
    back = rewind_at - rewind_at % 100
    cut = float(first.steps.loc[first.steps["step"] <= rewind_at, "time"].max())
    keep = TelemetryBatch(*(f[(f["step"] <= rewind_at) if "step" in f else (f["time"] <= cut)] for f in first.frames()))
    restart = cut + 30.0
    loaded = checkpoint_frame([(0, restart, back, "loaded")], timeline=1)
    second = _faulty_segment(rng, np.arange(back + 1, back + 301), timeline=1, t0=restart, faults=faults)
    steps, rank_steps, evals, checkpoints, events, actions, filed = (
        in_time_order(pd.concat(pair, ignore_index=True)) for pair in zip(keep.frames(), second.frames())
    )
    checkpoints = in_time_order(pd.concat([checkpoints, loaded]))
    return TelemetryBatch(steps, rank_steps, evals, checkpoints, events, actions, filed)


def _faulty_segment(
    rng: np.random.Generator, steps: np.ndarray, *, timeline: int, t0: float, faults: bool
) -> TelemetryBatch:
    """One timeline's frames over ``steps``, the faults in place unless ``faults`` is False."""
    compute = work(rng, len(steps), FAULTY_RANKS, 0.5)
    compute[(steps >= 400) & faults, 5] *= 1.3
    compute[(steps >= 450) & (steps < 650) & faults] *= 1.25
    timing = synchronous(compute)
    end = t0 + timing["end"] - timing["end"][0] + 1.0
    ranks = rank_step_frame({**timing, "end": end}, first_step=int(steps[0]), timeline=timeline)
    ranks["local_grad_norm"] = np.exp(0.05 * rng.standard_normal(len(ranks)))
    if faults:
        ranks.loc[(ranks["step"] == 700) & (ranks["rank"] == 6), "local_grad_norm"] *= 2.0**12
        ranks = ranks[~((ranks["rank"] == 3) & (ranks["step"] > 1050))]
    job = _faulty_job(rng, steps_frame(end, first_step=int(steps[0]), timeline=timeline), faults)
    return TelemetryBatch(
        steps=job,
        rank_steps=ranks,
        evals=_faulty_evals(rng, steps, end, timeline, faults),
        checkpoints=_faulty_checkpoints(steps, end, timeline, faults),
        **_faulty_requests(steps, end, timeline, faults),
    )


def _faulty_job(rng: np.random.Generator, job: pd.DataFrame, faults: bool) -> pd.DataFrame:
    """Loss, gradient norm and the two shards each step read."""
    steps = job["step"].to_numpy()
    reads = np.array([rng.choice(FAULTY_SHARDS, 2, replace=False) for _ in steps])
    bad = (reads == 7).any(axis=1) & (steps >= 300) & faults
    loss = 3.0 * steps**-0.1 * np.exp(0.01 * rng.standard_normal(len(steps)) + 0.05 * bad)
    grad = np.exp(0.05 * rng.standard_normal(len(steps)))
    if faults:
        loss[steps == 600] *= 3.0
        loss[steps == 900] = np.nan
        grad[steps == 599] *= 20.0
    return job.assign(loss=loss, grad_norm=grad, shards=[json.dumps(r.tolist()) for r in reads])


def _faulty_evals(
    rng: np.random.Generator, steps: np.ndarray, end: np.ndarray, timeline: int, faults: bool
) -> pd.DataFrame:
    """A held-out loss every 50 steps on a power law in compute (flat from step 800 with ``faults``)."""
    every = steps[steps % 50 == 0]
    value = 2.0 + 40.0 * (np.minimum(every, 750) if faults else every) ** -0.5
    evals = eval_frame([(float(end[steps == s][0]), int(s)) for s in every], timeline=timeline)
    return evals.assign(value=value * np.exp(0.002 * rng.standard_normal(len(every))), cum_flops=every * 1e15)


def _faulty_requests(steps: np.ndarray, end: np.ndarray, timeline: int, faults: bool) -> dict[str, pd.DataFrame]:
    """Two control requests filed on the timeline's 150th step: one answered at once, one (with ``faults``) never."""
    filed_at = float(end[min(150, len(end) - 1)]) + 0.25
    ids = [f"req-t{timeline}-answered", *([f"req-t{timeline}-lost"] if faults else [])]
    filed = pd.DataFrame({"time": filed_at, "request_id": ids, "action": "pause", "operator": "ana"})
    at = min(151, len(end) - 1)
    actions = pd.DataFrame(
        {
            "timeline": timeline,
            "step": int(steps[at]),
            "time": float(end[at]) + np.array([0.1, 0.2]),
            "rank": 0,
            "request_id": ids[0],
            "action": "pause",
            "status": ["requested", "applied"],
        }
    )
    return {"filed": filed[list(FILED_COLUMNS)], "actions": actions[list(ACTION_COLUMNS)]}


def _faulty_checkpoints(steps: np.ndarray, end: np.ndarray, timeline: int, faults: bool) -> pd.DataFrame:
    """A checkpoint saved every 100 steps (and, with ``faults``, one found corrupt at step 1000)."""
    rows = [(0, float(end[steps == s][0]), int(s), "saved") for s in steps[steps % 100 == 0]]
    rows += [(0, float(end[steps == s][0]) + 0.5, int(s), "corrupt") for s in steps[(steps == 1000) & faults]]
    frame = checkpoint_frame(rows, timeline=timeline)
    frame["path"] = [f"checkpoints/step-{s:08d}-t{timeline}" for _, _, s, _ in rows]
    return in_time_order(frame)
