"""The forecast rule's judging of the latest evals of one series against the band of their forecast.

The last ``patience``, 2x and 4x ``patience`` evals are held out of the fit and judged together: every one
above the forecast and their mean above the band of a mean (``eval_forecast.py``), each eval counted up to its
own one-eval band, so no one eval carries a window. Each window is judged against a fit that has not seen it,
so a stall cannot bend the fit to itself one eval at a time. Evals above the band become suspects, kept out of
the fit; while there are suspects each new eval is judged alone against its own band; evals that keep falling
by more than the band are an early fit that saturated too soon (the forecast was wrong, not the eval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .eval_forecast import Forecast, forecast_evals, t_quantile
from .finding import Finding


@dataclass
class EvalSeries:
    """One (timeline, split, score) eval series and its episode."""

    points: list[tuple[int, float, float]] = field(default_factory=list)  # (step, compute, value) fitted
    suspects: list[tuple[int, float, float, float, float]] = field(default_factory=list)  # + forecast, sigma
    finding: Finding | None = None
    latest: Forecast | None = None
    """The latest forecast: its law, noise, degrees of freedom and residual autocorrelation."""
    compute_unit: str = "cum_flops"
    """What the compute axis is: ``lr_tokens`` or ``lr_steps`` (the LR-weighted progress), ``cum_flops``,
    ``cum_tokens`` or ``step``, as the latest eval had it."""
    steps: list[int] = field(default_factory=list)
    """The step of every eval seen, in order."""
    gaps: dict[int, tuple[float, float]] = field(default_factory=dict)
    """step -> (the training loss at the eval, log scale; the eval's gap to it), where the run has one."""
    gap_hold: int | None = None
    """While the gap rule holds a stall: the step of its first eval (the gaps before it are the reference)."""


@dataclass(frozen=True)
class WindowJudge:
    """The forecast rule's settings (``EvalStallDetector``'s), and its judging of one series' latest evals."""

    min_evals: int
    band_z: float
    min_rel_sigma: float
    patience: int
    trend_evals: int

    def judge(self, series: EvalSeries, evaluation: tuple[int, float, float]) -> bool:
        """Is ``evaluation`` (step, compute, value) above the band: alone while there are suspects, else in a
        window with the evals before it? The evals above become suspects; the caller fits the rest."""
        return self.judge_alone(series, evaluation) if series.suspects else self.judge_window(series, evaluation)

    def judge_alone(self, series: EvalSeries, evaluation: tuple[int, float, float]) -> bool:
        """While evals are above the band: is this one too (then it joins the suspects)?"""
        forecast = self.forecast(series, series.points, [evaluation])
        if forecast is None:
            return False
        suspect = (*evaluation, float(forecast.center[0]), float(forecast.sigma[0]))
        width = float(forecast.half_width(self.band_z)[0])
        above = math.log(evaluation[2] / suspect[3]) > width
        # falling steadily, only slower than an early fit said: refit, it is no stall
        if above and not self._still_improving(series.suspects + [suspect], width):
            series.suspects.append(suspect)
            return True
        return False

    def judge_window(self, series: EvalSeries, evaluation: tuple[int, float, float]) -> bool:
        """The last ``m`` evals, held out of the fit, against the band of their mean, for ``m`` in
        ``windows()``: above it, they become suspects; else this eval joins the fit. Each window is judged
        against a fit that has not seen it, so a stall cannot bend the fit to itself one eval at a time."""
        for m in self.windows():
            fitted, window = series.points[: len(series.points) - m + 1], series.points[len(series.points) - m + 1 :]
            window = window + [evaluation]
            forecast = self.forecast(series, fitted, window)
            if forecast is None:
                break  # longer windows leave even fewer evals to fit
            excess = capped(np.log([w[2] for w in window]) - np.log(forecast.center), forecast.half_width(self.band_z))
            width = t_quantile(self.band_z, forecast.dof) * forecast.mean_sigma
            suspects = [(*w, float(f), float(sg)) for w, f, sg in zip(window, forecast.center, forecast.sigma)]
            if excess.mean() > width and excess.min() > 0 and not self._still_improving(suspects, width):
                series.points, series.suspects = fitted, suspects
                return True
        return False

    def windows(self) -> tuple[int, ...]:
        """How many of the latest evals are judged together: ``patience``, twice and four times as many."""
        return (self.patience, 2 * self.patience, 4 * self.patience)

    def forecast(
        self, series: EvalSeries, fitted: list[tuple[int, float, float]], evals: list[tuple[int, float, float]]
    ) -> Forecast | None:
        """The forecast, from the evals ``fitted``, at the computes of ``evals``; None before ``min_evals``."""
        if len(fitted) < self.min_evals:
            return None
        c = np.array([p[1] for p in fitted])
        v = np.array([p[2] for p in fitted])
        forecast = forecast_evals(c, v, np.array([e[1] for e in evals]), min_rel_sigma=self.min_rel_sigma)
        if forecast is not None:
            series.latest = forecast
        return forecast

    def _still_improving(self, evals: list[tuple], width: float) -> bool:
        """The last ``trend_evals`` evals (step, compute, value, ...) fall, by more than the band's half-width
        ``width``, first to last."""
        recent = np.array([e[2] for e in evals[-self.trend_evals :]])
        if len(recent) < self.trend_evals or math.log(recent[0] / recent[-1]) <= width:
            return False
        return falling_in_rank(recent)


def falling_in_rank(values: np.ndarray) -> bool:
    """Whether Spearman's rank correlation of ``values`` with their order is negative: the sign of the covariance
    of their average ranks with their positions."""
    ranks = pd.Series(values).rank().to_numpy()
    return bool(np.dot(ranks - ranks.mean(), np.arange(len(values)) - (len(values) - 1) / 2) < 0.0)


def capped(excess: np.ndarray, width: np.ndarray | float) -> np.ndarray:
    """The excesses of a window of evals, each counted up to its own one-eval band ``width``: no one eval far
    above can carry a window by itself, however far it jumped (a bad eval batch, or a spike of the training at
    the eval's step, which the training loss shows only after it), so a jump opens a finding only when the evals
    beside it are above the forecast too, and one at the newest eval one eval later, with its cause known."""
    return np.minimum(excess, np.broadcast_to(width, excess.shape))
