"""``bedside simulate``: synthetic telemetry at any scale, with labeled faults and nuisances (docs/simulate.md)."""
from .config import NOISE_FAMILIES, ModelSettings, SimulationConfig
from .errors import SimulationError
from .faults import FAULT_TYPES
from .run import simulate_run

__all__ = ["FAULT_TYPES", "NOISE_FAMILIES", "ModelSettings", "SimulationConfig", "SimulationError", "simulate_run"]
