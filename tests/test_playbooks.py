"""Playbooks: ``[playbooks]`` of bedside.toml (each mistake names its key), the pure decision over families of
incidents (spikes at onsets near and far from checkpoints, non-finite values, a bad shard, replicas that
disagree, a straggler, an eval stall that is never acted on), and the guardrails of ``auto`` mode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bedside.app.service.alerts.config import parse_settings
from bedside.app.service.detection import StoreDetection
from bedside.app.service.playbooks.decide import AutoAction, Decision, History, Request, decide, guard
from bedside.app.service.playbooks.rules import BUILTIN_RULES, PlaybookConfigError, PlaybookSettings, parse_playbooks
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store
from bedside.detectors.finding import Finding, Severity, SuggestedAction
from bedside.detectors.incidents import Incident, IncidentBook

SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "sample_runs"
CHECKPOINTS = {0: [0, 100, 200, 300]}


def incident(kind: str, start: int, end: int, **extra: Any) -> Incident:
    """The incident a real ``IncidentBook`` makes of one finding."""
    values: dict[str, Any] = dict(severity=Severity.CRITICAL, timeline=0, ranks=(), evidence={}) | extra
    found = Finding(kind=kind, start_step=start, end_step=end, score=9.0, summary=f"{kind} at {start}", **values)
    (made,) = IncidentBook().add([found])
    return made


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"mode": "sometimes"}, "playbooks.mode"),
        ({"colour": "red"}, "playbooks.colour"),
        ({"max_actions_per_hour": 0}, "playbooks.max_actions_per_hour"),
        ({"max_actions_per_hour": "2"}, "playbooks.max_actions_per_hour"),
        ({"escalate_after_failed_recoveries": True}, "playbooks.escalate_after_failed_recoveries"),
        ({"min_steps_before_onset": -1}, "playbooks.min_steps_before_onset"),
        ({"builtin_rules": "yes"}, "playbooks.builtin_rules"),
        ({"rules": []}, "playbooks.rules"),
        ({"rules": {"r": {"kinds": ["loss_spike"], "action": "reboot"}}}, "playbooks.rules.r.action"),
        ({"rules": {"r": {"kinds": ["meteor"], "action": "page"}}}, "playbooks.rules.r.kinds"),
        ({"rules": {"r": {"kinds": [], "action": "page"}}}, "playbooks.rules.r.kinds"),
        (
            {"rules": {"r": {"kinds": ["sdc"], "action": "page", "min_severity": "dire"}}},
            "playbooks.rules.r.min_severity",
        ),
        ({"rules": {"r": {"kinds": ["sdc"], "action": "page", "when": 1}}}, "playbooks.rules.r.when"),
        ({"rules": {"r": {"kinds": ["sdc"], "action": "rewind", "skip_window": 1}}}, "playbooks.rules.r.skip_window"),
        (
            {"rules": {"r": {"kinds": ["sdc"], "action": "page", "evidence_min": {"z": "big"}}}},
            "playbooks.rules.r.evidence_min.z",
        ),
    ],
)
def test_each_mistake_names_its_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(PlaybookConfigError, match=rf"^bedside\.toml: {key}: "):
        parse_settings({"playbooks": table}, {})


def test_defaults_and_own_rules_first() -> None:
    assert parse_settings({}, {}).playbooks == PlaybookSettings()
    settings = parse_playbooks(
        {
            "mode": "off",
            "max_actions_per_hour": 5,
            "rules": {"spike": {"kinds": ["loss_spike"], "action": "page", "evidence_min": {"peak_z": 50}}},
        },
        "bedside.toml",
    )
    assert (settings.mode, settings.max_actions_per_hour, settings.configured) == ("off", 5, True)
    assert [r.name for r in settings.rules] == ["spike"] + [r.name for r in BUILTIN_RULES if r.name != "spike"]
    assert parse_playbooks({"builtin_rules": False}, "x").rules == ()


@pytest.mark.parametrize(
    ("onset", "end", "to_step"),
    [(250, 260, 200), (205, 230, 100), (110, 111, 100), (109, 120, 0), (305, 305, 200)],
)
def test_spike_rewinds_far_enough_before_onset_and_skips_the_window(onset: int, end: int, to_step: int) -> None:
    decision = decide(incident("loss_spike", onset, end), CHECKPOINTS, PlaybookSettings())
    assert decision.rule == "spike"
    assert decision.requests == (
        Request("rewind", {"to_step": to_step}),
        Request("skip", {"first_batch": onset, "last_batch": end}),
    )
    assert decision.suggestion() == SuggestedAction("rewind", {"to_step": to_step}, f"playbook spike: {decision.why}")


def test_no_checkpoint_early_enough_pages_instead() -> None:
    decision = decide(incident("nonfinite", 5, 9), CHECKPOINTS, PlaybookSettings())
    assert (decision.recipe, decision.acts) == ("page", False)
    assert "no good checkpoint at least 10 steps before the onset at step 5" in decision.why


def test_checkpoints_of_another_timeline_when_its_own_has_none() -> None:
    decision = decide(incident("nonfinite", 150, 151, timeline=2), CHECKPOINTS, PlaybookSettings())
    assert decision.requests[0] == Request("rewind", {"to_step": 100})


def test_a_warning_spike_is_below_the_default_rule() -> None:
    decision = decide(incident("loss_spike", 250, 251, severity=Severity.WARNING), CHECKPOINTS, PlaybookSettings())
    assert (decision.rule, decision.acts) == (None, False)


def test_bad_shard_is_quarantined_then_rewound_before_its_first_bad_batch() -> None:
    decision = decide(incident("bad_shard", 240, 290, evidence={"shard": 7}), CHECKPOINTS, PlaybookSettings())
    assert decision.requests == (Request("quarantine", {"shard": 7}), Request("rewind", {"to_step": 200}))


def test_sdc_rewinds_before_the_disagreement_and_names_the_odd_rank() -> None:
    decision = decide(incident("sdc", 320, 330, ranks=(3,)), CHECKPOINTS, PlaybookSettings())
    assert decision.requests == (Request("rewind", {"to_step": 300}),)
    assert "rank 3 is suspect" in decision.why


def test_straggler_notifies_with_the_eviction_suggestion() -> None:
    evict = SuggestedAction("evict", {"rank": 2}, "rank 2 is persistently slower than its peers")
    decision = decide(
        incident("straggler", 50, 80, ranks=(2,), suggested_action=evict, severity=Severity.WARNING),
        CHECKPOINTS,
        PlaybookSettings(),
    )
    assert (decision.recipe, decision.acts) == ("notify", False)
    assert "evict" in decision.why and "rank 2 is persistently slower" in decision.why


@pytest.mark.parametrize("mode", ["suggest", "auto"])
def test_eval_stall_pages_and_never_acts(mode: str) -> None:
    settings = PlaybookSettings(mode=mode)
    decision = decide(incident("eval_stall", 400, 900, severity=Severity.WARNING), CHECKPOINTS, settings)
    assert (decision.rule, decision.recipe, decision.acts) == ("not_learning", "page", False)
    assert not guard(decision, "i1", History(), settings, now=0.0).allowed


def test_evidence_bounds_and_mode_off() -> None:
    rule = {"kinds": ["loss_spike"], "action": "page", "evidence_min": {"peak_z": 50}, "min_severity": "critical"}
    settings = parse_playbooks({"rules": {"huge": rule}}, "x")
    assert decide(incident("loss_spike", 250, 251, evidence={"peak_z": 60.0}), CHECKPOINTS, settings).rule == "huge"
    assert decide(incident("loss_spike", 250, 251, evidence={"peak_z": 20.0}), CHECKPOINTS, settings).rule == "spike"
    assert decide(incident("loss_spike", 250, 251), CHECKPOINTS, PlaybookSettings(mode="off")).acts is False


AUTO = PlaybookSettings(mode="auto")
REWIND = Decision("spike", "rewind", "why", (Request("rewind", {"to_step": 0}),))


def test_guard_allows_a_first_action_in_auto_mode_only() -> None:
    assert guard(REWIND, "i1", History(), AUTO, now=1e6).allowed
    assert not guard(REWIND, "i1", History(), PlaybookSettings(), now=1e6).allowed


def test_guard_acts_once_per_incident_and_honours_the_kill_switch() -> None:
    done = History(actions=(AutoAction(1e6 - 7200, "i1", "spike"),))
    assert "already acted on incident i1" in guard(REWIND, "i1", done, AUTO, now=1e6).why
    assert "switched off" in guard(REWIND, "i2", History(enabled=False), AUTO, now=1e6).why


def test_guard_limits_actions_per_hour() -> None:
    history = History(actions=(AutoAction(1e6 - 10, "a", "bad_shard"), AutoAction(1e6 - 20, "b", "sdc")))
    verdict = guard(REWIND, "c", history, AUTO, now=1e6)
    assert not verdict.allowed and "max_actions_per_hour" in verdict.why
    assert guard(REWIND, "c", history, AUTO, now=1e6 + 3600).allowed


def test_guard_escalates_after_recurring_faults_until_a_human_steps_in() -> None:
    actions = (AutoAction(1000.0, "a", "spike"), AutoAction(9000.0, "b", "spike"))
    verdict = guard(REWIND, "c", History(actions=actions), AUTO, now=20000.0)
    assert (verdict.allowed, verdict.escalate) == (False, True)
    assert "came back after 2 automatic recoveries" in verdict.why
    assert guard(REWIND, "c", History(actions=actions, human_at=5000.0), AUTO, now=20000.0).allowed


def test_suggest_mode_puts_the_decision_on_the_stored_incident(tmp_path: Path) -> None:
    """A recorded run with a non-finite step: its incident, as stored, suggests the playbook's rewind."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLE_RUNS / "tiny-faults", run)
    layout = RunLayout(run)
    with Store.open(layout.store, schemas=SCHEMAS) as store:
        Collector(run, store, warn=lambda text: None).ingest_available()
        detection = StoreDetection(store, playbooks=parse_playbooks({"mode": "suggest"}, "bedside.toml"))
        detection.update()
        detection.finish()
        incidents = store.fetch_named("api_incidents")
    suggested = {kinds[0]: json.loads(s) for kinds, s in zip(incidents["kinds"], incidents["suggested_action"])}
    assert suggested["nonfinite"]["action"] == "rewind" and suggested["nonfinite"]["args"]["to_step"] <= 140
    assert suggested["nonfinite"]["why"].startswith("playbook spike: rewind to step")
    assert suggested["straggler"]["action"] == "evict"  # the straggler rule notifies: the detector's suggestion stays
