"""``bedside simulate``: a simulated run (detectors/datasets) written as a run directory (docs/simulate.md)."""

from bedside.detectors.datasets import NOISE_FAMILIES, ModelSettings, SimulationConfig, SimulationError

from .run import simulate_run

__all__ = ["NOISE_FAMILIES", "ModelSettings", "SimulationConfig", "SimulationError", "simulate_run"]
