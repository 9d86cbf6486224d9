"""Robust statistics shared by the detectors: median/MAD scale, robust z-scores, one-sided CUSUM."""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np

MAD_TO_SIGMA = 1.4826
"""MAD times this estimates the standard deviation of normal data."""


def median(values: np.ndarray) -> float:
    """``np.median`` of a 1-D array, the same number (NaN when any value is NaN) at a fraction of its overhead,
    which dominates on the short windows a streaming detector takes a median of at every step."""
    half = len(values) // 2
    if not len(values) or np.isnan(values).any():
        return float(np.median(values)) if len(values) else math.nan
    part = np.partition(values, half)
    return float(part[half] if len(values) % 2 else (part[:half].max() + part[half]) / 2)


def mad_sigma(values: np.ndarray, axis: int | None = None, floor: float = 0.0) -> np.ndarray | float:
    """Robust standard deviation (scaled median absolute deviation), at least ``floor``; NaNs ignored."""
    if axis is None:
        known = np.ravel(values)
        known = known[~np.isnan(known)]
        deviations = np.abs(known - median(known)) if len(known) else known
        deviations = deviations[~np.isnan(deviations)]  # an infinite centre leaves none
        if len(deviations):
            return max(MAD_TO_SIGMA * median(deviations), floor)
    center = np.nanmedian(values, axis=axis, keepdims=axis is not None)
    scale = MAD_TO_SIGMA * np.nanmedian(np.abs(values - center), axis=axis)
    return np.maximum(scale, floor)


def windows(values: np.ndarray, width: int) -> np.ndarray:
    """Each run of ``width`` consecutive ``values``, one a row, read-only: ``sliding_window_view`` of a 1-D
    array without its argument checks, which cost 25 times the view itself on the short series a live update
    scores. Fewer than ``width`` values give no row."""
    values = np.ascontiguousarray(values)
    rows = len(values) - width + 1
    if rows <= 0:
        return np.empty((0, width), values.dtype)
    step = values.itemsize
    view = np.ndarray((rows, width), values.dtype, buffer=values, strides=(step, step))
    view.flags.writeable = False
    return view


def dense_row_median(values: np.ndarray) -> np.ndarray:
    """``np.median(values, axis=1)`` for rows free of NaNs (``row_median`` takes NaNs): the same numbers, about
    four times faster, from one partition at the middle (the lower middle is the largest value left of it)."""
    half = values.shape[1] // 2
    part = np.partition(values, half, axis=1)
    if values.shape[1] % 2:
        return part[:, half]
    return (part[:, :half].max(axis=1) + part[:, half]) / 2


class RollingQuantile:
    """The last ``size`` values, kept in arrival order and sorted: adding one costs a binary search and a
    move of at most ``size`` floats, a quantile costs two lookups."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._arrived: deque[float] = deque()
        self._sorted: list[float] = []
        self.added = 0
        """Values added in all (the newest is number ``added``; the last ``len(self)`` are held)."""

    def __len__(self) -> int:
        return len(self._arrived)

    def add(self, value: float) -> None:
        if len(self._arrived) == self.size:
            del self._sorted[bisect.bisect_left(self._sorted, self._arrived.popleft())]
        self._arrived.append(value)
        bisect.insort(self._sorted, value)
        self.added += 1

    def above(self, value: float) -> int:
        """How many of the values are greater than ``value``."""
        return len(self._sorted) - bisect.bisect_right(self._sorted, value)

    def quantile(self, q: float) -> float:
        """Linear interpolation between the order statistics around ``q * (n - 1)`` (numpy's default)."""
        at = q * (len(self._sorted) - 1)
        low = int(at)
        high = min(low + 1, len(self._sorted) - 1)
        return self._sorted[low] + (self._sorted[high] - self._sorted[low]) * (at - low)


def robust_z(values: np.ndarray, axis: int | None = None, floor: float = 1e-12) -> np.ndarray:
    """(x - median) / robust sigma along ``axis``; NaNs stay NaN."""
    center = np.nanmedian(values, axis=axis, keepdims=axis is not None)
    scale = mad_sigma(values, axis=axis, floor=floor)
    if axis is not None:
        scale = np.expand_dims(scale, axis)
    return (values - center) / scale


class Cusum:
    """One-sided upper CUSUM per series: ``S = max(0, S + z - k)``, alarm when ``S > h``.

    ``z`` are standardized observations (mean 0, sd 1 in control); ``k`` is half the
    shift (in sd) to detect fastest, ``h`` sets the false-alarm rate (ARL0). Inputs are
    clipped at ``clip`` so one heavy-tailed outlier cannot raise an alarm alone.
    """

    def __init__(self, size: int, *, k: float, h: float, clip: float = 4.0) -> None:
        self.k, self.h, self.clip = k, h, clip
        self.s = np.zeros(size)

    def resize(self, size: int) -> None:
        if size > len(self.s):
            self.s = np.concatenate([self.s, np.zeros(size - len(self.s))])

    def update(self, z: np.ndarray) -> np.ndarray:
        """Add one observation per series (NaN: no observation); True where the alarm is raised."""
        z = np.minimum(np.maximum(np.where(np.isnan(z), self.k, z), -self.clip), self.clip)  # one pass per step
        self.s = np.maximum(0.0, self.s + z - self.k)
        return self.s > self.h

    def reset(self, where: np.ndarray) -> None:
        self.s[where] = 0.0


def row_quantile(values: np.ndarray, q: float) -> np.ndarray:
    """The ``q`` quantile of each row (numpy's linear interpolation), NaNs ignored (NaN for an empty row), as a
    column (one sort, no Python loop)."""
    ordered = np.sort(values, axis=1)  # NaNs last
    last = np.maximum((~np.isnan(values)).sum(axis=1) - 1, 0)
    at = q * last
    below = np.floor(at).astype(int)
    rows = np.arange(len(values))
    lo, hi = ordered[rows, below], ordered[rows, np.minimum(below + 1, last)]
    return (lo + (hi - lo) * (at - below))[:, None]


def row_median(values: np.ndarray) -> np.ndarray:
    """Median of each row, NaNs ignored (NaN for an empty row), as a column (one sort, no Python loop)."""
    ordered = np.sort(values, axis=1)  # NaNs last
    count = (~np.isnan(values)).sum(axis=1)
    rows = np.arange(len(values))
    median = 0.5 * (ordered[rows, np.maximum(count - 1, 0) // 2] + ordered[rows, count // 2 - (count == 0)])
    return np.where(count > 0, median, np.nan)[:, None]
