"""How far a series sits above the lowest level it reached: the loss's backstop for a baseline that lost its way.

A trend baseline can be wrong for a while: where a run's fast early fall bends flat its line still forecasts
the fall, and a blow-up that creeps up (each point a few sigma over the last) drags the line along. The
level is the median of the last ``points`` values (log scale); the best is the lowest level reached so far
on this timeline (a rewind's new timeline keeps the bests before its branch step). A training loss held at
many times its best level has diverged, whatever its trend says.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

LEVEL_POINTS = 10


@dataclass(frozen=True)
class Rise:
    """The current level (log) over the best level reached (log), and where each was."""

    level: float
    best: float
    best_step: int
    since: int
    """The first of the last ``points`` steps at or above the ratio: where the rise shows."""


class LowestLevel:
    """The median of the last ``points`` log values against the lowest such median so far, per timeline."""

    def __init__(self, points: int = LEVEL_POINTS) -> None:
        self.points = points
        self._recent: deque[tuple[int, float]] = deque(maxlen=points)
        self._bests: dict[int | None, list[tuple[int, float]]] = {None: []}  # (step, level), falling
        self._timeline: int | None = None

    def on_timeline(self, timeline: int, step: int) -> None:
        """Switch to ``timeline``; a new one keeps the current one's bests before ``step``."""
        if timeline == self._timeline:
            return
        if timeline not in self._bests:
            self._bests[timeline] = [b for b in self._bests[self._timeline] if b[0] < step]
            self._recent.clear()
        self._timeline = timeline

    def extend(self, steps: list[int], ys: list[float]) -> None:
        """Add finite log values in order."""
        if not steps:
            return
        bests = self._bests[self._timeline]
        levels = self._levels(ys)
        for step, level in zip(steps[len(steps) - len(levels) :], levels.tolist()):
            if not bests or level < bests[-1][1]:
                bests.append((step, level))
        self._recent.extend(zip(steps, ys))

    def first_over(self, ys: list[float], ratio_log: float) -> int | None:
        """The index of the first of ``ys`` (upcoming values) whose level would sit ``ratio_log`` or more over
        the best level before it; None when none would."""
        levels = self._levels(ys)
        if not len(levels):
            return None
        offset = len(ys) - len(levels)
        bests = self._bests[self._timeline]
        floor = np.minimum.accumulate(np.concatenate([[bests[-1][1] if bests else np.inf], levels]))[:-1]
        over = np.flatnonzero(levels - floor >= ratio_log)
        return int(over[0]) + offset if len(over) else None

    def above(self, best: float) -> float:
        """The current level over ``best`` (log); the latest value's when fewer than ``points`` are known."""
        return float(np.median([y for _, y in self._recent])) - best if self._recent else 0.0

    def rise(self, ratio_log: float) -> Rise | None:
        """The current level when it sits ``ratio_log`` or more over the best before it; None otherwise."""
        bests = self._bests[self._timeline]
        if len(self._recent) < self.points or not bests:
            return None
        level = float(np.median([y for _, y in self._recent]))
        best_step, best = bests[-1]
        if level - best < ratio_log:
            return None
        since = next(step for step, y in self._recent if y - best >= ratio_log)
        return Rise(level, best, best_step, since)

    def _levels(self, ys: list[float]) -> np.ndarray:
        """The level after each of ``ys`` were added, for those with ``points`` values behind them."""
        values = np.array([y for _, y in self._recent] + list(ys), float)
        if len(values) < self.points:
            return np.empty(0)
        return np.median(sliding_window_view(values, self.points), axis=1)[-len(ys) :]
