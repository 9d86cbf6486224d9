"""The terminal side of the CLI: query results printed, progress and warnings (option values: ``options.py``)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import pandas as pd

from bedside.collectors.format import encode_number
from bedside.collectors.ingest import PassResult

from .service.log import warn

__all__ = ["Progress", "print_frame", "warn"]


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
