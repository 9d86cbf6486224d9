"""Seeded synthetic runs with ground truth, to test and score the detectors (docs/simulate.md).

``simulate(SimulationConfig(...))`` returns a ``SimulatedRun``: every signal of a synchronous
data x pipeline parallel job with nuisances that must not alarm, and the labels of the faults
injected into it (``SIMULATED_FAULTS`` in detectors/faults.py); ``run.frames()`` is its telemetry
as ``bedside.detectors.detect`` takes it. No I/O: ``bedside simulate`` writes a run directory
from it (app/simulation/).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports
from .defaults import NOISE_FAMILIES

if TYPE_CHECKING:
    from .config import ModelSettings, SimulationConfig
    from .errors import SimulationError
    from .simulated import SimulatedRun, simulate

__all__ = ["NOISE_FAMILIES", "ModelSettings", "SimulatedRun", "SimulationConfig", "SimulationError", "simulate"]
__getattr__ = lazy_exports(
    __name__,
    {
        "ModelSettings": "config",
        "SimulationConfig": "config",
        "SimulationError": "errors",
        "SimulatedRun": "simulated",
        "simulate": "simulated",
    },
)
"""The generator (numpy, pandas) loads on first use; the noise names cost nothing."""
