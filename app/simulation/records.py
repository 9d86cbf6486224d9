"""What the job-level records say: steps, evals, logs, ground truth and run.json."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from bedside.collectors.format import encode_number
from bedside.collectors.runinfo import RunInfo

from .config import SimulationConfig
from .nuisances import Nuisances
from .traces import Traces

GENERATOR = "bedside simulate"


def _number(value: float) -> float | str:
    return encode_number(float(value))


def step_fields(config: SimulationConfig, traces: Traces) -> list[dict[str, Any]]:
    """Rank 0's ``step`` record of every step: loss, grad norm, lr, tokens, FLOPs, and the shards read."""
    flops = 6 * config.model.params * traces.tokens
    rows = zip(traces.losses().tolist(), traces.grad_norms().tolist(), traces.lr.tolist(), traces.tokens.tolist(),
               flops.tolist(), traces.shards.tolist())
    return [{"metrics": {"loss": _number(loss), "grad_norm": _number(grad), "lr": lr, "tokens": int(tokens),
                         "flops": flop}, "shards": shards}
            for loss, grad, lr, tokens, flop, shards in rows]


def eval_fields(config: SimulationConfig, traces: Traces, nuisances: Nuisances) -> dict[int, dict[str, Any]]:
    """The held-out ``eval`` record of every eval step the run reaches."""
    steps = np.array([s for s in nuisances.eval_s if s <= config.last_step], dtype=int)
    losses = traces.eval_scores(steps - 1)
    tokens = np.cumsum(traces.tokens)
    return {int(s): {"metrics": {"loss": float(loss), "accuracy": accuracy(float(loss), config)}, "split": "heldout",
                     "cum_tokens": int(tokens[s - 1]), "cum_flops": 6 * config.model.params * float(tokens[s - 1])}
            for s, loss in zip(steps, losses)}


def accuracy(loss: float, config: SimulationConfig) -> float:
    """Next-token accuracy that goes with a held-out loss: 0.75 at the loss floor, falling as the loss rises."""
    return 0.75 * math.exp(-(loss - config.model.loss_floor) / 2.0)


def nonfinite_logs(traces: Traces) -> dict[int, dict[str, Any]]:
    """Rank 0's error log at each step whose gradient norm was not finite (the update is skipped)."""
    return {int(traces.steps[i]): {"level": "error", "message": f"non-finite gradient norm ({value}): update skipped"}
            for i, value in traces.nonfinite.items()}


def labels(config: SimulationConfig, step_start: np.ndarray, idle_from: float) -> list[dict[str, Any]]:
    """The ``fault_injected`` records: one per fault, at its first step (timed at its start), by first step.

    A hang's step never starts: its record is timed when the step before it and what followed were done.
    """
    faults = sorted(config.faults, key=lambda f: f.window.first)
    return [{"step": f.window.first, "fault": f.name, "target_ranks": list(f.ranks), "args": f.label(),
             "time": float(step_start[f.window.first - 1]) if f.window.first <= len(step_start) else idle_from}
            for f in faults]


def run_info(config: SimulationConfig, nuisances: Nuisances, out: Path) -> RunInfo:
    """run.json: world size, topology, and the config with where the nuisances fell."""
    snapshot = {**config.to_json(), "generator": GENERATOR, "nuisances": nuisances.to_json()}
    digest = hashlib.sha1(json.dumps([out.name, snapshot], sort_keys=True).encode()).hexdigest()
    return RunInfo(run_id=digest[:12], name=out.name, created=config.start_time, world_size=config.ranks,
                   topology=config.topology.placements(), config=snapshot)
