"""Busy but not learning: held-out eval against compute, forecast by a saturating law.

Evals of one split and score are fitted, as a function of the progress C the run made (the LR-weighted
progress ``sum(lr x tokens)`` where the run reports its LR, ``eval_progress.py``; else cumulative compute), by the power law
``E + A (C / C0)^-alpha`` and by exponential saturation ``E + A exp(-k C)``, the better by AICc
(``eval_forecast.py``: least squares on log scale, E below the best eval seen). New evals are
judged against a prediction interval: the residual noise over n - 3 degrees of freedom, plus the
fit's own uncertainty where it forecasts (the leverage of the law's gradient against the fit's
Jacobian), times Student t's quantile at the normal tail of ``band_z``. Persistence is measured in evals
(``eval_windows.py``): the last
``patience``, 2x and 4x ``patience`` evals are held out of the fit and judged together
(their mean against the band of a mean, widened for autocorrelated residuals), so a stall
cannot bend the fit to itself one eval at a time. Evals above the band are kept out of the
fit; the finding grows while each new eval stays above and clears when one comes back
inside, or when the last ``trend_evals`` of them keep falling by more than the band (an
early fit that saturated too soon: the forecast was wrong, not the eval). A second rule
sees the same failure without a forecast: over the last ``trend_evals`` evals the held-out
score's trend does not fall while the training loss falls, by ``train_drop`` and by
``TREND_Z`` standard errors of that trend (the job memorises what it is fed). A third judges the eval
against the training loss (``eval_gap.py``): the gap of the latest ``patience``, 2x and 4x ``patience`` evals
to the training loss at their steps, against the band of the gaps of the fitted evals before them, while the
eval does not improve. The newest eval of a window counts up to its own band (one jump cannot open a
finding), and an excess over the forecast that the training loss shares (it rose by over half of it, the gap by
under half: a spike or divergence of the training) opens none and clears one open.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .detector import Detector
from .eval_forecast import Forecast, ar1_correlation, forecast_evals, t_quantile
from .eval_gap import GapBand, gap_band
from .eval_progress import TrainingRecord
from .eval_windows import EvalSeries, WindowJudge, capped
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, POSITIVE, Range, ranges
from .telemetry import TelemetryBatch

__all__ = ["LOSS_SCORES", "EvalStallDetector", "forecast_evals"]  # forecast_evals: the dashboard draws the same band

LOSS_SCORES = ("loss", "eval_loss", "val_loss")
GAP_REFERENCE = 12
"""How many of the latest fitted evals give the reference band of the eval's gap to the training loss: enough
for a noise estimate (t's quantile with 11 degrees of freedom), few enough to follow a gap that drifts."""
TREND_Z = 3.0
"""How many standard errors of the eval's trend the training loss must fall by, over the same evals, before
an eval that does not fall counts as not learning (the eval's noise must not pass for a stall): the normal
tail, taken as Student t's quantile there for a noise estimated from few evals."""


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
        self.judge = WindowJudge(min_evals, band_z, min_rel_sigma, patience, trend_evals)
        self._series: dict[tuple[int, str, str], EvalSeries] = {}
        self._train = TrainingRecord()

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        self._train.take(batch)
        evals = batch.evals
        if evals.empty:
            return []
        evals = evals[evals["name"].isin(LOSS_SCORES)]
        out = []
        for row in evals.itertuples(index=False):
            compute, unit = self._train.progress(int(row.timeline), int(row.step)) or _compute(row)
            found = self._observe(
                int(row.timeline), str(row.split), str(row.name), int(row.step), compute, unit, float(row.value)
            )
            if found is not None:
                out.append(found)
        return out

    def _observe(
        self, timeline: int, split: str, name: str, step: int, compute: float, unit: str, value: float
    ) -> Finding | None:
        if not (math.isfinite(value) and math.isfinite(compute) and compute > 0 and value > 0):
            return None
        series = self._series_for(timeline, split, name, step)
        series.compute_unit = unit
        self._take_gap(timeline, series, step, value)
        evaluation = (step, compute, value)
        above = self.judge.judge(series, evaluation)
        if not above:  # back in the band: the suspects were noise, and rejoin the fit before this eval, in order
            series.points.extend([*(s[:3] for s in series.suspects), evaluation])
            series.suspects.clear()
        gap_up = self._judge_gap(series)
        learning_stopped = self._train_falls_eval_flat(timeline, series, step)
        shared = above and len(series.suspects) >= self.patience and self._train_rose_with_eval(series)
        if above and len(series.suspects) >= self.patience and not shared:
            return self._open_or_grow(timeline, split, name, series, "forecast")
        if gap_up:
            return self._open_or_grow(timeline, split, name, series, "eval_vs_train")
        if learning_stopped and (series.finding is None or not series.finding.active):  # a cleared one may reopen
            return self._open_or_grow(timeline, split, name, series, "train_vs_eval")
        if series.finding is not None and series.finding.active and (shared or not above) and not learning_stopped:
            series.finding = _cleared(series.finding, step)
            return series.finding
        return None

    def _series_for(self, timeline: int, split: str, name: str, step: int) -> EvalSeries:
        """The series on ``timeline``; a new timeline starts from its parent's evals before ``step``."""
        key = (timeline, split, name)
        if key not in self._series:
            parents = [k for k in self._series if k[1:] == (split, name) and k[0] < timeline]
            parent = self._series[max(parents)] if parents else EvalSeries()
            self._series[key] = EvalSeries(
                points=[p for p in parent.points if p[0] < step],
                steps=[s for s in parent.steps if s < step],
                gaps={s: g for s, g in parent.gaps.items() if s < step},
            )
        return self._series[key]

    def _take_gap(self, timeline: int, series: EvalSeries, step: int, value: float) -> None:
        """The eval's step, and its gap to the training loss at that step (when the run has one there)."""
        if series.steps and step <= series.steps[-1]:
            return  # an eval written again: the first one stands
        series.steps.append(step)
        if len(series.steps) >= 3:
            level = self._train.level(timeline, (series.steps[-3], series.steps[-2], step))
            if level is not None:
                series.gaps[step] = (level, math.log(value) - level)

    def _reference(self, series: EvalSeries, before: int) -> GapBand | None:
        """The band of the gaps of the latest ``GAP_REFERENCE`` fitted evals before step ``before``."""
        fitted = [p[0] for p in series.points if p[0] < before and p[0] in series.gaps][-GAP_REFERENCE:]
        if len(fitted) < self.min_evals - 1:
            return None
        return gap_band([series.gaps[s][1] for s in fitted], min_rel_sigma=self.min_rel_sigma)

    def _judge_gap(self, series: EvalSeries) -> bool:
        """Eval against the training loss: has the gap of the latest evals risen out of its band while the eval
        did not improve? While it holds, each new eval must stay above the band of one gap, or it clears."""
        latest = series.steps[-1]
        if latest not in series.gaps:
            series.gap_hold = None
            return False
        if series.gap_hold is not None:
            band = self._reference(series, series.gap_hold)
            if band is not None and series.gaps[latest][1] - band.level > band.width(1, self.band_z):
                return True
            series.gap_hold = None
            return False
        for m in self.judge.windows():
            window = series.steps[-m:]
            if len(window) < m or any(s not in series.gaps for s in window):
                break
            band = self._reference(series, window[0])
            if band is None:
                break
            excess = capped(np.array([series.gaps[s][1] for s in window]) - band.level, band.width(1, self.band_z))
            if (
                excess.mean() > band.width(m, self.band_z)
                and excess.min() > 0
                and self._eval_flat(series, window)
                and not self._training_rise(series, window, window[0]) > excess.mean()  # the training's own move
            ):
                series.gap_hold = window[0]
                return True
        return False

    def _training_rise(self, series: EvalSeries, steps: list[int], before: int) -> float:
        """How far the training loss at ``steps`` (their mean level, log scale) is above the lowest it was at the
        latest ``GAP_REFERENCE`` fitted evals before step ``before`` (NaN without them): a rise is the training's
        own spike, divergence or recovery from one, whose sudden moves the level at an eval lags."""
        reference = [p[0] for p in series.points if p[0] < before and p[0] in series.gaps][-GAP_REFERENCE:]
        if not reference or any(s not in series.gaps for s in steps):
            return math.nan
        return float(np.mean([series.gaps[s][0] for s in steps])) - min(series.gaps[s][0] for s in reference)

    def _eval_flat(self, series: EvalSeries, window: list[int]) -> bool:
        """The evals of ``window`` are, on average, no lower than the last eval before it (log scale: eval =
        gap + training level)."""
        before = [s for s in series.steps if s < window[0] and s in series.gaps]
        if not before:
            return False
        mean = float(np.mean([sum(series.gaps[s]) for s in window]))
        return mean >= sum(series.gaps[before[-1]])

    def _train_rose_with_eval(self, series: EvalSeries) -> bool:
        """The suspects' excess over the forecast is the training loss's: the training loss at them rose above
        the lowest of its level at the latest fitted evals by over half their excess, and their gap to it by under
        half (a spike or a divergence of the training itself, which the loss detectors report; not a stall)."""
        suspects = [s for s in series.suspects if s[0] in series.gaps]
        band = self._reference(series, series.suspects[0][0])
        if len(suspects) < len(series.suspects) or band is None:
            return False
        excess = float(np.mean([math.log(s[2] / s[3]) for s in suspects]))
        gap_rise = float(np.mean([series.gaps[s[0]][1] for s in suspects])) - band.level
        train_rise = self._training_rise(series, [s[0] for s in suspects], suspects[0][0])
        return train_rise > excess / 2 > gap_rise

    def _train_falls_eval_flat(self, timeline: int, series: EvalSeries, step: int) -> bool:
        """Over the last ``trend_evals`` evals: eval not improving while the training loss keeps falling."""
        recent = (series.points + [s[:3] for s in series.suspects])[-self.trend_evals :]
        latest = series.latest
        if len(recent) < self.trend_evals or len(series.points) < self.min_evals or latest is None:
            return False
        evals = np.array([r[2] for r in recent])
        first_step = recent[0][0]
        train = self._train.losses(timeline, first_step, step)
        if len(train) < 2 * self.trend_evals:
            return False
        bins = np.array_split(np.array(train), self.trend_evals)
        medians = np.log([np.median(b) for b in bins])
        # a fall counts down from the lowest the training was before (a recovery from its own spike is no learning)
        before = [g[0] for s, g in series.gaps.items() if s < first_step][-GAP_REFERENCE:]
        train_fall = min(medians[0], *before) - medians[-1]
        eval_fall, fall_se = _trend_fall(evals, latest)
        needed = max(-math.log1p(-self.train_drop), t_quantile(TREND_Z, latest.dof) * fall_se)
        return eval_fall <= 0.0 and train_fall >= needed

    def _open_or_grow(self, timeline: int, split: str, name: str, series: EvalSeries, rule: str) -> Finding:
        suspects = series.suspects if rule == "forecast" else []
        first = {"forecast": suspects[0][0] if suspects else None, "eval_vs_train": series.gap_hold}.get(rule)
        start = (
            series.finding.start_step
            if series.finding and series.finding.active
            else (
                first if first is not None else (series.points + [s[:3] for s in series.suspects])[-self.trend_evals][0]
            )
        )
        last = suspects[-1] if suspects else (*series.points[-1], float("nan"), float("nan"))
        if not suspects and series.suspects and series.suspects[-1][0] > last[0]:
            last = series.suspects[-1]
        excess = [math.log(v / f) / sigma for _, _, v, f, sigma in suspects] or self._gap_excess(series) or [0.0]
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
            "law": series.latest.law if series.latest else "",
        }
        why = {
            "forecast": "held-out eval is above the compute forecast",
            "eval_vs_train": "held-out eval rose against the training loss and did not improve",
        }.get(rule, "training loss falls while held-out eval does not")
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

    def _gap_excess(self, series: EvalSeries) -> list[float]:
        """While the gap rule holds: each held eval's gap above the reference, in the reference's noise."""
        band = self._reference(series, series.gap_hold) if series.gap_hold is not None else None
        if band is None:
            return []
        held = [s for s in series.steps if s >= (series.gap_hold or 0) and s in series.gaps]
        return [(series.gaps[s][1] - band.level) / band.noise for s in held]


def _trend_fall(evals: np.ndarray, latest: Forecast) -> tuple[float, float]:
    """How far ``evals`` fall, first to last, by their robust trend on log scale (Theil-Sen: the median of the
    slopes between every pair, so that no one eval, a bad eval batch or an eval on a spike, makes the trend), and
    the standard error of the least-squares trend under the latest fit's noise, correlated as that fit's residuals
    are (lag-1 autocorrelation)."""
    n = len(evals)
    x = np.arange(n) - (n - 1) / 2
    weights = (n - 1) * x / float(x @ x)
    fall_se = latest.noise * math.sqrt(float(weights @ ar1_correlation(latest.rho, n) @ weights))
    i, j = np.triu_indices(n, 1)
    log_evals = np.log(evals)
    slope = float(np.median((log_evals[j] - log_evals[i]) / (j - i)))
    return -slope * (n - 1), fall_se


def _cleared(finding: Finding, step: int) -> Finding:
    return replace(finding, active=False, evidence={**finding.evidence, "cleared_at_step": step})


def _compute(row: object) -> tuple[float, str]:
    """The eval's compute and what it is: cumulative FLOPs, else tokens, else the step."""
    for name in ("cum_flops", "cum_tokens", "step"):
        value = getattr(row, name)
        if value is not None and not (isinstance(value, float) and math.isnan(value)) and value > 0:
            return float(value), name
    return float("nan"), "step"
