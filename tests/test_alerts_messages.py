"""What notifiers receive: the payload (v1, against its JSON Schema) for every event, Slack Block Kit and Discord
embeds within each platform's limits and escaped, and signed webhook bodies checked by a real receiver."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

import jsonschema
import pytest
from receiver import Receiver

from bedside.app.service.alerts.config import NotifierConfig, parse_settings
from bedside.app.service.alerts.delivery import deliver
from bedside.app.service.alerts.payload import (
    Acknowledgement,
    RunRef,
    digest_payload,
    incident_payload,
    probe_payload,
    schema,
)
from bedside.app.service.alerts.render import discord_message, slack_message
from bedside.detectors.finding import Finding, SuggestedAction
from bedside.detectors.incidents import Incident, IncidentBook

VALIDATOR = jsonschema.Draft202012Validator(schema())
RUN = RunRef("912eef7d1259", "gpt-7b")
NOW = 1_796_000_000.25
DASHBOARD = "http://oncall-box:8501"
EVENTS = ("opened", "escalated", "resolved", "acknowledged", "digest", "test")
HOSTILE = "<!channel> <@U024BE7LH> & <https://evil.example|click here> *bold* @everyone"

SLACK_BLOCKS = ("header", "section", "context", "actions", "divider")
SLACK_TEXT_TYPES = ("plain_text", "mrkdwn")


def finding(
    kind: str,
    start: int,
    severity: str = "warning",
    *,
    active: bool = True,
    ranks: tuple[int, ...] = (),
    summary: str = "",
    evidence: dict | None = None,
    action: SuggestedAction | None = None,
) -> Finding:
    return Finding(
        kind=kind,
        severity=severity,
        timeline=0,
        start_step=start,
        end_step=start + 3,
        ranks=ranks,
        score=9.3,
        summary=summary or f"{kind} from step {start}",
        evidence=evidence if evidence is not None else {"peak": 3.3921, "z": 9.3, "trend": [1, 2]},
        suggested_action=action or SuggestedAction("rewind", {"to_step": start - 10}, "before the spike"),
        active=active,
        detector=kind,
    )


def incident(*findings: Finding) -> Incident:
    """The one incident these findings make."""
    [made] = IncidentBook().add(list(findings))
    assert len(made.findings) == len(findings)
    return made


def incident_payloads(dashboard_url: str = "") -> dict[str, dict[str, Any]]:
    """A payload for each incident event, from real incidents."""
    spike = finding("loss_spike", 85)
    nan = finding("nonfinite", 90, "critical", ranks=(1,))
    cleared = [finding("loss_spike", 85, active=False), finding("nonfinite", 90, "critical", active=False, ranks=(1,))]
    cases = {
        "opened": (incident(spike), None),
        "escalated": (incident(spike, nan), None),
        "resolved": (incident(*cleared), None),
        "acknowledged": (incident(spike, nan), Acknowledgement("alice", "looking at shard 3")),
    }
    return {
        event: incident_payload(
            f"{RUN.run_id}/hook/{made.incident_id}/{event}/1",
            event,
            RUN,
            made,
            notifier="hook",
            ack=ack,
            dashboard_url=dashboard_url,
            now=NOW,
        )
        for event, (made, ack) in cases.items()
    }


def digest(dashboard_url: str = "", held: int = 3) -> dict[str, Any]:
    incidents = [
        {
            "id": f"straggler@0:{100 * i}/r{i}",
            "title": "Slow or stuck ranks: straggler",
            "severity": "warning",
            "status": "open",
            "event": "opened",
        }
        for i in range(held)
    ]
    return digest_payload(
        f"{RUN.run_id}/hook/digest/1",
        RUN,
        notifier="hook",
        severity="warning",
        findings=14,
        since=NOW - 300,
        held=incidents,
        dashboard_url=dashboard_url,
        now=NOW,
    )


def every_payload(dashboard_url: str = "") -> dict[str, dict[str, Any]]:
    return {
        **incident_payloads(dashboard_url),
        "digest": digest(dashboard_url),
        "test": probe_payload(f"{RUN.name}/hook/test/1", RUN, notifier="hook", now=NOW),
    }


def hostile_payloads() -> list[dict[str, Any]]:
    """Payloads with everything a run and its users can make long or nasty: huge summaries with Slack control
    characters, an SDC across 1024 ranks, many evidence values, a long acknowledgement note, a long run name."""
    ranks = tuple(range(1024))
    summary = (HOSTILE + " ") * 120
    evidence = {f"value_{i}": "x" * 80 for i in range(20)} | {"note": HOSTILE}
    action = SuggestedAction("evict", {"ranks": list(ranks), "why": HOSTILE}, HOSTILE * 20)
    wide = incident(
        finding("sdc", 170, "critical", ranks=ranks, summary=summary, evidence=evidence, action=action),
        *[finding("nonfinite", 170 + i, "critical", ranks=(i,), summary=summary) for i in range(1, 30)],
    )
    run = RunRef("r" * 64, ("gpt-7b <!here> & friends " * 20).strip())
    ack = Acknowledgement("<@U024BE7LH> & co", (HOSTILE + " ") * 100)
    built = [
        incident_payload(
            f"{run.run_id}/hook/{wide.incident_id}/{event}/1",
            event,
            run,
            wide,
            notifier="hook",
            ack=ack if event == "acknowledged" else None,
            dashboard_url=DASHBOARD,
            now=NOW,
        )
        for event in ("opened", "escalated", "acknowledged")
    ]
    held = [
        {"id": f"sdc@0:{i}/r{i}", "title": HOSTILE * 3, "severity": "critical", "status": "open", "event": "opened"}
        for i in range(40)
    ]
    built.append(
        digest_payload(
            f"{run.run_id}/hook/digest/1",
            run,
            notifier="hook",
            severity="critical",
            findings=10_000,
            since=NOW - 300,
            held=held,
            dashboard_url=DASHBOARD,
            now=NOW,
        )
    )
    return built


# -- the payload ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dashboard_url", ["", DASHBOARD])
def test_every_event_s_payload_validates_against_the_schema(dashboard_url: str) -> None:
    payloads = every_payload(dashboard_url)
    assert set(payloads) == set(EVENTS)
    for event, payload in payloads.items():
        VALIDATOR.validate(payload)
        assert payload["event"] == event and payload["schema"] == "bedside.alert/1"
        assert datetime.fromisoformat(payload["created_at"]).timestamp() == pytest.approx(NOW, abs=0.001)
        assert json.loads(json.dumps(payload, allow_nan=False)) == payload
    for payload in hostile_payloads():
        VALIDATOR.validate(payload)


def test_the_payload_tells_the_incident_s_state_and_links_to_the_dashboard() -> None:
    payloads = every_payload(DASHBOARD)
    assert {e: p["incident"]["status"] for e, p in payloads.items() if p["incident"]} == {
        "opened": "open",
        "escalated": "open",
        "resolved": "resolved",
        "acknowledged": "acknowledged",
    }
    escalated = payloads["escalated"]["incident"]
    assert (escalated["severity"], escalated["kinds"], escalated["ranks"], escalated["findings"]) == (
        "critical",
        ["loss_spike", "nonfinite"],
        [1],
        2,
    )
    assert escalated["url"] == f"{DASHBOARD}/incidents?run=gpt-7b&incident=loss_spike%400%3A85"
    assert escalated["evidence"] == {"peak": 3.3921, "z": 9.3}  # scalars only
    acknowledged = payloads["acknowledged"]
    assert (acknowledged["incident"]["acknowledged_by"], acknowledged["incident"]["ack_note"]) == (
        "alice",
        "looking at shard 3",
    )
    assert payloads["digest"]["digest"]["url"] == f"{DASHBOARD}/incidents?run=gpt-7b"
    assert (
        payloads["digest"]["text"] == "[WARNING] gpt-7b: 14 more findings in the last 5 minutes (3 messages held back)"
    )
    assert all(p["incident"] is None and p["digest"] is None for e, p in payloads.items() if e == "test")
    assert every_payload("")["opened"]["incident"]["url"] is None


def test_a_resolved_message_says_why_it_resolved() -> None:
    book = IncidentBook()
    [opened] = book.add([finding("grad_spike", 500, "critical")])
    [left] = book.went_on(1)
    cleared = incident(finding("loss_spike", 85, active=False))
    for made, why in ((left, "timeline 0 was abandoned: the run went on from a rewind (timeline 1)"),
                      (cleared, "every finding cleared")):  # fmt: skip
        payload = incident_payload(
            f"{RUN.run_id}/hook/{made.incident_id}/resolved/1", "resolved", RUN, made, notifier="hook", ack=None,
            dashboard_url="", now=NOW,
        )  # fmt: skip
        VALIDATOR.validate(payload)
        assert payload["incident"]["resolution"] == why
        assert f"Resolved: {why}" in json.dumps(slack_message(payload)) + json.dumps(discord_message(payload))
    assert incident_payloads()["opened"]["incident"]["resolution"] is None and not opened.resolved


def test_the_schema_refuses_a_payload_that_breaks_the_contract() -> None:
    payload = every_payload()["opened"]
    for broken in (
        {**payload, "event": "exploded"},
        {**payload, "digest": digest()["digest"]},
        {**payload, "extra": 1},
        {k: v for k, v in payload.items() if k != "id"},
        {**payload, "incident": {**payload["incident"], "status": "closed"}},
    ):
        assert list(VALIDATOR.iter_errors(broken))


# -- Slack ----------------------------------------------------------------------------------------------------


def text_object_problems(obj: Any, limit: int, where: str, types: tuple[str, ...] = SLACK_TEXT_TYPES) -> list[str]:
    if not isinstance(obj, dict) or obj.get("type") not in types:
        return [f"{where}: not a text object of type {'/'.join(types)}: {obj!r:.80}"]
    text = obj.get("text")
    if not isinstance(text, str) or not 1 <= len(text) <= limit:
        return [f"{where}: text of {len(text) if isinstance(text, str) else text!r} characters (1 to {limit})"]
    if obj["type"] == "mrkdwn" and ("<" in text or ">" in text):
        return [f"{where}: raw < or > in mrkdwn (data must be escaped): {text[:80]!r}"]
    return []


def block_problems(block: dict[str, Any], i: int) -> list[str]:
    kind, where = block.get("type"), f"block {i} ({block.get('type')})"
    if kind not in SLACK_BLOCKS:
        return [f"{where}: not a Block Kit layout block"]
    if kind == "header":
        return text_object_problems(block.get("text"), 150, where, ("plain_text",))
    if kind == "section":
        fields = block.get("fields", [])
        found = [] if "text" not in block else text_object_problems(block["text"], 3000, where)
        if "text" not in block and not fields:
            found.append(f"{where}: neither text nor fields")
        if len(fields) > 10:
            found.append(f"{where}: {len(fields)} fields (at most 10)")
        return found + [p for j, f in enumerate(fields) for p in text_object_problems(f, 2000, f"{where} field {j}")]
    if kind == "context":
        elements = block.get("elements", [])
        found = [] if 1 <= len(elements) <= 10 else [f"{where}: {len(elements)} elements (1 to 10)"]
        return found + [p for j, e in enumerate(elements) for p in text_object_problems(e, 3000, f"{where} {j}")]
    if kind == "actions":
        elements = block.get("elements", [])
        found = [] if 1 <= len(elements) <= 25 else [f"{where}: {len(elements)} elements (1 to 25)"]
        for j, button in enumerate(elements):
            if button.get("type") != "button" or len(button.get("action_id", "")) > 255:
                found.append(f"{where} {j}: not a button with an action_id of at most 255 characters")
            found += text_object_problems(button.get("text"), 75, f"{where} {j}", ("plain_text",))
            if "url" in button and not 1 <= len(button["url"]) <= 3000:
                found.append(f"{where} {j}: url of {len(button['url'])} characters")
        return found
    return []


def slack_problems(message: dict[str, Any]) -> list[str]:
    """Everything in ``message`` that Slack's incoming webhooks would refuse (Block Kit limits)."""
    found = [] if isinstance(message.get("text"), str) and message["text"] else ["no notification text"]
    blocks = message.get("blocks", [])
    if not 1 <= len(blocks) <= 50:
        found.append(f"{len(blocks)} blocks (1 to 50)")
    return found + [p for i, block in enumerate(blocks) for p in block_problems(block, i)]


def slack_texts(message: dict[str, Any]) -> list[str]:
    """Every mrkdwn text of a Slack message."""
    objects = []
    for block in message["blocks"]:
        objects += [block.get("text")] + block.get("fields", []) + block.get("elements", [])
    return [o["text"] for o in objects if isinstance(o, dict) and o.get("type") == "mrkdwn"]


@pytest.mark.parametrize("dashboard_url", ["", DASHBOARD])
def test_slack_messages_are_valid_block_kit_for_every_event(dashboard_url: str) -> None:
    for event, payload in every_payload(dashboard_url).items():
        message = slack_message(payload)
        assert slack_problems(message) == [], event
        assert message["text"] == payload["text"]
        assert message["blocks"][0]["type"] == "header"
        buttons = [e for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]
        part = payload["incident"] or payload["digest"]
        if dashboard_url and part:
            assert [b["url"] for b in buttons] == [part["url"]], event
        else:
            assert buttons == [], event


def test_slack_messages_stay_within_limits_and_escaped_whatever_the_data() -> None:
    for payload in hostile_payloads():
        message = slack_message(payload)
        assert slack_problems(message) == [], payload["event"]
        texts = "\n".join(slack_texts(message))
        assert "&lt;!channel&gt;" in texts and "&lt;@U024BE7LH&gt;" in texts and " &amp; " in texts
        assert "<!" not in texts and "<http" not in texts


def test_slack_escapes_what_the_data_holds_but_keeps_its_own_formatting() -> None:
    spike = finding("loss_spike", 85, summary="loss > 2 & <rising>")
    payload = incident_payload(
        "id", "opened", RunRef("", "a<b>&c"), incident(spike), notifier="hook", ack=None, dashboard_url="", now=NOW
    )
    texts = slack_texts(slack_message(payload))
    assert "loss &gt; 2 &amp; &lt;rising&gt;" in texts
    assert "*Run*\na&lt;b&gt;&amp;c" in texts


# -- Discord --------------------------------------------------------------------------------------------------


def discord_problems(message: dict[str, Any]) -> list[str]:
    """Everything in ``message`` that Discord's webhook API would refuse (embed limits)."""
    embeds = message.get("embeds", [])
    found = [] if 1 <= len(embeds) <= 10 else [f"{len(embeds)} embeds (1 to 10)"]
    if message.get("allowed_mentions") != {"parse": []}:
        found.append(f"allowed_mentions is {message.get('allowed_mentions')!r}, not {{'parse': []}}")
    if len(message.get("content", "")) > 2000 or not 1 <= len(message.get("username", "x")) <= 80:
        found.append("content over 2000 or username not 1 to 80 characters")
    total = 0
    for i, embed in enumerate(embeds):
        fields = embed.get("fields", [])
        sizes = {
            "title": (len(embed.get("title", "")), 256),
            "description": (len(embed.get("description", "")), 4096),
            "footer": (len(embed.get("footer", {}).get("text", "")), 2048),
            "fields": (len(fields), 25),
        }
        found += [f"embed {i}: {name} of {n} (at most {limit})" for name, (n, limit) in sizes.items() if n > limit]
        for j, field in enumerate(fields):
            if not 1 <= len(field["name"]) <= 256 or not 1 <= len(field["value"]) <= 1024:
                found.append(
                    f"embed {i} field {j}: name {len(field['name'])} (1 to 256), "
                    f"value {len(field['value'])} (1 to 1024)"
                )
        if not 0 <= embed.get("color", 0) <= 0xFFFFFF:
            found.append(f"embed {i}: color {embed['color']}")
        total += sizes["title"][0] + sizes["description"][0] + sizes["footer"][0]
        total += sum(len(f["name"]) + len(f["value"]) for f in fields)
    if total > 6000:
        found.append(f"embeds hold {total} characters (at most 6000)")
    return found


@pytest.mark.parametrize("dashboard_url", ["", DASHBOARD])
def test_discord_messages_are_valid_embeds_that_ping_nobody(dashboard_url: str) -> None:
    for event, payload in every_payload(dashboard_url).items():
        message = discord_message(payload)
        assert discord_problems(message) == [], event
        [embed] = message["embeds"]
        part = payload["incident"] or payload["digest"]
        assert embed.get("url") == (part["url"] if dashboard_url and part else None), event
        assert payload["id"] in embed["footer"]["text"]


def test_discord_messages_stay_within_limits_whatever_the_data() -> None:
    for payload in hostile_payloads():
        assert discord_problems(discord_message(payload)) == [], payload["event"]


def test_discord_marks_a_resolved_incident_green_and_others_by_severity() -> None:
    payloads = incident_payloads()
    colors = {event: discord_message(p)["embeds"][0]["color"] for event, p in payloads.items()}
    assert colors["resolved"] == 0x16A34A
    assert colors["opened"] != colors["escalated"] and len({colors["opened"], colors["resolved"]}) == 2


# -- on the wire ----------------------------------------------------------------------------------------------


def verifies(secret: str, body: bytes, header: str | None) -> bool:
    """A receiver's check of the signature header, written from the documentation, not from our code."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return header is not None and hmac.compare_digest(expected, header)


def notifiers(receiver: Receiver, secret: str) -> dict[str, NotifierConfig]:
    document = {
        "notifiers": {
            "hook": {
                "type": "webhook",
                "url": f"{receiver.url}/hook",
                "secret": "${SIGNING_SECRET}",
                "headers": {"Authorization": "Bearer ${BOT_TOKEN}"},
                "timeout_s": 2,
            },
            "slack": {"type": "slack", "url": f"{receiver.url}/slack/T0/B0/x", "timeout_s": 2},
            "discord": {"type": "discord", "url": f"{receiver.url}/discord/1/y", "timeout_s": 2},
        }
    }
    settings = parse_settings(document, {"SIGNING_SECRET": secret, "BOT_TOKEN": "bot-token"})
    return {n.name: n for n in settings.notifiers}


def test_a_webhook_receives_the_payload_signed_with_the_shared_secret(receiver: Receiver) -> None:
    secret = "s3cret-shared-with-the-receiver"
    hook = notifiers(receiver, secret)["hook"]
    payloads = every_payload(DASHBOARD)
    for payload in payloads.values():
        assert deliver(hook, payload).delivered
    requests = receiver.wait_for(len(payloads))
    for request, payload in zip(requests, payloads.values()):
        assert request.path == "/hook"
        assert request.json() == payload
        VALIDATOR.validate(request.json())
        assert request.key == payload["id"]
        assert (request.headers["Content-Type"], request.headers["User-Agent"], request.headers["Authorization"]) == (
            "application/json",
            "bedside-alerts/1",
            "Bearer bot-token",
        )
        signature = request.headers["X-Bedside-Signature-256"]
        assert verifies(secret, request.body, signature)
        assert not verifies("another-secret", request.body, signature)
        assert not verifies(secret, request.body + b" ", signature)


def test_slack_and_discord_receive_their_rendering_and_no_signature(receiver: Receiver) -> None:
    chosen = notifiers(receiver, "unused")
    payload = every_payload(DASHBOARD)["escalated"]
    assert deliver(chosen["slack"], payload).delivered and deliver(chosen["discord"], payload).delivered
    slack, discord = receiver.wait_for(2)
    assert (slack.path, discord.path) == ("/slack/T0/B0/x", "/discord/1/y?wait=true")
    assert slack.json() == slack_message(payload) and discord.json() == discord_message(payload)
    assert slack_problems(slack.json()) == [] and discord_problems(discord.json()) == []
    assert "X-Bedside-Signature-256" not in slack.headers and slack.key == payload["id"]


def test_a_test_message_validates_after_a_round_trip(receiver: Receiver) -> None:
    hook = notifiers(receiver, "k")["hook"]
    assert deliver(hook, probe_payload("gpt/hook/test/1", RUN, notifier="hook", now=NOW)).delivered
    [request] = receiver.wait_for(1)
    VALIDATOR.validate(request.json())
    assert request.json()["text"] == "[TEST] gpt-7b: bedside can reach this notifier"


# -- control characters ---------------------------------------------------------------------------------------

ESCAPES = "\x1b]0;OWNED\x07\x1b]52;c;ZWNobyBwd25lZAo=\x07\x1b[1A\x1b[2K\u202egnp.exe\nFAKE LINE: all clear"
"""What a run name, a summary or a note can hold: OSC 0 (window title), OSC 52 (clipboard), cursor up and erase
line, a right-to-left override, a newline that starts a forged line."""


def test_no_message_carries_a_control_character_from_the_run(tmp_path) -> None:
    """Slack, Discord and the log line show the run's control characters as escapes (a log line reaches a
    terminal; a chat shows what it is sent); the webhook's payload is data and keeps them exactly."""
    spike = finding("loss_spike", 85, summary=f"loss{ESCAPES}", evidence={"metric": ESCAPES})
    payload = incident_payload(
        "id",
        "acknowledged",
        RunRef("", f"run{ESCAPES}"),
        incident(spike),
        notifier="hook",
        ack=Acknowledgement("ana", ESCAPES),
        dashboard_url="",
        now=NOW,
    )
    log = tmp_path / "alerts.log"
    settings = parse_settings({"notifiers": {"log": {"type": "log", "path": str(log)}}}, {})
    assert deliver(settings.notifiers[0], payload).delivered
    rendered = {
        "slack": "\n".join(slack_texts(slack_message(payload))),
        "discord": "\n".join(strings(discord_message(payload))),
        "log": log.read_text(),
    }
    for where, text in rendered.items():
        assert not {"\x1b", "\x07", "\u202e"} & set(text), where
        assert "\nFAKE LINE" not in text and "\\x1b]0;OWNED\\x07" in text and "\\u202e" in text, where
    assert payload["run"]["name"] == f"run{ESCAPES}"


def strings(value: Any) -> list[str]:
    """Every string in a JSON-like value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in [key, *strings(item)]]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []
