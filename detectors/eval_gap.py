"""The held-out eval against the training loss: their gap, and how far the latest evals may move it.

Where the run reports its training loss, the gap ``g = log(eval) - log(train)`` at each eval (the training
loss at the eval's step: ``TrainingRecord.level``) is smooth where the curve is not: a warmup, an LR drop,
a cosine anneal or a spike move both losses together and leave the gap where it was. A stall moves the
eval alone. The gap of the last ``m`` evals is judged against the gaps of the evals before them
(``reference``): their mean, their standard deviation ``s`` (drift included: a conservative band), and the
lag-1 autocorrelation of their deviations, so that the mean of ``m`` correlated gaps and the error of the
reference mean both widen the band ``t s sqrt(f(m, rho) / m + 1 / n)``, ``t`` Student t's quantile with
``n - 1`` degrees of freedom at the normal tail of ``band_z``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .eval_forecast import ar1_correlation, lag1_autocorrelation, t_quantile


@dataclass(frozen=True)
class GapBand:
    """The reference gaps' mean, noise ``s`` and autocorrelation, and how many there are."""

    level: float
    noise: float
    rho: float
    n: int

    def width(self, m: int, band_z: float) -> float:
        """The band's half-width for the mean of ``m`` new gaps."""
        noise_of_mean = float(np.sum(ar1_correlation(self.rho, m))) / m**2
        return t_quantile(band_z, self.n - 1) * self.noise * math.sqrt(noise_of_mean + 1.0 / self.n)


def gap_band(reference: list[float], *, min_rel_sigma: float) -> GapBand | None:
    """The band of ``reference`` gaps; None with fewer than three."""
    if len(reference) < 3:
        return None
    gaps = np.array(reference)
    noise = max(float(gaps.std(ddof=1)), min_rel_sigma)
    return GapBand(float(gaps.mean()), noise, lag1_autocorrelation(gaps), len(gaps))
