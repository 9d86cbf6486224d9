"""The playbooks' state as the run's audit trail holds it: the kill switch and the automatic actions so far.

Nothing is kept beside the trail (``RUN/control/audit.jsonl``, opened as ``collectors/audit.py`` opens it: no
symlinks, regular files only): ``bedside playbook off RUN`` and ``on`` append entries (``playbook_off``,
``playbook_on``), every automatic request is an entry whose operator is ``playbook:RULE``, and an escalation is a
``playbook_off`` entry by the playbook itself. A trail whose chain is broken reads as switched off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bedside.collectors import audit
from bedside.collectors.layout import RunLayout

from .decide import AutoAction, History

AUTOMATIC = "playbook:"
"""How an automatic entry's operator starts; the rule's name follows."""
SWITCHES = {"playbook_off": False, "playbook_on": True}


@dataclass(frozen=True)
class Switch:
    """The kill switch: on or off, and the entry that set it (None: never set, so on)."""

    enabled: bool
    entry: Mapping[str, Any] | None = None
    broken: str | None = None


def read_switch(layout: RunLayout) -> Switch:
    """The switch as the newest ``playbook_on`` or ``playbook_off`` entry left it; off when the chain is broken."""
    return _switch(audit.verify(layout))


def _switch(report: audit.ChainReport) -> Switch:
    if report.broken:
        return Switch(False, None, report.broken)
    entry = next((e for e in reversed(report.entries) if e.get("what") in SWITCHES), None)
    return Switch(entry is None or SWITCHES[entry["what"]], entry)


def read_history(layout: RunLayout) -> History:
    """Every automatic action of the trail, when a human last filed a request or switched playbooks on, and the
    switch (off when the chain is broken)."""
    report = audit.verify(layout)
    entries = [] if report.broken else report.entries
    actions = tuple(
        AutoAction(float(e["time"]), str(e.get("incident_id")), str(e["operator"])[len(AUTOMATIC) :])
        for e in entries
        if _automatic(e) and e.get("request_id") and _timed(e)
    )
    human = [
        float(e["time"])
        for e in entries
        if not _automatic(e) and (e.get("request_id") or e.get("what") == "playbook_on")
    ]
    switch = _switch(report)
    return History(actions=actions, human_at=max(human, default=0.0), enabled=switch.enabled)


def set_switch(layout: RunLayout, enabled: bool, *, operator: str, reason: str, incident_id: str | None = None) -> None:
    """Record the switch turned on or off in the trail (UnsafeFileError when the trail is no regular file)."""
    audit.check_reason(reason)
    audit.record(
        layout,
        operator=operator,
        what="playbook_on" if enabled else "playbook_off",
        reason=reason,
        incident_id=incident_id,
    )


def _automatic(entry: Mapping[str, Any]) -> bool:
    operator = entry.get("operator")
    return isinstance(operator, str) and operator.startswith(AUTOMATIC)


def _timed(entry: Mapping[str, Any]) -> bool:
    """Whether the entry's time is a number (a trail rewritten by hand may hold anything there)."""
    value = entry.get("time")
    return isinstance(value, (int, float)) and not isinstance(value, bool)
