"""Which action a playbook takes for an incident, with which arguments, or none and why; pure (no I/O).

``decide`` reads the incident's findings, the run's good checkpoints (step lists per timeline, as the detectors
keep them) and the settings; ``guard`` holds an automatic action against the guardrails given the history of
automatic actions (docs/playbooks.md). The trainer reads global batch ``i`` at step ``i``, so a skip of the
fault window names its steps as batches.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bedside.detectors.finding import Finding, SuggestedAction
from bedside.detectors.incidents import Incident

from .rules import PlaybookSettings, Rule

HOUR_S = 3600.0


@dataclass(frozen=True)
class Request:
    """One control request a decision files (``collectors/control.py`` checks its arguments)."""

    action: str
    args: Mapping[str, int]


@dataclass(frozen=True)
class Decision:
    """A rule's recipe for an incident: the requests to file (none: notify or page only) and why."""

    rule: str | None
    recipe: str
    why: str
    requests: tuple[Request, ...] = ()

    @property
    def acts(self) -> bool:
        return bool(self.requests)

    def suggestion(self) -> SuggestedAction:
        """The decision as the incident's suggested action: its first request; the rest are said in words."""
        if not self.requests:
            return SuggestedAction("investigate", {}, f"playbook {self.rule}: {self.why}")
        first = self.requests[0]
        return SuggestedAction(first.action, dict(first.args), f"playbook {self.rule}: {self.why}")


def decide(incident: Incident, checkpoints: Mapping[int, Sequence[int]], settings: PlaybookSettings) -> Decision:
    """The first rule (in order) that one of the incident's findings matches, and its recipe's requests."""
    if settings.mode == "off":
        return Decision(None, "none", "playbooks are off in bedside.toml")
    for rule in settings.rules:
        matching = [f for f in incident.findings if rule.matches(f.kind, f.severity, f.evidence)]
        if matching:
            return _recipe(rule, matching, incident, checkpoints, settings.min_steps_before_onset)
    return Decision(None, "none", f"no playbook rule matches {', '.join(incident.kinds) or 'its findings'}")


def _recipe(
    rule: Rule, matching: list[Finding], incident: Incident, checkpoints: Mapping[int, Sequence[int]], margin: int
) -> Decision:
    onset = min(f.start_step for f in matching)
    end = max(f.end_step for f in matching)
    if rule.action == "page":
        return Decision(rule.name, "page", f"{_kinds(matching)} from step {onset}: a human decides, never automatic")
    if rule.action == "notify":
        return Decision(rule.name, "notify", _notice(matching))
    target = checkpoint_before(checkpoints, incident.timeline, onset - margin)
    if rule.action == "quarantine":
        return _quarantine(rule, matching, onset, target)
    if target is None:
        return Decision(
            rule.name,
            "page",
            f"no good checkpoint at least {margin} steps before the onset at step {onset} to rewind to",
        )
    requests = [Request("rewind", {"to_step": target})]
    why = (
        f"rewind to step {target}, the newest good checkpoint at least {margin} steps before the onset at step {onset}"
    )
    if rule.skip_window:
        requests.append(Request("skip", {"first_batch": onset, "last_batch": max(onset, end)}))
        why += f", and skip batches {onset}-{max(onset, end)} of the fault window"
    suspect = _suspects(matching) if "sdc" in rule.kinds else ""
    return Decision(rule.name, "rewind", why + suspect, tuple(requests))


def _quarantine(rule: Rule, matching: list[Finding], onset: int, target: int | None) -> Decision:
    shards = sorted({f.evidence["shard"] for f in matching if _is_count(f.evidence.get("shard"))})
    if not shards:
        return Decision(rule.name, "page", "the findings name no shard to quarantine")
    requests = [Request("quarantine", {"shard": shard}) for shard in shards]
    why = f"quarantine shard{'s' if len(shards) > 1 else ''} {', '.join(map(str, shards))}"
    if rule.rewind and target is not None:
        requests.append(Request("rewind", {"to_step": target}))
        why += f" and rewind to step {target}, before its first bad batch at step {onset}"
    elif rule.rewind:
        why += f" (no good checkpoint before its first bad batch at step {onset} to rewind to)"
    return Decision(rule.name, "quarantine", why, tuple(requests))


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _suspects(matching: list[Finding]) -> str:
    ranks = sorted({r for f in matching for r in f.ranks})
    return f"; rank {', '.join(map(str, ranks))} is suspect (replicas disagreed)" if ranks else ""


def _notice(matching: list[Finding]) -> str:
    worst = max(matching, key=lambda f: f.severity.level)
    said = worst.suggested_action
    return f"{worst.summary}; suggested: {said.action} {dict(said.args)} ({said.why})" if said.why else worst.summary


def _kinds(findings: list[Finding]) -> str:
    return ", ".join(sorted({f.kind for f in findings}))


def checkpoint_before(checkpoints: Mapping[int, Sequence[int]], timeline: int, limit: int) -> int | None:
    """The newest good checkpoint at or before ``limit`` on ``timeline`` (failing that, on any timeline)."""
    steps = sorted(checkpoints.get(timeline) or {s for found in checkpoints.values() for s in found})
    i = bisect.bisect_right(steps, limit)
    return steps[i - 1] if i and limit >= 0 else None


@dataclass(frozen=True)
class AutoAction:
    """An automatic request recorded in the audit trail: when, for which incident, by which rule (one decision
    may file several; the guardrails count incidents)."""

    time: float
    incident_id: str
    rule: str


@dataclass(frozen=True)
class History:
    """What the guardrails weigh: every automatic action of the run, when a human last acted or switched
    playbooks on (failed recoveries are counted from then), and whether the kill switch lets playbooks act."""

    actions: tuple[AutoAction, ...] = ()
    human_at: float = 0.0
    enabled: bool = True

    def failed_recoveries(self, rule: str | None, incident_id: str) -> int:
        """Automatic actions by ``rule`` on other incidents since a human last stepped in: the fault came back
        after each of them, since another incident of the same rule is open now."""
        return len({a.incident_id for a in self.actions if a.time >= self.human_at and a.rule == rule} - {incident_id})


@dataclass(frozen=True)
class Verdict:
    """Whether an automatic action may go ahead; when not, why, and whether automation stops and pages."""

    allowed: bool
    why: str = ""
    escalate: bool = False
    done: bool = False
    """Refused because a playbook already acted on the incident (nothing new to say)."""


def guard(decision: Decision, incident_id: str, history: History, settings: PlaybookSettings, now: float) -> Verdict:
    """Hold an automatic action against the kill switch, once per incident, escalation and the hourly limit."""
    if settings.mode != "auto" or not decision.acts:
        return Verdict(False, f"mode {settings.mode}" if settings.mode != "auto" else decision.why)
    if not history.enabled:
        return Verdict(False, "playbooks are switched off for this run (bedside playbook on RUN)")
    if any(a.incident_id == incident_id for a in history.actions):
        return Verdict(False, f"a playbook already acted on incident {incident_id}", done=True)
    failed = history.failed_recoveries(decision.rule, incident_id)
    if failed >= settings.escalate_after_failed_recoveries:
        return Verdict(
            False,
            f"the fault came back after {failed} automatic recoveries by rule {decision.rule} in a row: "
            "automation stops and a human decides",
            escalate=True,
        )
    recent = len({a.incident_id for a in history.actions if now - a.time < HOUR_S})
    if recent >= settings.max_actions_per_hour:
        return Verdict(False, f"{recent} automatic actions in the last hour (max_actions_per_hour)")
    return Verdict(True)
