"""Everything a report tells, read at once through the dashboard's named queries, with the store open read-only.

A report never writes into the run: the store is opened read-only (``collectors.query.open_for_reading``), and a
store another process holds, or one that is damaged, is rebuilt in memory from the raw telemetry, without the
findings and incidents (``RunRecord.note`` says so). The audit trail is read, never appended to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bedside.collectors import audit
from bedside.collectors.layout import RunLayout, require_run_dir
from bedside.collectors.query import open_for_reading
from bedside.collectors.store import Store

from ..dashboard import rank_view
from ..service.schema import SCHEMAS

QUERIES: dict[str, dict[str, Any]] = {
    "run": {},
    "progress": {"window": 50},
    "timelines": {},
    "restarts": {},
    "hosts": {},
    "steps": {},
    "evals": {},
    "incidents": {},
    "open_incidents": {},
    "unanswered": {},
    "actions": {},
    "checkpoints": {},
    "good_checkpoint": {},
    "goodput": {},
    "abandoned": {},
}
"""The dashboard's queries (``dash_<name>``) a report reads, with their parameters."""
HEATMAP_COLUMNS = 200
"""Step buckets of a straggler incident's heatmap at most."""


@dataclass(frozen=True)
class RankWindow:
    """The rank heatmap around one straggler incident: its rows, cells, phase, band size and flagged ranks."""

    incident_id: str
    rows: pd.DataFrame
    cells: pd.DataFrame
    phase: str
    band: int
    flagged: list[int]
    first: int
    last: int


@dataclass(frozen=True)
class RunRecord:
    """One run as a report tells it: query results by name, each incident's findings, the rank windows and the
    audit trail, as of ``read_at``."""

    run_dir: Path
    source: str
    note: str
    frames: dict[str, pd.DataFrame]
    findings: dict[str, pd.DataFrame]
    windows: list[RankWindow]
    trail: audit.ChainReport
    read_at: float = field(default_factory=time.time)

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.frames[name]


def read_run(run_dir: Path) -> RunRecord:
    """Read everything a report of ``run_dir`` tells; RunDirError when it is no run directory."""
    view = open_for_reading(require_run_dir(run_dir), verify=True, schemas=SCHEMAS)
    try:
        frames = {name: view.store.fetch_named(f"dash_{name}", params) for name, params in QUERIES.items()}
        findings = {
            incident: view.store.fetch_named("dash_incident_findings", {"incident_id": incident})
            for incident in frames["incidents"]["incident_id"]
        }
        incidents = frames["incidents"]
        stragglers = incidents[incidents["kinds"].map(lambda kinds: "straggler" in kinds).astype(bool)]
        windows = [rank_window(view.store, row, findings[row["incident_id"]]) for _, row in stragglers.iterrows()]
        heads = audit.read_heads(view.store) if view.source == "store" else None
    finally:
        view.store.close()
    trail = audit.verify(RunLayout(run_dir), heads)
    return RunRecord(run_dir, view.source, view.note, frames, findings, windows, trail)


def rank_window(store: Store, incident: pd.Series, findings: pd.DataFrame) -> RankWindow:
    """Each rank's compute time over its peers' (step time for a run without phases) from ``rank_view.INCIDENT_MARGIN`` steps
    before a straggler incident to as many after it."""
    timeline = int(incident["timeline"])
    first = max(0, int(incident["start_step"]) - rank_view.INCIDENT_MARGIN)
    last = int(incident["end_step"]) + rank_view.INCIDENT_MARGIN
    rows = store.fetch_named("dash_rank_rows", {"timeline": timeline})
    band = rank_view.band_size(len(rows))
    params = {"timeline": timeline, "first_step": first, "last_step": last, "band": band}
    params |= {"bucket": max(1, -(-(last - first + 1) // HEATMAP_COLUMNS)), "first_row": 0, "last_row": len(rows)}
    for phase in ("compute", "step"):
        cells = store.fetch_named("dash_rank_heatmap", params | {"phase": phase})
        if cells["ratio"].notna().any():
            break
    flagged = rank_view.flagged_ranks(findings)
    return RankWindow(str(incident["incident_id"]), rows, cells, phase, band, flagged, first, last)
