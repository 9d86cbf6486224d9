"""Named exceptions of the simulator."""
from __future__ import annotations

from bedside.collectors.errors import BedsideError


class SimulationError(BedsideError):
    """A simulation config or fault spec is not valid, or the output directory cannot be used."""
