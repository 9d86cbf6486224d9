"""Playbooks in ``auto`` mode with the real pieces: ``bedside watch`` files the decided requests through the signed
request and audit path as ``playbook:RULE`` and announces them on a real webhook; the guardrails read the trail
(once per incident, the kill switch of ``bedside playbook``, escalation that switches playbooks off and pages)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from receiver import Receiver

from bedside.app.service.alerts.config import load_settings
from bedside.app.service.owner_health import HealthNotices
from bedside.app.service.playbooks.auto import AutoPlaybook
from bedside.app.service.playbooks.trail import read_history, read_switch
from bedside.collectors import audit
from bedside.collectors.layout import RunLayout
from bedside.detectors.finding import Finding, Severity
from bedside.detectors.incidents import Incident, IncidentBook

CHECKPOINTS = {0: [0, 100, 200]}


def write_config(folder: Path, receiver: Receiver, **playbooks: object) -> Path:
    """A bedside.toml beside the run: one webhook on ``receiver`` and ``[playbooks]`` in auto mode."""
    extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in playbooks.items())
    path = folder / "bedside.toml"
    path.write_text(
        f'[notifiers.hook]\ntype = "webhook"\nurl = "{receiver.url}/hook"\nmin_severity = "critical"\n'
        f'\n[playbooks]\nmode = "auto"\n{extra}'
    )
    return path


def wait_for(receiver: Receiver, count: int, timeout_s: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while len(receiver.requests) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return [r.json() for r in receiver.requests]


def test_watch_in_auto_mode_files_the_rewind_and_skip_as_the_playbook(
    tiny_faults: Path, receiver: Receiver, bedside
) -> None:
    write_config(tiny_faults.parent, receiver)
    done = bedside("watch", tiny_faults, "--until-finished", "--quiet", "--drain", "5")
    assert done.returncode == 0, done.stderr
    layout = RunLayout(tiny_faults)
    filed = sorted(
        (json.loads(p.read_text()) for p in layout.control_requests.glob("req-*.json")), key=lambda r: r["request_id"]
    )
    assert [(r["action"], r["args"], r["operator"]) for r in filed] == [
        ("rewind", {"to_step": 100}, "playbook:spike"),
        ("skip", {"first_batch": 150, "last_batch": 185}, "playbook:spike"),
    ]
    report = audit.verify(layout)
    assert report.broken is None
    assert [(e["what"], e["operator"], e["incident_id"], e["request_id"]) for e in report.entries] == [
        (r["action"], "playbook:spike", "nonfinite@0:150", r["request_id"]) for r in filed
    ]
    assert all(e["reason"].startswith("playbook rule spike: rewind to step 100") for e in report.entries)
    acted = [m for m in (r.json() for r in receiver.requests) if m["event"] == "playbook_acted"]
    assert len(acted) == 1 and acted[0]["playbook"]["rule"] == "spike"
    assert [r["request_id"] for r in acted[0]["playbook"]["requests"]] == [r["request_id"] for r in filed]
    status = bedside("playbook", "status", tiny_faults)
    assert status.stdout.splitlines() == [
        "mode: auto",
        "switch: on (never switched)",
        "automatic requests so far: 2 for 1 incidents",
    ]


def spike(start: int) -> Incident:
    found = Finding(
        kind="nonfinite",
        severity=Severity.CRITICAL,
        timeline=0,
        start_step=start,
        end_step=start,
        ranks=(),
        score=1.0,
        summary=f"non-finite loss at step {start}",
        evidence={},
        active=True,
    )
    (made,) = IncidentBook().add([found])
    return made


def test_once_per_incident_kill_switch_and_escalation(tiny_faults: Path, receiver: Receiver, bedside) -> None:
    layout = RunLayout(tiny_faults)
    settings = load_settings(write_config(tiny_faults.parent, receiver, max_actions_per_hour=10), {})
    said: list[str] = []
    playbook = AutoPlaybook(
        layout, settings.playbooks, HealthNotices(layout, settings, warn=said.append), warn=said.append
    )

    playbook.consider([spike(150)], CHECKPOINTS, time.time())
    playbook.consider([spike(150)], CHECKPOINTS, time.time())
    assert said == [] and len(read_history(layout).actions) == 2  # a rewind and a skip, for one incident

    assert (
        bedside("playbook", "off", tiny_faults, "--reason", "on-call takes over", "--operator", "ana").returncode == 0
    )
    playbook.consider([spike(170)], CHECKPOINTS, time.time())
    assert "switched off" in said[-1] and len(read_history(layout).actions) == 2
    switch = read_switch(layout)
    assert (switch.enabled, switch.entry["operator"], switch.entry["reason"]) == (False, "ana", "on-call takes over")

    assert bedside("playbook", "on", tiny_faults, "--operator", "ana").returncode == 0
    playbook.consider([spike(170)], CHECKPOINTS, time.time())
    playbook.consider([spike(190)], CHECKPOINTS, time.time())
    playbook.consider([spike(195)], CHECKPOINTS, time.time())  # the fault came back after two recoveries
    switch = read_switch(layout)
    assert (switch.enabled, switch.entry["operator"], switch.entry["incident_id"]) == (
        False,
        "playbook:spike",
        "nonfinite@0:195",
    )
    assert "came back after 2 automatic recoveries" in switch.entry["reason"]
    messages = wait_for(receiver, 4)
    assert [m["event"] for m in messages] == ["playbook_acted"] * 3 + ["playbook_stopped"]
    assert messages[-1]["severity"] == "critical" and "automation stops" in messages[-1]["text"]
    assert audit.verify(layout).broken is None


def test_a_broken_trail_reads_as_switched_off_and_nothing_is_filed(
    tiny_faults: Path, receiver: Receiver, bedside
) -> None:
    layout = RunLayout(tiny_faults)
    settings = load_settings(write_config(tiny_faults.parent, receiver), {})
    said: list[str] = []
    playbook = AutoPlaybook(
        layout, settings.playbooks, HealthNotices(layout, settings, warn=said.append), warn=said.append
    )
    audit.audit_path(layout).write_text('{"seq": 0, "what": "rewind"}\n')  # no hash: the chain is broken
    playbook.consider([spike(150)], CHECKPOINTS, time.time())
    assert said == [
        "playbook spike did not act on incident nonfinite@0:150: "
        "playbooks are switched off for this run (bedside playbook on RUN)"
    ]
    assert not list(layout.control_requests.glob("req-*.json")) and receiver.requests == []
    assert (
        bedside("playbook", "status", tiny_faults)
        .stdout.splitlines()[1]
        .startswith("switch: off (the audit trail's chain is broken: ")
    )
