"""Named exceptions of the simulated datasets."""

from __future__ import annotations


class SimulationError(ValueError):
    """A simulation config or fault spec is not valid, or the output directory cannot be used."""
