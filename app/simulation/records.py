"""What the job-level records say: steps, ground truth and run.json."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bedside.collectors.format import encode_number
from bedside.collectors.runinfo import RankPlacement, RunInfo
from bedside.detectors.datasets import SimulatedRun, SimulationConfig
from bedside.detectors.datasets.nuisances import Nuisances
from bedside.detectors.datasets.topology import Topology
from bedside.detectors.datasets.traces import Traces

GENERATOR = "bedside simulate"


def _number(value: float) -> float | str:
    return encode_number(float(value))


def step_fields(config: SimulationConfig, traces: Traces) -> list[dict[str, Any]]:
    """Rank 0's ``step`` record of every step: loss, grad norm, lr, tokens, FLOPs, and the shards read."""
    flops = 6 * config.model.params * traces.tokens
    rows = zip(
        traces.losses().tolist(),
        traces.grad_norms().tolist(),
        traces.lr.tolist(),
        traces.tokens.tolist(),
        flops.tolist(),
        traces.shards.tolist(),
    )
    return [
        {
            "metrics": {
                "loss": _number(loss),
                "grad_norm": _number(grad),
                "lr": lr,
                "tokens": int(tokens),
                "flops": flop,
            },
            "shards": shards,
        }
        for loss, grad, lr, tokens, flop, shards in rows
    ]


def labels(run: SimulatedRun) -> list[dict[str, Any]]:
    """The ``fault_injected`` records: one per fault, at its first step (timed at its start), by first step.

    A hang's step never starts: its record is timed when the step before it and what followed were done.
    """
    return [
        {
            "step": f.window.first,
            "fault": f.name,
            "target_ranks": list(f.ranks),
            "args": f.args(),
            "time": run.onset_time(f),
        }
        for f in run.faults
    ]


def run_info(config: SimulationConfig, nuisances: Nuisances, out: Path) -> RunInfo:
    """run.json: world size, topology, and the config with where the nuisances fell."""
    snapshot = {**config.to_json(), "generator": GENERATOR, "nuisances": nuisances.to_json()}
    digest = hashlib.sha1(json.dumps([out.name, snapshot], sort_keys=True).encode()).hexdigest()
    return RunInfo(
        run_id=digest[:12],
        name=out.name,
        created=config.start_time,
        world_size=config.ranks,
        topology=tuple(placement(config.topology, rank) for rank in range(config.ranks)),
        config=snapshot,
    )


def placement(topology: Topology, rank: int) -> RankPlacement:
    """Where ``rank`` runs, as run.json records it."""
    return RankPlacement(**asdict(topology.placement(rank)))
