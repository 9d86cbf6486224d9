"""The owner of a run's store inside a long-running process: collector, detectors and alerts.

DuckDB lets one process write a store (docs/architecture.md, "One owner per store").
``bedside serve`` keeps one ``RunOwner`` per run, following it in a thread, and the
dashboard reads through the owner's store and asks it to acknowledge incidents; the
same pieces, without a thread, make ``bedside watch`` and the demo.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from bedside.collectors.follow import DEFAULT_RESCAN_EVERY_S, Follower
from bedside.collectors.ingest import Collector, PassResult
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store
from bedside.detectors.alerts.config import AlertSettings
from bedside.detectors.alerts.router import AlertRouter
from bedside.detectors.alerts.sender import OutboxSender

from .detect import LiveDetection

OWNER_DRAIN_S = 5.0


def alerting_detection(store: Store, settings: AlertSettings, *, quiet: bool = False,
                       warn: Callable[[str], None]) -> tuple[LiveDetection, OutboxSender]:
    """Live detection whose incident changes go to the notifiers of ``settings``, and the sender (not started)."""
    sender = OutboxSender(store, settings, warn=warn)
    router = AlertRouter(store, settings, on_commit=sender.wake) if settings.notifiers else None
    return LiveDetection(store, quiet=quiet, alerts=router), sender


class RunOwner:
    """Holds one run's store for writing and keeps it caught up (StoreLockedError if another process holds it).

    ``version`` grows whenever ingestion or detection changed the store, so readers can
    cache what they computed for a version.
    """

    def __init__(self, run_dir: Path, settings: AlertSettings, *, warn: Callable[[str], None],
                 rescan_every_s: float = DEFAULT_RESCAN_EVERY_S) -> None:
        self.layout = RunLayout(run_dir)
        self.store = Store.open(self.layout.store)
        self.live, self.sender = alerting_detection(self.store, settings, quiet=True, warn=warn)
        self.collector = Collector(self.layout.root, self.store, warn=warn)
        self.version = 0
        self.finished = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower = Follower(self.collector, rescan_every_s=rescan_every_s, on_pass=self._on_pass,
                                  on_idle=self._on_idle, warn=warn)

    def catch_up(self) -> None:
        """Ingest and detect what the run holds now (in the calling thread)."""
        self.collector.ingest_available(on_pass=self._on_pass)
        self._on_idle()

    def start(self) -> None:
        """Follow the run in a background thread, and deliver alerts, until ``close``."""
        self.sender.start()
        self._thread = threading.Thread(target=self._follower.run, args=(self._stop,),
                                        name=f"owner-{self.layout.root.name}", daemon=True)
        self._thread.start()

    def acknowledge(self, incident_id: str, by: str, note: str) -> None:
        """Record an acknowledgement (and announce it to the notifiers told of the incident)."""
        with self._lock:
            self.live.detection.acknowledge(incident_id, by, note)
            self.version += 1

    def resolve(self, incident_id: str, by: str, note: str) -> None:
        """Close an incident by hand (and announce it to the notifiers told of it)."""
        with self._lock:
            self.live.detection.resolve(incident_id, by, note)
            self.version += 1

    def close(self) -> None:
        """Stop following, give pending alerts a few seconds, close the store."""
        self._stop.set()
        self._follower.wake()
        if self._thread:
            self._thread.join()
        self.sender.close(drain_s=OWNER_DRAIN_S if self._thread else 0.0)
        self.store.close()

    def _on_pass(self, result: PassResult) -> None:
        with self._lock:
            self.live.update(result)
            self.version += 1

    def _on_idle(self) -> None:
        """A quiet wake-up: let time pass for the detectors, and settle the run once it has ended."""
        with self._lock:
            changed = self.live.tick()
            if not self.finished and self._follower.run_ended():
                changed += self.live.finish()
                self.finished = True
            if changed:
                self.version += 1
