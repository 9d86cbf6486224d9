"""What a generated run is when nothing says otherwise: the one list of defaults that ``SimulationConfig``
and ``bedside simulate`` (at start-up, before numpy is imported) both read."""

from __future__ import annotations

NOISE_FAMILIES = ("gaussian", "student", "lognormal")
"""The noise families a generated run's metrics can be drawn from."""
NOISE = "gaussian"
SEED = 0
RANKS_PER_HOST = 8
PIPELINE_STAGES = 1
EVAL_EVERY = 50
CHECKPOINT_EVERY = 100
CHECKSUM_EVERY = 10
