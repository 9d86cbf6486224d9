"""A robust baseline that follows a falling training curve, for one series per timeline.

The baseline is a line through the last ``window`` accepted points, log value against
log step (training curves are close to power laws in the step, so the line bends with
the fast early fall as well as the slow late one): its slope is the difference of the medians of the window's two halves over their distance,
its level the median of the detrended points. The spread is the robust sigma (MAD) of
the one-step-ahead residuals of the last ``memory`` accepted points: the error of the
forecast itself, trend error included, learned over a longer span than the line. Only
admitted points teach anything: the line, the spread and the tail factor all learn from
the points the caller accepts, so an outlier (and every point of an episode) is scored
against the baseline without moving it, and a spike cannot raise the bar for the next
one. The tail factor is capped at ``MAX_TAIL``. A rewind starts a new timeline from the
parent's points before the branch step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from .robust import mad_sigma

GAUSSIAN_UPPER_Q995 = 2.5758
"""The 99.5th percentile of normal data in sigmas: the yardstick for the tail factor."""
TAIL_SLACK = 1.1
FIRST_TAIL_ZS = 100
MIN_TAIL_ZS = 800
EARLY_TAIL = 2.0
MAX_TAIL = 4.0
"""The tail factor's cap: a bar of at most 16 sigma at ``z_alarm`` 4, whatever the recent z-scores held."""
MIN_FORECAST_ERRORS = 40
"""Forecast errors seen before a score counts: early curvature must have had its say in sigma."""


@dataclass(frozen=True)
class Line:
    """The baseline: log value = ``level`` + ``slope`` * log(1 + step)."""

    level: float
    slope: float

    def at(self, step: int) -> float:
        return self.level + self.slope * math.log1p(step)


@dataclass(frozen=True)
class Score:
    """One point against its baseline: the line, its forecast, robust z and the threshold's tail factor."""

    line: Line
    predicted: float
    sigma: float
    z: float
    tail: float
    ready: bool = True


class RobustTrend:
    """Rolling robust linear trend of log values, with the spread and tails of its forecast errors."""

    def __init__(
        self,
        *,
        window: int = 100,
        min_points: int = 30,
        sigma_floor: float = 1e-4,
        memory: int = 200,
        tail_memory: int = 2000,
        tail_power: float = 2.5,
    ) -> None:
        self.window, self.min_points, self.sigma_floor, self.tail_power = window, min_points, sigma_floor, tail_power
        self._points: dict[int | None, deque[tuple[int, float]]] = {}  # None: points seen before any timeline
        self._residuals: deque[float] = deque(maxlen=memory)
        self._zs: deque[float] = deque(maxlen=tail_memory)
        self._timeline: int | None = None

    def on_timeline(self, timeline: int, step: int) -> None:
        """Switch to ``timeline``; a new one starts from the current one's points before ``step``."""
        if timeline == self._timeline:
            return
        if timeline not in self._points:
            parent = self._points.get(self._timeline, deque())
            self._points[timeline] = deque(((s, y) for s, y in parent if s < step), maxlen=self.window)
        self._timeline = timeline

    def score(self, step: int, y: float) -> Score | None:
        """``y`` (a log value) against the baseline at ``step``; None while too few points.

        Not ``ready`` until ``MIN_FORECAST_ERRORS`` forecasts have been checked against
        what came: until then sigma is the line's own spread, too hopeful early in a run.
        Scoring learns nothing: ``admit`` does, for the points the caller accepts.
        """
        points = self._points.get(self._timeline)
        if points is None or len(points) < self.min_points:
            return None
        steps = np.log1p(np.fromiter((s for s, _ in points), float, len(points)))
        ys = np.fromiter((v for _, v in points), float, len(points))
        half = len(ys) // 2
        run = np.median(steps[half:]) - np.median(steps[:half])
        slope = (np.median(ys[half:]) - np.median(ys[:half])) / run if run > 0 else 0.0
        detrended = ys - slope * steps
        line = Line(float(np.median(detrended)), float(slope))
        predicted = line.at(step)
        ready = len(self._residuals) >= MIN_FORECAST_ERRORS
        spread = np.fromiter(self._residuals, float) if ready else detrended - line.level
        sigma = float(mad_sigma(spread, floor=self.sigma_floor))
        return Score(line, predicted, sigma, (y - predicted) / sigma, self._tail(), ready)

    def _tail(self) -> float:
        """(upper q99.5 of recent z / the normal 2.576 / slack) ** tail_power, at least 1.

        The upper tail only, since spikes are upward and noise may be skewed; from
        z-scores each taken against the sigma of its day, of admitted points only (an
        alarm's own z never raises the next bar). ``TAIL_SLACK`` absorbs the sampling error
        of the quantile. A few hundred z-scores show a tail only roughly, and heavy tails
        least of all: until ``MIN_TAIL_ZS`` are seen the factor is at least ``EARLY_TAIL``.
        At most ``MAX_TAIL``: the power amplifies a quantile's error, and a handful of
        large accepted points must not lift the bar out of reach.
        """
        if len(self._zs) < FIRST_TAIL_ZS:
            return EARLY_TAIL
        upper = float(np.quantile(np.fromiter(self._zs, float), 0.995))
        measured = min(max(1.0, upper / GAUSSIAN_UPPER_Q995 / TAIL_SLACK) ** self.tail_power, MAX_TAIL)
        return measured if len(self._zs) >= MIN_TAIL_ZS else max(measured, EARLY_TAIL)

    def admit(self, step: int, y: float, score: Score | None) -> None:
        """Add an accepted point to the baseline; when it was scored, its forecast error to the
        spread and, once scores are ``ready``, its z to the tail."""
        self._points.setdefault(self._timeline, deque(maxlen=self.window)).append((step, y))
        if score is not None:
            self._residuals.append(y - score.predicted)
            if score.ready:
                self._zs.append(score.z)

    def restart(self) -> None:
        """Forget the current timeline's points (after a level shift that did not recover)."""
        self._points[self._timeline] = deque(maxlen=self.window)
