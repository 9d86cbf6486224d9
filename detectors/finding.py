"""The one output type of every detector: a ``Finding`` with its evidence and suggested action."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any


class Severity(StrEnum):
    """How loudly a finding should be raised: info is logged, warning notifies, critical pages."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def level(self) -> int:
        return ("info", "warning", "critical").index(self.value)


def __getattr__(name: str) -> tuple[str, ...]:
    """``FINDING_KINDS``: every kind a finding can have, as the registered detectors declare them (read from
    the registry on first use, since the detectors themselves import this module)."""
    if name == "FINDING_KINDS":
        return declared_kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def declared_kinds() -> tuple[str, ...]:
    """Every kind a finding can have (``bedside detect --json`` prints only these)."""
    from .registry import finding_kinds  # the registry imports every detector, and they import this module

    return tuple(finding_kinds())


ACTION_NAMES = ("rewind", "skip", "quarantine", "evict", "investigate", "none")
"""What a finding can suggest; rewind, skip and quarantine map onto control requests."""

JSON_KEYS = (
    "kind",
    "severity",
    "timeline",
    "start_step",
    "end_step",
    "ranks",
    "score",
    "summary",
    "evidence",
    "suggested_action",
)
"""The keys of a finding as ``bedside detect --json`` prints it, in this order."""


@dataclass(frozen=True)
class SuggestedAction:
    """What the on-call should do, with the arguments a control request would need."""

    action: str
    args: Mapping[str, Any] = field(default_factory=dict)
    why: str = ""

    def __post_init__(self) -> None:
        if self.action not in ACTION_NAMES:
            raise ValueError(f"unknown action {self.action!r}: expected one of {', '.join(ACTION_NAMES)}")

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "args": dict(self.args), "why": self.why}


NO_ACTION = SuggestedAction("none")


@dataclass(frozen=True)
class Finding:
    """Something a detector saw, from ``start_step`` to ``end_step`` on one timeline.

    ``ranks`` is empty for a job-level finding. ``active`` is True while the condition
    lasts (a spike not yet recovered, a rank still slow); a detector reports the same
    finding again (same ``finding_id``) when it grows, changes severity or clears.
    """

    kind: str
    severity: Severity
    timeline: int
    start_step: int
    end_step: int
    ranks: tuple[int, ...]
    score: float
    summary: str
    evidence: Mapping[str, Any]
    suggested_action: SuggestedAction = NO_ACTION
    active: bool = False
    detector: str = ""
    subject: str = ""
    """What else tells this finding from another of its kind, onset and ranks (a data shard: ``shard3``); part
    of ``finding_id``, so that two shards going bad at the same step are two findings."""

    def __post_init__(self) -> None:
        if self.kind not in (kinds := declared_kinds()):
            raise ValueError(f"unknown finding kind {self.kind!r}: expected one of {', '.join(kinds)}")
        if self.end_step < self.start_step:
            raise ValueError(f"end_step {self.end_step} is before start_step {self.start_step}")
        object.__setattr__(self, "severity", Severity(self.severity))
        object.__setattr__(self, "ranks", tuple(sorted(int(r) for r in self.ranks)))

    @property
    def finding_id(self) -> str:
        """Stable across updates and replays: kind, timeline, onset, ranks and subject."""
        ranks = "-".join(map(str, self.ranks[:8])) + ("+" if len(self.ranks) > 8 else "")
        place = (f"/r{ranks}" if ranks else "") + (f"/{self.subject}" if self.subject else "")
        return f"{self.kind}@{self.timeline}:{self.start_step}{place}"

    def to_json(self) -> dict[str, Any]:
        """The finding as ``bedside detect --json`` prints it: exactly ``JSON_KEYS``."""
        return {
            "kind": self.kind,
            "severity": self.severity.value,
            "timeline": self.timeline,
            "start_step": self.start_step,
            "end_step": self.end_step,
            "ranks": list(self.ranks),
            "score": json_number(self.score),
            "summary": self.summary,
            "evidence": json_safe(self.evidence),
            "suggested_action": self.suggested_action.to_json(),
        }


def json_number(value: float) -> float | str | None:
    """A float that strict JSON can carry (non-finite as a string, as in the telemetry format)."""
    if value is None:
        return None
    value = float(value)
    if math.isfinite(value):
        return round(value, 6)
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars, tuples and non-finite floats made strict-JSON friendly."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return json_number(value)
    return str(value)
