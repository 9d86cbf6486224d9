"""Seeded synthetic runs with ground truth, to test and score the detectors (docs/simulate.md).

``simulate(SimulationConfig(...))`` returns a ``SimulatedRun``: every signal of a synchronous
data x pipeline parallel job with nuisances that must not alarm, and the labels of the faults
injected into it (``SIMULATED_FAULTS`` in detectors/faults.py); ``run.frames()`` is its telemetry
as ``bedside.detectors.detect`` takes it. No I/O: ``bedside simulate`` writes a run directory
from it (app/simulation/).
"""
from .config import NOISE_FAMILIES, ModelSettings, SimulationConfig
from .errors import SimulationError
from .simulated import SimulatedRun, simulate

__all__ = ["NOISE_FAMILIES", "ModelSettings", "SimulatedRun", "SimulationConfig", "SimulationError", "simulate"]
