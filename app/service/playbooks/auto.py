"""``auto`` mode in the live service: file what a playbook decides for an incident through the same signed
request and audit trail as a person, within the guardrails, and announce every automatic action in chat.

The operator of each request is ``playbook:RULE`` and its reason names the rule. Before each action the trail is
read again (``trail.read_history``): the kill switch (``bedside playbook off RUN``), the incidents already acted
on and the actions of the last hour. When a rule's fault came back after ``escalate_after_failed_recoveries``
automatic recoveries in a row, the playbook switches itself off in the trail and pages every notifier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bedside.collectors import audit
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout
from bedside.detectors.incidents import Incident

from ..alerts.config import NotifierConfig
from ..alerts.payload import RunRef, playbook_payload
from ..owner_health import HealthNotices
from .decide import Decision, decide, guard
from .rules import PlaybookSettings
from .trail import AUTOMATIC, read_history, set_switch


class AutoPlaybook:
    """Acts on the incidents the live detection records, for the run at ``layout``."""

    def __init__(
        self, layout: RunLayout, settings: PlaybookSettings, notices: HealthNotices, *, warn: Callable[[str], None]
    ) -> None:
        self.layout = layout
        self.settings = settings
        self.notices = notices
        self.warn = warn
        self._said: set[tuple[str, str]] = set()
        self._acted: set[str] = set()  # incidents the trail says a playbook acted on: never again, so never reread

    def consider(self, incidents: Iterable[Incident], checkpoints: Mapping[int, Sequence[int]], now: float) -> None:
        """Decide for each open incident of the newest timeline; file, escalate or say why not."""
        incidents = [i for i in incidents if not i.resolved]
        newest = max((i.timeline for i in incidents), default=0)
        for incident in (i for i in incidents if i.timeline == newest):
            if incident.incident_id in self._acted:
                continue
            decision = decide(incident, checkpoints, self.settings)
            if decision.acts:
                self._act(incident, decision, now)

    def _act(self, incident: Incident, decision: Decision, now: float) -> None:
        verdict = guard(decision, incident.incident_id, read_history(self.layout), self.settings, now)
        if verdict.done:
            self._acted.add(incident.incident_id)
        if verdict.escalate:
            self._stop(incident, decision, verdict.why)
        elif verdict.allowed:
            self._file(incident, decision)
        elif not verdict.done and (incident.incident_id, verdict.why) not in self._said:
            self._said.add((incident.incident_id, verdict.why))
            self.warn(f"playbook {decision.rule} did not act on incident {incident.incident_id}: {verdict.why}")

    def _file(self, incident: Incident, decision: Decision) -> None:
        operator, reason = f"{AUTOMATIC}{decision.rule}", f"playbook rule {decision.rule}: {decision.why}"
        filed: list[dict[str, Any]] = []
        for request in decision.requests:
            try:
                request_id, _ = audit.file_request(
                    self.layout,
                    request.action,
                    request.args,
                    operator=operator,
                    reason=reason,
                    incident_id=incident.incident_id,
                )
            except (ValueError, OSError, BedsideError) as error:
                self.warn(f"playbook {decision.rule} could not file {request.action}: {error}")
                break
            filed.append({"request_id": request_id, "action": request.action, "args": dict(request.args)})
        if filed:
            self._announce(incident, decision.rule, filed, decision.why, stopped=False)

    def _stop(self, incident: Incident, decision: Decision, why: str) -> None:
        """Switch playbooks off in the trail, as the playbook, and page every notifier saying why."""
        try:
            set_switch(
                self.layout, False, operator=f"{AUTOMATIC}{decision.rule}", reason=why, incident_id=incident.incident_id
            )
        except (ValueError, OSError, BedsideError) as error:
            self.warn(f"playbook {decision.rule} could not record that it stops: {error}")
        self.warn(f"playbook {decision.rule} stopped on incident {incident.incident_id}: {why}")
        self._announce(incident, decision.rule, [], why, stopped=True)

    def _announce(
        self, incident: Incident, rule: str | None, requests: list[dict[str, Any]], reason: str, *, stopped: bool
    ) -> None:
        playbook = {"rule": rule or "", "incident_id": incident.incident_id, "requests": requests, "reason": reason}
        state = "stopped" if stopped else "acted"

        def payload(notifier: NotifierConfig, run: RunRef, now: float) -> dict:
            message_id = f"{run.run_id or run.name}/{notifier.name}/playbook/{incident.incident_id}/{state}"
            return playbook_payload(
                message_id, run, notifier=notifier.name, playbook=playbook, stopped=stopped, now=now
            )

        self.notices.announce(payload)
