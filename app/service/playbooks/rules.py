"""``[playbooks]`` of bedside.toml: the mode, the guardrails and the rules, validated with errors naming the key.

A rule maps findings (kinds, a least severity, optional evidence bounds) to a recipe: ``rewind`` (to the newest
good checkpoint at least ``min_steps_before_onset`` steps before the onset, then skip the fault window's batches
when ``skip_window``), ``quarantine`` (the shard the finding names, then a rewind before its first bad batch),
``notify`` (tell the on-call, act on nothing) or ``page`` (page a human, never act). The built-in rules
(``BUILTIN_RULES``) come after the file's own; a rule of the file with a built-in rule's name replaces it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bedside.collectors.errors import BedsideError
from bedside.detectors import finding
from bedside.detectors.finding import Severity

MODES = ("suggest", "auto", "off")
RECIPES = ("rewind", "quarantine", "notify", "page")
_SETTING_KEYS = ("mode", "max_actions_per_hour", "escalate_after_failed_recoveries", "min_steps_before_onset")
_TOP_KEYS = (*_SETTING_KEYS, "builtin_rules", "rules")
_RULE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,48}$")
_RULE_KEYS = ("kinds", "min_severity", "evidence_min", "evidence_max", "action", "skip_window", "rewind")


class PlaybookConfigError(BedsideError):
    """``[playbooks]`` of bedside.toml is not valid: the message names the file and the key."""


@dataclass(frozen=True)
class Rule:
    """Findings of ``kinds`` at ``min_severity`` or worse, within the evidence bounds, call for ``action``."""

    name: str
    kinds: tuple[str, ...]
    action: str
    min_severity: Severity = Severity.WARNING
    evidence_min: Mapping[str, float] = field(default_factory=dict)
    evidence_max: Mapping[str, float] = field(default_factory=dict)
    skip_window: bool = False
    rewind: bool = True

    def matches(self, kind: str, severity: Severity, evidence: Mapping[str, Any]) -> bool:
        """Whether one finding of ``kind``, ``severity`` and ``evidence`` is for this rule."""
        if kind not in self.kinds or severity.level < self.min_severity.level:
            return False
        return all(_number(evidence.get(k)) >= v for k, v in self.evidence_min.items()) and all(
            _number(evidence.get(k)) <= v for k, v in self.evidence_max.items()
        )


def _number(value: Any) -> float:
    """An evidence value as a number (NaN when it is none, which no bound accepts)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


BUILTIN_RULES = (
    Rule("spike", ("loss_spike", "nonfinite"), "rewind", Severity.CRITICAL, skip_window=True),
    Rule("bad_shard", ("bad_shard",), "quarantine", Severity.WARNING),
    Rule("sdc", ("sdc",), "rewind", Severity.WARNING),
    Rule("straggler", ("straggler",), "notify", Severity.WARNING),
    Rule("not_learning", ("eval_stall",), "page", Severity.WARNING),
)
"""The defaults of docs/playbooks.md, tried after the rules of the file."""


@dataclass(frozen=True)
class PlaybookSettings:
    """The mode, the guardrails of ``auto``, and the rules in the order they are tried."""

    mode: str = "suggest"
    max_actions_per_hour: int = 2
    escalate_after_failed_recoveries: int = 2
    min_steps_before_onset: int = 10
    rules: tuple[Rule, ...] = BUILTIN_RULES
    configured: bool = False
    """Whether bedside.toml has a ``[playbooks]`` section (without one, the detectors' suggestions stand)."""


def parse_playbooks(table: Any, where: str) -> PlaybookSettings:
    """Settings from the ``[playbooks]`` table of the document at ``where``; PlaybookConfigError naming the key."""
    if table is None:
        return PlaybookSettings()
    table = _table(table, where, "playbooks")
    _only_keys(table, _TOP_KEYS, where, "playbooks")
    mode = table.get("mode", "suggest")
    if mode not in MODES:
        raise _fail(where, "playbooks.mode", f"expected one of {', '.join(MODES)}, got {mode!r}")
    builtin = table.get("builtin_rules", True)
    if not isinstance(builtin, bool):
        raise _fail(where, "playbooks.builtin_rules", f"expected true or false, got {builtin!r}")
    own = tuple(
        _rule(name, body, where) for name, body in _table(table.get("rules", {}), where, "playbooks.rules").items()
    )
    names = {rule.name for rule in own}
    return PlaybookSettings(
        mode=mode,
        max_actions_per_hour=_count(table, "max_actions_per_hour", PlaybookSettings.max_actions_per_hour, where),
        escalate_after_failed_recoveries=_count(
            table, "escalate_after_failed_recoveries", PlaybookSettings.escalate_after_failed_recoveries, where
        ),
        min_steps_before_onset=_count(
            table, "min_steps_before_onset", PlaybookSettings.min_steps_before_onset, where, least=0
        ),
        rules=own + (tuple(r for r in BUILTIN_RULES if r.name not in names) if builtin else ()),
        configured=True,
    )


def _rule(name: str, body: Any, where: str) -> Rule:
    key = f"playbooks.rules.{name}"
    if not _RULE_NAME.match(name):
        raise _fail(where, key, "a rule's name is 1 to 48 letters, digits, '.', '_' or '-'")
    body = _table(body, where, key)
    _only_keys(body, _RULE_KEYS, where, key)
    action = body.get("action")
    if action not in RECIPES:
        raise _fail(where, f"{key}.action", f"expected one of {', '.join(RECIPES)}, got {action!r}")
    kinds = body.get("kinds")
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
        raise _fail(where, f"{key}.kinds", "expected a non-empty list of finding kinds")
    known = finding.FINDING_KINDS
    if unknown := [k for k in kinds if k not in known]:
        raise _fail(where, f"{key}.kinds", f"unknown kind {unknown[0]!r} (expected {', '.join(known)})")
    severity = body.get("min_severity", Severity.WARNING.value)
    if severity not in [s.value for s in Severity]:
        raise _fail(where, f"{key}.min_severity", f"expected info, warning or critical, got {severity!r}")
    flags = {flag: body.get(flag, default) for flag, default in (("skip_window", False), ("rewind", True))}
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise _fail(where, f"{key}.{flag}", f"expected true or false, got {value!r}")
    return Rule(
        name=name,
        kinds=tuple(kinds),
        action=action,
        min_severity=Severity(severity),
        evidence_min=_bounds(body, "evidence_min", key, where),
        evidence_max=_bounds(body, "evidence_max", key, where),
        **flags,
    )


def _bounds(body: Mapping[str, Any], name: str, key: str, where: str) -> dict[str, float]:
    bounds = _table(body.get(name, {}), where, f"{key}.{name}")
    for evidence, value in bounds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _fail(where, f"{key}.{name}.{evidence}", f"expected a finite number, got {value!r}")
    return {str(k): float(v) for k, v in bounds.items()}


def _count(table: Mapping[str, Any], key: str, default: int, where: str, *, least: int = 1) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _fail(where, f"playbooks.{key}", f"expected an integer >= {least}, got {value!r}")
    return value


def _table(value: Any, where: str, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, key, f"must be a table, got {type(value).__name__}")
    return value


def _only_keys(table: Mapping[str, Any], allowed: tuple[str, ...], where: str, prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise _fail(where, f"{prefix}.{key}", f"unknown key (expected one of {', '.join(allowed)})")


def _fail(where: str, key: str, problem: str) -> PlaybookConfigError:
    return PlaybookConfigError(f"{where}: {key}: {problem}")
