"""Findings and incidents into the run's store (tables finding_rows and incident_rows)."""

from __future__ import annotations

import json
import math
import time

import pyarrow as pa

from bedside.collectors.store import Store
from bedside.detectors.finding import Finding, json_safe
from bedside.detectors.incidents import Incident, IncidentBook

from .alerts.router import OutboxWrite


def load_book(store: Store) -> IncidentBook:
    """An incident book that remembers which incident each stored finding joined."""
    rows = store.fetch_named("finding_incidents")
    incidents = store.fetch_named("incident_acks")
    closed = {i for i, by in zip(incidents["incident_id"], incidents["resolved_by"]) if by is not None}
    return IncidentBook(dict(zip(rows["finding_id"], rows["incident_id"])), closed=closed)


def save(
    store: Store,
    book: IncidentBook,
    findings: list[Finding],
    incidents: list[Incident],
    outbox: OutboxWrite | None = None,
    now: float | None = None,
) -> None:
    """Upsert changed findings and incidents, with the alert messages they call for, in one transaction.

    Stored findings keep their first_seen, incidents their acknowledgement.
    """
    outbox = outbox or OutboxWrite()
    now = time.time() if now is None else now
    store.write_named(
        [
            ("upsert_findings", {"new_findings": _findings_table(book, findings, now)}),
            ("upsert_incidents", {"new_incidents": _incidents_table(incidents, now)}),
        ]
        + outbox.writes()
    )


def save_acknowledgement(store: Store, incident_id: str, by: str, note: str, outbox: OutboxWrite, now: float) -> None:
    """Record who acknowledged an incident and why, with the messages announcing it, in one transaction."""
    ack = pa.Table.from_pylist([{"incident_id": incident_id, "by": by, "note": note, "at": now}], schema=_ACK_SCHEMA)
    store.write_named([("acknowledge_incident", {"ack": ack})] + outbox.writes())


def save_resolution(store: Store, incident_id: str, by: str, note: str, outbox: OutboxWrite, now: float) -> None:
    """Record who closed an incident by hand and why, with the messages announcing it, in one transaction."""
    closing = pa.Table.from_pylist(
        [{"incident_id": incident_id, "by": by, "note": note, "at": now}], schema=_ACK_SCHEMA
    )
    store.write_named([("resolve_incident", {"closing": closing})] + outbox.writes())


def _findings_table(book: IncidentBook, findings: list[Finding], now: float) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "finding_id": f.finding_id,
                "detector": f.detector,
                "kind": f.kind,
                "severity": f.severity.value,
                "timeline": f.timeline,
                "start_step": f.start_step,
                "end_step": f.end_step,
                "ranks": list(f.ranks),
                "score": f.score if math.isfinite(f.score) else None,
                "summary": f.summary,
                "evidence": json.dumps(json_safe(f.evidence)),
                "suggested_action": json.dumps(f.suggested_action.to_json()),
                "active": f.active,
                "incident_id": book.incident_of(f),
                "now": now,
            }
            for f in findings
        ],
        schema=_FINDINGS_SCHEMA,
    )


def _incidents_table(incidents: list[Incident], now: float) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "incident_id": i.incident_id,
                "title": i.title,
                "severity": i.severity.value,
                "resolved": i.resolved,
                "cause": i.cause,
                "timeline": i.timeline,
                "start_step": i.start_step,
                "end_step": i.end_step,
                "kinds": list(i.kinds),
                "ranks": list(i.ranks),
                "findings": len(i.findings),
                "summary": i.summary,
                "suggested_action": json.dumps(i.suggested_action.to_json()),
                "resolution": i.resolution,
                "now": now,
            }
            for i in incidents
        ],
        schema=_INCIDENTS_SCHEMA,
    )


_FINDINGS_SCHEMA = pa.schema(
    [
        ("finding_id", pa.string()),
        ("detector", pa.string()),
        ("kind", pa.string()),
        ("severity", pa.string()),
        ("timeline", pa.int32()),
        ("start_step", pa.int64()),
        ("end_step", pa.int64()),
        ("ranks", pa.list_(pa.int32())),
        ("score", pa.float64()),
        ("summary", pa.string()),
        ("evidence", pa.string()),
        ("suggested_action", pa.string()),
        ("active", pa.bool_()),
        ("incident_id", pa.string()),
        ("now", pa.float64()),
    ]
)
_ACK_SCHEMA = pa.schema(
    [("incident_id", pa.string()), ("by", pa.string()), ("note", pa.string()), ("at", pa.float64())]
)
_INCIDENTS_SCHEMA = pa.schema(
    [
        ("incident_id", pa.string()),
        ("title", pa.string()),
        ("severity", pa.string()),
        ("resolved", pa.bool_()),
        ("cause", pa.string()),
        ("timeline", pa.int32()),
        ("start_step", pa.int64()),
        ("end_step", pa.int64()),
        ("kinds", pa.list_(pa.string())),
        ("ranks", pa.list_(pa.int32())),
        ("findings", pa.int32()),
        ("summary", pa.string()),
        ("suggested_action", pa.string()),
        ("resolution", pa.string()),
        ("now", pa.float64()),
    ]
)
