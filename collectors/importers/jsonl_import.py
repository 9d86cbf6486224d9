"""Reading JSONL imports, and the row model every import format is read into.

A JSONL line is either a wide row (``step``, optional ``rank``, ``time``,
``timeline``, and metric fields) or, when it has ``kind``, a bedside record to
copy. Wide CSV rows are parsed by the same ``make_row``. A file of rows that give no timeline starts the
next one where a series' step goes back (``restarts.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..bounded import (
    MAX_ABS_NUMBER,
    MAX_CELL_CHARS,
    MAX_NUMBER_CHARS,
    BoundedInputError,
    NotJsonError,
    parse_json,
    short,
)
from ..errors import ImportFormatError
from ..format import ENVELOPE_FIELDS, MAX_EXACT_INTEGER, MAX_RANK, MAX_TIME, RANK_STEP_METRICS, STEP_METRICS
from ..records import Record, build_record
from .restarts import split_restarts
from .source import open_source, text_lines

ROW_FIELDS = ("step", "rank", "time", "timeline")
"""Fields that place a row; every other field of a wide row is a metric."""
JOB_ONLY = (*STEP_METRICS, "shard")
RANK_ONLY = (*RANK_STEP_METRICS, "param_checksum")
EVAL_PREFIX = "eval/"
NON_FINITE = frozenset(f"{sign}{word}" for sign in ("", "+", "-") for word in ("nan", "inf", "infinity"))
"""Text of the numbers that are not finite, in lower case: a value, never a time or a place."""

Number = int | float
MAX_TIME_SHOWN = f"{MAX_TIME:.0e}".replace("e+", "e")  # 1e11
MAX_IMPORTED_RANK = MAX_RANK - 1
"""The largest rank an import writes: the world size it records with it (the highest rank plus one) must be at
most ``MAX_RANK`` too, or the collector rejects the run's ``rank_info`` records."""


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
    with open_source(path) as fh:
        for number, line in enumerate(text_lines(fh, path), start=1):
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
    obj = json_value(line, where)
    if not isinstance(obj, dict):
        raise ImportFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def json_value(text: str, where: str) -> Any:
    """The JSON value of ``text`` read by the bounded parser, ``NaN`` and ``Infinity`` allowed (a NaN loss is a
    finding)."""
    try:
        return parse_json(text, where, allow_nan=True)
    except NotJsonError as error:  # a file of the wrong format, not one past a limit
        raise ImportFormatError(str(error)) from None


def _bedside_record(obj: dict[str, Any], where: str) -> Record:
    """A bedside record to copy: its envelope checked, its ``seq`` 0 (renumbered on write)."""
    if not isinstance(obj["kind"], str) or not obj["kind"]:
        raise ImportFormatError(f"{where}: kind must be a non-empty string")
    placed = {
        "rank": integer(obj.get("rank"), where, "rank", maximum=MAX_IMPORTED_RANK),
        "step": integer(obj.get("step"), where, "step"),
        "timeline": integer(obj.get("timeline"), where, "timeline", maximum=MAX_RANK),
    }
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
    rank = (
        None
        if blank(fields.get("rank"))
        else integer(fields["rank"], where, "rank", minimum=-1, maximum=MAX_IMPORTED_RANK)
    )
    rank = None if rank == -1 else rank
    timeline = 0 if blank(fields.get("timeline")) else integer(fields["timeline"], where, "timeline", maximum=MAX_RANK)
    return Row(
        where=where,
        step=integer(fields.get("step"), where, "step"),
        rank=rank,
        time=time_value(fields.get("time"), where),
        timeline=timeline,
        values={cell_text(name, where): _metric(name, value, rank is None, where) for name, value in values.items()},
    )


def cell_text(text: str, where: str, what: str = "a metric name") -> str:
    """Text from outside kept as text (a name, a checksum): at most ``MAX_CELL_CHARS`` characters."""
    if len(text) > MAX_CELL_CHARS:
        raise BoundedInputError(f"{where}: {what} of {len(text)} characters, more than {MAX_CELL_CHARS}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON's "\ud800": written out as "?", two such names would be one
            raise ImportFormatError(f"{where}: {what} holds {text[exc.start]!r}, a lone surrogate: no text") from None
    return text


def _metric(name: str, raw: Any, job_level: bool, where: str) -> Any:
    """A metric's value, checked against its name and the row's level (job or rank)."""
    if job_level and name in RANK_ONLY:
        raise ImportFormatError(f"{where}: {name} is a per-rank metric, but the row has no rank")
    if not job_level and (name in JOB_ONLY or name.startswith(EVAL_PREFIX)):
        raise ImportFormatError(f"{where}: {name} is a job-level metric; give it on a row with an empty rank")
    if name == EVAL_PREFIX:
        raise ImportFormatError(f"{where}: eval/ needs a score name after the slash")
    if name == "param_checksum":
        return cell_text(str(raw), where, "param_checksum")
    return integer(raw, where, name) if name == "shard" else number(raw, where, name)


def number(raw: Any, where: str, name: str) -> Number:
    """A JSON number, or text holding one (``NaN``, ``Infinity`` and ``-Infinity`` included): text of at most
    ``MAX_NUMBER_CHARS`` characters, a finite value within ``MAX_ABS_NUMBER`` (else a BoundedInputError)."""
    if isinstance(raw, str):
        text = raw.strip()
        if text.lower() in NON_FINITE:
            return float(text)
        if len(text) > MAX_NUMBER_CHARS:
            raise BoundedInputError(
                f"{where}: {name} has {len(text)} characters, more than a number's {MAX_NUMBER_CHARS}"
            )
        value = _spelled(text)
    else:
        value = raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else None
    if value is None:
        raise ImportFormatError(f"{where}: {name} must be a number, got {short(raw)}")
    spelled_infinity = isinstance(raw, float) and math.isinf(raw)  # JSON's Infinity, a binary format's inf
    if abs(value) > MAX_ABS_NUMBER and not spelled_infinity:
        raise BoundedInputError(f"{where}: {name} is out of range (beyond {MAX_ABS_NUMBER:g}): {short(raw)}")
    return value


def _spelled(text: str) -> Number | None:
    """The number ``text`` spells (an integer when it is one); None when it spells none."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return None


def integer(raw: Any, where: str, name: str, minimum: int = 0, maximum: int = MAX_EXACT_INTEGER - 1) -> int:
    """A required whole number from ``minimum`` to ``maximum`` (``3`` and ``3.0`` both read as 3)."""
    if blank(raw):
        raise ImportFormatError(f"{where}: {name} is missing")
    value = number(raw, where, name)
    if not math.isfinite(value) or value != int(value) or value < minimum:
        raise ImportFormatError(f"{where}: {name} must be an integer >= {minimum}, got {short(raw)}")
    if value > maximum:
        raise BoundedInputError(f"{where}: {name} must be at most {maximum}, got {short(raw)}")
    return int(value)


def time_value(raw: Any, where: str, required: bool = False) -> float | None:
    """Unix seconds from 0 to below ``MAX_TIME``, as the collector accepts them; None when absent and not
    ``required``."""
    if blank(raw):
        if required:
            raise ImportFormatError(f"{where}: time is missing")
        return None
    value = float(number(raw, where, "time"))
    if not 0 <= value < MAX_TIME:  # NaN and the infinities too
        raise ImportFormatError(
            f"{where}: time must be unix seconds from 0 to below {MAX_TIME_SHOWN}, got {short(raw)}"
        )
    return value


def blank(raw: Any) -> bool:
    """True for an absent value: None, or text of only spaces."""
    return raw is None or (isinstance(raw, str) and not raw.strip())
