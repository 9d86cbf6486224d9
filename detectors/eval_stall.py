"""Busy but not learning: held-out eval against compute, forecast by a saturating power law.

Evals of one split and score are fitted, as a function of cumulative compute C, with
``L(C) = E + A * (C / C0) ** -alpha`` (scipy ``curve_fit``, bounded so E lies below the
best eval seen); a new eval is judged against the forecast band
``forecast * exp(band_z * sigma)``, sigma being the robust spread of the fit's log
residuals (at least ``min_rel_sigma``). Evals above the band are kept out of the fit;
``patience`` of them in a row open a finding, which grows while evals stay above and
clears when one comes back inside, or when the last ``trend_evals`` of them keep falling
by more than the band (an early fit that saturated too soon: the forecast was wrong, not
the eval, and without this they would never re-enter the fit). A second rule sees the
same failure without a forecast: over the last ``trend_evals`` evals the held-out score
is flat or rising while the training loss keeps falling (the job memorises what it is fed).
"""

from __future__ import annotations

import bisect
import math
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import optimize, stats

from .detector import Detector
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, POSITIVE, Range, ranges
from .robust import mad_sigma
from .telemetry import TelemetryBatch

LOSS_SCORES = ("loss", "eval_loss", "val_loss")


@dataclass
class _Series:
    """One (timeline, split, score) eval series and its episode."""

    points: list[tuple[int, float, float]] = field(default_factory=list)  # (step, compute, value) fitted
    suspects: list[tuple[int, float, float, float]] = field(default_factory=list)  # + forecast
    finding: Finding | None = None
    compute_unit: str = "cum_flops"
    """What the compute axis is: ``cum_flops``, ``cum_tokens`` or ``step``, as the latest eval carried it."""


class EvalStallDetector(Detector):
    """Held-out eval that stopped improving against the compute spent."""

    name = "eval_stall"
    kinds = (
        FindingKind(
            "eval_stall",
            Family.LEARNING,
            tolerance=400,
            cause="the job computes but the model stopped improving",
            precedence=50,
        ),
    )
    limits = ranges(
        min_evals=Range(3, integer=True),
        band_z=POSITIVE,
        min_rel_sigma=POSITIVE,
        patience=COUNT,
        trend_evals=Range(2, integer=True),
        train_drop=Range(0, 1, high_open=True),
    )

    def __init__(
        self,
        *,
        min_evals: int = 6,
        band_z: float = 3.0,
        min_rel_sigma: float = 0.001,
        patience: int = 2,
        trend_evals: int = 5,
        train_drop: float = 0.02,
    ) -> None:
        super().__init__()
        self.min_evals, self.band_z, self.min_rel_sigma = min_evals, band_z, min_rel_sigma
        self.patience, self.trend_evals, self.train_drop = patience, trend_evals, train_drop
        self._series: dict[tuple[int, str, str], _Series] = {}
        self._train: dict[int, list[tuple[int, float]]] = {}

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        self._take_train_loss(batch)
        evals = batch.evals
        if evals.empty:
            return []
        evals = evals[evals["name"].isin(LOSS_SCORES)]
        out = []
        for row in evals.itertuples(index=False):
            compute, unit = _compute(row)
            found = self._observe(
                int(row.timeline), str(row.split), str(row.name), int(row.step), compute, unit, float(row.value)
            )
            if found is not None:
                out.append(found)
        return out

    def _take_train_loss(self, batch: TelemetryBatch) -> None:
        """Each timeline's finite training losses, kept in step order: a step written again (a restart
        resumed from an earlier checkpoint) replaces what followed it."""
        steps = batch.steps
        for timeline, group in steps.groupby("timeline", sort=True) if len(steps) else ():
            keep = np.isfinite(group["loss"].to_numpy(dtype=float, na_value=np.nan))
            losses = self._train.setdefault(int(timeline), [])
            for step, loss in zip(group["step"].to_numpy(int)[keep], group["loss"].to_numpy(float)[keep]):
                if losses and step <= losses[-1][0]:
                    del losses[bisect.bisect_left(losses, (step, -math.inf)) :]
                losses.append((int(step), float(loss)))

    def _observe(
        self, timeline: int, split: str, name: str, step: int, compute: float, unit: str, value: float
    ) -> Finding | None:
        if not (math.isfinite(value) and math.isfinite(compute) and compute > 0):
            return None
        series = self._series_for(timeline, split, name, step)
        series.compute_unit = unit
        forecast, sigma = self._forecast(series, compute)
        above = False
        if forecast is not None and math.log(value) > math.log(forecast) + self.band_z * sigma:
            suspect = (step, compute, value, forecast)
            # falling steadily, only slower than an early fit said: refit, it is no stall
            above = not self._still_improving(series.suspects + [suspect], sigma)
            if above:
                series.suspects.append(suspect)
        if not above:
            series.points.extend((s, c, v) for s, c, v, _ in series.suspects)  # back in the band: they were noise
            series.suspects.clear()
            series.points.append((step, compute, value))
        learning_stopped = self._train_falls_eval_flat(timeline, series, step)
        if above and len(series.suspects) >= self.patience:
            return self._open_or_grow(timeline, split, name, series, sigma, "forecast")
        if learning_stopped and (series.finding is None or not series.finding.active):  # a cleared one may reopen
            return self._open_or_grow(timeline, split, name, series, sigma, "train_vs_eval")
        if series.finding is not None and series.finding.active and not above and not learning_stopped:
            series.finding = _cleared(series.finding, step)
            return series.finding
        return None

    def _series_for(self, timeline: int, split: str, name: str, step: int) -> _Series:
        """The series on ``timeline``; a new timeline starts from its parent's evals before ``step``."""
        key = (timeline, split, name)
        if key not in self._series:
            parents = [k for k in self._series if k[1:] == (split, name) and k[0] < timeline]
            parent = self._series[max(parents)] if parents else _Series()
            self._series[key] = _Series(points=[p for p in parent.points if p[0] < step])
        return self._series[key]

    def _forecast(self, series: _Series, compute: float) -> tuple[float | None, float]:
        if len(series.points) < self.min_evals:
            return None, 0.0
        c = np.array([p[1] for p in series.points])
        v = np.array([p[2] for p in series.points])
        forecast = forecast_evals(c, v, np.array([compute]), min_rel_sigma=self.min_rel_sigma)
        if forecast is None:
            return None, 0.0
        center, sigma = forecast
        return float(center[0]), sigma

    def _still_improving(self, evals: list[tuple], sigma: float) -> bool:
        """The last ``trend_evals`` evals (step, compute, value, ...) fall, by more than the band, first to last."""
        recent = np.array([e[2] for e in evals[-self.trend_evals :]])
        if len(recent) < self.trend_evals or math.log(recent[0] / recent[-1]) <= self.band_z * sigma:
            return False
        return bool(stats.spearmanr(np.arange(len(recent)), recent).statistic < 0.0)

    def _train_falls_eval_flat(self, timeline: int, series: _Series, step: int) -> bool:
        """Over the last ``trend_evals`` evals: eval not improving while the training loss keeps falling."""
        recent = (series.points + [s[:3] for s in series.suspects])[-self.trend_evals :]
        if len(recent) < self.trend_evals or len(series.points) < self.min_evals:
            return False
        evals = np.array([r[2] for r in recent])
        first_step = recent[0][0]
        losses = self._train.get(timeline, [])  # in step order: bisect rather than scan the whole run
        train = losses[
            bisect.bisect_left(losses, (first_step, -math.inf)) : bisect.bisect_right(losses, (step, math.inf))
        ]
        if len(train) < 2 * self.trend_evals:
            return False
        bins = np.array_split(np.array([v for _, v in train]), self.trend_evals)
        medians = np.array([np.median(b) for b in bins])
        eval_rho = stats.spearmanr(np.arange(len(evals)), evals).statistic
        train_drop = 1.0 - medians[-1] / medians[0]
        return bool(eval_rho >= 0.0 and evals[-1] >= evals[0] and train_drop >= self.train_drop)

    def _open_or_grow(self, timeline: int, split: str, name: str, series: _Series, sigma: float, rule: str) -> Finding:
        suspects = series.suspects
        start = (
            series.finding.start_step
            if series.finding and series.finding.active
            else (suspects[0][0] if suspects else series.points[-self.trend_evals][0])
        )
        last = suspects[-1] if suspects else (*series.points[-1], float("nan"))
        excess = [math.log(v / f) / sigma for _, _, v, f in suspects] or [0.0]
        evidence = {
            "split": split,
            "score": name,
            "rule": rule,
            "evals_above_band": len(suspects),
            "last_eval": {
                "step": last[0],
                "value": last[2],
                "forecast": last[3],
                "compute": last[1],
                "compute_unit": series.compute_unit,
            },
            "band_z": self.band_z,
            "sigma_log": sigma,
            "excess_sigma": max(excess),
            "fitted_evals": len(series.points),
        }
        why = (
            "held-out eval is above the compute forecast"
            if rule == "forecast"
            else "training loss falls while held-out eval does not"
        )
        series.finding = Finding(
            kind="eval_stall",
            severity=Severity.WARNING,
            timeline=timeline,
            start_step=start,
            end_step=last[0],
            ranks=(),
            score=round(max(excess), 3),
            summary=f"{split} {name} stopped improving against compute from step {start}: {why}",
            evidence=evidence,
            suggested_action=SuggestedAction(
                "investigate", {"step": start}, "check the data pipeline (repeated or mislabelled batches) and the LR"
            ),
            active=True,
            detector=self.name,
        )
        return series.finding


def _cleared(finding: Finding, step: int) -> Finding:
    return replace(finding, active=False, evidence={**finding.evidence, "cleared_at_step": step})


def _compute(row: object) -> tuple[float, str]:
    """The eval's compute and what it is: cumulative FLOPs, else tokens, else the step."""
    for name in ("cum_flops", "cum_tokens", "step"):
        value = getattr(row, name)
        if value is not None and not (isinstance(value, float) and math.isnan(value)) and value > 0:
            return float(value), name
    return float("nan"), "step"


def forecast_evals(
    compute: np.ndarray, values: np.ndarray, at: np.ndarray, *, min_rel_sigma: float = 0.001
) -> tuple[np.ndarray, float] | None:
    """The saturating power law through (compute, values), evaluated at ``at``, and its relative sigma.

    The band the detector holds evals to is ``center * exp(±band_z * sigma)``; None when
    the fit fails. The dashboard draws the same band.
    """
    params = _fit_power_law(compute, values)
    if params is None:
        return None
    residuals = np.log(values) - np.log(_power_law(compute, *params))
    spread = float(mad_sigma(residuals))
    sigma = max(spread * math.sqrt(len(values) / max(len(values) - 3, 1)), min_rel_sigma)  # three fitted parameters
    return _power_law(at, *params), sigma


def _power_law(c: np.ndarray, e: float, a: float, alpha: float, c0: float) -> np.ndarray:
    return e + a * (c / c0) ** -alpha


def _fit_power_law(c: np.ndarray, v: np.ndarray) -> tuple[float, float, float, float] | None:
    """(E, A, alpha, C0) of the saturating power law through (c, v); None when the fit fails."""
    c0 = float(c[0])
    floor = float(v.min())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (e, a, alpha), _ = optimize.curve_fit(
                lambda x, e, a, alpha: _power_law(x, e, a, alpha, c0),
                c,
                v,
                p0=(0.5 * floor, max(float(v[0]) - 0.5 * floor, 1e-6), 0.3),
                bounds=([0.0, 0.0, 0.0], [floor, np.inf, 3.0]),
                maxfev=2000,
            )
    except (RuntimeError, ValueError, optimize.OptimizeWarning):
        return None
    return float(e), float(a), float(alpha), c0
