"""The CLI's option values: argparse types that check them, and the output formats a command can print.

Every command's parser is built from this module and from constants, never from the modules that run the
command, so that ``bedside --help`` loads none of pandas, DuckDB or the service (tests/test_boundaries.py).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

FORMATS = ("table", "csv", "json")


def integer_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=``: a whole number in [low, high] (no upper bound when ``high`` is None)."""
    allowed = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {value}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """An argparse ``type=``: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value
