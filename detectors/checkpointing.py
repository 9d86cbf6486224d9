"""How often to checkpoint: the Young/Daly interval from the measured save cost and interruption rate.

With a save costing ``C`` seconds and interruptions every ``M`` seconds on average, the
interval that minimises expected waste is ``sqrt(2 C M)`` (Young 1974; Daly 2006 adds
higher-order terms that matter only when C approaches M). Waste per unit of time with
interval ``T`` is about ``C / T`` (time spent saving) plus ``T / (2 M)`` (work lost,
on average half an interval, per interruption).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointAdvice:
    """The recommended interval and what the current one costs, as fractions of wall-clock time."""

    save_s: float
    mtbf_s: float
    interruptions: int
    current_interval_s: float | None
    optimal_interval_s: float
    current_waste: float | None
    optimal_waste: float


def expected_waste(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """Fraction of time lost to saving and to recomputing after interruptions, for one interval."""
    return save_s / interval_s + interval_s / (2.0 * mtbf_s)


def advise(save_s: float, span_s: float, interruptions: int, current_interval_s: float | None) -> CheckpointAdvice:
    """Young/Daly advice from a measured save cost and ``interruptions`` seen over ``span_s`` seconds.

    With no interruption seen yet, the mean time between them is taken as at least the
    span observed (one interruption assumed just after it): a cautious, finite estimate.
    """
    if save_s <= 0 or span_s <= 0:
        raise ValueError("save time and observed span must be > 0")
    mtbf = span_s / max(interruptions, 1)
    optimal = math.sqrt(2.0 * save_s * mtbf)
    current_waste = expected_waste(current_interval_s, save_s, mtbf) if current_interval_s else None
    return CheckpointAdvice(
        save_s, mtbf, interruptions, current_interval_s, optimal, current_waste, expected_waste(optimal, save_s, mtbf)
    )
