"""Where held-out eval should be next, and how far one eval there may fall from it.

Evals against cumulative compute C are fitted by two saturating laws, least squares on log scale:
the power law ``E + A (C / C0)^-alpha`` and the exponential ``E + A exp(-k (C - C0) / span)`` (a run that
saturates faster than any power law; ``C0`` is the first eval's compute, ``span`` that of the fitted
evals). Both have three parameters, so the corrected Akaike criterion picks the one with the smaller
residual. The prediction interval: the residual noise ``s`` over ``n - 3`` degrees of freedom, plus the
fit's own uncertainty where it forecasts (the delta method: the leverage of the law's log-gradient
against the fit's Jacobian), times Student t's quantile at the normal tail of a ``band_z``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import special

if TYPE_CHECKING:
    from scipy import optimize

Curve = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(x, params) -> values at the normalised computes x, or the rows of d log L / d params there."""


@dataclass(frozen=True)
class Law:
    """A saturating family ``E + A g(x; rate)``: its curve, its log-gradient, the bound of its rate, the
    rate it starts from, and how it normalises compute."""

    name: str
    curve: Curve
    log_gradient: Curve
    max_rate: float
    start_rate: float
    normalise: Callable[[np.ndarray, np.ndarray], np.ndarray]
    """(computes, fitted computes) -> x."""


def _power_decay(x: np.ndarray, params: np.ndarray) -> np.ndarray:
    return params[0] + params[1] * x ** -params[2]


def _power_gradient(x: np.ndarray, params: np.ndarray) -> np.ndarray:
    u = x ** -params[2]
    law = params[0] + params[1] * u
    return np.column_stack([1.0 / law, u / law, -params[1] * u * np.log(x) / law])


def _exponential_decay(x: np.ndarray, params: np.ndarray) -> np.ndarray:
    return params[0] + params[1] * np.exp(-params[2] * x)


def _exponential_gradient(x: np.ndarray, params: np.ndarray) -> np.ndarray:
    u = np.exp(-params[2] * x)
    law = params[0] + params[1] * u
    return np.column_stack([1.0 / law, u / law, -params[1] * u * x / law])


def _by_first(at: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    return at / fitted[0]


def _over_span(at: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    return (at - fitted[0]) / max(float(fitted[-1] - fitted[0]), 1e-300)


LAWS = (
    Law("power_law", _power_decay, _power_gradient, 3.0, 0.3, _by_first),
    Law("exponential", _exponential_decay, _exponential_gradient, 30.0, 1.0, _over_span),
)
PARAMETERS = 3
MIN_AMPLITUDE = 1e-12
LM_TOLERANCES = {"ftol": 1e-8, "xtol": 1e-8, "gtol": 1e-8}
"""``least_squares``' defaults, which the fits were measured with."""


@dataclass(frozen=True)
class Forecast:
    """The chosen law at some computes, and how far one new eval there may fall from it.

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
    """The standard error of the mean of one new eval at each point: ``s * sqrt(f / m + h_mean)``."""
    law: str
    """The family the forecast comes from (``LAWS``)."""
    rho: float
    """The lag-1 autocorrelation of the fit's residuals, in [0, 0.9] (``lag1_autocorrelation``)."""

    def half_width(self, band_z: float) -> np.ndarray:
        """The band's half-width on log scale: Student t's quantile with ``dof`` degrees of freedom at the
        normal tail of ``band_z``, times ``sigma`` (a z-band widened for a noise estimated from few evals)."""
        return t_quantile(band_z, self.dof) * self.sigma

    def band(self, band_z: float) -> tuple[np.ndarray, np.ndarray]:
        """(low, high): ``center x exp(-/+ half_width)``."""
        spread = np.exp(self.half_width(band_z))
        return self.center / spread, self.center * spread


@functools.lru_cache(maxsize=4096)
def t_quantile(band_z: float, dof: int) -> float:
    """Student t's quantile with ``dof`` degrees of freedom at the normal tail of ``band_z``."""
    return float(special.stdtrit(max(dof, 1), special.ndtr(band_z)))


@dataclass(frozen=True)
class _Fit:
    law: Law
    params: np.ndarray
    jacobian: np.ndarray
    residuals: np.ndarray

    def aicc(self) -> float:
        """The corrected Akaike criterion of the fit (Gaussian errors on log scale)."""
        n, k = len(self.residuals), PARAMETERS + 1  # the noise is a parameter too
        rss = max(float(self.residuals @ self.residuals), 1e-300)
        return n * math.log(rss / n) + 2 * k + 2 * k * (k + 1) / max(n - k - 1, 1)


def forecast_evals(
    compute: np.ndarray, values: np.ndarray, at: np.ndarray, *, min_rel_sigma: float = 0.001
) -> Forecast | None:
    """The law that fits (compute, values) best, evaluated at ``at``, with its prediction interval.

    The noise ``s`` is the root mean square of the log residuals over ``n - 3`` degrees of freedom
    (unbiased for the variance), at least ``min_rel_sigma``; the fit's uncertainty at a compute is the
    leverage ``h = g (J'J)^+ g'`` of the law's log-gradient ``g`` there against the fit's Jacobian ``J``.
    None when no law fits or there is no degree of freedom. The detector holds evals to this band; the
    dashboard draws the same.
    """
    n = len(values)
    best = _best_fit(compute.astype(float).tobytes(), values.astype(float).tobytes()) if n > PARAMETERS else None
    if best is None:
        return None
    s = max(math.sqrt(float(best.residuals @ best.residuals) / (n - PARAMETERS)), min_rel_sigma)
    x = best.law.normalise(at, compute)
    grad = best.law.log_gradient(x, best.params)
    unit_cov = np.linalg.pinv(best.jacobian.T @ best.jacobian)
    leverage = np.maximum(np.einsum("ij,jk,ik->i", grad, unit_cov, grad), 0.0)
    mean_grad = grad.mean(axis=0)
    mean_leverage = max(float(mean_grad @ unit_cov @ mean_grad), 0.0)
    rho = lag1_autocorrelation(best.residuals)
    noise_of_mean = float(np.sum(ar1_correlation(rho, len(at)))) / len(at) ** 2
    return Forecast(
        best.law.curve(x, best.params),
        s * np.sqrt(1.0 + leverage),
        n - PARAMETERS,
        s,
        s * math.sqrt(noise_of_mean + mean_leverage),
        best.law.name,
        rho,
    )


def lag1_autocorrelation(residuals: np.ndarray) -> float:
    """The lag-1 autocorrelation of ``residuals``, clipped to [0, 0.9]: correlated eval noise, or a law that
    misfits the curve, averages out more slowly than independent noise."""
    centred = residuals - residuals.mean()
    denominator = float(centred @ centred)
    rho = float(centred[1:] @ centred[:-1]) / denominator if denominator > 0 else 0.0
    return min(max(rho, 0.0), 0.9)


def ar1_correlation(rho: float, m: int) -> np.ndarray:
    """The correlation matrix of ``m`` consecutive evals under AR(1) noise: ``rho^|i - j|``. A weighted sum
    ``w'e`` of their noise has variance ``s^2 w' R w`` (the mean: ``s^2 sum(R) / m^2``)."""
    lags = np.arange(m)
    return rho ** np.abs(lags[:, None] - lags[None, :])


@functools.lru_cache(maxsize=1024)
def _best_fit(compute: bytes, values: bytes) -> _Fit | None:
    """The law with the smallest AICc through (compute, values), given as float64 bytes; None when none fits.

    Remembered: the detector's windows fit the same prefix of a series again as later evals arrive (the
    prefix held out of a window of ``2m`` evals is the one a window of ``m`` held ``m`` evals earlier)."""
    c, v = np.frombuffer(compute), np.frombuffer(values)
    fits = [fit for law in LAWS if (fit := _fit(law, c, v)) is not None]
    return min(fits, key=_Fit.aicc) if fits else None


def _fit(law: Law, compute: np.ndarray, values: np.ndarray) -> _Fit | None:
    """``law`` through (compute, values) by least squares on log scale within its bounds (E between 0 and the
    best eval, A positive, the rate in [0, ``max_rate``]); None when the fit fails.

    The bounded optimum is nearly always inside the bounds (the power law) or on the face E = best eval (the
    exponential), so Levenberg-Marquardt (MINPACK) is tried there first: free, then with E held at the best eval.
    Its answer stands when it lies within the bounds and, on the face, the residuals pull E up against it (the
    Karush-Kuhn-Tucker condition); otherwise bounded trust-region least squares decides. Measured over the 2,032
    fits of two eval-stall tests: every one settled by the first two, with the parameters of the bounded fit
    (within 1e-4) and its residual sum of squares (within 1e-8), three times faster."""
    x = law.normalise(compute, compute)
    floor = float(values.min())
    log_v = np.log(values)

    def residuals(params: np.ndarray) -> np.ndarray:
        return np.log(law.curve(x, params)) - log_v

    def gradient(params: np.ndarray) -> np.ndarray:
        return law.log_gradient(x, params)

    def on_floor(free: np.ndarray) -> np.ndarray:
        return np.array([floor, free[0], free[1]])

    start = np.array([0.5 * floor, max(float(values[0]) - 0.5 * floor, 1e-6), law.start_rate])
    inside = _levenberg_marquardt(residuals, gradient, start)
    if inside is not None and 0 < inside[0][0] < floor and _free_in_bounds(law, inside[0][1:]):
        return _Fit(law, inside[0], gradient(inside[0]), inside[1])
    face = _levenberg_marquardt(
        lambda free: residuals(on_floor(free)),
        lambda free: gradient(on_floor(free))[:, 1:],
        np.array([max(float(values[0]) - floor, 1e-6), law.start_rate]),
    )
    if face is not None and _free_in_bounds(law, face[0]):
        params = on_floor(face[0])
        jacobian = gradient(params)
        if jacobian[:, 0] @ face[1] <= 0:  # the residual sum of squares falls as E rises past the best eval
            return _Fit(law, params, jacobian, face[1])
    bounded = _least_squares(
        residuals, gradient, start, bounds=([0.0, MIN_AMPLITUDE, 0.0], [floor, np.inf, law.max_rate]), max_nfev=200
    )
    return None if bounded is None else _Fit(law, bounded.x, bounded.jac, bounded.fun)


def _free_in_bounds(law: Law, amplitude_and_rate: np.ndarray) -> bool:
    amplitude, rate = amplitude_and_rate
    return bool(amplitude > MIN_AMPLITUDE and 0 < rate < law.max_rate)


def _levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray], jacobian: Callable[[np.ndarray], np.ndarray], start: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """(parameters, residuals) of MINPACK's Levenberg-Marquardt from ``start``, unbounded; None when it fails or
    ends anywhere not finite. scipy's ``leastsq`` directly, with the tolerances and evaluation budget of
    ``least_squares(method="lm")``, which runs the same MINPACK routine behind a wrapper that cost half the time
    of these small fits."""
    from scipy import optimize  # imported by the first fit: half a second that a process with no evals never pays

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            params, _, info, _, status = optimize.leastsq(
                residuals, start, Dfun=jacobian, full_output=True, **LM_TOLERANCES, maxfev=100 * len(start)
            )
    except (RuntimeError, ValueError, TypeError):
        return None
    fun = info["fvec"]
    finite = np.all(np.isfinite(params)) and np.all(np.isfinite(fun)) and np.all(np.isfinite(jacobian(params)))
    if status not in (1, 2, 3, 4) or not finite:
        return None
    return params, fun


def _least_squares(
    residuals: Callable[[np.ndarray], np.ndarray],
    jacobian: Callable[[np.ndarray], np.ndarray],
    start: np.ndarray,
    **options: Any,
) -> optimize.OptimizeResult | None:
    """scipy's ``least_squares``; None when it fails or ends anywhere not finite."""
    from scipy import optimize

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            fit = optimize.least_squares(residuals, start, jac=jacobian, **options)
    except (RuntimeError, ValueError):
        return None
    if fit.status <= 0 or not np.all(np.isfinite(fit.jac)) or not np.all(np.isfinite(fit.fun)):
        return None
    return fit
