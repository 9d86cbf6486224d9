"""Telemetry format v1: the record kinds, their fields and canonical metric names.

The prose specification is ``docs/telemetry-format.md``; the machine-readable
one is ``telemetry.schema.json`` beside this module. Both describe the same
format; ``tests/test_format.py`` keeps them in step. The records themselves, one
dataclass per kind, are in ``records.py``.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from importlib import resources
from typing import Any

SCHEMA_VERSION = 1

ENVELOPE_FIELDS = ("kind", "time", "rank", "step", "timeline", "seq")
"""Fields every record carries."""

MAX_RANK = 2**31 - 1
"""The largest rank (and timeline) the store holds: a 32-bit signed integer."""

MAX_EXACT_INTEGER = 2**53
"""``step`` and ``seq`` must be below this: JSON readers that hold numbers as doubles round beyond it."""

MAX_TIME = 1e11
"""``time`` is unix seconds from 0 to below this (the year 5138): a milli- or nanosecond epoch is past it. The
collector's check (``store/queries/stage_lines.sql``), every importer's and ``telemetry.schema.json`` hold to it
(``tests/test_import_ranges.py``)."""

MAX_KIND_CHARS = 64
"""The longest ``kind`` a record may carry."""

MAX_LINE_BYTES = 16 << 20
"""The longest line (newline included): past this many bytes without a newline the rest of the file is
rejected from that line's offset and not read again."""


class Kind(StrEnum):
    """Record kinds of format v1. Readers keep records of any other kind as events."""

    RANK_INFO = "rank_info"
    STEP = "step"
    RANK_STEP = "rank_step"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"
    ACTION = "action"
    HEARTBEAT = "heartbeat"
    LOG = "log"
    RUN_END = "run_end"
    FAULT_INJECTED = "fault_injected"


STEP_METRICS = ("loss", "grad_norm", "lr", "tokens", "flops")
"""Canonical job-level metrics of a ``step`` record (``tokens`` and ``flops`` per step)."""

RANK_STEP_METRICS = (
    "step_time",
    "data_time",
    "compute_time",
    "comm_time",
    "optimizer_time",
    "local_grad_norm",
    "cpu_wait_time",
)
"""Canonical per-rank metrics of a ``rank_step`` record (seconds, the norm before all-reduce, and the seconds the
rank's thread waited for a CPU)."""

CHECKPOINT_METRICS = ("duration_s", "bytes")
"""Canonical metrics of a ``checkpoint`` record (seconds the event took, bytes written or read)."""

CHECKPOINT_EVENTS = ("save_started", "saved", "save_failed", "verified", "corrupt", "loaded", "deleted")
"""Values of ``event`` in a ``checkpoint`` record."""

ACTION_STATUSES = ("requested", "applied", "rejected")
"""Values of ``status`` in an ``action`` record."""


class RunEndStatus(StrEnum):
    """Values of ``status`` in a ``run_end`` record: how a rank ended."""

    FINISHED = "finished"
    FAILED = "failed"
    ABORTED = "aborted"


RUN_END_STATUSES = tuple(RunEndStatus)
"""Every ``run_end`` status (what ended runs show as their status)."""


def encode_number(value: float) -> float | str:
    """Return ``value`` as strict JSON can carry it: non-finite floats become strings."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def encode_line(record: dict[str, Any]) -> str:
    """One record as one telemetry line (compact JSON, newline-terminated).

    Text stays UTF-8 rather than ``\\u`` escapes: a string holding undecodable bytes
    (``os.fsdecode`` of a path) has lone surrogates, whose escapes DuckDB's JSON
    parser rejects; encoding the line with ``errors="replace"`` keeps the record.
    """
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"


def schema_text() -> str:
    """The JSON Schema of one telemetry line, as shipped in the package."""
    return resources.files(__package__).joinpath("telemetry.schema.json").read_text()


def schema() -> dict[str, Any]:
    """The JSON Schema of one telemetry line, parsed."""
    return json.loads(schema_text())
