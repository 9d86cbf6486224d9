"""Incidents: findings that share a cause and a time window, with a lifecycle.

A finding joins the incident of its family (training health, performance, learning)
on its timeline whose step window it touches within ``gap`` steps, unless it began
later than that and names another slow culprit (ranks or a host that the incident's
findings of its kind do not name: a second host that slows down later is a second
incident); otherwise it opens a new incident, named after it. Findings are assigned
once and never move, so an incident's id is stable while it grows (what alerts and
acknowledgements refer to). An incident is resolved, with the reason kept, when every
finding in it has cleared, or when a rewind abandoned its timeline (about the numbers
trained only: a slow host stays slow on the new timeline), or when an operator closes
it by hand; a closed incident takes no new findings (they open a new incident).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .registry import finding_kinds

ACTIONABLE = ("rewind", "quarantine", "evict", "skip")
UNEXPLAINED = "unexplained by data or hardware signals so far"


def family_of(kind: str) -> Family:
    """The family of findings of ``kind``: which findings can share a cause."""
    return finding_kinds()[kind].family


def concerns_training(kinds: Iterable[str]) -> bool:
    """Whether an incident of findings of ``kinds`` concerns the numbers being trained, not only the job's speed."""
    return any(family_of(kind) != Family.PERFORMANCE for kind in kinds)


@dataclass(frozen=True)
class Incident:
    """A group of findings with one cause, as the on-call sees it."""

    incident_id: str
    title: str
    severity: Severity
    resolved: bool
    cause: str
    timeline: int
    start_step: int
    end_step: int
    kinds: tuple[str, ...]
    ranks: tuple[int, ...]
    findings: tuple[Finding, ...]
    summary: str
    suggested_action: SuggestedAction
    closed_by_hand: bool = False  # an operator resolved it: it takes no new findings and nothing more is sent
    resolution: str | None = None  # why it is resolved, in words (None while open)


CLEARED = "every finding cleared"


def abandoned(timeline: int, newest: int) -> str:
    """The resolution of an incident whose timeline a rewind left."""
    return f"timeline {timeline} was abandoned: the run went on from a rewind (timeline {newest})"


class IncidentBook:
    """Assigns findings to incidents (remembering past assignments) and describes each incident."""

    def __init__(
        self, assignments: dict[str, str] | None = None, *, closed: set[str] | None = None, gap: int = 25
    ) -> None:
        self.gap = gap
        self._incident_of: dict[str, str] = dict(assignments or {})
        self._members: dict[str, dict[str, Finding]] = {}
        self._closed: set[str] = set(closed or ())
        self._newest: int | None = None

    def add(self, findings: list[Finding]) -> list[Incident]:
        """Take new or changed findings; the incidents they changed.

        Placed in onset order, so that an incident is named after its earliest finding however
        the findings were batched (a whole run at once comes in detector order).
        """
        touched = []
        for finding in sorted(findings, key=lambda f: (f.timeline, f.start_step, f.kind, f.ranks)):
            incident_id = self._incident_of.get(finding.finding_id) or self._place(finding)
            self._incident_of[finding.finding_id] = incident_id
            self._members.setdefault(incident_id, {})[finding.finding_id] = finding
            if incident_id not in touched:
                touched.append(incident_id)
        return [self.describe(i) for i in touched]

    def went_on(self, timeline: int | None) -> list[Incident]:
        """The run has reached ``timeline``: the incidents about the numbers trained on an older timeline that this
        resolves (their findings may never clear: the detector that made them has moved on)."""
        if timeline is None or (self._newest is not None and timeline <= self._newest):
            return []
        before = {i: self.describe(i).resolved for i in self._members}
        self._newest = timeline
        return [incident for i, was in before.items() if not was and (incident := self.describe(i)).resolved]

    def close(self, incident_id: str) -> None:
        """An operator resolved the incident by hand: new findings no longer join it."""
        self._closed.add(incident_id)

    def incident_ids(self) -> list[str]:
        """Every incident the book holds, oldest first."""
        return list(self._members)

    def incident_of(self, finding: Finding) -> str:
        return self._incident_of[finding.finding_id]

    def _place(self, finding: Finding) -> str:
        family = family_of(finding.kind)
        for incident_id, members in self._members.items():
            if incident_id in self._closed:
                continue
            first = next(iter(members.values()))
            if family_of(first.kind) != family or first.timeline != finding.timeline:
                continue
            start = min(f.start_step for f in members.values())
            end = max(f.end_step for f in members.values())
            near = finding.start_step <= end + self.gap and finding.end_step >= start - self.gap
            together = abs(finding.start_step - start) <= self.gap  # began with it: one cause can hit both
            if near and (together or _same_culprit(finding, members.values())):
                return incident_id
        return finding.finding_id

    def describe(self, incident_id: str) -> Incident:
        members = sorted(self._members[incident_id].values(), key=lambda f: (f.start_step, f.kind))
        worst = worst_of(members)
        kinds = tuple(dict.fromkeys(f.kind for f in members))
        family = family_of(members[0].kind)
        extra = len(members) - 1
        resolution = self._resolution(incident_id, members)
        return Incident(
            incident_id=incident_id,
            title=f"{family.heading}: {', '.join(kinds)}",
            severity=worst.severity,
            resolved=resolution is not None,
            cause=_cause(members),
            timeline=members[0].timeline,
            start_step=min(f.start_step for f in members),
            end_step=max(f.end_step for f in members),
            kinds=kinds,
            ranks=tuple(sorted({r for f in members for r in f.ranks})),
            findings=tuple(members),
            summary=worst.summary + (f" (+{extra} related finding{'s' if extra > 1 else ''})" if extra else ""),
            suggested_action=_action(members, worst),
            closed_by_hand=incident_id in self._closed,
            resolution=resolution,
        )

    def _resolution(self, incident_id: str, members: list[Finding]) -> str | None:
        if not any(f.active for f in members):
            return CLEARED
        timeline = members[0].timeline
        if self._newest is not None and timeline < self._newest and concerns_training(f.kind for f in members):
            return abandoned(timeline, self._newest)
        return None


def id_ranges(ids: Iterable[int], *, runs: int = 8, sep: str = ", ", more: str = ", and {} more") -> str:
    """Ranks (or batches) as runs of consecutive ids, at most ``runs`` of them: ``768-1023``, ``1, 3, 5-7``, then
    how many more (``more`` formatted with their count)."""
    spans: list[list[int]] = []
    for n in sorted({int(i) for i in ids}):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = sep.join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:runs])
    hidden = sum(b - a + 1 for a, b in spans[runs:])
    return text + (more.format(hidden) if hidden else "")


def worst_of(findings: Iterable[Finding]) -> Finding:
    """The finding that speaks for an incident: the most severe, then the highest score."""
    return max(findings, key=lambda f: (f.severity.level, f.score))


def _cause(members: list[Finding]) -> str:
    """The likeliest cause the findings point to, in words: the cause their kinds declare (the lowest
    precedence first), else a gradient-norm spike that led a loss spike, else unexplained."""
    declared = {kind.name: kind for f in members if (kind := finding_kinds()[f.kind]).cause}
    if declared:
        best = min(declared.values(), key=lambda kind: kind.precedence)
        return best.cause.format(ranks=id_ranges(_ranks_of(members, best)))
    first = {kind: min(f.start_step for f in members if f.kind == kind) for kind in {f.kind for f in members}}
    if {"loss_spike", "grad_spike"} <= set(first) and first["grad_spike"] < first["loss_spike"]:
        return f"optimisation: the gradient norm led the loss by {first['loss_spike'] - first['grad_spike']} steps"
    return UNEXPLAINED


def _same_culprit(finding: Finding, members: Iterable[Finding]) -> bool:
    """Whether ``finding`` can share a cause with ``members``: it is about speed and names ranks, and the
    incident names none of its kind, or they share a rank or a host (a NaN or a spike on another rank is still
    the same trouble spreading; a slow rank elsewhere is another machine)."""
    named = [f for f in members if f.kind == finding.kind and f.ranks]
    if family_of(finding.kind) != Family.PERFORMANCE or not finding.ranks or not named:
        return True
    mine = _culprits(finding)
    return any(mine & _culprits(f) for f in named)


def _culprits(finding: Finding) -> set[tuple[str, object]]:
    """The ranks a finding names, and its host where its evidence names one."""
    place = finding.evidence.get("place")
    host = finding.evidence.get("host") or (place.get("host") if isinstance(place, dict) else None)
    return {("rank", r) for r in finding.ranks} | ({("host", host)} if host else set())


def _ranks_of(members: list[Finding], kind: FindingKind) -> list[int]:
    return sorted({r for f in members if f.kind == kind.name for r in f.ranks})


def _action(members: list[Finding], worst: Finding) -> SuggestedAction:
    """The most severe actionable suggestion of the incident's findings, else the worst finding's."""
    actionable = [f for f in members if f.suggested_action.action in ACTIONABLE]
    if not actionable:
        return worst.suggested_action
    return worst_of(actionable).suggested_action
