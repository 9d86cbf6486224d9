"""The dashboard's audit trail: every action and acknowledgement, who did it and why, append-only.

One JSON object per line in ``RUN/control/audit.jsonl``. Lines are only ever appended;
a line that does not parse (a torn write) is reported, never dropped silently.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from bedside.collectors.appendfile import AppendFile
from bedside.collectors.layout import RunLayout

AUDIT_NAME = "audit.jsonl"
COLUMNS = ("time", "operator", "what", "incident_id", "request_id", "args", "reason")


def audit_path(layout: RunLayout) -> Path:
    return layout.control / AUDIT_NAME


def record(layout: RunLayout, *, operator: str, what: str, reason: str, incident_id: str | None = None,
           request_id: str | None = None, args: dict[str, Any] | None = None) -> None:
    """Append one entry."""
    entry = {"time": time.time(), "operator": operator, "what": what, "incident_id": incident_id,
             "request_id": request_id, "args": args or {}, "reason": reason}
    trail = AppendFile(audit_path(layout))
    try:
        trail.write((json.dumps(entry, separators=(",", ":")) + "\n").encode())
    finally:
        trail.close()


def read(layout: RunLayout) -> tuple[pd.DataFrame, int]:
    """Every entry, newest first, and how many lines could not be read."""
    path = audit_path(layout)
    entries, unreadable = [], 0
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                unreadable += 1
                continue
            entries.append({name: entry.get(name) for name in COLUMNS})
    frame = pd.DataFrame(entries, columns=list(COLUMNS))
    if not frame.empty:
        frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
        frame["args"] = frame["args"].map(lambda a: json.dumps(a) if a else "")
    return frame.iloc[::-1].reset_index(drop=True), unreadable
