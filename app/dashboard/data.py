"""The dashboard's one data layer: named queries of a run (SQL in ``collectors/store/queries/dash_*.sql``),
cached per store version, and the few writes an operator can make (actions, acknowledgements).

A run is read through its owner's store in this process. When another process holds
the store (``bedside watch``), it is rebuilt read-only from the raw telemetry each
refresh, without findings (those live in the owner's store).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd

from bedside.collectors import audit
from bedside.collectors.control_reader import reader_warning
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout
from bedside.collectors.query import ReadView, open_for_reading
from bedside.collectors.store import Store
from bedside.collectors.store.console import (
    ConsoleLimits,
    ConsoleResult,
    CsvExport,
    run_console_query,
    write_console_csv,
)

from ..service.owner import RunOwner
from ..service.playbooks.trail import Switch, read_switch, set_switch
from ..service.schema import SCHEMAS

CACHED_VERSIONS = 1
ENDED = ("finished", "failed", "aborted")
PREVIEW_LIMITS = ConsoleLimits(timeout_s=10.0, max_rows=1_000, max_bytes=16 << 20)
"""What the SQL page shows of a result: the browser gets at most this, whatever the query."""
CSV_LIMITS = ConsoleLimits(timeout_s=120.0, max_rows=50_000_000, max_bytes=4 << 30)
"""What a CSV download of a result may hold: written to a file on the server a batch at a time (memory holds one
batch), so the bounds are the disk's and the time's."""


class RunData:
    """One run as the pages see it."""

    def __init__(self, run_dir: Path, owner: RunOwner | None, *, refresh_s: float) -> None:
        self.run_dir = run_dir
        self.layout = RunLayout(run_dir)
        self.owner = owner
        self.refresh_s = refresh_s
        self.note = (
            ""
            if owner
            else (
                "Read-only: another process holds this run's store (bedside watch?). Telemetry "
                "is read from the raw files; findings, incidents and acknowledgements are in "
                "that process."
            )
        )
        self.timings: dict[str, float] = {}
        self._lock = threading.RLock()  # every browser session shares this object, each in its own thread
        self._cache: dict[tuple, pd.DataFrame] = {}
        self._view: tuple[int, ReadView] | None = None

    @property
    def name(self) -> str:
        return self.run_dir.name

    def title(self) -> str:
        """The run's name from run.json, else its folder's."""
        run = self.frame("run")
        return str(run["name"].iloc[0]) if not run.empty and run["name"].notna().iloc[0] else self.name

    @property
    def can_write(self) -> bool:
        """Acknowledgements need the store's owner; control requests only the run directory."""
        return self.owner is not None

    def version(self) -> int:
        """Changes whenever the store may have: the owner's counter, else the refresh period."""
        return self.owner.version if self.owner else int(time.time() // self.refresh_s)

    def store(self) -> Store:
        """The owner's store, else a read-only copy rebuilt each refresh period (call with the lock held)."""
        if self.owner:
            return self.owner.store
        version = self.version()
        if self._view is None or self._view[0] != version:
            if self._view:
                self._view[1].store.close()
            self._view = (
                version,
                open_for_reading(self.run_dir, verify=True, schemas=SCHEMAS),
            )  # a damaged store: the telemetry
        return self._view[1].store

    def frame(self, query: str, /, **params: Any) -> pd.DataFrame:
        """The named query ``dash_<query>`` with its parameters, cached until the store changes."""
        with self._lock:
            key = (query, tuple(sorted(params.items())), self.version())
            if key not in self._cache:
                started = time.perf_counter()
                self._cache[key] = self.store().fetch_named(f"dash_{query}", params)
                self.timings[query] = time.perf_counter() - started
                self._forget_old(key[2])
            return self._cache[key]

    def user_query(self, sql: str) -> ConsoleResult:
        """A viewer's SELECT over the documented views, in a sandbox that cannot write (``store.console``): its
        first ``PREVIEW_LIMITS`` rows, and whether there are more."""
        if self.owner:
            return run_console_query(self.owner.store, sql, PREVIEW_LIMITS)
        with self._lock:  # a read-only copy stays open while the query runs
            return run_console_query(self.store(), sql, PREVIEW_LIMITS)

    def user_csv(self, sql: str, out: BinaryIO) -> CsvExport:
        """Write the whole result of a viewer's SELECT to ``out`` as CSV (within ``CSV_LIMITS``), run again in a
        new sandbox a batch at a time; what it holds."""
        if self.owner:
            return write_console_csv(self.owner.store, sql, out, CSV_LIMITS)
        with self._lock:
            return write_console_csv(self.store(), sql, out, CSV_LIMITS)

    def action_refusal(self, incident_id: str | None) -> str | None:
        """Why no control request may be filed now (the run has ended, the incident is resolved); None if one may."""
        run = self.frame("run")
        if not run.empty and run["status"].iloc[0] in ENDED:
            return f"the run has {run['status'].iloc[0]}: no trainer is left to apply a request"
        if incident_id is not None:
            incidents = self.frame("incidents")
            status = incidents.loc[incidents["incident_id"] == incident_id, "status"]
            if not status.empty and status.iloc[0] == "resolved":
                return "the incident is resolved: act on an open one"
        return None

    def reader_warning(self) -> str | None:
        """Why a request filed now may wait unread (no control reader, or a stale one, or the run has ended)."""
        run, reader = self.frame("run"), self.frame("control_reader")
        status = str(run["status"].iloc[0]) if not run.empty else "empty"
        last = reader["last_beat"].dropna()
        return reader_warning(status, float(last.iloc[0]) if not last.empty else None, time.time())

    def request(
        self, action: str, args: dict[str, Any], *, operator: str, reason: str, incident_id: str | None
    ) -> tuple[str, audit.AuditHead]:
        """File a control request for the trainer and record it in the audit trail; its request id and the
        trail's new head."""
        if refusal := self.action_refusal(incident_id):
            raise BedsideError(f"not filed: {refusal}")
        try:
            request_id, head = audit.file_request(
                self.layout, action, args, operator=operator, reason=reason, incident_id=incident_id
            )
        except ValueError as exc:
            raise BedsideError(str(exc)) from exc
        self._keep_audit_head()
        return request_id, head

    def acknowledge(self, incident_id: str, *, operator: str, note: str) -> None:
        """Take an incident on: stored, announced to the notifiers, and in the audit trail."""
        if not self.owner:
            raise BedsideError("acknowledging needs the store, which another process holds: use that process")
        incidents = self.frame("incidents")
        taken = incidents[(incidents["incident_id"] == incident_id) & (incidents["status"] != "open")]
        if not taken.empty:
            raise BedsideError(f"not acknowledged: the incident is already {taken['status'].iloc[0]}")
        self.owner.acknowledge(incident_id, operator, note)
        self._audit(operator=operator, what="acknowledge", reason=note, incident_id=incident_id)

    def resolve(self, incident_id: str, *, operator: str, note: str) -> None:
        """Close an incident by hand (a false alarm, or handled): stored, announced, and in the audit trail."""
        if not self.owner:
            raise BedsideError("resolving needs the store, which another process holds: use that process")
        if not note.strip():
            raise BedsideError("say why the incident is resolved: the note goes to the audit trail and the alerts")
        self.owner.resolve(incident_id, operator, note.strip())
        self._audit(operator=operator, what="resolve", reason=note.strip(), incident_id=incident_id)

    def playbook_switch(self) -> Switch:
        """The kill switch of automatic playbooks as the trail last recorded it (off when the chain is broken)."""
        return read_switch(self.layout)

    def switch_playbooks(self, enabled: bool, *, operator: str, reason: str) -> None:
        """Turn automatic playbooks on or off for the run, as ``bedside playbook on|off`` does: an audit entry,
        which the live service reads before each automatic action."""
        try:
            set_switch(self.layout, enabled, operator=operator, reason=reason.strip())
        except (ValueError, OSError) as exc:
            raise BedsideError(f"playbooks not switched {'on' if enabled else 'off'}: {exc}") from exc
        self._keep_audit_head()

    def audit_trail(self) -> tuple[pd.DataFrame, audit.ChainReport]:
        """The trail, newest first, and its chain checked (against the heads the store recorded, when owned)."""
        report = audit.verify(self.layout, audit.read_heads(self.owner.store) if self.owner else None)
        return audit.entries_frame(report.entries), report

    def _audit(self, **entry: Any) -> None:
        audit.record(self.layout, **entry)
        self._keep_audit_head()

    def _keep_audit_head(self) -> None:
        """Have the owner record the trail's new head now, rather than on its next pass."""
        if self.owner:
            self.owner.keep_audit_head()

    def close(self) -> None:
        """Release a read-only copy (an owner's store is closed by its owner)."""
        with self._lock:
            if self._view:
                self._view[1].store.close()
                self._view = None

    def _forget_old(self, version: int) -> None:
        for key in [k for k in self._cache if k[2] < version - CACHED_VERSIONS + 1]:
            del self._cache[key]
