"""Where each simulated rank sits: ranks laid out dp x pp (tp = 1), consecutive ranks per host."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: the columns of the run's topology (``TOPOLOGY_COLUMNS``)."""

    rank: int
    host: str
    local_rank: int
    dp: int
    tp: int
    pp: int


@dataclass(frozen=True)
class Topology:
    """Megatron's order with tp = 1: the data-parallel index runs fastest, the pipeline stage slowest.

    Rank ``r`` is data-parallel replica ``r % dp_size`` of stage ``r // dp_size`` and runs on
    host ``r // ranks_per_host``, so a host holds ranks of one stage whenever ``ranks_per_host``
    divides ``dp_size``.
    """

    ranks: int
    pp: int
    ranks_per_host: int

    @property
    def dp_size(self) -> int:
        return self.ranks // self.pp

    @property
    def hosts(self) -> int:
        return math.ceil(self.ranks / self.ranks_per_host)

    def stage(self) -> np.ndarray:
        """The pipeline stage of every rank."""
        return np.arange(self.ranks) // self.dp_size

    def dp(self) -> np.ndarray:
        """The data-parallel index of every rank."""
        return np.arange(self.ranks) % self.dp_size

    def host_ranks(self, host: int) -> tuple[int, ...]:
        first = host * self.ranks_per_host
        return tuple(range(first, min(first + self.ranks_per_host, self.ranks)))

    @staticmethod
    def host_name(host: int) -> str:
        return f"node-{host:04d}"

    def placement(self, rank: int) -> Placement:
        return Placement(
            rank=rank,
            host=self.host_name(rank // self.ranks_per_host),
            local_rank=rank % self.ranks_per_host,
            dp=rank % self.dp_size,
            tp=0,
            pp=rank // self.dp_size,
        )
