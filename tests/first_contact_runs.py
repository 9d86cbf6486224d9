"""The first minutes of runs of many shapes, each with one fault: the labelled half of the first-contact benchmark.

A run's loss falls from its start by a factor of 3 to 300 toward its floor, on one of several initial-descent
shapes (exponential, power law, either behind a linear warm-up of the learning rate), over time scales of 5 to
200 steps, under Gaussian, Student-t (3 degrees of freedom) or AR(1) log noise of 1% to 10%. One fault starts at
an onset from step 20 to 2,000; the run goes on 100 steps past it. ``score`` runs the library's detectors over
it and says whether the fault was found, how late, and what alarmed before it. Used by
``bench/detect_quality.py --suite first_contact`` (every combination) and ``tests/test_detect_first_contact.py``
(a slice of each family).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import telemetry_frames as tf

from bedside.detectors import detect
from bedside.detectors.finding import Severity

SHAPES = ("exponential", "power_law", "warmup_exponential", "warmup_power_law")
FAULTS = ("blow_up", "creep", "spike", "plateau", "nan")
ONSETS = (20, 50, 150, 500, 2000)
AFTER = 100
"""Steps of run after the onset."""
FOUND_BY = {"blow_up": "loss_spike", "creep": "loss_spike", "spike": "loss_spike", "plateau": "loss_spike"}
"""The finding kind that should name each fault (a NaN: ``nonfinite``)."""


@dataclass(frozen=True)
class Case:
    """One run: its descent, noise, fault and onset."""

    shape: str
    scale: float
    """Steps over which the descent does most of its work (its time constant)."""
    drop: float
    """The loss at step 0 over its floor."""
    noise: str
    sigma: float
    fault: str
    ratio: float
    """How large the fault is: the loss over its level at the peak (blow-up, spike, plateau), or per step (creep)."""
    onset: int
    seed: int

    @property
    def visible(self) -> int:
        """The first step at which the fault has the loss at least twice its level (a NaN: its step): delays
        count from here, since a blow-up that climbs or creeps is no incident until it has."""
        if self.fault == "blow_up":
            return self.onset + max(math.ceil(5 * math.log(2) / math.log(self.ratio)) - 1, 0)
        if self.fault == "creep":
            return self.onset + math.ceil(math.log(2) / math.log(self.ratio)) - 1
        return self.onset

    @property
    def name(self) -> str:
        return f"{self.shape}/{self.scale:g}/{self.fault}x{self.ratio:g}@{self.onset}/{self.noise}"


def descent(shape: str, scale: float, drop: float, steps: np.ndarray) -> np.ndarray:
    """The loss without noise: from ``drop`` times the floor (1.0) toward it."""
    warm = shape.startswith("warmup_")
    t = np.cumsum(np.minimum(1.0, steps / (2 * scale))) if warm else steps.astype(float)  # the LR's running sum
    if shape.endswith("exponential"):
        return 1.0 + (drop - 1.0) * np.exp(-t / scale)
    return 1.0 + (drop - 1.0) * (1.0 + t / scale) ** -1.5


def run(case: Case) -> pd.DataFrame:
    """The job's loss and gradient norm per step, the fault applied from ``case.onset``."""
    rng = np.random.default_rng(case.seed)
    n = case.onset + AFTER
    step = np.arange(1, n + 1)
    loss = descent(case.shape, case.scale, case.drop, step) * np.exp(tf.log_noise(rng, case.noise, n, case.sigma))
    grad = np.exp(tf.log_noise(rng, case.noise, n, 2 * case.sigma)) * (1.0 + 0.5 * np.exp(-step / case.scale))
    at = case.onset - 1
    if case.fault == "blow_up":  # the LR jumps: the loss climbs over 5 steps to ``ratio`` times and stays
        rise = np.minimum(np.arange(1, n - at + 1) / 5.0, 1.0)
        loss[at:] *= case.ratio**rise
        grad[at:] *= case.ratio**rise
    elif case.fault == "creep":
        growth = case.ratio ** np.minimum(np.arange(1, n - at + 1), 40)
        loss[at:] *= growth
        grad[at:] *= growth
    elif case.fault == "spike":
        loss[at] *= case.ratio
        grad[at] *= case.ratio
    elif case.fault == "plateau":
        loss[at : at + 5] *= case.ratio
        grad[at : at + 5] *= case.ratio
    elif case.fault == "nan":
        loss[at] = np.nan
    frame = tf.steps_frame(1.8e9 + step.astype(float), first_step=1)
    return frame.assign(loss=loss, grad_norm=grad)


@dataclass(frozen=True)
class Outcome:
    case: Case
    delay: int | None
    """Steps from the fault's ``visible`` step to the first finding of its kind at warning or above, opened
    from its onset on; None: not found."""
    early: tuple[str, ...]
    """Summaries of the alarms (warning or critical) that opened before the onset."""


def score(case: Case) -> Outcome:
    kind = FOUND_BY.get(case.fault, "nonfinite")
    findings = detect(steps=run(case), only=["loss_spike", "grad_spike", "nonfinite"]).findings
    alarms = [f for f in findings if f.severity != Severity.INFO]
    early = tuple(f.summary for f in alarms if f.start_step < case.onset)
    found = [f.start_step - case.visible for f in alarms if f.kind == kind and f.start_step >= case.onset]
    return Outcome(case, min(found) if found else None, early)


def cases(*, seeds: int = 1, quick: bool = False) -> list[Case]:
    """Every combination of descent, noise, fault and onset (``quick``: fewer scales, noises and sizes)."""
    scales = (5.0, 40.0) if quick else (5.0, 20.0, 80.0, 200.0)
    noises = (("gaussian", 0.03), ("student_t3", 0.03)) if quick else (
        ("gaussian", 0.01), ("gaussian", 0.05), ("student_t3", 0.03), ("ar1", 0.03), ("gaussian", 0.1)
    )  # fmt: skip
    faults = (("blow_up", 30.0), ("creep", 1.15), ("spike", 3.0), ("plateau", 2.0), ("nan", 1.0))
    if not quick:
        faults += (("blow_up", 3.0), ("spike", 2.0))
    out = []
    for i, (shape, scale, (noise, sigma), (fault, ratio), onset, seed) in enumerate(
        itertools.product(SHAPES, scales, noises, faults, ONSETS, range(seeds))
    ):
        drop = (3.0, 30.0, 300.0)[i % 3]
        out.append(Case(shape, scale, drop, noise, sigma, fault, ratio, onset, 1000 * seed + i))
    return out
