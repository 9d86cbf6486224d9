"""What the job reports besides its timings: the held-out evals and the log of skipped updates."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .config import SimulationConfig
from .nuisances import Nuisances
from .traces import Traces


def eval_fields(config: SimulationConfig, traces: Traces, nuisances: Nuisances) -> dict[int, dict[str, Any]]:
    """The held-out ``eval`` record of every eval step the run reaches."""
    steps = np.array([s for s in nuisances.eval_s if s <= config.last_step], dtype=int)
    losses = traces.eval_scores(steps - 1)
    tokens = np.cumsum(traces.tokens)
    return {
        int(s): {
            "metrics": {"loss": float(loss), "accuracy": accuracy(float(loss), config)},
            "split": "heldout",
            "cum_tokens": int(tokens[s - 1]),
            "cum_flops": 6 * config.model.params * float(tokens[s - 1]),
        }
        for s, loss in zip(steps, losses)
    }


def accuracy(loss: float, config: SimulationConfig) -> float:
    """Next-token accuracy that goes with a held-out loss: 0.75 at the loss floor, falling as the loss rises."""
    return 0.75 * math.exp(-(loss - config.model.loss_floor) / 2.0)


def nonfinite_logs(traces: Traces) -> dict[int, dict[str, Any]]:
    """Rank 0's error log at each step whose gradient norm was not finite (the update is skipped)."""
    return {
        int(traces.steps[i]): {"level": "error", "message": f"non-finite gradient norm ({value}): update skipped"}
        for i, value in traces.nonfinite.items()
    }
