"""The eval forecast's band: where held-out eval should be next, and how far one eval there may fall.

The band is the noise plus the fit's own uncertainty where it forecasts (the leverage term), so it widens as the
forecast reaches past the evals it was fitted to, and it holds its share of the evals that come later. Curves of
two laws with Gaussian and Student-t noise, fitted to few evals and to many.
"""

from __future__ import annotations

import numpy as np
import pytest

from bedside.detectors.eval_forecast import forecast_evals

BAND_Z = 2.0  # a two-sided normal band of 95.4%
NOISE = 0.01  # the eval noise, log scale
CURVES = 200


def compute(fitted: int, later: int) -> np.ndarray:
    """Eval computes spaced evenly on log scale, 40x from the first to the last."""
    return np.geomspace(1.0, 40.0, fitted + later) * 1e15


def truth(law: str, c: np.ndarray, fitted: int) -> np.ndarray:
    if law == "power_law":
        return 2.0 + 1.5 * (c / c[0]) ** -0.5
    return 2.0 + 1.5 * np.exp(-3.0 * (c - c[0]) / (c[fitted - 1] - c[0]))


def noise(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Unit-variance noise: Gaussian, or Student's t with 3 degrees of freedom (heavy tails)."""
    return rng.standard_normal(n) if kind == "gaussian" else rng.standard_t(3, n) / np.sqrt(3.0)


@pytest.mark.parametrize("law", ["power_law", "exponential"])
def test_the_band_widens_as_the_forecast_reaches_past_the_fitted_evals(law: str) -> None:
    c = compute(10, 10)
    values = truth(law, c, 10) * np.exp(NOISE * noise("gaussian", np.random.default_rng(1), 20))
    forecast = forecast_evals(c[:10], values[:10], c[10:])
    assert forecast is not None and forecast.law == law
    assert np.all(np.diff(forecast.sigma) > 0), forecast.sigma
    assert forecast.sigma[0] > forecast.noise * 1.01  # the fit's own uncertainty adds to the noise


@pytest.mark.parametrize("kind", ["gaussian", "student_t3"])
@pytest.mark.parametrize("law", ["power_law", "exponential"])
@pytest.mark.parametrize(("fitted", "later", "share"), [(20, 10, 0.9), (8, 8, 0.65)])
def test_the_band_holds_its_share_of_the_evals_that_come_later(
    law: str, kind: str, fitted: int, later: int, share: float
) -> None:
    """Nominal 95%. Measured over 200 curves: 20 evals forecasting 10 later (up to 2x the compute) hold 93-97% of
    them; without the leverage term 80-86%. Fitted to 8 and forecasting 8 (5x the compute) the band holds only
    73-91% (the choice between the laws is uncertain too, and the band does not count that); without the
    leverage term 43-76%."""
    rng = np.random.default_rng(7)
    c = compute(fitted, later)
    held = []
    for _ in range(CURVES):
        values = truth(law, c, fitted) * np.exp(NOISE * noise(kind, rng, fitted + later))
        forecast = forecast_evals(c[:fitted], values[:fitted], c[fitted:])
        assert forecast is not None
        low, high = forecast.band(BAND_Z)
        held.append(np.mean((values[fitted:] >= low) & (values[fitted:] <= high)))
    assert np.mean(held) >= share, np.mean(held)
