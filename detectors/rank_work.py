"""A rank's own work in a step, its position and the job's pace, as the detectors that compare ranks read them,
and seconds of wall time as the on-call reads them.

In a synchronous job every rank's ``step_time`` is the same (the collectives wait for the slowest rank), so a
rank's own **work** is ``compute_time + data_time`` (either one alone when the other is missing; ``step_time`` for
a step where no rank reports either), less ``cpu_wait_time`` where the rank reports it: the time its thread waited
for a CPU that other processes of its host held is the host's, not the rank's.

A rank's **position** is the ranks doing the same work: its pipeline stage (refined by TP index when each such
slot holds two or more ranks), every rank when the run declares no stages. The job's **pace** is what it would
wait for were no rank slower than the fast ranks of its position (their lower quartile): the largest such work
over the positions. The lower quartile, not the median: a slow host holding half the job (or half a stage)
moves the median as far as its own excess but not them. A rank's work beyond the pace is what the job waits
for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from .robust import row_quantile

FAST_QUANTILE = 0.25
"""The fast ranks of a position, or of the job (the straggler detector's level: a contended machine slows them
too): this quantile of their work."""


def rank_work(
    step_time: np.ndarray, compute: np.ndarray, data: np.ndarray, cpu_wait: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's work in each step (steps x ranks seconds; NaN where none is known), and whether each step
    reports phases at all (steps x 1)."""
    both = compute + data
    phases = np.where(np.isnan(both), np.fmax(compute, data), both)  # a phase not reported adds 0
    phased = ~np.isnan(phases).all(axis=1, keepdims=True)
    work = np.where(phased, phases, step_time)
    work -= np.fmin(np.nan_to_num(cpu_wait), work)
    work[~(work > 0)] = np.nan
    return work, phased


@dataclass(frozen=True)
class Positions:
    """Ranks ``0..size-1`` by position: ``label`` per rank (-1: not placed), and whether the run declared them."""

    label: np.ndarray
    declared: bool
    stage: dict[int, int | None]  # label -> pipeline stage

    @cached_property
    def groups(self) -> list[tuple[int, np.ndarray]]:
        """Each position's label and its ranks (worked out once: the positions last until the topology changes)."""
        return [(int(g), np.flatnonzero(self.label == g)) for g in np.unique(self.label) if g >= 0]


def place_ranks(topology: pd.DataFrame, size: int) -> Positions:
    """Positions from the topology: by pipeline stage, refined by TP index when its slots hold two or more
    ranks (a median over slots); one position of every rank when no stage is declared."""
    topo = topology[topology["rank"] < size].dropna(subset=["pp"])
    if topo.empty:
        return Positions(np.zeros(size, int), False, {0: None})
    keys = ["pp", "tp"] if topo["tp"].notna().all() and topo.groupby(["pp", "tp"]).size().median() >= 2 else ["pp"]
    codes, uniques = pd.MultiIndex.from_frame(topo[keys].astype(int)).factorize()
    label = np.full(size, -1)
    label[topo["rank"].to_numpy(int)] = codes
    return Positions(label, True, {i: int(key[0]) for i, key in enumerate(uniques)})


class Placement:
    """The positions of ranks ``0..size-1``, placed again when the topology or the rank count changes."""

    def __init__(self) -> None:
        self._placed: tuple[tuple[int, int], Positions] | None = None

    def of(self, topology: pd.DataFrame, size: int) -> Positions:
        key = (size, len(topology))
        if self._placed is None or self._placed[0] != key:
            self._placed = (key, place_ranks(topology, size))
        return self._placed[1]


def job_pace(work: np.ndarray, positions: Positions) -> np.ndarray:
    """The job's pace in each step (steps x 1) from its ranks' work (steps x ranks ``0..size-1``): the largest,
    over positions, of the work of the position's fast ranks."""
    paces = [row_quantile(work[:, members], FAST_QUANTILE) for _, members in positions.groups]
    return np.fmax.reduce(paces) if paces else row_quantile(work, FAST_QUANTILE)


def wall_time(seconds: float) -> str:
    """Seconds as the on-call reads them: ``42.0 s``, ``3.5 min``."""
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
