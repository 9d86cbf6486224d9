"""What a detector's settings may be: the range of each, checked when the detector is made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from types import MappingProxyType

from .errors import DetectorConfigError


@dataclass(frozen=True)
class Range:
    """Numbers from ``low`` to ``high`` (either end open or absent); ``integer`` admits whole numbers only."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False

    def admits(self, value: object) -> bool:
        """Whether ``value`` is a number of this range (NaN, booleans and text never are)."""
        kind = Integral if self.integer else Real
        if isinstance(value, bool) or not isinstance(value, kind) or math.isnan(float(value)):
            return False
        x = float(value)
        above = self.low is None or (x > self.low if self.low_open else x >= self.low)
        below = self.high is None or (x < self.high if self.high_open else x <= self.high)
        return above and below

    def __str__(self) -> str:
        what = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            return (
                f"{what} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
            )
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{what} {'<' if self.high_open else '<='} {self.high:g}"
        return what

    def check(self, detector: str, setting: str, value: object) -> None:
        """Raise ``DetectorConfigError`` naming the detector, the setting, the value and this range."""
        if not self.admits(value):
            raise DetectorConfigError(
                f"detector {detector!r}: setting {setting} = {value!r} is out of range (expected {self})"
            )


POSITIVE = Range(0, low_open=True)
"""A number > 0 (thresholds, factors, seconds)."""
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1, low_open=True, high_open=True)
"""A number strictly between 0 and 1 (a quantile, a rate, a share)."""
COUNT = Range(1, integer=True)
"""A whole number >= 1 (steps, points, batches)."""
OPTIONAL_COUNT = Range(0, integer=True)
"""A whole number >= 0 (a warm-up or an allowance that may be switched off)."""


@dataclass(frozen=True)
class Below:
    """Setting ``lower`` must stay below setting ``upper`` (``or_equal``: at most equal) for the detector to work."""

    lower: str
    upper: str
    or_equal: bool = False

    def check(self, detector: str, settings: dict[str, object]) -> None:
        """Raise ``DetectorConfigError`` naming both settings and their values when the order is broken."""
        low, high = settings[self.lower], settings[self.upper]
        assert isinstance(low, Real) and isinstance(high, Real)  # each passed its range first
        if not (low <= high if self.or_equal else low < high):
            relation = "at most" if self.or_equal else "below"
            raise DetectorConfigError(
                f"detector {detector!r}: setting {self.lower} = {low!r} must be {relation} {self.upper} = {high!r}"
            )


def ranges(**limits: Range) -> MappingProxyType[str, Range]:
    """A detector's ``limits``: the range of each of its settings, by name."""
    return MappingProxyType(limits)
