"""Which incident changes become messages, for each notifier, and the outbox rows that carry them.

Per notifier and incident: the first change that qualifies opens it (``opened``); later
findings update it silently unless the severity rises (``escalated``); clearing sends
``resolved`` and coming back ``reopened``; an acknowledgement is announced too. Each
notifier has a token bucket: a message it denies is kept as ``held`` and summarised,
with the findings that arrived quietly meanwhile, in one digest per window. What was
said is rebuilt from the outbox when the owner restarts, so a replay says nothing twice.
Incidents that had opened and cleared before alerts were configured stay history.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from bedside.collectors.audit import AuditHead, read_heads
from bedside.collectors.store import Store
from bedside.detectors.finding import Severity
from bedside.detectors.incidents import Incident

from .config import AlertSettings, NotifierConfig
from .payload import Acknowledgement, RunRef, digest_payload, incident_payload

RATE_LIMITED = ("opened", "escalated", "reopened", "resolved")
"""Events a notifier's token bucket can hold back (acknowledgements and digests are never held)."""


@dataclass(frozen=True)
class OutboxMessage:
    """One message for one notifier, as the outbox stores it."""

    message_id: str
    notifier: str
    incident_id: str | None
    event: str
    severity: str
    incident_status: str | None
    payload: dict[str, Any]
    created_at: float
    status: str  # pending or held


@dataclass
class OutboxWrite:
    """New messages, and the held messages a digest now covers (message id, digest id)."""

    messages: list[OutboxMessage] = field(default_factory=list)
    digested: list[tuple[str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.messages or self.digested)

    def extend(self, other: OutboxWrite) -> None:
        self.messages += other.messages
        self.digested += other.digested

    def writes(self) -> list[tuple[str, dict[str, pa.Table]]]:
        """The named write and its tables, for ``Store.write_named``."""
        messages = pa.Table.from_pylist(
            [
                {
                    "position": i,
                    "message_id": m.message_id,
                    "notifier": m.notifier,
                    "incident_id": m.incident_id,
                    "event": m.event,
                    "severity": m.severity,
                    "incident_status": m.incident_status,
                    "payload": json.dumps(m.payload, separators=(",", ":")),
                    "created_at": m.created_at,
                    "status": m.status,
                }
                for i, m in enumerate(self.messages)
            ],
            schema=_MESSAGES_SCHEMA,
        )
        digested = pa.Table.from_pylist(
            [{"message_id": m, "digest_id": d} for m, d in self.digested], schema=_DIGESTED_SCHEMA
        )
        return [("insert_outbox", {"new_messages": messages, "digested": digested})]


class TokenBucket:
    """``burst`` messages at once, refilled at ``per_minute``."""

    def __init__(self, per_minute: float, burst: int) -> None:
        self.rate = per_minute / 60.0
        self.capacity = float(burst)
        self.tokens = float(burst)
        self.at: float | None = None

    def take(self, now: float) -> bool:
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _Told:
    """What one notifier has been told of one incident."""

    level: int = -1
    resolved: bool = False
    events: Counter = field(default_factory=Counter)


@dataclass
class _Window:
    """What one notifier's next digest will cover."""

    since: float | None = None
    level: int = Severity.WARNING.level
    findings: set[str] = field(default_factory=set)
    held: list[OutboxMessage] = field(default_factory=list)

    def note(self, now: float, severity: Severity) -> None:
        if self.since is None:
            self.since = now
        self.level = max(self.level, severity.level)


class AlertRouter:
    """Turns incident changes into outbox messages for every configured notifier."""

    def __init__(self, store: Store, settings: AlertSettings, *, on_commit: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.settings = settings
        self.on_commit = on_commit
        self._notifiers = settings.notifiers
        self._buckets = {n.name: TokenBucket(n.per_minute, n.burst) for n in self._notifiers}
        self._windows = {n.name: _Window() for n in self._notifiers}
        self._told: dict[tuple[str, str], _Told] = {}
        incidents = store.fetch_named("incident_acks")
        self._history = {i for i, resolved in zip(incidents["incident_id"], incidents["resolved"]) if resolved}
        stored = store.fetch_named("finding_incidents")
        self._stored_findings = {
            f: (int(end), bool(active))
            for f, end, active in zip(stored["finding_id"], stored["end_step"], stored["active"])
        }
        self._stored_members = Counter(stored["incident_id"])
        self._recall(store.fetch_named("outbox_history"))

    def _recall(self, history: Any) -> None:
        """Rebuild what each notifier was told, and the held messages awaiting a digest, from the outbox."""
        for row in history.itertuples(index=False):
            if row.incident_id is None:
                continue
            told = self._told.setdefault((row.notifier, row.incident_id), _Told())
            told.events[row.event] += 1
            told.level = max(told.level, Severity(row.severity).level)
            told.resolved = row.incident_status == "resolved"
            if row.status == "held" and row.notifier in self._windows:
                window = self._windows[row.notifier]
                window.note(row.created_at, Severity(row.severity))
                window.held.append(
                    OutboxMessage(
                        row.message_id,
                        row.notifier,
                        row.incident_id,
                        row.event,
                        row.severity,
                        row.incident_status,
                        json.loads(row.payload),
                        row.created_at,
                        "held",
                    )
                )

    def route(self, incidents: list[Incident], changed: set[str], now: float) -> OutboxWrite:
        """The messages these incident changes call for; ``changed`` are the finding ids that changed."""
        out = OutboxWrite()
        acks = self._stored_acks() if incidents and self._notifiers else {}
        for incident in incidents:
            if incident.closed_by_hand or self._replayed(incident):
                continue
            for notifier in self._notifiers:
                message = self._message_for(notifier, incident, now, acks.get(incident.incident_id))
                if message:
                    out.messages.append(message)
                if (message is None or message.status == "held") and self._told_of(notifier, incident).level >= 0:
                    self._quiet(notifier, incident, changed, now)
        return out

    def acknowledge(self, incident: Incident, by: str, note: str, now: float) -> OutboxWrite:
        """Announce an acknowledgement to every notifier that was told of the incident (never held back)."""
        ack = Acknowledgement(by, note)
        out = OutboxWrite()
        for notifier in self._notifiers:
            if self._told_of(notifier, incident).level >= 0 and not incident.resolved:
                out.messages.append(self._message(notifier, incident, "acknowledged", now, held=False, ack=ack))
        return out

    def resolve_by_hand(self, incident: Incident, by: str, note: str, now: float) -> OutboxWrite:
        """Announce that an operator closed the incident to every notifier told of it and not yet told it was
        resolved (never held back); nothing more is said of it."""
        resolution = Acknowledgement(by, note)
        ack = self._stored_acks().get(incident.incident_id)
        out = OutboxWrite()
        for notifier in self._notifiers:
            told = self._told_of(notifier, incident)
            if told.level >= 0 and not told.resolved:
                out.messages.append(
                    self._message(notifier, incident, "resolved", now, held=False, resolution=resolution, ack=ack)
                )
        return out

    def tick(self, now: float) -> OutboxWrite:
        """Digests for notifiers whose window has passed and which were flooded in it."""
        out = OutboxWrite()
        for notifier in self._notifiers:
            window = self._windows[notifier.name]
            if window.since is None or now - window.since < self.settings.digest_window_s:
                continue
            if window.held or len(window.findings) >= self.settings.digest_min_findings:
                out.extend(self._digest(notifier, window, now))
            self._windows[notifier.name] = _Window()
        return out

    def committed(self) -> None:
        """The messages routed so far are in the store: wake the sender."""
        self.on_commit()

    def _replayed(self, incident: Incident) -> bool:
        """Whether the incident is in a state older than the one stored: a restarted owner's replay passing
        through what was already routed (a finding still active that the end of the data settled, one not
        replayed yet), which is no news. Anything beyond the stored state is."""
        behind = len(incident.findings) < self._stored_members[incident.incident_id]
        for finding in incident.findings:
            if finding.finding_id not in self._stored_findings:
                return False
            end_step, active = self._stored_findings[finding.finding_id]
            if finding.end_step > end_step or (active and not finding.active):
                return False
            behind |= finding.end_step < end_step or (finding.active and not active)
        return behind

    def _message_for(
        self, notifier: NotifierConfig, incident: Incident, now: float, ack: Acknowledgement | None
    ) -> OutboxMessage | None:
        told = self._told_of(notifier, incident)
        if told.level < 0:
            if not notifier.accepts(incident.severity, incident.kinds):
                return None
            if incident.resolved and incident.incident_id in self._history:
                return None  # opened and cleared before this notifier was configured
            event = "opened"
        elif incident.resolved != told.resolved:
            event = "resolved" if incident.resolved else "reopened"
        elif incident.severity.level > told.level:
            event = "escalated"
        else:
            return None
        held = not self._buckets[notifier.name].take(now)
        return self._message(notifier, incident, event, now, held=held, ack=ack)

    def _message(
        self,
        notifier: NotifierConfig,
        incident: Incident,
        event: str,
        now: float,
        *,
        held: bool,
        resolution: Acknowledgement | None = None,
        ack: Acknowledgement | None = None,
    ) -> OutboxMessage:
        """The message of ``event``, showing ``ack`` (who took the incident on) when there is one."""
        told = self._told_of(notifier, incident)
        told.events[event] += 1
        told.level = max(told.level, incident.severity.level)
        told.resolved = incident.resolved or resolution is not None
        run = self._run()
        message_id = f"{run.run_id or run.name}/{notifier.name}/{incident.incident_id}/{event}/{told.events[event]}"
        payload = incident_payload(
            message_id,
            event,
            run,
            incident,
            notifier=notifier.name,
            ack=ack,
            dashboard_url=self.settings.dashboard_url,
            now=now,
            resolution=resolution,
            audit_head=self._audit_head(),
        )
        message = OutboxMessage(
            message_id,
            notifier.name,
            incident.incident_id,
            event,
            incident.severity.value,
            payload["incident"]["status"],
            payload,
            now,
            "held" if held else "pending",
        )
        if held:
            self._windows[notifier.name].held.append(message)
        return message

    def _quiet(self, notifier: NotifierConfig, incident: Incident, changed: set[str], now: float) -> None:
        """Count the incident's new findings that went out without a message of their own (or were held)."""
        window = self._windows[notifier.name]
        new = {f.finding_id for f in incident.findings} & changed - self._stored_findings.keys()
        if new or (window.held and window.held[-1].incident_id == incident.incident_id):
            window.note(now, incident.severity)
            window.findings |= new

    def _digest(self, notifier: NotifierConfig, window: _Window, now: float) -> OutboxWrite:
        run = self._run()
        assert window.since is not None
        severity = ("info", "warning", "critical")[window.level]
        digest_id = f"{run.run_id or run.name}/{notifier.name}/digest/{int(window.since * 1000)}"
        held = [
            {
                "id": m.incident_id,
                "title": m.payload["incident"]["title"],
                "severity": m.severity,
                "status": m.incident_status,
                "event": m.event,
            }
            for m in window.held
        ]
        payload = digest_payload(
            digest_id,
            run,
            notifier=notifier.name,
            severity=severity,
            findings=len(window.findings),
            since=window.since,
            held=held,
            dashboard_url=self.settings.dashboard_url,
            now=now,
            audit_head=self._audit_head(),
        )
        message = OutboxMessage(digest_id, notifier.name, None, "digest", severity, None, payload, now, "pending")
        return OutboxWrite([message], [(m.message_id, digest_id) for m in window.held])

    def _stored_acks(self) -> dict[str, Acknowledgement]:
        """Who acknowledged each incident, read from the store (its only record) once per routing."""
        rows = self.store.fetch_named("incident_acks")
        return {
            i: Acknowledgement(by, note or "")
            for i, by, note in zip(rows["incident_id"], rows["acknowledged_by"], rows["ack_note"])
            if by
        }

    def _told_of(self, notifier: NotifierConfig, incident: Incident) -> _Told:
        return self._told.setdefault((notifier.name, incident.incident_id), _Told())

    def _audit_head(self) -> AuditHead | None:
        """The audit trail's newest head the store recorded (checked by its owner), None before the first."""
        heads = read_heads(self.store)
        return heads[-1] if heads else None

    def _run(self) -> RunRef:
        rows = self.store.fetch_named("alert_run")
        fallback = self.store.path.parent.name if self.store.path else "run"
        if rows.empty:
            return RunRef("", fallback)
        return RunRef(rows["run_id"][0] or "", rows["name"][0] or fallback)


_MESSAGES_SCHEMA = pa.schema(
    [
        ("position", pa.int64()),
        ("message_id", pa.string()),
        ("notifier", pa.string()),
        ("incident_id", pa.string()),
        ("event", pa.string()),
        ("severity", pa.string()),
        ("incident_status", pa.string()),
        ("payload", pa.string()),
        ("created_at", pa.float64()),
        ("status", pa.string()),
    ]
)
_DIGESTED_SCHEMA = pa.schema([("message_id", pa.string()), ("digest_id", pa.string())])
