"""The audit trail's head leaves the machine: each alert carries it (``audit_head``, in Slack's and Discord's
rendering too), ``bedside action`` prints it, and ``bedside audit verify --head`` checks the trail against such a
copy. Without any copy of the head (the store deleted, or rebuilt) verify no longer says "chain intact" with exit
0: a trail rewritten consistently is caught by the head a chat channel kept. Real runs, the real CLI in new
processes, a real HTTP receiver."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from receiver import Receiver

from bedside.app.service.alerts.payload import schema
from bedside.app.service.alerts.render import discord_message, slack_message
from bedside.collectors import audit
from bedside.collectors.layout import RunLayout

WATCH_S = 180


def act(bedside, run: Path, action: str, reason: str) -> str:
    """``bedside action RUN ACTION`` in a new process; the head it prints (``SEQ:HASH``)."""
    done = bedside("action", run, action, "--reason", reason, "--operator", "ana")
    assert done.returncode == 0, done.stderr
    _, head = done.stdout.splitlines()
    assert head.startswith("audit head ")
    return head.removeprefix("audit head ")


def watch_until_finished(bedside, run: Path, tmp_path: Path, receiver: Receiver) -> list[dict]:
    """``bedside watch RUN --until-finished`` alerting a webhook on the receiver; the payloads delivered."""
    config = tmp_path / "bedside.toml"
    config.write_text(
        f'[notifiers.hook]\ntype = "webhook"\nurl = "{receiver.url}/hook"\nmin_severity = "info"\nburst = 100\n'
    )
    done = bedside("watch", run, "--config", config, "--until-finished", "--quiet", timeout=WATCH_S)
    assert done.returncode == 0, done.stderr
    return [r.json() for r in receiver.delivered()]


def rewrite_consistently(layout: RunLayout, reason: str) -> None:
    """What someone with write access to the run does: every entry changed and the chain hashed again."""
    entries, prev = [], audit.GENESIS
    for line in audit.audit_path(layout).read_text().splitlines():
        entry = {**json.loads(line), "reason": reason, "prev": prev}
        entry["hash"] = audit.entry_hash(entry)
        entries.append(entry)
        prev = entry["hash"]
    audit.audit_path(layout).write_bytes(b"".join(audit.canonical_line(e) for e in entries))


@pytest.mark.slow(reason="bedside watch follows a whole sample run to its end, alerting a real receiver")
def test_alerts_carry_the_head_and_a_copy_from_chat_catches_a_consistent_rewrite_with_the_store_deleted(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver, bedside
) -> None:
    layout = RunLayout(tiny_faults)
    act(bedside, tiny_faults, "pause", "look first")
    printed = act(bedside, tiny_faults, "resume", "carry on")
    payloads = watch_until_finished(bedside, tiny_faults, tmp_path, receiver)
    assert len(payloads) >= 3
    validator = jsonschema.Draft202012Validator(schema())
    for payload in payloads:
        validator.validate(payload)
        assert f"{payload['audit_head']['seq']}:{payload['audit_head']['hash']}" == printed
    assert bedside("audit", "verify", tiny_faults).returncode == 0

    rewrite_consistently(layout, "nothing happened")
    for path in tiny_faults.glob("bedside.duckdb*"):
        path.unlink()
    alone = bedside("audit", "verify", tiny_faults)
    assert alone.returncode == 3, alone.stderr
    assert alone.stdout.startswith(
        f"audit trail of {tiny_faults}: 2 entries, chain intact, but not checked: no head to check against (no store)"
    )
    from_chat = bedside("audit", "verify", tiny_faults, "--head", printed)
    assert from_chat.returncode == 1, from_chat.stderr
    assert from_chat.stdout.strip() == (
        f"audit trail of {tiny_faults} is broken: line 2 (entry 1) differs from the head given: the trail was "
        f"rewritten from there (checked against the head given (entry 1); the store's copy: none, no store)"
    )
    accepted = bedside("audit", "verify", tiny_faults, "--no-head")
    assert accepted.returncode == 0, accepted.stderr
    assert "(checked against no head: no store; the chain alone was checked (--no-head)" in accepted.stdout


@pytest.mark.slow(reason="bedside watch follows a whole sample run to its end, then the store is rebuilt")
def test_after_a_rebuild_verify_has_no_recorded_head_and_says_so(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver, bedside
) -> None:
    printed = act(bedside, tiny_faults, "pause", "look first")
    watch_until_finished(bedside, tiny_faults, tmp_path, receiver)
    done = bedside("audit", "verify", tiny_faults)
    assert done.returncode == 0 and "(checked against 1 head(s) the store recorded)" in done.stdout, done.stdout
    assert bedside("collect", tiny_faults, "--rebuild", "--quiet").returncode == 0
    done = bedside("audit", "verify", tiny_faults)
    assert done.returncode == 3, done.stderr
    assert "but not checked: no head to check against (the store recorded none (rebuilt" in done.stdout
    done = bedside("audit", "verify", tiny_faults, "--head", printed)
    assert done.returncode == 0, done.stderr
    assert "(checked against the head given (entry 0); the store's copy: none, the store recorded none" in done.stdout


def test_a_head_given_past_the_end_of_the_trail_is_a_trail_cut_short(tiny_faults: Path, bedside) -> None:
    act(bedside, tiny_faults, "pause", "look first")
    second = act(bedside, tiny_faults, "resume", "carry on")
    path = audit.audit_path(RunLayout(tiny_faults))
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    done = bedside("audit", "verify", tiny_faults, "--head", second)
    assert done.returncode == 1
    assert "is broken: the head given is entry 1, but the trail ends at entry 0: entries were deleted" in done.stdout


def test_a_malformed_head_is_a_usage_error(tiny_faults: Path, bedside) -> None:
    for given in ("7", "x:" + "a" * 64, "3:abc", "3:" + "g" * 64):
        done = bedside("audit", "verify", tiny_faults, "--head", given)
        assert done.returncode == 2 and "argument --head: a head" in done.stderr, (given, done.stderr)
    done = bedside("audit", "verify", tiny_faults, "--head", "0:" + "a" * 64, "--no-head")
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_chat_renderings_show_the_whole_head() -> None:
    head = {"seq": 12, "hash": "ab" * 32}
    payload = {
        "schema": "bedside.alert/1",
        "id": "run/hook/digest/1",
        "event": "digest",
        "severity": "warning",
        "created_at": "2024-01-01T00:00:00.000Z",
        "notifier": "chat",
        "run": {"id": "r", "name": "run"},
        "incident": None,
        "digest": {
            "findings": 4,
            "since": "2024-01-01T00:00:00.000Z",
            "window_s": 300.0,
            "held_messages": 0,
            "incidents": [],
            "more_incidents": 0,
            "url": None,
        },
        "text": "[WARNING] run: 4 more findings in the last 5 minutes (0 messages held back)",
        "audit_head": head,
    }
    jsonschema.Draft202012Validator(schema()).validate(payload)
    line = f"audit head 12:{'ab' * 32}"
    assert {"type": "context", "elements": [{"type": "mrkdwn", "text": line}]} in slack_message(payload)["blocks"]
    assert discord_message(payload)["embeds"][0]["footer"]["text"] == f"bedside · run/hook/digest/1 · {line}"
