"""Seeded eval curves of varied shapes, with and without a stall, and the eval-stall detector's calibration on them.

Used by ``tests/test_eval_stall_calibration.py`` (a few dozen curves) and ``bench/eval_stall_calibration.py``
(a few hundred). Every curve is drawn from its own seed: a shape, a noise model and level, a number of evals,
and, for a stalled curve, the eval after which the held-out loss stays where it was while the training loss
keeps following the curve. The shapes are families the detector does *not* fit, beside the one it does:

- ``power_law``: ``E + A x^-alpha``, the detector's own family;
- ``exponential``: ``E + A exp(-x / tau)``, saturating faster than any power law, to flat within the run;
- ``warmup``: a power law in LR-weighted progress under a linear warmup over the first evals;
- ``cosine``: a power law in LR-weighted progress under a cosine decay to 10%, plus the annealing bonus
  (the loss drops as the LR falls);
- ``lr_drop``: the same under a step schedule (LR x0.1 at 60-80% of the run): a sudden drop, then slower.

Noise is on log scale: normal, Student-t(3) (scaled to the same standard deviation), or AR(1) with phi 0.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import signal

from bedside.detectors.eval_stall import EvalStallDetector
from bedside.detectors.telemetry import EVAL_COLUMNS, STEP_COLUMNS, TelemetryBatch

SHAPES = ("power_law", "exponential", "warmup", "cosine", "lr_drop")
NOISES = ("gaussian", "student_t3", "ar1")
STEPS_PER_EVAL = 10
FLOPS_PER_STEP = 1e15
TRAIN_SIGMA = 0.01
PEAK_LR = 3e-4
DETECTABLE_SIGMA = 6.0
"""A stall is *detectable* when the clean curve would have fallen by at least this many noise sigmas over the
3 eval intervals after its onset: less than that is within the noise of a few evals, and no test can be asked to
tell it from a flat curve that soon."""


@dataclass(frozen=True)
class Curve:
    """One drawn curve: its shape, noise, length, stall (the last eval on the curve, or None) and seed."""

    seed: int
    shape: str
    noise: str
    sigma: float
    evals: int
    stall_at: int | None
    clean: np.ndarray
    """The noise-free held-out loss at each eval, without the stall."""
    lr: np.ndarray
    """The learning rate over the steps before each eval, relative to its peak (what the run reports)."""

    def detectable(self) -> bool:
        if self.stall_at is None:
            return False
        k = self.stall_at
        return math.log(self.clean[k] / self.clean[min(k + 3, self.evals - 1)]) >= DETECTABLE_SIGMA * self.sigma


def draw(seed: int, *, stalled: bool) -> Curve:
    """The curve of ``seed``: every choice is drawn from ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    shape = SHAPES[rng.integers(len(SHAPES))]
    noise = NOISES[rng.integers(len(NOISES))]
    sigma = float(np.exp(rng.uniform(np.log(0.002), np.log(0.02))))
    evals = int(rng.integers(10, 61))
    clean, lr = _clean(rng, shape, evals)
    stall_at = int(rng.integers(max(6, evals // 3), evals - 3)) if stalled else None
    return Curve(seed, shape, noise, sigma, evals, stall_at, clean, lr)


def _clean(rng: np.random.Generator, shape: str, evals: int) -> tuple[np.ndarray, np.ndarray]:
    """The noise-free held-out loss at each eval, and the LR (relative to its peak) of the steps before it."""
    t = np.arange(1, evals + 1, dtype=float)  # eval index; compute is proportional to it
    floor = rng.uniform(1.5, 3.0)
    amplitude = floor * rng.uniform(0.3, 2.0)
    lr = np.ones(evals)
    if shape == "exponential":
        tau = evals / rng.uniform(1.0, 4.0)
        return floor + amplitude * np.exp(-t / tau), lr
    if shape == "warmup":
        lr = np.minimum(1.0, t / rng.integers(2, max(3, evals // 5) + 1))
    elif shape == "cosine":
        lr = 0.1 + 0.45 * (1 + np.cos(math.pi * (t - 1) / (evals - 1)))
    elif shape == "lr_drop":
        lr = np.where(t > rng.uniform(0.6, 0.8) * evals, 0.1, 1.0)
    x0 = float(np.exp(rng.uniform(np.log(0.3), np.log(3.0))))  # where the run starts on the curve
    progress = x0 + np.cumsum(lr) - lr[0]
    alpha = rng.uniform(0.15, 0.8)
    curve = floor + amplitude * (progress / x0) ** -alpha
    if shape in ("cosine", "lr_drop"):  # the annealing bonus: the loss falls as the LR does
        curve -= 0.3 * amplitude * (progress[-1] / x0) ** -alpha * (1.0 - lr)
    return curve, lr


def log_noise(rng: np.random.Generator, kind: str, n: int, sigma: float) -> np.ndarray:
    if kind == "gaussian":
        eps = rng.standard_normal(n)
    elif kind == "student_t3":
        eps = rng.standard_t(3, n) / math.sqrt(3.0)
    else:
        phi = 0.5
        eps = signal.lfilter([math.sqrt(1 - phi**2)], [1.0, -phi], rng.standard_normal(n))
    return sigma * eps


def telemetry(curve: Curve, *, report_lr: bool = True) -> TelemetryBatch:
    """The curve's evals (``heldout`` ``loss`` every ``STEPS_PER_EVAL`` steps) and the training loss between them,
    with the learning rate of its schedule (``report_lr``; else none, as an import that logged no LR)."""
    rng = np.random.default_rng([curve.seed, 1])
    values = curve.clean.copy()
    if curve.stall_at is not None:
        values[curve.stall_at + 1 :] = values[curve.stall_at]
    values *= np.exp(log_noise(rng, curve.noise, curve.evals, curve.sigma))
    at = np.arange(1, curve.evals + 1) * STEPS_PER_EVAL
    steps = np.arange(1, at[-1] + 1)
    train = 0.97 * np.interp(steps, at, curve.clean) * np.exp(TRAIN_SIGMA * rng.standard_normal(len(steps)))
    evals = pd.DataFrame(
        {
            "timeline": 0,
            "step": at,
            "time": at + 0.5,
            "split": "heldout",
            "name": "loss",
            "value": values,
            "cum_tokens": at * 65_536.0,
            "cum_flops": at * FLOPS_PER_STEP,
        }
    )[list(EVAL_COLUMNS)]
    train_rows = pd.DataFrame(
        {
            "timeline": 0,
            "step": steps,
            "time": steps.astype(float),
            "rank": 0,
            "seq": steps,
            "loss": train,
            "grad_norm": 1.0,
            "lr": PEAK_LR * np.repeat(curve.lr, STEPS_PER_EVAL) if report_lr else np.nan,
            "tokens": 65_536.0,
            "flops": FLOPS_PER_STEP,
            "shards": None,
        }
    )[list(STEP_COLUMNS)]
    return TelemetryBatch(steps=train_rows, evals=evals)


def first_reports(curve: Curve, *, report_lr: bool = True, **settings: float) -> list[int]:
    """The eval index at which each finding was first reported, in order."""
    reported: dict[str, int] = {}
    for finding in EvalStallDetector(**settings).update(telemetry(curve, report_lr=report_lr)):
        reported.setdefault(finding.finding_id, finding.end_step // STEPS_PER_EVAL - 1)
    return sorted(reported.values())


@dataclass(frozen=True)
class Calibration:
    """Over stall-free curves, the share with any finding; over stalled ones, recall within 3 eval intervals."""

    clean_runs: int
    false_stalls: int
    stalled_runs: int
    detectable: int
    found_within_3: int
    found_within_3_all: int
    found_ever: int
    false_by_shape: dict[str, tuple[int, int]]

    @property
    def false_stall_rate(self) -> float:
        return self.false_stalls / max(self.clean_runs, 1)

    @property
    def recall_within_3(self) -> float:
        """Over detectable stalls: found within 3 eval intervals of the onset."""
        return self.found_within_3 / max(self.detectable, 1)


def calibrate(runs: int, *, first_seed: int = 0, report_lr: bool = True, **settings: float) -> Calibration:
    """``runs`` stall-free curves (seeds ``first_seed`` on) and ``runs`` stalled ones (the next seeds), their
    telemetry with the LR of their schedule or (``report_lr`` False) without any."""
    false_by_shape: dict[str, list[int]] = {s: [0, 0] for s in SHAPES}
    false_stalls = 0
    for seed in range(first_seed, first_seed + runs):
        curve = draw(seed, stalled=False)
        flagged = bool(first_reports(curve, report_lr=report_lr, **settings))
        false_stalls += flagged
        false_by_shape[curve.shape][0] += flagged
        false_by_shape[curve.shape][1] += 1
    detectable = within_3 = within_3_all = ever = 0
    for seed in range(first_seed + runs, first_seed + 2 * runs):
        curve = draw(seed, stalled=True)
        assert curve.stall_at is not None
        after = [
            j - curve.stall_at for j in first_reports(curve, report_lr=report_lr, **settings) if j > curve.stall_at
        ]
        hit = bool(after) and after[0] <= 3
        ever += bool(after)
        within_3_all += hit
        if curve.detectable():
            detectable += 1
            within_3 += hit
    return Calibration(
        runs,
        false_stalls,
        runs,
        detectable,
        within_3,
        within_3_all,
        ever,
        {s: (f, n) for s, (f, n) in false_by_shape.items()},
    )
