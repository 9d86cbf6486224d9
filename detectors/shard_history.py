"""The bad-shard detector's recent batches, and one shard's contrast judged against its own read pattern.

A shard's contrast is the forgotten mean z of the batches that read it minus that of the batches that did
not, with Welch's standard error: right when batches are independent, which real runs do not promise. A
loader that reads a shard over a stretch of consecutive steps, autocorrelated noise or a trend that lags a
bend all make neighbouring z alike, and Welch's t then grows with the stretch, shard or no shard. So the same
t is taken for the shard's read pattern moved in time (every circular shift of it over the recent batches,
one FFT per sum), over the batches that did not read the shard: those contrasts are the run's serial
dependence alone, with no shard behind them. Their spread (the median absolute t over 0.6745, at least 1)
divides the shard's t. Batches that read shards already found worse are left out on both sides: a bad shard
explains them, so a shard that merely shared them stands on its other batches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

MIN_SHIFTS = 50
"""Shifts of the pattern needed for its spread: fewer recent batches judge nothing yet."""
MAD_TO_SD = 0.6745


@dataclass(frozen=True)
class Contrast:
    """One shard's batches against the other recent batches, as of now."""

    batches: float
    mean_z: float
    others_mean_z: float
    welch_t: float
    serial_factor: float

    @property
    def t(self) -> float:
        """Welch's t over the spread that moving the pattern in time gives it."""
        return self.welch_t / self.serial_factor


class BatchHistory:
    """The last ``size`` scored batches: their z, and the batches each shard was read in."""

    def __init__(self, size: int, decay: float) -> None:
        self.size, self.decay = size, decay
        self._z: deque[float] = deque(maxlen=size)
        self._reads: dict[int, deque[int]] = {}
        self._count = 0

    def add(self, z: float, shards: list[int]) -> None:
        self._z.append(z)
        oldest = self._count + 1 - self.size
        for shard in shards:
            reads = self._reads.setdefault(shard, deque())
            reads.append(self._count)
            while reads[0] < oldest:
                reads.popleft()
        self._count += 1

    def contrast(self, shard: int, without: Collection[int] = ()) -> Contrast | None:
        """``shard``'s contrast over the recent batches, those that read a shard in ``without`` left out;
        None while too few batches are left to judge it."""
        n = len(self._z)
        if n <= MIN_SHIFTS:
            return None
        weight = self.decay ** np.arange(n - 1, -1, -1, dtype=float)  # forgotten per batch, newest 1
        for other in without:
            weight[self._positions(other)] = 0.0
        pattern = np.zeros(n)
        pattern[self._positions(shard)] = 1.0
        z = np.fromiter(self._z, float, n)
        mine, theirs = weight * pattern, weight * (1.0 - pattern)
        actual = float(_welch_t(_sums(mine, z)[:, None], _sums(theirs, z)[:, None])[0])
        null = _shifted_t(pattern, theirs, z)
        null = null[np.isfinite(null)]
        if not np.isfinite(actual) or len(null) < MIN_SHIFTS:
            return None
        return Contrast(
            batches=float(mine.sum()),
            mean_z=float(mine @ z / mine.sum()),
            others_mean_z=float(theirs @ z / theirs.sum()),
            welch_t=actual,
            serial_factor=max(1.0, float(np.median(np.abs(null))) / MAD_TO_SD),
        )

    def shared(self, shard: int, other: int) -> bool:
        """Whether the two shards were read in one of the recent batches."""
        return bool(np.intersect1d(self._positions(shard), self._positions(other)).size)

    def _positions(self, shard: int) -> np.ndarray:
        oldest = self._count - len(self._z)
        reads = np.fromiter(self._reads.get(shard, ()), int)
        return reads[reads >= oldest] - oldest


def _sums(weight: np.ndarray, z: np.ndarray) -> np.ndarray:
    """The sums of w, w z, w z^2 and w^2."""
    return np.array([weight.sum(), weight @ z, weight @ (z * z), weight @ weight])


def _shifted_t(pattern: np.ndarray, weight: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Welch's t inside against outside ``pattern`` moved by each circular shift but 0, over the batches
    ``weight`` keeps (none that read the shard)."""
    n = len(z)
    spectrum = np.conj(np.fft.rfft(pattern))
    series = (weight, weight * z, weight * z * z, weight * weight)
    inside = np.array([np.fft.irfft(np.fft.rfft(s) * spectrum, n) for s in series])[:, 1:]
    outside = np.array([s.sum() for s in series])[:, None] - inside
    return _welch_t(inside, outside)


def _welch_t(inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
    """Welch's t from the sums (rows: w, w z, w z^2, w^2) inside and outside, one column per contrast; NaN
    where a side holds under two batches' worth of weight."""
    with np.errstate(divide="ignore", invalid="ignore"):
        (mean_in, var_in), (mean_out, var_out) = _moments(inside), _moments(outside)
        return (mean_in - mean_out) / np.sqrt(var_in + var_out)


def _moments(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weighted mean and the variance of that mean (over the effective count of batches)."""
    total, first, second, squares = sums
    mean = first / total
    effective = total * total / squares
    ok = effective >= 2.0
    variance = np.maximum(second / total - mean * mean, 0.0) / np.maximum(effective - 1.0, 1.0)
    return np.where(ok, mean, np.nan), np.where(ok, variance, np.nan)
