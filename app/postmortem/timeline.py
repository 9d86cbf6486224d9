"""The incidents as the on-call lived them: one line per incident, and one chronological table of what happened,
who did what and why, and what came of it.

Its sources are the store's incidents (onset and, once every finding cleared, resolution), the audit trail
(acknowledgements, hand resolutions and filed requests, each with its operator, reason and incident) and the
trainer's answers to requests (``control_requests``: applied or rejected, and its message). A request filed by
hand, which the trail never saw, appears from the trainer's record of it.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import pandas as pd

from ..dashboard.actions import request_status
from ..dashboard.formats import clock
from ..dashboard.summaries import incident_rows
from .reading import RunRecord

EVENT_COLUMNS = ("time", "where", "event", "who", "detail", "incident")
ACTION_COLUMNS = ("requested", "action", "operator", "reason", "incident", "outcome", "message", "request")
ENDED = ("finished", "failed", "aborted")


def incident_lines(incidents: pd.DataFrame) -> list[str]:
    """One line per incident in triage order: severity, status, title, where it happened and its name."""
    return [
        f"[{row.severity}, {row.status}] {row.title}: timeline {row.timeline}, steps {row.steps}, ranks {row.ranks} "
        f"({row.incident})"
        for row in incident_rows(incidents).itertuples()
    ]


def events(record: RunRecord) -> pd.DataFrame:
    """Every incident's onset and resolution, every audited decision and every answer of the trainer, oldest first;
    each row's cells as text (``EVENT_COLUMNS``)."""
    trail = record.trail.entries
    filed = {str(e.get("request_id")) for e in trail if e.get("request_id")}
    rows = incident_events(record["incidents"], record["steps"]) + trail_events(trail)
    rows += answer_events(record["actions"], filed)
    rows.sort(key=lambda row: row["at"])
    table = pd.DataFrame(rows, columns=["at", *EVENT_COLUMNS])
    return table.drop(columns="at").fillna("")


def incident_events(incidents: pd.DataFrame, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Each incident's onset, and its resolution when the detectors resolved it (a hand resolution is audited),
    placed at the wall-clock time of its last step: detectors replayed over an old run resolve it today."""
    rows = []
    for row in incidents.itertuples():
        onset = seconds(row.onset_at) if seconds(row.onset_at) is not None else seconds(row.opened_at)
        where, what = f"{row.timeline}:{row.start_step}", f"{row.severity} incident: {row.title}"
        rows.append(event(onset, where, what, "detectors", row.summary, row.incident_id))
        if row.status == "resolved" and _absent(row.resolved_by):
            done = f"{row.timeline}:{row.end_step}"
            at = step_time(steps, row.timeline, row.end_step) or seconds(row.updated_at)
            rows.append(event(at, done, "resolved", "detectors", row.resolution, row.incident_id))
    return rows


def step_time(steps: pd.DataFrame, timeline: int, step: int) -> float | None:
    """When ``timeline`` reached ``step`` (its newest step record at or before it); None without one."""
    before = steps[(steps["timeline"] == timeline) & (steps["step"] <= step)]
    return seconds(before["time"].max()) if not before.empty else None


def trail_events(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The audit trail's entries: who acknowledged, resolved or asked for what, and why."""
    rows = []
    for entry in entries:
        what = str(entry.get("what"))
        label = f"{what} filed" if entry.get("request_id") else what
        detail = _with_args(str(entry.get("reason") or ""), entry.get("args"))
        incident = entry.get("incident_id")
        rows.append(event(seconds(entry.get("time")), "", label, entry.get("operator"), detail, incident))
    return rows


def answer_events(actions: pd.DataFrame, filed: set[str]) -> list[dict[str, Any]]:
    """The trainer's side of each request: when it took one the trail did not file, and what it did with it."""
    rows = []
    for row in actions.itertuples():
        where = "" if _absent(row.step) else f"{int(row.timeline)}:{int(row.step)}"
        if row.request_id not in filed and seconds(row.requested_at) is not None:
            detail = _with_args(str(row.reason or ""), row.args)
            rows.append(event(seconds(row.requested_at), where, f"{row.action} requested", row.operator, detail, None))
        if row.status in ("applied", "rejected"):
            rows.append(
                event(seconds(row.updated_at), where, f"{row.action} {row.status}", "trainer", row.message, None)
            )
    return rows


def action_rows(record: RunRecord) -> pd.DataFrame:
    """Every control request, answered or only filed: when it was asked, by whom, why, for which incident and what
    came of it (``ACTION_COLUMNS``), oldest first."""
    run, actions = record["run"], record["actions"]
    ended = not run.empty and run["status"].iloc[0] in ENDED
    filed = {str(e["request_id"]): e for e in record.trail.entries if e.get("request_id")}
    asked = actions.rename(columns={"requested_at": "time"}).to_dict("records")
    asked += [  # filed in the trail, never seen by the store: what the trail says of them
        {"request_id": i, "action": e.get("what"), "message": None} | e for i, e in filed.items()
        if i not in set(actions["request_id"])
    ]  # fmt: skip
    rows = [
        {
            "requested": stamp(seconds(request["time"])),
            "action": _with_args(_text(request["action"]), request["args"]),
            "operator": _text(request["operator"]),
            "reason": _text(request["reason"]),
            "incident": _text(filed.get(request["request_id"], {}).get("incident_id")),
            "outcome": request_status(
                request["request_id"], actions, record.layout, ended=ended, unanswered=record["unanswered"]
            ),
            "message": _text(request["message"]),
            "request": request["request_id"],
            "at": seconds(request["time"]) or math.inf,
        }
        for request in asked
    ]
    table = pd.DataFrame(rows, columns=[*ACTION_COLUMNS, "at"])
    return table.sort_values("at", kind="stable").drop(columns="at").reset_index(drop=True)


def event(at: float | None, where: str, what: str, who: Any, detail: Any, incident: Any) -> dict[str, Any]:
    """One row of the chronological table (``at`` sorts it: an unknown time last)."""
    return {
        "at": math.inf if at is None else at,
        "time": stamp(at),
        "where": where,
        "event": what,
        "who": _text(who),
        "detail": _text(detail),
        "incident": _text(incident),
    }


def seconds(value: Any) -> float | None:
    """A moment as unix seconds, None when it is missing or not a number (the trail's come from outside)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def stamp(at: float | None) -> str:
    return clock(at) if at is not None else ""


def _with_args(text: str, args: Any) -> str:
    """``text`` followed by a request's arguments (JSON text or a mapping), when it has any."""
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    shown = json.dumps(args, sort_keys=True) if isinstance(args, dict) and args else ""
    return f"{text} {shown}".strip()


def _absent(value: Any) -> bool:
    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def _text(value: Any) -> str:
    return "" if _absent(value) else str(value)
