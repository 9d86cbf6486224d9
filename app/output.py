"""The terminal side of the CLI: option values checked, query results printed, progress and warnings."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import pandas as pd

from bedside.collectors.format import encode_number
from bedside.collectors.ingest import PassResult

from .service.log import warn

FORMATS = ("table", "csv", "json")
__all__ = ["FORMATS", "Progress", "integer_in", "positive_seconds", "print_frame", "warn"]


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


def print_frame(frame: pd.DataFrame, fmt: str, out: TextIO = sys.stdout) -> None:
    """Write ``frame`` as an aligned table, CSV, or JSON records (one array)."""
    if fmt == "csv":
        frame.to_csv(out, index=False)
    elif fmt == "json":
        rows = [{k: _jsonable(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
        out.write(json.dumps(rows, indent=1, default=str) + "\n")
    elif frame.empty:
        out.write("(no rows) columns: " + ", ".join(map(str, frame.columns)) + "\n")
    else:
        with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200):
            out.write(frame.to_string(index=False) + "\n")


def _jsonable(value: Any) -> Any:
    """A cell as JSON: NULL as null, NaN and infinities as the format's strings, times in ISO 8601."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float):
        return encode_number(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


class Progress:
    """Prints a progress line at most every ``every_s`` while a long ingest runs."""

    def __init__(self, quiet: bool = False, every_s: float = 1.0, out: TextIO = sys.stderr) -> None:
        self.quiet = quiet
        self.every_s = every_s
        self.out = out
        self.total = PassResult()
        self._started = time.monotonic()
        self._printed = 0.0

    def update(self, result: PassResult) -> None:
        """Count one pass; print a line when the last one is ``every_s`` old."""
        self.total.add(result)
        if time.monotonic() - self._printed >= self.every_s:
            self.report()

    def report(self, prefix: str = "ingested") -> None:
        """Print the totals so far (lines, MB, rate, rejected) unless quiet."""
        if self.quiet:
            return
        elapsed = max(time.monotonic() - self._started, 1e-9)
        t = self.total
        self.out.write(
            f"{prefix} {t.lines:,} lines ({t.bytes / 1e6:,.1f} MB, {t.lines / elapsed:,.0f} lines/s), "
            f"{t.rejected:,} rejected\n"
        )
        self.out.flush()
        self._printed = time.monotonic()
