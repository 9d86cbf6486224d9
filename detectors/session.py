"""Detection over a run's store: feed new rows to the detectors, keep findings and incidents in the store.

The same object serves batch mode (``bedside detect``: one ``update`` then ``finish``)
and streaming (the collector calls ``update`` after each ingested batch and ``tick``
while the run is quiet). A new process replays the store from its first row, so
detector state is rebuilt exactly, and upserts what it finds: stored findings keep
their first-seen time, incidents their id and acknowledgement.
"""
from __future__ import annotations

import time

from bedside.collectors.store import Store

from .detector import Detector
from .feed import StoreFeed
from .finding import Finding
from .incidents import Incident
from .runner import DetectorRunner
from .sink import load_book, save


class StoreDetection:
    """Detectors kept up to date with one store; ``persist`` False only reads (a store held elsewhere)."""

    def __init__(self, store: Store, detectors: list[Detector] | None = None, *, persist: bool = True) -> None:
        self.store = store
        self.persist = persist and not store.read_only
        self.feed = StoreFeed(store)
        self.runner = DetectorRunner(detectors)
        self.book = load_book(store)

    def update(self, *, caught_up: bool = True) -> list[Finding]:
        """Feed what was ingested since the last call; the findings opened or changed.

        ``caught_up`` False says the collector has a backlog (its pass used the whole
        byte budget): ranks' files may be read unevenly, so no rank is given up for missing.
        """
        self.runner.run.caught_up = caught_up
        self.runner.run.world_size = self.feed.world_size()
        self.runner.run.topology = self.feed.topology()
        batch = self.feed.next_batch()
        return self._record(self.runner.update(batch) if len(batch) else [])

    def finish(self) -> list[Finding]:
        """The run's data is complete (batch mode or an ended run)."""
        return self._record(self.runner.finish())

    def tick(self, now: float | None = None) -> list[Finding]:
        """Let wall-clock time pass (a live run that went quiet)."""
        return self._record(self.runner.tick(time.time() if now is None else now))

    def incidents(self) -> list[Incident]:
        return [self.book.describe(i) for i in dict.fromkeys(self.book.incident_of(f) for f in self.runner.ordered())]

    def _record(self, changed: list[Finding]) -> list[Finding]:
        if changed:
            incidents = self.book.add(changed)
            if self.persist:
                save(self.store, self.book, changed, incidents)
        return changed
