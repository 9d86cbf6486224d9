"""The detectors as a library: run them over plain DataFrames, with no store and no service.

``detect`` builds one ``TelemetryBatch`` from the frames (columns as docs/detectors.md and
``telemetry.py`` name them), feeds it to a ``DetectorRunner`` as the service does in batch
mode (``update`` then ``finish``, each result placed in an ``IncidentBook``) and returns
the findings and the incidents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .errors import DetectorInputError
from .finding import Finding
from .incidents import Incident, IncidentBook
from .registry import build_detectors
from .runner import DetectorRunner
from .telemetry import (
    ACTION_COLUMNS,
    CHECKPOINT_COLUMNS,
    EVAL_COLUMNS,
    EVENT_COLUMNS,
    FILED_COLUMNS,
    RANK_STEP_COLUMNS,
    STEP_COLUMNS,
    TOPOLOGY_COLUMNS,
    RunState,
    TelemetryBatch,
    empty_frame,
)

FRAMES = {
    "steps": STEP_COLUMNS,
    "rank_steps": RANK_STEP_COLUMNS,
    "evals": EVAL_COLUMNS,
    "checkpoints": CHECKPOINT_COLUMNS,
    "events": EVENT_COLUMNS,
    "actions": ACTION_COLUMNS,
    "filed": FILED_COLUMNS,
}
REQUIRED = {
    "steps": ("step",),
    "rank_steps": ("step", "rank"),
    "evals": ("step", "name", "value"),
    "checkpoints": ("step", "event"),
    "events": ("step", "kind"),
    "actions": ("step", "request_id", "status"),
    "filed": ("time", "request_id"),
}
"""The columns a frame cannot do without; every other column may be left out."""
INTEGER_COLUMNS = ("timeline", "step", "rank", "seq")
TEXT_COLUMNS = (
    "shards",
    "param_checksum",
    "split",
    "name",
    "event",
    "path",
    "message",
    "kind",
    "host",
    "request_id",
    "action",
    "status",
    "operator",
)


@dataclass(frozen=True)
class Detection:
    """What the detectors found: every finding (latest version, by timeline and onset) and the incidents."""

    findings: list[Finding]
    incidents: list[Incident]


def detect(
    *,
    steps: pd.DataFrame | None = None,
    rank_steps: pd.DataFrame | None = None,
    evals: pd.DataFrame | None = None,
    checkpoints: pd.DataFrame | None = None,
    events: pd.DataFrame | None = None,
    actions: pd.DataFrame | None = None,
    filed: pd.DataFrame | None = None,
    topology: pd.DataFrame | None = None,
    world_size: int | None = None,
    settings: dict[str, dict[str, Any]] | None = None,
    only: list[str] | None = None,
) -> Detection:
    """Run the registered detectors (or those in ``only``, with ``settings`` by name) over whole frames.

    A frame left out is empty; a column left out is missing (NaN), except ``timeline``
    (0), ``rank`` (0), ``seq`` (the row's position) and ``time`` (the step, as seconds, each
    timeline after the one before: a rewind's steps come after the abandoned branch's).
    ``world_size`` defaults to the ranks seen.
    """
    run = RunState(world_size=world_size, topology=_topology(topology))
    runner = DetectorRunner(build_detectors(settings, only), run)
    book = IncidentBook()
    batch = telemetry_batch(
        steps=steps,
        rank_steps=rank_steps,
        evals=evals,
        checkpoints=checkpoints,
        events=events,
        actions=actions,
        filed=filed,
    )
    book.add(runner.update(batch))
    book.add(runner.finish())
    book.went_on(run.newest_timeline)
    findings = runner.ordered()
    incidents = [book.describe(i) for i in dict.fromkeys(book.incident_of(f) for f in findings)]
    return Detection(findings, incidents)


def telemetry_batch(**frames: pd.DataFrame | None) -> TelemetryBatch:
    """One batch from frames named as ``TelemetryBatch``'s fields, completed as ``detect`` says."""
    unknown = sorted(set(frames) - set(FRAMES))
    if unknown:
        raise DetectorInputError(f"unknown frame {', '.join(unknown)} (known: {', '.join(FRAMES)})")
    steps = [frame["step"] for frame in frames.values() if frame is not None and "step" in frame and len(frame)]
    span = 1.0 + max((float(pd.to_numeric(s, errors="coerce").max()) for s in steps), default=0.0)
    return TelemetryBatch(**{name: _completed(name, frame, span) for name, frame in frames.items()})


def _completed(name: str, frame: pd.DataFrame | None, span: float) -> pd.DataFrame:
    """``frame`` with every column the detectors read, in the order its rows were written; without times, a
    row's time is its step plus ``span`` (one more than any step given) per timeline before its own."""
    columns = FRAMES[name]
    if frame is None or frame.empty:
        return empty_frame(columns)
    missing = [c for c in REQUIRED[name] if c not in frame or frame[c].isna().any()]
    if missing:
        raise DetectorInputError(f"{name}: column {', '.join(missing)} is missing or has missing values")
    out = frame.reset_index(drop=True)
    defaults = {"timeline": 0, "rank": 0, "seq": np.arange(len(out))}
    out = out.assign(**{c: defaults.get(c, None if c in TEXT_COLUMNS else np.nan) for c in columns if c not in out})
    out = out.assign(**{c: _whole(name, c, out[c]) for c in INTEGER_COLUMNS if c in columns})
    if "time" not in frame:
        out = out.assign(time=out["step"].astype(float) + span * out["timeline"].astype(float))
    return out.sort_values("time", kind="stable", ignore_index=True)[list(columns)]


def _whole(frame: str, column: str, values: pd.Series) -> np.ndarray:
    """``values`` as int64; ``DetectorInputError`` naming the column when one is not a whole number."""
    x = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    if not np.isfinite(x).all() or (x != np.round(x)).any():
        raise DetectorInputError(f"{frame}: column {column} must hold whole numbers only")
    return x.astype(np.int64)


def _topology(frame: pd.DataFrame | None) -> pd.DataFrame:
    """Each rank's host and mesh coordinates (``rank`` required), or none."""
    if frame is None or frame.empty:
        return empty_frame(TOPOLOGY_COLUMNS)
    if "rank" not in frame:
        raise DetectorInputError("topology: column rank is missing")
    return frame.assign(**{c: None if c in TEXT_COLUMNS else np.nan for c in TOPOLOGY_COLUMNS if c not in frame})
