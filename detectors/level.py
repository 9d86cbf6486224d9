"""How far a series sits above the lowest level it held: the loss's backstop for a baseline that lost its way.

A trend baseline can be wrong for a while: where a run's fast early fall bends flat its line still forecasts
the fall, and a blow-up that creeps up (each point a few sigma over the last) drags the line along. The
level is the median of the last ``points`` values (log scale). The best is the lowest level the series
*held*: the lowest over time of the highest of ``points`` consecutive levels, so a short dip (a few easy
batches) sets no best the run cannot come back to. A rewind's new timeline keeps the bests before its
branch step. A training loss held at many times its best level has diverged, whatever its trend says.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .robust import windows

LEVEL_POINTS = 10


@dataclass(frozen=True)
class Rise:
    """The current level (log) over the best level held (log), and where each was."""

    level: float
    best: float
    best_step: int
    since: int
    """The first of the last ``points`` steps at or above the ratio: where the rise shows."""
    peak_step: int
    peak: float
    """The highest of the last ``points`` values (log) and its step."""


@dataclass
class _Timeline:
    recent: deque[tuple[int, float]]
    """The last ``points`` (step, log value)."""
    levels: deque[float]
    """The last ``points`` levels."""
    bests: list[tuple[int, float]] = field(default_factory=list)
    """(step, held level), falling."""


class LowestLevel:
    """The median of the last ``points`` log values against the lowest level held so far, per timeline."""

    def __init__(self, points: int = LEVEL_POINTS) -> None:
        self.points = points
        self._timelines: dict[int | None, _Timeline] = {None: self._new()}
        self._timeline: int | None = None

    def on_timeline(self, timeline: int, step: int) -> None:
        """Switch to ``timeline``; a new one keeps the current one's bests before ``step``."""
        if timeline not in self._timelines:
            new = self._new()
            new.bests = [b for b in self._now.bests if b[0] < step]
            self._timelines[timeline] = new
        self._timeline = timeline

    def extend(self, steps: list[int], ys: list[float]) -> None:
        """Add finite log values in order."""
        if not steps:
            return
        now = self._now
        levels, held = self._upcoming(ys)
        for step, value in zip(steps[len(steps) - len(held) :], held.tolist()):
            if not now.bests or value < now.bests[-1][1]:
                now.bests.append((step, value))
        now.levels.extend(levels.tolist())
        now.recent.extend(zip(steps, ys))

    def first_over(self, ys: list[float], ratio_log: float) -> int | None:
        """The index of the first of ``ys`` (upcoming values) whose level would sit ``ratio_log`` or more over
        the best level held up to it; None when none would."""
        levels, held = self._upcoming(ys)
        if not len(held):
            return None
        bests = self._now.bests
        floor = np.minimum.accumulate(np.concatenate([[bests[-1][1] if bests else np.inf], held]))[1:]
        over = np.flatnonzero(levels[len(levels) - len(held) :] - floor >= ratio_log)
        return int(over[0]) + len(ys) - len(held) if len(over) else None

    def above(self, best: float) -> float:
        """The current level over ``best`` (log): the median of the values known, up to ``points``."""
        recent = self._now.recent
        return float(np.median([y for _, y in recent])) - best if recent else 0.0

    def rise(self, ratio_log: float) -> Rise | None:
        """The current level when it sits ``ratio_log`` or more over the best held; None otherwise."""
        now = self._now
        if len(now.recent) < self.points or not now.bests:
            return None
        level = float(np.median([y for _, y in now.recent]))
        best_step, best = now.bests[-1]
        if level - best < ratio_log:
            return None
        since = next(step for step, y in now.recent if y - best >= ratio_log)
        peak_step, peak = max(now.recent, key=lambda point: point[1])
        return Rise(level, best, best_step, since, peak_step, peak)

    @property
    def _now(self) -> _Timeline:
        return self._timelines[self._timeline]

    def _new(self) -> _Timeline:
        return _Timeline(deque(maxlen=self.points), deque(maxlen=self.points))

    def _upcoming(self, ys: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """After each of ``ys`` were added: the levels (for those with ``points`` values behind them) and the
        held levels (for those with ``points`` levels behind them), each aligned to the end of ``ys``."""
        if not ys:
            return np.empty(0), np.empty(0)
        now = self._now
        values = np.array([y for _, y in now.recent] + list(ys), float)
        levels = np.median(windows(values, self.points), axis=1) if len(values) >= self.points else []
        levels = np.asarray(levels, float)[-len(ys) :]
        window = np.concatenate([np.asarray(now.levels, float), levels])
        held = windows(window, self.points).max(axis=1) if len(window) >= self.points else []
        return levels, np.asarray(held, float)[-len(levels) :] if len(levels) else np.empty(0)
