"""Numbers, durations and moments as the on-call reads them, and the run statuses' labels: plain text, shared by
the pages, their pure modules and the post-mortem report (no Streamlit here)."""

from __future__ import annotations

import math
import time

import pandas as pd

STATUS_LABELS = {
    "live": "live",
    "stalled": "stalled",
    "finished": "finished",
    "failed": "crashed",
    "aborted": "aborted",
    "empty": "empty",
}


def age(seconds: float | None) -> str:
    """A duration in words: 42 s, 5 min, 3.2 h, 2.1 d."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "–"
    seconds = max(seconds, 0.0)  # clocks of different hosts: a moment ago, not "-0 s"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}" if unit != "min" else f"{seconds / size:.0f} min"
    return f"{seconds:.0f} s"


def clock(timestamp: float) -> str:
    """A moment as the on-call reads it: 2026-12-01 21:34:28 UTC."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


SI_PREFIXES = (
    ("Q", 1e30), ("R", 1e27), ("Y", 1e24), ("Z", 1e21), ("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6),
    ("k", 1e3),
)  # fmt: skip
SCIENTIFIC_FROM = 1e33
"""Past quetta a number reads in scientific notation."""


def number(value: float | None, unit: str = "") -> str:
    """A number in three digits with an SI prefix, up to quetta: 1.36e11 -> 136 G, 5.28e20 -> 528 E; scientific
    past 1e33 ("4.2e+35"). The prefix is chosen after rounding, so 999.96e3 reads 1 M, not 1e+03 k."""
    if value is None or pd.isna(value):
        return "–"
    shown = abs(float(f"{value:.3g}"))
    if shown >= SCIENTIFIC_FROM or not math.isfinite(shown):
        return f"{value:.3g} {unit}".strip()
    for prefix, size in SI_PREFIXES:
        if shown >= size:
            return f"{value / size:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".strip()
