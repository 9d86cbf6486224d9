"""The alert payload, version 1: what every notifier is given and what a generic webhook receives.

Its JSON Schema is ``alert.schema.json`` (docs/alerts.md). Slack and Discord messages
are rendered from it, so the outbox keeps one form of each message.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from bedside.detectors.finding import Finding, json_safe
from bedside.detectors.incidents import Incident, worst_of

if TYPE_CHECKING:
    from bedside.collectors.audit import AuditHead

PAYLOAD_SCHEMA = "bedside.alert/1"
EVENT_WORDS = {
    "opened": "New incident",
    "escalated": "Severity rose",
    "reopened": "Reopened",
    "resolved": "Resolved",
    "acknowledged": "Acknowledged",
    "digest": "Digest",
    "test": "Test message",
    "owner_failed": "Monitoring stopped",
    "owner_recovered": "Monitoring resumed",
    "playbook_acted": "Playbook acted",
    "playbook_stopped": "Playbook stopped",
}
"""Every event a message can announce, and how a message names it."""
KEY_EVIDENCE = 8
"""How many scalar evidence values a message shows."""


@dataclass(frozen=True)
class RunRef:
    """The run a message is about."""

    run_id: str
    name: str


@dataclass(frozen=True)
class Acknowledgement:
    by: str
    note: str


def schema() -> dict[str, Any]:
    """The JSON Schema of the payload."""
    return json.loads(resources.files(__package__).joinpath("alert.schema.json").read_text())


def incident_payload(
    message_id: str,
    event: str,
    run: RunRef,
    incident: Incident,
    *,
    notifier: str,
    ack: Acknowledgement | None,
    dashboard_url: str,
    now: float,
    resolution: Acknowledgement | None = None,
    audit_head: AuditHead | None = None,
) -> dict[str, Any]:
    """An incident's message: what happened, where, the key evidence and what to do.

    ``resolution``: who closed the incident by hand, and why; ``audit_head``: the audit trail's head the store
    recorded last, a copy that leaves the machine with the message.
    """
    status = "resolved" if incident.resolved or resolution else "acknowledged" if ack else "open"
    body = {
        "id": incident.incident_id,
        "title": incident.title,
        "status": status,
        "severity": incident.severity.value,
        "cause": incident.cause,
        "timeline": incident.timeline,
        "start_step": incident.start_step,
        "end_step": incident.end_step,
        "kinds": list(incident.kinds),
        "ranks": list(incident.ranks),
        "findings": len(incident.findings),
        "summary": incident.summary,
        "suggested_action": incident.suggested_action.to_json(),
        "evidence": key_evidence(worst_of(incident.findings)),
        "acknowledged_by": ack.by if ack else None,
        "ack_note": ack.note if ack else None,
        "resolved_by": resolution.by if resolution else None,
        "resolve_note": resolution.note if resolution else None,
        "resolution": "closed by hand" if resolution else incident.resolution,
        "url": incident_url(dashboard_url, run, incident.incident_id),
    }
    envelope = _envelope(message_id, event, run, notifier, now, incident.severity.value, incident=json_safe(body))
    return envelope | {"audit_head": head_json(audit_head)}


def digest_payload(
    message_id: str,
    run: RunRef,
    *,
    notifier: str,
    severity: str,
    findings: int,
    since: float,
    held: list[dict[str, Any]],
    dashboard_url: str,
    now: float,
    listed: int = 10,
    audit_head: AuditHead | None = None,
) -> dict[str, Any]:
    """What a flood held back: how many findings since ``since``, and the incidents whose messages waited (and,
    as every routed message, the audit trail's last recorded head)."""
    digest = {
        "findings": findings,
        "since": _iso(since),
        "window_s": round(now - since, 3),
        "held_messages": len(held),
        "incidents": held[:listed],
        "more_incidents": max(0, len(held) - listed),
        "url": incident_url(dashboard_url, run, None),
    }
    envelope = _envelope(message_id, "digest", run, notifier, now, severity, digest=digest)
    return envelope | {"audit_head": head_json(audit_head)}


def probe_payload(message_id: str, run: RunRef, *, notifier: str, now: float) -> dict[str, Any]:
    """A message that only proves the path works."""
    return _envelope(message_id, "test", run, notifier, now, "info")


def owner_payload(
    message_id: str,
    run: RunRef,
    *,
    notifier: str,
    error: str,
    failed_at: float,
    restarts: int,
    next_retry_at: float | None,
    now: float,
) -> dict[str, Any]:
    """The process following the run failed (``next_retry_at`` set) or works again after a failure (None)."""
    owner = {
        "state": "failed" if next_retry_at else "recovered",
        "error": error,
        "failed_at": _iso(failed_at),
        "restarts": restarts,
        "next_retry_at": _iso(next_retry_at) if next_retry_at else None,
    }
    event, severity = ("owner_failed", "critical") if next_retry_at else ("owner_recovered", "info")
    payload = _envelope(message_id, event, run, notifier, now, severity)
    retry = f"; retrying at {owner['next_retry_at']}" if next_retry_at else ""
    payload["text"] = f"[{severity.upper()}] {run.name}: {EVENT_WORDS[event]}: " + (
        f"{error}{retry} (restarts so far: {restarts})"
        if next_retry_at
        else f"ingestion and detection caught up again after: {error}"
    )
    return payload | {"owner": owner}


def playbook_payload(
    message_id: str, run: RunRef, *, notifier: str, playbook: dict[str, Any], stopped: bool, now: float
) -> dict[str, Any]:
    """An automatic playbook filed ``playbook["requests"]`` (``playbook_acted``), or stopped and pages a human
    (``playbook_stopped``, critical)."""
    event, severity = ("playbook_stopped", "critical") if stopped else ("playbook_acted", "warning")
    payload = _envelope(message_id, event, run, notifier, now, severity)
    filed = "; ".join(
        f"{r['action']} ({', '.join(f'{k}={v}' for k, v in r['args'].items())}) as {r['request_id']}"
        for r in playbook["requests"]
    )
    payload["text"] = (
        f"[{severity.upper()}] {run.name}: {EVENT_WORDS[event]}: rule {playbook['rule']} on incident "
        f"{playbook['incident_id']}: " + (playbook["reason"] if stopped else f"filed {filed}: {playbook['reason']}")
    )
    return payload | {"playbook": playbook}


def _envelope(
    message_id: str,
    event: str,
    run: RunRef,
    notifier: str,
    now: float,
    severity: str,
    incident: dict | None = None,
    digest: dict | None = None,
) -> dict[str, Any]:
    return {
        "schema": PAYLOAD_SCHEMA,
        "id": message_id,
        "event": event,
        "severity": severity,
        "created_at": _iso(now),
        "notifier": notifier,
        "run": {"id": run.run_id, "name": run.name},
        "incident": incident,
        "digest": digest,
        "text": headline(event, run, severity, incident, digest),
    }


def headline(event: str, run: RunRef, severity: str, incident: dict | None, digest: dict | None) -> str:
    """The message in one line (chat notification text, log line); owner messages set their own."""
    if incident:
        steps = f"steps {incident['start_step']}-{incident['end_step']}, timeline {incident['timeline']}"
        status = (
            "" if event in ("resolved", "acknowledged") or incident["status"] == "open" else f", {incident['status']}"
        )
        return (
            f"[{severity.upper()}] {run.name}: {EVENT_WORDS[event]}: {incident['title']} ({steps}{status}): "
            f"{incident['summary']}"
        )
    if digest:
        minutes = max(1, round(digest["window_s"] / 60))
        return (
            f"[{severity.upper()}] {run.name}: {digest['findings']} more finding"
            f"{'' if digest['findings'] == 1 else 's'} in the last {minutes} minute{'' if minutes == 1 else 's'}"
            f" ({digest['held_messages']} message{'' if digest['held_messages'] == 1 else 's'} held back)"
        )
    return f"[TEST] {run.name}: bedside can reach this notifier"


def head_json(head: AuditHead | None) -> dict[str, Any] | None:
    """An audit trail head as the payload carries it."""
    return {"seq": head.seq, "hash": head.hash} if head else None


def incident_url(dashboard_url: str, run: RunRef, incident_id: str | None) -> str | None:
    """The dashboard's incidents page (on one incident), or None without a configured dashboard URL."""
    if not dashboard_url:
        return None
    query = {"run": run.name} | ({"incident": incident_id} if incident_id else {})
    return f"{dashboard_url}/incidents?{urlencode(query, quote_via=quote)}"


def key_evidence(finding: Finding) -> dict[str, Any]:
    """The worst finding's scalar evidence (numbers, short strings), at most ``KEY_EVIDENCE`` of them."""
    picked = {}
    for name, value in json_safe(finding.evidence).items():
        if isinstance(value, (int, float, bool)) or (isinstance(value, str) and len(value) <= 80):
            picked[name] = round(value, 4) if isinstance(value, float) else value
        if len(picked) == KEY_EVIDENCE:
            break
    return picked


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"
