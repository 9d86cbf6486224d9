"""Chat messages rendered from an alert payload: Slack Block Kit and Discord embeds, within each one's limits.

Every piece of a message that comes from the run (its name, a finding's summary and evidence, an operator's
note) has its control and format characters escaped (``visible``): a chat shows them, never obeys them, and a
newline in a run name cannot fake a line of the message.
"""

from __future__ import annotations

from typing import Any

from bedside.collectors.display_text import visible

from .payload import EVENT_WORDS

SEVERITY_MARK = {"info": "🔵", "warning": "🟠", "critical": "🔴"}
DISCORD_COLOR = {"info": 0x3B82F6, "warning": 0xF59E0B, "critical": 0xDC2626}
RESOLVED_MARK, RESOLVED_COLOR = "✅", 0x16A34A
SLACK_HEADER_MAX, SLACK_TEXT_MAX, SLACK_FIELD_MAX = 150, 3000, 2000
DISCORD_TITLE_MAX, DISCORD_DESCRIPTION_MAX, DISCORD_FIELD_MAX = 256, 4096, 1024
DISCORD_EMBED_TOTAL_MAX = 6000


def slack_message(payload: dict[str, Any]) -> dict[str, Any]:
    """An incoming-webhook message: ``text`` for notifications, ``blocks`` for the channel."""
    blocks: list[dict[str, Any]] = [{"type": "header", "text": _plain(_title(payload), SLACK_HEADER_MAX)}]
    for line in _body(payload):
        blocks.append({"type": "section", "text": _mrkdwn(_escape(line))})
    fields = [f"*{name}*\n{_escape(value)}" for name, value in _facts(payload)]
    if fields:
        blocks.append({"type": "section", "fields": [_mrkdwn(f, SLACK_FIELD_MAX) for f in fields[:10]]})
    evidence = _evidence_line(payload)
    if evidence:
        blocks.append({"type": "context", "elements": [_mrkdwn(_escape(evidence))]})
    if head := _head_line(payload):
        blocks.append({"type": "context", "elements": [_mrkdwn(head)]})
    url = _url(payload)
    if url:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": _plain("Open in dashboard", 75),
                        "url": url,
                        "action_id": "open_incident",
                    }
                ],
            }
        )
    return {"text": _clip(visible(payload["text"]), SLACK_TEXT_MAX), "blocks": blocks}


def discord_message(payload: dict[str, Any]) -> dict[str, Any]:
    """A webhook message with one embed; mentions disabled so that a summary can never ping anyone."""
    embed: dict[str, Any] = {
        "title": _clip(_title(payload), DISCORD_TITLE_MAX),
        "description": _clip("\n\n".join(_body(payload)), DISCORD_DESCRIPTION_MAX),
        "color": _color(payload),
        "fields": [
            {"name": name, "value": _clip(value, DISCORD_FIELD_MAX), "inline": len(value) < 40}
            for name, value in _facts(payload)
        ],
        "footer": {"text": " · ".join(filter(None, ("bedside", payload["id"], _head_line(payload))))},
        "timestamp": payload["created_at"],
    }
    evidence = _evidence_line(payload)
    if evidence:
        embed["fields"].append({"name": "Evidence", "value": _clip(evidence, DISCORD_FIELD_MAX), "inline": False})
    url = _url(payload)
    if url:
        embed["url"] = url
    overflow = _embed_size(embed) - DISCORD_EMBED_TOTAL_MAX
    if overflow > 0:  # Discord refuses embeds over 6000 characters in all: the description gives way
        embed["description"] = _clip(embed["description"], len(embed["description"]) - overflow)
    return {"username": "bedside", "allowed_mentions": {"parse": []}, "embeds": [embed]}


def _embed_size(embed: dict[str, Any]) -> int:
    """The characters Discord counts against an embed's total: title, description, field names and values, footer."""
    fields = sum(len(f["name"]) + len(f["value"]) for f in embed["fields"])
    return len(embed["title"]) + len(embed["description"]) + fields + len(embed["footer"]["text"])


def _title(payload: dict[str, Any]) -> str:
    incident = payload["incident"]
    resolved = incident is not None and incident["status"] == "resolved"
    mark = RESOLVED_MARK if resolved else SEVERITY_MARK[payload["severity"]]
    subject = incident["title"] if incident else payload["run"]["name"] or "bedside"
    return f"{mark} {EVENT_WORDS[payload['event']]}: {visible(subject)}"


def _body(payload: dict[str, Any]) -> list[str]:
    """The summary and the suggested action (incidents), or what was held back (digests)."""
    incident, digest = payload["incident"], payload["digest"]
    if incident:
        lines = [incident["summary"]]
        action = incident["suggested_action"]
        if action["action"] != "none":
            args = ", ".join(f"{k}={v}" for k, v in action["args"].items())
            lines.append(
                f"Suggested action: {action['action']}"
                + (f" ({args})" if args else "")
                + (f": {action['why']}" if action["why"] else "")
            )
        for who, note, done in (
            ("acknowledged_by", "ack_note", "Acknowledged"),
            ("resolved_by", "resolve_note", "Resolved by hand"),
        ):
            if incident.get(who):
                lines.append(f"{done} by {incident[who]}" + (f": {incident[note]}" if incident.get(note) else ""))
        if incident.get("resolution") and not incident.get("resolved_by"):
            lines.append(f"Resolved: {incident['resolution']}")
        return [visible(line) for line in lines]
    if digest:
        held = [visible(f"{i['severity']} {i['event']}: {i['title']} ({i['status']})") for i in digest["incidents"]]
        more = [f"and {digest['more_incidents']} more"] if digest["more_incidents"] else []
        return [visible(payload["text"])] + (["\n".join(held + more)] if held else [])
    return [visible(payload["text"])]


def _facts(payload: dict[str, Any]) -> list[tuple[str, str]]:
    incident = payload["incident"]
    run = payload["run"]["name"] or payload["run"]["id"] or "?"
    if not incident:
        return [("Run", visible(run))]
    ranks = ", ".join(map(str, incident["ranks"][:16])) + (" …" if len(incident["ranks"]) > 16 else "")
    facts = [
        ("Severity", incident["severity"]),
        ("Status", incident["status"]),
        ("Run", run),
        ("Steps", f"{incident['start_step']}–{incident['end_step']} (timeline {incident['timeline']})"),
        ("Ranks", ranks or "job-wide"),
        ("Findings", str(incident["findings"])),
        ("Cause", incident["cause"]),
    ]
    return [(name, visible(value)) for name, value in facts]


def _evidence_line(payload: dict[str, Any]) -> str:
    incident = payload["incident"]
    if not incident or not incident["evidence"]:
        return ""
    return visible(" · ".join(f"{name}={value}" for name, value in incident["evidence"].items()))


def _head_line(payload: dict[str, Any]) -> str:
    """The audit trail's head the message carries, as ``bedside audit verify --head`` takes it ("" without one)."""
    head = payload.get("audit_head")
    return f"audit head {head['seq']}:{head['hash']}" if head else ""


def _url(payload: dict[str, Any]) -> str | None:
    part = payload["incident"] or payload["digest"]
    return part["url"] if part else None


def _color(payload: dict[str, Any]) -> int:
    incident = payload["incident"]
    if incident and incident["status"] == "resolved":
        return RESOLVED_COLOR
    return DISCORD_COLOR[payload["severity"]]


def _plain(text: str, limit: int) -> dict[str, Any]:
    return {"type": "plain_text", "text": _clip(text, limit), "emoji": True}


def _mrkdwn(text: str, limit: int = SLACK_TEXT_MAX) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": _clip(text, limit)}


def _escape(text: str) -> str:
    """Slack's three control characters, escaped so that data cannot form links or mentions."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
