"""Findings scored against ground truth with a step margin (ruptures' ``metrics/precisionrecall.py``).

A finding **matches** a label when its kind is the label's expected kind (detectors/faults.py),
it is on the label's timeline (after a rewind, the abandoned branch's findings are no evidence
about a fault injected on the new one, nor the other way round), it starts within the label's steps widened by the margin (``before`` the first step: change-point
detectors date an onset back; ``after`` the last), and it blames ranks the label covers or
names none. A label is found when a finding matches it; its **delay** is from its first step to
the start of the matching finding nearest its onset (the first from two steps before it on, else the
latest before that), and its **culprit** is right when that finding names
only ranks of the label. A finding is a **false alarm** when it is neither of a label's kind
within the label's margin on its timeline (whatever ranks it names: a straggler's peers wait
too) nor the known consequence of a fault nearby on the same timeline (``CONSEQUENCES``: a NaN also moves the gradient norm).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .faults import Label
from .finding import Finding

CONSEQUENCES = {
    "loss_spike": {"grad_spike", "nonfinite", "bad_shard"},
    "nonfinite": {"loss_spike", "grad_spike"},
    "bad_shard": {"loss_spike", "grad_spike"},
    "hang": {"throughput_drop", "straggler"},
    "sdc": {"grad_spike", "loss_spike", "nonfinite"},
    "straggler": {"throughput_drop"},
    "throughput_drop": {"straggler"},
    "eval_stall": set(),
}
"""The finding kinds each expected kind also causes: not false alarms near such a fault."""
CONSEQUENCE_STEPS = (5, 200)
"""Steps before a fault's first step and after its last where its consequences are expected."""
ON_TIME_LEAD = 2
"""A finding starting this many steps before its fault's first step still counts as on time (not dated back)."""
CULPRIT_MAX_RANKS = 64
"""Faults covering more ranks than this score no culprit."""
FINDING_COLUMNS = ("finding_id", "kind", "severity", "timeline", "start_step", "ranks")


@dataclass(frozen=True)
class Margin:
    """Steps around a label's window where a finding still matches it; ``by_kind``: (before, after) by kind."""

    before: int = 2
    after: int = 0
    by_kind: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def steps(self, label: Label) -> tuple[int, int]:
        """The first and last step a matching finding may start at."""
        before, after = self.by_kind.get(label.expected_kind, (self.before, self.after))
        return label.first - before, label.last + after


def findings_frame(findings: Iterable[Finding]) -> pd.DataFrame:
    """Findings as the rows this module scores (``FINDING_COLUMNS``, as the store's findings view has them)."""
    rows = [(f.finding_id, f.kind, f.severity.value, f.timeline, f.start_step, tuple(f.ranks)) for f in findings]
    return pd.DataFrame(rows, columns=list(FINDING_COLUMNS))


def labels_of(records: pd.DataFrame) -> list[Label]:
    """One label per fault and timeline from ``fault_labels`` rows (timeline, step, fault, target_ranks,
    args), by first step; rows without a ``timeline`` column are of timeline 0.

    A fault recorded at each firing or occurrence (docs/faults.md) is one label: its spec's window.
    """
    labels: dict[tuple[str, str, int, int], Label] = {}
    for row in records[["timeline", "step", "fault", "target_ranks", "args"]].itertuples(index=False):
        label = Label.from_record(int(row.step), row.fault, row.target_ranks, row.args, int(row.timeline))
        labels.setdefault((label.fault, label.spec, label.timeline, label.first), label)
    return sorted(labels.values(), key=lambda label: (label.first, label.timeline))


def match(findings: pd.DataFrame, labels: Sequence[Label], margin: Margin) -> pd.DataFrame:
    """Per label: whether it was found, the earliest matching finding, the delay and whether the culprit is right."""
    rows = []
    for label in labels:
        hits = [f for f in _candidates(findings, label, margin) if _blames(f["ranks"], label)]
        first = _closest(hits, label)
        rows.append(
            {
                "timeline": label.timeline,
                "step": label.first,
                "fault": label.fault,
                "kind": label.expected_kind,
                "target_ranks": list(label.ranks),
                "magnitude": label.magnitude,
                "found": first is not None,
                "finding_id": first["finding_id"] if first else None,
                "delay": first["start_step"] - label.first if first else None,
                "culprit": _culprit(first["ranks"], label) if first else None,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "timeline",
            "step",
            "fault",
            "kind",
            "target_ranks",
            "magnitude",
            "found",
            "finding_id",
            "delay",
            "culprit",
        ],
    )


def false_alarms(findings: pd.DataFrame, labels: Sequence[Label], margin: Margin) -> pd.DataFrame:
    """The alarms (warning or critical findings) that no label explains: none of its kind within its margin,
    none a consequence of it. An info finding pages nobody, so it is no false alarm."""
    explained = {f["finding_id"] for label in labels for f in _candidates(findings, label, margin)}
    explained |= {f["finding_id"] for label in labels for f in _consequences(findings, label)}
    return findings[~findings["finding_id"].isin(explained) & (findings["severity"] != "info")]


def precision_recall(matches: pd.DataFrame, alarms: pd.DataFrame, steps: int) -> pd.DataFrame:
    """Per kind: faults, recall, precision, median and p90 delay, false alarms per 10k steps, culprit accuracy.

    ``matches`` and ``alarms`` as ``match`` and ``false_alarms`` give them (rows of many runs may be
    concatenated); ``steps``: the steps of every run scored.
    """
    counts = alarms["kind"].value_counts().to_dict() if len(alarms) else {}
    rows = []
    for kind, group in matches.groupby("kind"):
        delays, culprits = group["delay"].dropna(), group["culprit"].dropna()
        found, fa = int(group["found"].sum()), counts.get(kind, 0)
        rows.append(
            {
                "kind": kind,
                "faults": len(group),
                "recall": round(group["found"].mean(), 3),
                "precision": round(found / (found + fa), 3) if found + fa else float("nan"),
                "median_delay": delays.median() if len(delays) else None,
                "p90_delay": delays.quantile(0.9) if len(delays) else None,
                "false_alarms_per_10k": _per_10k(fa, steps),
                "culprit_accuracy": round(culprits.astype(float).mean(), 3) if len(culprits) else None,
            }
        )
    for kind in sorted(set(counts) - set(matches["kind"])):
        rows.append({"kind": kind, "faults": 0, "false_alarms_per_10k": _per_10k(counts[kind], steps)})
    return pd.DataFrame(rows)


def scorecard(records: pd.DataFrame, findings: pd.DataFrame, margin: int) -> pd.DataFrame:
    """Each injected fault and the finding that caught it: step, fault, target_ranks, found_as, delay_steps.

    ``records``: ``fault_labels`` rows; ``findings``: ``FINDING_COLUMNS`` rows; ``margin``: steps
    either side of each fault's window.
    """
    labels = labels_of(records)
    matches = match(findings, labels, Margin(margin, margin))
    return pd.DataFrame(
        {
            "step": matches["step"].astype("int64"),
            "fault": matches["fault"],
            "target_ranks": [json.dumps(ranks, separators=(",", ":")) for ranks in matches["target_ranks"]],
            "found_as": pd.Series(
                [k if found else None for k, found in zip(matches["kind"], matches["found"])], dtype=object
            ),
            "delay_steps": matches["delay"].astype("Int64"),
            "why_missed": [
                "" if found else why_missed(findings, label, margin) for label, found in zip(labels, matches["found"])
            ],
        }
    )  # whole steps, missing where nothing caught it


def why_missed(findings: pd.DataFrame, label: Label, margin: int) -> str:
    """In words, why no finding caught ``label``: a finding of its kind that blamed other ranks, or that started
    outside the window, or none of its kind on its timeline at all."""
    kind, target = label.expected_kind, ", ".join(map(str, label.ranks)) or "any rank"
    low, high = label.first - margin, label.last + margin
    near = [_ranks(r) for r in _near(findings, label, {kind}, low, high)["ranks"]]
    if near:
        blamed = ", ".join(str(r) for r in sorted({r for named in near for r in named})) or "none"
        return f"a {kind} finding in steps {low}-{high} named rank(s) {blamed}, not {target}"
    same = findings[(findings["timeline"] == label.timeline) & (findings["kind"] == kind)]
    if not same.empty:
        nearest = int(same["start_step"].iloc[(same["start_step"] - label.first).abs().argmin()])
        return f"the nearest {kind} finding starts at step {nearest}, outside steps {low}-{high}"
    return f"no {kind} finding on timeline {label.timeline}: the effect did not stand out from the run's own noise"


def _candidates(findings: pd.DataFrame, label: Label, margin: Margin) -> list[dict[str, Any]]:
    """The findings of the label's kind on its timeline that start within its margin, whatever ranks they name."""
    low, high = margin.steps(label)
    near = _near(findings, label, {label.expected_kind}, low, high)
    return [{**row, "ranks": _ranks(row["ranks"])} for row in near.to_dict("records")]


def _consequences(findings: pd.DataFrame, label: Label) -> list[dict[str, Any]]:
    before, after = CONSEQUENCE_STEPS
    kinds = CONSEQUENCES.get(label.expected_kind, set())
    return _near(findings, label, kinds, label.first - before, label.last + after).to_dict("records")


def _near(findings: pd.DataFrame, label: Label, kinds: set[str], low: int, high: int) -> pd.DataFrame:
    """The findings of ``kinds`` on the label's timeline that start from step ``low`` to ``high``."""
    return findings[
        (findings["timeline"] == label.timeline)
        & findings["kind"].isin(kinds)
        & findings["start_step"].between(low, high)
    ]


def _closest(hits: list[dict[str, Any]], label: Label) -> dict[str, Any] | None:
    """The finding that caught the label: the first that starts at most ``ON_TIME_LEAD`` steps before it, else
    (a detector that dates an onset back) the latest that starts before that; None without hits. An earlier
    finding within the margin is most often another fault's, so the nearest start wins, not the earliest."""
    on_time = [f for f in hits if f["start_step"] >= label.first - ON_TIME_LEAD]
    if on_time:
        return min(on_time, key=lambda f: f["start_step"])
    return max(hits, key=lambda f: f["start_step"]) if hits else None


def _blames(ranks: tuple[int, ...], label: Label) -> bool:
    """A finding that names no rank, or some rank of the label, may be the label's."""
    return not ranks or not label.ranks or bool(set(ranks) & set(label.ranks))


def _culprit(ranks: tuple[int, ...], label: Label) -> bool | None:
    if not (ranks and label.ranks and len(label.ranks) < CULPRIT_MAX_RANKS):
        return None
    return set(ranks) <= set(label.ranks)


def _ranks(value: Any) -> tuple[int, ...]:
    """A finding's ranks from a tuple, a list or array, JSON text, or nothing."""
    if isinstance(value, str):
        value = json.loads(value)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ()
    return tuple(int(rank) for rank in value)


def _per_10k(count: int, steps: int) -> float:
    return round(count / steps * 1e4, 2) if steps else float("nan")
