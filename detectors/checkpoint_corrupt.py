"""A checkpoint that fails verification: the run's way back has a hole in it.

The trainer checks a checkpoint (size and sha256 of every file against its manifest) before
it loads it for a resume or a rewind, and before retention counts it among those it keeps;
each one that fails is a ``checkpoint`` event ``corrupt`` naming the checkpoint (``path``)
and the first mismatch (``message``). Corrupt checkpoints reported before the next
``saved`` one are one finding: a warning for one, critical from ``critical_count`` on (the
storage is suspect and the fallback grows thin). The finding clears when a checkpoint is
saved after them: the run again has a recent place to go back to.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pandas as pd

from .detector import Detector
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, ranges
from .telemetry import TelemetryBatch

_NAME = re.compile(r"step-(\d+)-t(\d+)$")


class CheckpointCorruptDetector(Detector):
    """Checkpoints the trainer found corrupt, until a new one is saved."""

    name = "checkpoint_corrupt"
    kinds = (
        FindingKind(
            "checkpoint_corrupt",
            Family.CHECKPOINTS,
            tolerance=0,
            cause="storage: checkpoints fail verification",
            precedence=60,
        ),
    )
    limits = ranges(critical_count=COUNT)

    def __init__(self, *, critical_count: int = 2) -> None:
        super().__init__()
        self.critical_count = critical_count
        self._open: Finding | None = None

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        ck = batch.checkpoints
        if ck.empty:
            return []
        rows = ck[ck["event"].isin(("corrupt", "saved"))]
        changed: dict[str, Finding] = {}
        for row in rows.itertuples(index=False):
            found = self._corrupt(row) if row.event == "corrupt" else self._saved(int(row.step))
            if found is not None:
                changed[found.finding_id] = found
        return list(changed.values())

    def _corrupt(self, row: Any) -> Finding:
        path, reason = _text(getattr(row, "path", None)), _text(getattr(row, "message", None))
        step, timeline = int(row.step), int(row.timeline)
        previous = self._open
        checkpoints = [*(previous.evidence["checkpoints"] if previous else ()), _described(path, reason)]
        count = len(checkpoints)
        severity = Severity.CRITICAL if count >= self.critical_count else Severity.WARNING
        fallback = self.run.checkpoint_before(timeline, step + 1)
        onset = (previous.timeline, previous.start_step, previous.end_step) if previous else (timeline, step, step)
        self._open = Finding(
            kind="checkpoint_corrupt",
            severity=severity,
            timeline=onset[0],
            start_step=onset[1],
            end_step=max(step, onset[2]),
            ranks=(),
            score=float(count),
            summary=f"{count} checkpoint{'s' if count > 1 else ''} failed verification (latest: {path or 'unnamed'})",
            evidence={
                "checkpoints": checkpoints,
                "count": count,
                "critical_count": self.critical_count,
                "newest_good_checkpoint_step": fallback,
            },
            suggested_action=SuggestedAction(
                "investigate",
                {},
                "check the checkpoint storage (disk, filesystem, copies) and take a fresh "
                "checkpoint: a rewind or restart can only fall back past the corrupt ones",
            ),
            active=True,
            detector=self.name,
        )
        return self._open

    def _saved(self, step: int) -> Finding | None:
        if self._open is None:
            return None
        summary = f"{self._open.summary}; a checkpoint was saved since, at step {step}"
        evidence = {**self._open.evidence, "cleared_at_step": step}
        cleared = replace(self._open, active=False, summary=summary, evidence=evidence)
        self._open = None
        return cleared


def _described(path: str | None, reason: str | None) -> dict[str, object]:
    """One corrupt checkpoint as evidence: its path, the (timeline, step) its name says, and what failed."""
    match = _NAME.search(path or "")
    return {
        "path": path,
        "step": int(match[1]) if match else None,
        "timeline": int(match[2]) if match else None,
        "reason": reason,
    }


def _text(value: object) -> str | None:
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
