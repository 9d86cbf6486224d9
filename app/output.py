"""The terminal side of the CLI: query results printed, progress and warnings (option values: ``options.py``)."""

from __future__ import annotations

import io
import json
import sys
import time
from typing import Any, TextIO

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from bedside.collectors.display_text import visible
from bedside.collectors.format import encode_number
from bedside.collectors.ingest import PassResult

from .service.log import warn

__all__ = ["Progress", "print_frame", "warn"]


def print_frame(frame: pd.DataFrame, fmt: str, out: TextIO = sys.stdout) -> None:
    """Write ``frame`` as an aligned table, CSV, or JSON records (one array). Every value prints: a column that
    pandas cannot write (an interval, a union, a date or time past Python's range such as ``DATE 'infinity'``)
    is written as its text. A table shows control and format characters as their escapes (``visible``)."""
    text = io.StringIO()
    try:
        _write_frame(frame, fmt, text)
    except UNPRINTABLE:
        text = io.StringIO()
        _write_frame(_printable(frame, fmt), fmt, text)
    out.write(text.getvalue())


UNPRINTABLE = (NotImplementedError, OverflowError, ValueError, TypeError, pa.ArrowException)
"""What pandas and pyarrow raise for a type or value they cannot write (ArrowNotImplementedError is both)."""


def _write_frame(frame: pd.DataFrame, fmt: str, out: TextIO) -> None:
    if fmt == "csv":
        frame.to_csv(out, index=False)
    elif fmt == "json":
        rows = [{k: _jsonable(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
        out.write(json.dumps(rows, indent=1, default=str) + "\n")
    elif frame.empty:
        out.write("(no rows) columns: " + visible(", ".join(map(str, frame.columns))) + "\n")
    else:
        with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200):
            table = _visible_cells(frame).to_string(index=False)
        out.write("\n".join(map(visible, table.split("\n"))) + "\n")  # and what a cell's own text hid


def _visible_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its column names and text cells ``visible``: a table goes to a terminal, CSV and JSON are
    data (JSON escapes control characters itself)."""
    shown = frame.set_axis([visible(str(name)) for name in frame.columns], axis=1)
    for position in range(shown.shape[1]):
        column = shown.iloc[:, position]
        if column.dtype == object or pd.api.types.is_string_dtype(column.dtype):
            shown.isetitem(position, column.map(lambda value: visible(value) if isinstance(value, str) else value))
    return shown


def _printable(frame: pd.DataFrame, fmt: str) -> pd.DataFrame:
    """``frame`` with each column that cannot be written as ``fmt`` replaced by its text."""
    printable = frame.copy()
    for position in range(frame.shape[1]):
        try:
            _write_frame(frame.iloc[:, [position]], fmt, io.StringIO())
        except UNPRINTABLE:
            printable.isetitem(position, _as_text(frame.iloc[:, position]))
    return printable


def _as_text(column: pd.Series) -> pd.Series:
    """Each value of ``column`` as text (NULL stays NULL): Arrow's cast where it has one (a date past Python's
    range reads ``<value out of range: DAYS>``), else Python's text of the value, else Arrow's own printing."""
    values = pa.array(column)
    try:
        text = pc.cast(values, pa.string())
    except pa.ArrowException:
        text = pa.array([_value_text(values, row) for row in range(len(values))], pa.string())
    return pd.Series(text, index=column.index, name=column.name, dtype=pd.ArrowDtype(pa.string()))


def _value_text(values: pa.Array, row: int) -> str | None:
    value = values[row]
    if not value.is_valid:
        return None
    try:
        return str(value.as_py())
    except UNPRINTABLE:  # a date or time past Python's range inside a list or struct
        return values.slice(row, 1).to_string(skip_new_lines=True, window=1 << 30, container_window=1 << 30)


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
