"""Parameter checksums: the replicas of a pipeline stage agree, until one's parameters diverge."""

from __future__ import annotations

import numpy as np

from .config import SimulationConfig
from .models import stream

_MASK = (1 << 63) - 1


class Checksums:
    """The ``param_checksum`` of every rank, every ``checksum_every`` steps (``checked``).

    A stage's replicas report one digest per checksum step; a rank whose parameters diverged
    (``corruptions``: rank -> steps) reports another from that step on, changed again at
    each further divergence.
    """

    def __init__(self, config: SimulationConfig, corruptions: dict[int, list[int]]) -> None:
        self.every = config.checksum_every
        self.checked = np.arange(self.every, config.steps + 1, self.every)
        self.base = stream(config.seed, "checksum").integers(0, _MASK, (config.pp, len(self.checked)), dtype=np.int64)
        self.stage = config.topology.stage()
        self.corruptions = {rank: sorted(steps) for rank, steps in corruptions.items()}

    def digests(self, rank: int) -> list[int]:
        """The rank's digest at each checked step (``checked``)."""
        row = self.base[self.stage[rank]].tolist()
        if rank not in self.corruptions:
            return row
        hits = np.searchsorted(self.corruptions[rank], self.checked, side="right")
        return [value ^ _mix(rank, int(n)) if n else value for value, n in zip(row, hits)]


def _mix(rank: int, divergences: int) -> int:
    """A non-zero 63-bit pattern, distinct per rank and divergence count."""
    return (((rank + 1) * 0x9E3779B97F4A7C15 + divergences * 0xBF58476D1CE4E5B9) & _MASK) | 1
