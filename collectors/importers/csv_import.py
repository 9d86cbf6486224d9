"""Reading CSV imports: long (``step,rank,name,value``) or wide (one column per metric).

The format is detected from the header: both ``name`` and ``value`` columns
mean long format. Cells are stripped of surrounding spaces; an empty cell in a
wide row means "not measured". Without a ``timeline`` column, a series whose step goes back starts
the next timeline (``restarts.py``).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ..errors import ImportFormatError
from .jsonl_import import ROW_FIELDS, Parsed, Row, cell_text, make_row
from .restarts import split_restarts
from .source import open_source, text_lines

LONG_COLUMNS = ("step", "rank", "name", "value")


def read_csv(path: Path) -> Parsed:
    """Every data row of ``path``; rows with only empty cells are counted as skipped."""
    with open_source(path) as fh:
        reader = csv.reader(text_lines(fh, path, bom=True))
        header = _header(csv_cells(reader, path), path)
        long = _is_long(header)
        parsed = Parsed("csv-long" if long else "csv-wide")
        while (cells := csv_cells(reader, path)) is not None:
            where = f"{path}, line {reader.line_num}"
            if not any(cell.strip() for cell in cells):
                parsed.skipped += 1
                continue
            if len(cells) != len(header):
                raise ImportFormatError(f"{where}: {len(cells)} cells, but the header has {len(header)} columns")
            row = dict(zip(header, (cell.strip() for cell in cells)))
            parsed.rows.append(_long_row(row, where) if long else _wide_row(row, where))
    if "timeline" not in header:
        split_restarts(parsed)
    return parsed


def csv_cells(reader: Any, path: Path) -> list[str] | None:
    """The next row of a CSV ``reader`` (None at the end), each cell at most ``MAX_CELL_CHARS`` characters;
    the csv module's own errors (a cell past its field limit, a stray NUL) named with the line."""
    try:
        cells = next(reader, None)
    except csv.Error as exc:
        raise ImportFormatError(f"{path}, line {reader.line_num}: not CSV ({exc})") from None
    for column, cell in enumerate(cells or (), start=1):
        cell_text(cell, f"{path}, line {reader.line_num}, column {column}", "a cell")
    return cells


def _is_long(columns: list[str]) -> bool:
    return {"name", "value"} <= set(columns)


def _header(header: list[str] | None, path: Path) -> list[str]:
    columns = [name.strip() for name in header or []]
    problem = _header_problem(columns)
    if problem:
        raise ImportFormatError(f"{path}, line 1: {problem}")
    return columns


def _header_problem(columns: list[str]) -> str | None:
    """What is wrong with a header: absent, duplicate or unnamed columns, or a missing one."""
    if not columns:
        return "empty file, expected a header row"
    if duplicate := next((c for i, c in enumerate(columns) if c in columns[:i]), None):
        return f"duplicate column {duplicate}"
    if "" in columns:
        return "a column without a name"
    allowed = (*LONG_COLUMNS, "time", "timeline")
    if missing := [c for c in (LONG_COLUMNS if _is_long(columns) else ("step",)) if c not in columns]:
        return f"missing column {missing[0]}"
    if _is_long(columns) and (extra := [c for c in columns if c not in allowed]):
        return f"unexpected column {extra[0]} (long format has {', '.join(allowed)})"
    return None


def _long_row(row: dict[str, str], where: str) -> Row:
    if not row["name"]:
        raise ImportFormatError(f"{where}: name is empty")
    if not row["value"]:
        raise ImportFormatError(f"{where}: value is empty (leave the row out when nothing was measured)")
    return make_row(row, {row["name"]: row["value"]}, where)


def _wide_row(row: dict[str, str], where: str) -> Row:
    return make_row(row, {name: value for name, value in row.items() if name not in ROW_FIELDS and value}, where)
