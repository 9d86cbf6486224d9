"""Detection over a run's store: feed new rows to the detectors, keep findings and incidents in the store.

The same object serves batch mode (``bedside detect``: one ``update`` then ``finish``)
and streaming (the collector calls ``update`` after each ingested batch and ``tick``
while the run is quiet). A new process replays the store from its first row, so
detector state is rebuilt exactly, and upserts what it finds: stored findings keep
their first-seen time, incidents their id and acknowledgement. With an alert router,
the messages each change calls for are written in the same transaction.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from bedside.collectors.audit import AuditKeeper
from bedside.collectors.display_text import visible
from bedside.collectors.errors import BedsideError, StoreLockedError
from bedside.collectors.ingest import Collector, PassResult
from bedside.collectors.layout import RunLayout
from bedside.collectors.query import open_for_reading
from bedside.collectors.store import Store
from bedside.detectors.detector import Detector
from bedside.detectors.finding import Finding
from bedside.detectors.incidents import Incident
from bedside.detectors.runner import DetectorRunner

from .alerts.router import AlertRouter, OutboxWrite
from .feed import StoreFeed
from .log import warn
from .playbooks.decide import decide
from .playbooks.rules import PlaybookSettings
from .schema import SCHEMAS
from .sink import load_book, save, save_acknowledgement, save_resolution

Acting = Callable[[list[Incident], Mapping[int, Sequence[int]], float], None]
"""What the live service does with the incidents detection recorded (``playbooks.auto.AutoPlaybook.consider``)."""


class StoreDetection:
    """Detectors kept up to date with one store; ``persist`` False only reads (a store held elsewhere)."""

    def __init__(
        self,
        store: Store,
        detectors: list[Detector] | None = None,
        *,
        persist: bool = True,
        alerts: AlertRouter | None = None,
        playbooks: PlaybookSettings | None = None,
        act: Acting | None = None,
    ) -> None:
        self.store = store
        self.playbooks = playbooks
        self.act = act
        self.persist = persist and not store.read_only
        if alerts and not self.persist:
            raise BedsideError("alerts need the store's owner: this detection only reads the store")
        self.feed = StoreFeed(store)
        self.runner = DetectorRunner(detectors)
        self.book = load_book(store)
        self.alerts = alerts

    def update(self, *, caught_up: bool = True) -> list[Finding]:
        """Feed what was ingested since the last call; the findings opened or changed.

        ``caught_up`` False says the collector has a backlog (its pass used the whole
        byte budget): ranks' files may be read unevenly, so no rank is given up for missing.
        """
        self.runner.run.world_size = self.feed.world_size()
        self.runner.run.topology = self.feed.topology()
        found: list[Finding] = []
        while True:  # a large backlog (a restart's replay) goes through in slices, in bounded memory
            batch = self.feed.next_batch()
            self.runner.run.caught_up = caught_up and not self.feed.behind
            found += self.runner.update(batch) if len(batch) else []
            if not self.feed.behind:
                break
        changed = self._record(list({f.finding_id: f for f in found}.values()))
        if self.alerts:
            self._send(self.alerts, self.alerts.tick(time.time()))
        return changed

    def finish(self) -> list[Finding]:
        """The run's data is complete (batch mode or an ended run)."""
        return self._record(self.runner.finish())

    def tick(self, now: float | None = None) -> list[Finding]:
        """Let wall-clock time pass (a live run that went quiet); digests whose window passed are written."""
        now = time.time() if now is None else now
        changed = self._record(self.runner.tick(now), now)
        if self.alerts:
            self._send(self.alerts, self.alerts.tick(now))
        return changed

    def acknowledge(self, incident_id: str, by: str, note: str = "", now: float | None = None) -> None:
        """Someone took an incident on: recorded, and announced to the notifiers that were told of it."""
        incident = self._incident_for(incident_id, by, "an acknowledgement")
        now = time.time() if now is None else now
        outbox = self.alerts.acknowledge(incident, by, note, now) if self.alerts else OutboxWrite()
        save_acknowledgement(self.store, incident_id, by, note, outbox, now)
        if self.alerts:
            self.alerts.committed()

    def resolve(self, incident_id: str, by: str, note: str, now: float | None = None) -> None:
        """Someone closed an incident by hand: it stays resolved, later findings open a new incident, and the
        notifiers that were told of it hear that it was resolved, by whom and why."""
        self._incident_for(incident_id, by, "resolving an incident")
        now = time.time() if now is None else now
        self.book.close(incident_id)
        incident = self.book.describe(incident_id)
        outbox = self.alerts.resolve_by_hand(incident, by, note, now) if self.alerts else OutboxWrite()
        save_resolution(self.store, incident_id, by, note, outbox, now)
        if self.alerts:
            self.alerts.committed()

    def _incident_for(self, incident_id: str, by: str, what: str) -> Incident:
        if incident_id not in self.book.incident_ids():
            raise BedsideError(f"no incident {incident_id!r} in this run")
        if not by.strip():
            raise BedsideError(f"{what} needs the name of who does it")
        return self.book.describe(incident_id)

    def _record(self, changed: list[Finding], now: float | None = None) -> list[Finding]:
        """Place the changed findings in incidents (and resolve those a rewind abandoned); store and route them."""
        left = self.book.went_on(self.runner.run.newest_timeline)
        incidents = self.book.add(changed) if changed else []
        incidents += [i for i in left if i.incident_id not in {j.incident_id for j in incidents}]
        incidents = [self._suggest(i) for i in incidents]
        if incidents:
            now = time.time() if now is None else now
            alerts = self.alerts
            outbox = alerts.route(incidents, {f.finding_id for f in changed}, now) if alerts else None
            if self.persist:
                save(self.store, self.book, changed, incidents, outbox, now)
            if alerts and outbox:
                alerts.committed()
            if self.act:
                self.act(incidents, self.runner.run.good_checkpoints, now)
        return changed

    def _suggest(self, incident: Incident) -> Incident:
        """The incident carrying its playbook's decision as the suggested action, where a configured rule
        matches it and does more than notify (docs/playbooks.md); else as the detectors suggested."""
        if self.playbooks is None or not self.playbooks.configured:
            return incident
        decision = decide(incident, self.runner.run.good_checkpoints, self.playbooks)
        if decision.rule is None or decision.recipe == "notify":  # a notice keeps the detector's own suggestion
            return incident
        return replace(incident, suggested_action=decision.suggestion())

    def _send(self, alerts: AlertRouter, outbox: OutboxWrite) -> None:
        if outbox:
            self.store.write_named(outbox.writes())
            alerts.committed()


def detect_run(run_dir: Path) -> list[Finding]:
    """Batch detection (``bedside detect``): ingest what the run holds and the audit trail's filings, run every
    detector over it, keep the findings and incidents in its store (unless another process holds the store);
    every finding."""
    layout = RunLayout(run_dir)
    try:
        store = Store.open(layout.store, schemas=SCHEMAS)
    except StoreLockedError:
        warn("the store is held by another process: detecting over the raw telemetry, findings not saved")
        with open_for_reading(run_dir, schemas=SCHEMAS).store as memory:
            return detect_store(memory, persist=False)
    with store:
        Collector(layout.root, store, warn=warn).ingest_available()
        AuditKeeper(layout).keep_head(store)  # the trail's head, and the requests it says were filed
        return detect_store(store)


def detect_store(store: Store, detectors: list[Detector] | None = None, *, persist: bool = True) -> list[Finding]:
    """Batch detection over what ``store`` holds: every detector (or ``detectors``) fed all of it, then
    finished; the findings and incidents kept in the store unless ``persist`` is False; every finding."""
    detection = StoreDetection(store, detectors, persist=persist)
    detection.update()
    detection.finish()
    return detection.runner.ordered()


class LiveDetection:
    """Detection inside a following collector: after each batch, and on quiet wake-ups; prints what changes.

    The first quiet wake-up replays what the store already holds, whoever ingested it (``bedside collect``
    before ``serve``), so a store with nothing new to ingest is still covered. With an alert router, each
    change's messages go to the outbox with it. ``ran_at`` is when detection last went over the store.
    """

    def __init__(
        self,
        store: Store,
        *,
        quiet: bool = False,
        alerts: AlertRouter | None = None,
        playbooks: PlaybookSettings | None = None,
        act: Acting | None = None,
    ) -> None:
        self.detection = StoreDetection(store, alerts=alerts, playbooks=playbooks, act=act)
        self.quiet = quiet
        self.ran_at: float | None = None
        self._said: dict[str, tuple[bool, str]] = {}

    def update(self, result: PassResult) -> list[Finding]:
        """After an ingest pass (whose backlog says whether ranks' files are level yet); the findings changed."""
        return self._say(self.detection.update(caught_up=not result.backlog))

    def tick(self) -> list[Finding]:
        """A quiet wake-up: the store's rows not fed yet (the first time, all of them), then time passing."""
        replayed = self.detection.update() if self.ran_at is None else []
        return self._say(replayed + self.detection.tick())

    def finish(self) -> list[Finding]:
        return self._say(self.detection.finish())

    def _say(self, changed: list[Finding]) -> list[Finding]:
        """One line when a finding opens, clears or changes severity (not each time it grows)."""
        self.ran_at = time.time()
        for finding in [] if self.quiet else changed:
            now = (finding.active, finding.severity.value)
            if self._said.get(finding.finding_id) != now:
                self._said[finding.finding_id] = now
                state = "open" if finding.active else "cleared"
                summary = visible(finding.summary)  # may quote a metric's or a rank's name
                print(f"[{finding.severity.value}] {finding.kind} ({state}): {summary}", file=sys.stderr)
        return changed
