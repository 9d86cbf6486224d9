"""Reading JSONL imports, and the row model every import format is read into.

A JSONL line is either a wide row (``step``, optional ``rank``, ``time``,
``timeline``, and metric fields) or, when it has ``kind``, a bedside record to
copy. Wide CSV rows are parsed by the same ``make_row``. A file of rows that give no timeline starts the
next one where a series' step goes back (``restarts.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ImportFormatError
from ..format import ENVELOPE_FIELDS, RANK_STEP_METRICS, STEP_METRICS
from ..records import Record, build_record
from .restarts import split_restarts

ROW_FIELDS = ("step", "rank", "time", "timeline")
"""Fields that place a row; every other field of a wide row is a metric."""
JOB_ONLY = (*STEP_METRICS, "shard")
RANK_ONLY = (*RANK_STEP_METRICS, "param_checksum")
EVAL_PREFIX = "eval/"

Number = int | float


@dataclass(frozen=True)
class Row:
    """One input row: where it sits (``rank`` None for job level) and its metrics."""

    where: str
    step: int
    rank: int | None
    time: float | None
    timeline: int
    values: dict[str, Any]


@dataclass
class Parsed:
    """An input file read and checked: data rows, bedside records to copy, blank rows, and what was not
    imported though readable or lost to damage (``warnings``, one line each)."""

    format: str
    rows: list[Row] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    skipped: int = 0
    warnings: list[str] = field(default_factory=list)
    run_name: str | None = None  # the name the input gives its run, if any


def read_jsonl(path: Path) -> Parsed:
    """Every line of ``path`` as a row or a bedside record; blank lines are counted as skipped."""
    parsed = Parsed("jsonl")
    placed = False  # whether any row gives its timeline
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            where = f"{path}, line {number}"
            if not line.strip():
                parsed.skipped += 1
                continue
            obj = json_object(line, where)
            if "kind" in obj:
                parsed.records.append(_bedside_record(obj, where))
            else:
                values = {n: v for n, v in obj.items() if n not in ROW_FIELDS and v is not None}
                parsed.rows.append(make_row(obj, values, where))
                placed = placed or not blank(obj.get("timeline"))
    if not placed and not parsed.records:
        split_restarts(parsed)
    return parsed


def json_object(line: str, where: str) -> dict[str, Any]:
    """The JSON object of one line; an error naming ``where`` when it is not one."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ImportFormatError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(obj, dict):
        raise ImportFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _bedside_record(obj: dict[str, Any], where: str) -> Record:
    """A bedside record to copy: its envelope checked, its ``seq`` 0 (renumbered on write)."""
    if not isinstance(obj["kind"], str) or not obj["kind"]:
        raise ImportFormatError(f"{where}: kind must be a non-empty string")
    placed = {name: integer(obj.get(name), where, name) for name in ("rank", "step", "timeline")}
    copied = {name: value for name, value in obj.items() if name not in ENVELOPE_FIELDS and name != "metrics"}
    return build_record(
        obj["kind"],
        copied,
        **placed,
        seq=0,
        metrics=obj.get("metrics"),
        time=time_value(obj.get("time"), where, required=True),
    )


def make_row(fields: dict[str, Any], values: dict[str, Any], where: str) -> Row:
    """A row from its placing ``fields`` and raw metric ``values`` (text or JSON values)."""
    rank = None if blank(fields.get("rank")) else integer(fields["rank"], where, "rank", minimum=-1)
    rank = None if rank == -1 else rank
    timeline = 0 if blank(fields.get("timeline")) else integer(fields["timeline"], where, "timeline")
    return Row(
        where=where,
        step=integer(fields.get("step"), where, "step"),
        rank=rank,
        time=time_value(fields.get("time"), where),
        timeline=timeline,
        values={name: _metric(name, value, rank is None, where) for name, value in values.items()},
    )


def _metric(name: str, raw: Any, job_level: bool, where: str) -> Any:
    """A metric's value, checked against its name and the row's level (job or rank)."""
    if job_level and name in RANK_ONLY:
        raise ImportFormatError(f"{where}: {name} is a per-rank metric, but the row has no rank")
    if not job_level and (name in JOB_ONLY or name.startswith(EVAL_PREFIX)):
        raise ImportFormatError(f"{where}: {name} is a job-level metric; give it on a row with an empty rank")
    if name == EVAL_PREFIX:
        raise ImportFormatError(f"{where}: eval/ needs a score name after the slash")
    if name == "param_checksum":
        return str(raw)
    return integer(raw, where, name) if name == "shard" else number(raw, where, name)


def number(raw: Any, where: str, name: str) -> Number:
    """A JSON number, or text holding one (``NaN``, ``Infinity`` and ``-Infinity`` included)."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        for parse in (int, float):
            try:
                return parse(raw)
            except ValueError:
                pass
    raise ImportFormatError(f"{where}: {name} must be a number, got {raw!r}")


def integer(raw: Any, where: str, name: str, minimum: int = 0) -> int:
    """A required whole number >= ``minimum`` (``3`` and ``3.0`` both read as 3)."""
    if blank(raw):
        raise ImportFormatError(f"{where}: {name} is missing")
    value = number(raw, where, name)
    if not math.isfinite(value) or value != int(value) or value < minimum:
        raise ImportFormatError(f"{where}: {name} must be an integer >= {minimum}, got {raw!r}")
    return int(value)


def time_value(raw: Any, where: str, required: bool = False) -> float | None:
    """Unix seconds, finite; None when absent and not ``required``."""
    if blank(raw):
        if required:
            raise ImportFormatError(f"{where}: time is missing")
        return None
    value = float(number(raw, where, "time"))
    if not math.isfinite(value):
        raise ImportFormatError(f"{where}: time must be a finite number of unix seconds, got {raw!r}")
    return value


def blank(raw: Any) -> bool:
    """True for an absent value: None, or text of only spaces."""
    return raw is None or (isinstance(raw, str) and not raw.strip())
