"""Busy but not learning: held-out eval against compute, forecast by a saturating power law.

Evals of one split and score are fitted, as a function of cumulative compute C, with
``L(C) = E + A * (C / C0) ** -alpha`` (least squares on log scale, bounded so E lies below
the best eval seen). New evals are judged against a prediction interval: the residual
noise over n - 3 degrees of freedom, plus the fit's own uncertainty where it forecasts
(the leverage of the law's gradient against the fit's Jacobian), times Student t's
quantile at the normal tail of ``band_z``. Persistence is measured in evals: the last
``patience``, 2x and 4x ``patience`` evals are held out of the fit and judged together
(their mean against the band of a mean, widened for autocorrelated residuals), so a stall
cannot bend the fit to itself one eval at a time. Evals above the band are kept out of the
fit; the finding grows while each new eval stays above and clears when one comes back
inside, or when the last ``trend_evals`` of them keep falling by more than the band (an
early fit that saturated too soon: the forecast was wrong, not the eval). A second rule
sees the same failure without a forecast: over the last ``trend_evals`` evals the held-out
score's trend does not fall while the training loss falls, by ``train_drop`` and by
``TREND_Z`` standard errors of that trend (the job memorises what it is fed).
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
from .telemetry import TelemetryBatch

LOSS_SCORES = ("loss", "eval_loss", "val_loss")
TREND_Z = 3.0
"""How many standard errors of the eval's trend the training loss must fall by, over the same evals, before
an eval that does not fall counts as not learning (the eval's noise must not pass for a stall)."""


@dataclass
class _Series:
    """One (timeline, split, score) eval series and its episode."""

    points: list[tuple[int, float, float]] = field(default_factory=list)  # (step, compute, value) fitted
    suspects: list[tuple[int, float, float, float, float]] = field(default_factory=list)  # + forecast, sigma
    finding: Finding | None = None
    noise: float = 0.0
    """The eval noise (log scale) of the latest fit; 0 before there is one."""
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
        band_z: float = 4.0,
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
        if not (math.isfinite(value) and math.isfinite(compute) and compute > 0 and value > 0):
            return None
        series = self._series_for(timeline, split, name, step)
        series.compute_unit = unit
        evaluation = (step, compute, value)
        above = self._judge_alone(series, evaluation) if series.suspects else self._judge_window(series, evaluation)
        if not above:
            series.points.extend(s[:3] for s in series.suspects)  # back in the band: they were noise
            series.suspects.clear()
        learning_stopped = self._train_falls_eval_flat(timeline, series, step)
        if above and len(series.suspects) >= self.patience:
            return self._open_or_grow(timeline, split, name, series, "forecast")
        if learning_stopped and (series.finding is None or not series.finding.active):  # a cleared one may reopen
            return self._open_or_grow(timeline, split, name, series, "train_vs_eval")
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

    def _judge_alone(self, series: _Series, evaluation: tuple[int, float, float]) -> bool:
        """While evals are above the band: is this one too (then it joins the suspects)?"""
        forecast = self._forecast(series, series.points, [evaluation])
        if forecast is None:
            series.points.append(evaluation)
            return False
        suspect = (*evaluation, float(forecast.center[0]), float(forecast.sigma[0]))
        width = float(forecast.half_width(self.band_z)[0])
        above = math.log(evaluation[2] / suspect[3]) > width
        # falling steadily, only slower than an early fit said: refit, it is no stall
        if above and not self._still_improving(series.suspects + [suspect], width):
            series.suspects.append(suspect)
            return True
        series.points.append(evaluation)
        return False

    def _judge_window(self, series: _Series, evaluation: tuple[int, float, float]) -> bool:
        """The last ``m`` evals, held out of the fit, against the band of their mean, for ``m`` in
        ``windows()``: above it, they become suspects; else this eval joins the fit. Each window is judged
        against a fit that has not seen it, so a stall cannot bend the fit to itself one eval at a time."""
        for m in self.windows():
            fitted, window = series.points[: len(series.points) - m + 1], series.points[len(series.points) - m + 1 :]
            window = window + [evaluation]
            forecast = self._forecast(series, fitted, window)
            if forecast is None:
                break  # longer windows leave even fewer evals to fit
            excess = np.log([w[2] for w in window]) - np.log(forecast.center)
            width = _t_quantile(self.band_z, forecast.dof) * forecast.mean_sigma
            suspects = [(*w, float(f), float(sg)) for w, f, sg in zip(window, forecast.center, forecast.sigma)]
            if excess.mean() > width and excess.min() > 0 and not self._still_improving(suspects, width):
                series.points, series.suspects = fitted, suspects
                return True
        series.points.append(evaluation)
        return False

    def windows(self) -> tuple[int, ...]:
        """How many of the latest evals are judged together: ``patience``, twice and four times as many."""
        return (self.patience, 2 * self.patience, 4 * self.patience)

    def _forecast(
        self, series: _Series, fitted: list[tuple[int, float, float]], evals: list[tuple[int, float, float]]
    ) -> Forecast | None:
        """The forecast, from the evals ``fitted``, at the computes of ``evals``; None before ``min_evals``."""
        if len(fitted) < self.min_evals:
            return None
        c = np.array([p[1] for p in fitted])
        v = np.array([p[2] for p in fitted])
        forecast = forecast_evals(c, v, np.array([e[1] for e in evals]), min_rel_sigma=self.min_rel_sigma)
        if forecast is not None:
            series.noise = forecast.noise
        return forecast

    def _still_improving(self, evals: list[tuple], width: float) -> bool:
        """The last ``trend_evals`` evals (step, compute, value, ...) fall, by more than the band's half-width
        ``width``, first to last."""
        recent = np.array([e[2] for e in evals[-self.trend_evals :]])
        if len(recent) < self.trend_evals or math.log(recent[0] / recent[-1]) <= width:
            return False
        return bool(stats.spearmanr(np.arange(len(recent)), recent).statistic < 0.0)

    def _train_falls_eval_flat(self, timeline: int, series: _Series, step: int) -> bool:
        """Over the last ``trend_evals`` evals: eval not improving while the training loss keeps falling."""
        recent = (series.points + [s[:3] for s in series.suspects])[-self.trend_evals :]
        if len(recent) < self.trend_evals or len(series.points) < self.min_evals or not series.noise:
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
        x = np.arange(len(evals)) - (len(evals) - 1) / 2
        eval_fall = -(len(evals) - 1) * float(x @ np.log(evals)) / float(x @ x)  # least-squares trend, log scale
        fall_se = (len(evals) - 1) * series.noise / math.sqrt(float(x @ x))
        train_fall = math.log(medians[0] / medians[-1])
        return eval_fall <= 0.0 and train_fall >= max(-math.log1p(-self.train_drop), TREND_Z * fall_se)

    def _open_or_grow(self, timeline: int, split: str, name: str, series: _Series, rule: str) -> Finding:
        suspects = series.suspects
        start = (
            series.finding.start_step
            if series.finding and series.finding.active
            else (suspects[0][0] if suspects else series.points[-self.trend_evals][0])
        )
        last = suspects[-1] if suspects else (*series.points[-1], float("nan"), float("nan"))
        excess = [math.log(v / f) / sigma for _, _, v, f, sigma in suspects] or [0.0]
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
            "sigma_log": last[4],
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


@dataclass(frozen=True)
class Forecast:
    """The fitted law at some computes, and how far one new eval there may fall from it.

    ``sigma`` is, on log scale, the standard error of predicting one new eval at each point: the
    observation noise and the fit's own uncertainty at that compute, ``s * sqrt(1 + h)``. ``dof`` is
    the residual degrees of freedom of the fit (evals minus three parameters).
    """

    center: np.ndarray
    sigma: np.ndarray
    dof: int
    noise: float
    """``s``: the observation noise alone, log scale."""
    mean_sigma: float
    """The standard error of the mean of one new eval at each point: ``s * sqrt(1 / m + h_mean)``."""

    def half_width(self, band_z: float) -> np.ndarray:
        """The band's half-width on log scale: Student t's quantile with ``dof`` degrees of freedom at the
        normal tail of ``band_z``, times ``sigma`` (a z-band widened for a noise estimated from few evals)."""
        return _t_quantile(band_z, self.dof) * self.sigma

    def band(self, band_z: float) -> tuple[np.ndarray, np.ndarray]:
        """(low, high): ``center x exp(-/+ half_width)``."""
        spread = np.exp(self.half_width(band_z))
        return self.center / spread, self.center * spread


def _t_quantile(band_z: float, dof: int) -> float:
    return float(stats.t.ppf(stats.norm.cdf(band_z), max(dof, 1)))


def forecast_evals(
    compute: np.ndarray, values: np.ndarray, at: np.ndarray, *, min_rel_sigma: float = 0.001
) -> Forecast | None:
    """The saturating power law through (compute, values), evaluated at ``at``, with its prediction interval.

    The fit is least squares on log scale. The noise ``s`` is the root mean square of the log residuals
    over ``n - 3`` degrees of freedom (unbiased for the variance, unlike a median-based spread from a few
    points), at least ``min_rel_sigma``; the fit's uncertainty at a compute is the leverage
    ``h = g (J'J)^+ g'`` of the law's log-gradient ``g`` there against the fit's Jacobian ``J`` (the
    delta method: the parameter covariance is ``s^2 (J'J)^-1``). None when the fit fails or has no
    degree of freedom. The detector holds evals to this band; the dashboard draws the same.
    """
    n = len(values)
    fitted = _fit_power_law(compute, values) if n > 3 else None
    if fitted is None:
        return None
    params, jac = fitted
    residuals = np.log(values) - np.log(_power_law(compute, *params))
    s = max(math.sqrt(float(residuals @ residuals) / (n - 3)), min_rel_sigma)
    grad = _log_gradient(at, *params)
    unit_cov = np.linalg.pinv(jac.T @ jac)
    leverage = np.maximum(np.einsum("ij,jk,ik->i", grad, unit_cov, grad), 0.0)
    mean_grad = grad.mean(axis=0)
    mean_leverage = max(float(mean_grad @ unit_cov @ mean_grad), 0.0)
    noise_of_mean = _mean_variance_factor(residuals, len(at)) / len(at)
    return Forecast(
        _power_law(at, *params), s * np.sqrt(1.0 + leverage), n - 3, s, s * math.sqrt(noise_of_mean + mean_leverage)
    )


def _mean_variance_factor(residuals: np.ndarray, m: int) -> float:
    """How much more than ``1 / m`` of the noise variance the mean of ``m`` consecutive new evals keeps:
    ``1 + 2 sum_k (1 - k/m) rho^k`` for the lag-1 autocorrelation ``rho`` of the fit's residuals (in
    [0, 0.9]: correlated eval noise, or a family that misfits the curve, averages out more slowly)."""
    centred = residuals - residuals.mean()
    denominator = float(centred @ centred)
    rho = float(centred[1:] @ centred[:-1]) / denominator if denominator > 0 else 0.0
    rho = min(max(rho, 0.0), 0.9)
    k = np.arange(1, m)
    return 1.0 + 2.0 * float(np.sum((1.0 - k / m) * rho**k))


def _power_law(c: np.ndarray, e: float, a: float, alpha: float, c0: float) -> np.ndarray:
    return e + a * (c / c0) ** -alpha


def _log_gradient(c: np.ndarray, e: float, a: float, alpha: float, c0: float) -> np.ndarray:
    """d log L / d (E, A, alpha) at each compute: one row per point."""
    u = (c / c0) ** -alpha
    law = e + a * u
    return np.column_stack([1.0 / law, u / law, -a * u * np.log(c / c0) / law])


def _fit_power_law(c: np.ndarray, v: np.ndarray) -> tuple[tuple[float, float, float, float], np.ndarray] | None:
    """(E, A, alpha, C0) of the saturating power law through (c, v), least squares on log scale, and the
    Jacobian of the log residuals there; None when the fit fails."""
    c0 = float(c[0])
    floor = float(v.min())
    log_v = np.log(v)

    def residuals(p: np.ndarray) -> np.ndarray:
        return np.log(_power_law(c, p[0], p[1], p[2], c0)) - log_v

    def jacobian(p: np.ndarray) -> np.ndarray:
        return _log_gradient(c, p[0], p[1], p[2], c0)

    start = np.array([0.5 * floor, max(float(v[0]) - 0.5 * floor, 1e-6), 0.3])
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            fit = optimize.least_squares(
                residuals, start, jac=jacobian, bounds=([0.0, 1e-12, 0.0], [floor, np.inf, 3.0]), max_nfev=200
            )
    except (RuntimeError, ValueError):
        return None
    if fit.status <= 0 or not np.all(np.isfinite(fit.jac)):
        return None
    e, a, alpha = (float(x) for x in fit.x)
    return (e, a, alpha, c0), fit.jac
