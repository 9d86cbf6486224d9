"""A control request that was filed and never answered: someone asked the run to act, and nothing happened.

Filing writes the request into ``RUN/control/requests/`` and an entry into the audit trail
(the ``filed`` frame); rank 0's loop answers each request it takes (``requested``, then
``applied`` or ``rejected``: the ``actions`` frame) at its next step boundary. Whoever can
write ``requests/`` can also delete a filed request or hide it (a dot-file is never read),
and a loop without a control reader reads none: the trail then says the request was filed
and the on-call believes it is in hand. A request with no answer once the run has gone on
for ``steps`` steps (and ``grace_s`` seconds, so that clocks a little apart cannot decide it)
or for ``seconds`` (a run that is paused or slow still writes heartbeats) is a finding: a
warning, cleared if an answer comes after all. A run that writes nothing after the filing
(ended, or dead) is not judged: ``bedside action`` already warns that no reader polls.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

import pandas as pd

from .detector import Detector
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, POSITIVE, ranges
from .telemetry import TelemetryBatch

KEPT_STEPS = 4096  # step times kept beyond those a pending request needs: for a filing copied in late


@dataclass(frozen=True)
class _Filed:
    request_id: str
    time: float
    action: str
    operator: str


class UnansweredRequestDetector(Detector):
    """Requests filed through bedside that the run went on past without answering."""

    name = "unanswered_request"
    kinds = (
        FindingKind(
            "unanswered_request",
            Family.CONTROL,
            tolerance=0,
            cause="control: a filed request never reached the loop",
            precedence=50,
        ),
    )
    limits = ranges(steps=COUNT, seconds=POSITIVE, grace_s=POSITIVE)

    def __init__(self, *, steps: int = 20, seconds: float = 120.0, grace_s: float = 30.0) -> None:
        super().__init__()
        self.steps, self.seconds, self.grace_s = steps, seconds, grace_s
        self._filed: dict[str, _Filed] = {}  # filed, not yet due
        self._judged: set[str] = set()  # every request id filed so far
        self._answers: dict[str, float] = {}  # each answered request's first answer time
        self._open: dict[str, Finding] = {}
        self._times: list[float] = []  # job steps' times, in the order written (nondecreasing)
        self._places: list[tuple[int, int]] = []  # their (timeline, step)
        self._latest = -float("inf")

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        changed = self._take_answers(batch)
        self._take_filings(batch)
        self._take_progress(batch)
        return changed + [f for f in map(self._judge, list(self._filed.values())) if f is not None]

    def _take_answers(self, batch: TelemetryBatch) -> list[Finding]:
        """Each request's first answer time; the open findings an answer clears."""
        if not len(batch.actions):
            return []
        times = batch.floats("actions", "time")
        for request_id, time in zip(batch.actions["request_id"].astype(str), times.tolist()):
            self._answers[request_id] = min(time, self._answers.get(request_id, time))
        return [self._cleared(self._open.pop(i)) for i in [i for i in self._open if i in self._answers]]

    def _take_filings(self, batch: TelemetryBatch) -> None:
        if not len(batch.filed):
            return
        for row in batch.filed.itertuples(index=False):
            request_id = str(row.request_id)
            if request_id not in self._judged:
                self._judged.add(request_id)
                self._filed[request_id] = _Filed(request_id, float(row.time), _text(row.action), _text(row.operator))

    def _take_progress(self, batch: TelemetryBatch) -> None:
        if len(batch.steps):
            self._times += batch.floats("steps", "time").tolist()
            self._places += list(zip(batch.ints("steps", "timeline").tolist(), batch.ints("steps", "step").tolist()))
            if len(self._times) > 2 * KEPT_STEPS:  # what no pending request needs, past the last KEPT_STEPS
                oldest = min((f.time for f in self._filed.values()), default=float("inf"))
                drop = min(len(self._times) - KEPT_STEPS, bisect.bisect_right(self._times, oldest))
                del self._times[:drop], self._places[:drop]
        for name in ("steps", "rank_steps", "events", "actions"):
            if len(getattr(batch, name)):
                self._latest = max(self._latest, float(batch.floats(name, "time").max()))

    def _due(self, filed: _Filed) -> tuple[int, int, float] | None:
        """When the run had gone on far enough past ``filed``: the index of that step among those kept (-1: judged
        by the clock, after the last step), the steps since the filing, and the time it fell due; None if not yet.

        The first step at least ``steps`` after the filing and ``grace_s`` after it, or ``seconds`` after it,
        whichever comes first: the same step however the rows were batched.
        """
        first = bisect.bisect_right(self._times, filed.time)
        by_steps = max(first + self.steps - 1, bisect.bisect_left(self._times, filed.time + self.grace_s))
        at = min(by_steps, bisect.bisect_left(self._times, filed.time + self.seconds))
        if at < len(self._times):
            return at, at - first + 1, self._times[at]
        if self._latest - filed.time >= self.seconds and self._places:
            return -1, len(self._times) - first, filed.time + self.seconds
        return None

    def _judge(self, filed: _Filed) -> Finding | None:
        """The finding for ``filed`` once it fell due without an answer before; None while it is not due, or when
        it was answered in time (it leaves the pending then). Answered after it fell due: the finding, cleared."""
        due = self._due(filed)
        answered = self._answers.get(filed.request_id)
        if due is None:
            if answered is not None:
                del self._filed[filed.request_id]
            return None
        del self._filed[filed.request_id]
        at, steps, due_time = due
        if answered is not None and answered <= due_time:
            return None
        (timeline, step), waited = self._places[at], due_time - filed.time
        when = _when(filed.time)
        finding = Finding(
            kind="unanswered_request",
            severity=Severity.WARNING,
            timeline=timeline,
            start_step=step,
            end_step=step,
            ranks=(),
            score=round(waited, 3),
            summary=(
                f"control request {filed.request_id} ({filed.action or 'an action'} by {filed.operator or 'someone'}, "
                f"filed {when}) was not applied: {steps} steps and {waited:.0f} s later no rank had answered it; "
                "its file was removed or hidden from control/requests/, or the loop reads no requests"
            ),
            evidence={
                "request_id": filed.request_id,
                "action": filed.action,
                "operator": filed.operator,
                "filed_at": filed.time,
                "steps_since": steps,
                "seconds_since": round(waited, 3),
            },
            suggested_action=SuggestedAction(
                "investigate",
                {},
                "look for the request in RUN/control/requests/ and processed/ (bedside audit shows who filed it), "
                "and file it again if it is still wanted",
            ),
            active=True,
            detector=self.name,
            subject=filed.request_id,
        )
        if answered is not None:
            return self._cleared(finding)
        self._open[filed.request_id] = finding
        return finding

    @staticmethod
    def _cleared(finding: Finding) -> Finding:
        """A finding whose request was answered after all, cleared."""
        return replace(finding, active=False, summary=f"{finding.summary}; answered later after all")


def _when(time: float) -> str:
    """A filing time in words (unix seconds no calendar holds, as they are)."""
    try:
        return pd.Timestamp(time, unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M:%S UTC")
    except (ValueError, OverflowError):
        return f"at unix time {time:g}"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
