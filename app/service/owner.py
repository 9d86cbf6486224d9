"""The one composition of bedside's service: follow -> ingest -> detect -> persist -> route -> deliver.

DuckDB lets one process write a store (docs/architecture.md, "One owner per store"). A ``RunOwner`` holds one
run's store for writing and keeps it caught up: ``bedside serve`` keeps one per run, following it in a thread
(the dashboard reads through the owner's store and asks it to acknowledge incidents); ``bedside watch``,
``bedside collect --follow`` and ``bedside demo`` follow with one in their main thread. What differs between them
is an ``OwnerSettings`` value, never a second loop.

An owner that restarts never stops silently: any failure while following (a full disk, a damaged block, a dropped
table) is logged, announced to the notifiers (``owner_health``) and shown in ``health``; the owner then starts again
from the store after a capped exponential backoff, with a new store connection, collector and detection, which
resume exactly where the store's committed offsets and findings say. An owner that does not restart
(``collect --follow``, the demo) raises the failure to its caller instead.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bedside.collectors.audit import AuditKeeper
from bedside.collectors.errors import BedsideError
from bedside.collectors.follow import DEFAULT_RESCAN_EVERY_S, Follower
from bedside.collectors.ingest import DEFAULT_BATCH_BYTES, Collector, PassResult
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

from .alerts.config import AlertSettings
from .alerts.router import AlertRouter
from .alerts.sender import OutboxSender
from .detection import Acting, LiveDetection
from .log import warn as log_warning
from .owner_health import HealthNotices, OwnerHealth, describe
from .playbooks.auto import AutoPlaybook
from .schema import SCHEMAS

OWNER_DRAIN_S = 5.0


@dataclass(frozen=True, kw_only=True)
class OwnerSettings:
    """How one owner follows its run: the only thing ``serve``, ``watch``, ``collect --follow`` and ``demo`` vary."""

    alerts: AlertSettings = field(default_factory=AlertSettings)
    """The notifiers incident changes go to (none: detection without alerts)."""
    rescan_every_s: float = DEFAULT_RESCAN_EVERY_S
    """Seconds between the follower's safety-net rescans."""
    batch_bytes: int = DEFAULT_BATCH_BYTES
    """Most telemetry bytes one ingest transaction takes."""
    detect: bool = True
    """Run the detectors after each pass (``collect --follow --no-detect``: ingestion only)."""
    quiet: bool = True
    """No line on stderr when a finding opens, clears or changes severity."""
    restart: bool = True
    """Start again after a failure (``serve``, ``watch``); False raises it to the caller."""

    def __post_init__(self) -> None:
        if not self.rescan_every_s > 0:
            raise BedsideError(f"rescan_every_s must be > 0 seconds, not {self.rescan_every_s!r}")
        if self.batch_bytes < 1:
            raise BedsideError(f"batch_bytes must be at least 1, not {self.batch_bytes!r}")


def alerting_detection(
    store: Store, settings: OwnerSettings, *, warn: Callable[[str], None], act: Acting | None = None
) -> tuple[LiveDetection | None, OutboxSender | None]:
    """Live detection whose incident changes go to the notifiers of ``settings``, and the sender (not started);
    neither when the settings say not to detect."""
    if not settings.detect:
        return None, None
    sender = OutboxSender(store, settings.alerts, warn=warn)
    router = AlertRouter(store, settings.alerts, on_commit=sender.wake) if settings.alerts.notifiers else None
    live = LiveDetection(store, quiet=settings.quiet, alerts=router, playbooks=settings.alerts.playbooks, act=act)
    return live, sender


class RunOwner:
    """Holds one run's store for writing and keeps it caught up (StoreLockedError if another process holds it,
    StoreCorruptError if the store is damaged).

    ``version`` grows whenever ingestion or detection changed the store (or the owner's health changed), so
    readers can cache what they computed for a version.
    """

    def __init__(
        self,
        run_dir: Path,
        settings: OwnerSettings | None = None,
        *,
        warn: Callable[[str], None] = log_warning,
        on_pass: Callable[[PassResult], None] = lambda result: None,
        health: OwnerHealth | None = None,
    ) -> None:
        self.layout = RunLayout(run_dir)
        self.settings = settings or OwnerSettings()
        self.warn = warn
        self.on_pass = on_pass
        self.health = health or OwnerHealth()
        self.notices = HealthNotices(self.layout, self.settings.alerts, warn=warn)
        self.audit = AuditKeeper(self.layout)
        self.version = 0
        self.finished = False
        self._lock = threading.RLock()  # the store's writer connection: ingest passes and the pages' writes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sending = False
        self._drained: int | None = None
        self.live: LiveDetection | None = None
        self.sender: OutboxSender | None = None
        self._follower: Follower | None = None
        self.store = Store.open(self.layout.store, schemas=SCHEMAS)
        try:
            self._build()
        except Exception as exc:  # the store opened but cannot be followed: a failure like any later one
            if not self.settings.restart:
                self.store.close()
            self._failed(exc)

    @property
    def detected_at(self) -> float | None:
        """When detection last went over the store (None: not yet since this owner started)."""
        return self.live.ran_at if self.live else None

    def catch_up(self) -> None:
        """Ingest and detect what the run holds now (in the calling thread); a failure goes to ``health``."""
        try:
            if self.health.failing:
                self._restart()
            with self._lock:
                self.collector.ingest_available(on_pass=self._on_pass)
            self._on_idle()
        except Exception as exc:
            self._failed(exc)

    def finish(self) -> None:
        """The run's data is complete (its training process exited): ingest the rest, and let detection settle."""
        with self._lock:
            self.collector.ingest_available(on_pass=self._on_pass)
            if self.live is not None and not self.finished:
                self.live.finish()
            self.finished = True
            self.version += 1

    def start(self) -> None:
        """Follow the run in a background thread, and deliver alerts, until ``close``."""
        self._thread = threading.Thread(
            target=self.follow, args=(self._stop,), name=f"owner-{self.layout.root.name}", daemon=True
        )
        self._thread.start()

    def follow(self, stop: threading.Event, *, until_finished: bool = False) -> None:
        """Follow the run and deliver alerts until ``stop`` (or, when asked, the run's end), starting again
        after each failure once its backoff has passed (or raising it, when the settings say not to restart)."""
        self._sending = True
        if self.sender and not self.health.failing:
            self.sender.start()
        while not stop.is_set():
            try:
                if self.health.failing:
                    self._restart()
                assert self._follower is not None
                self._follower.run(stop, until_finished=until_finished)
                self._on_idle()  # the run's end, when that is what stopped the follower
                return
            except Exception as exc:
                stop.wait(self._failed(exc))

    def follow_until_signalled(self, *, until_finished: bool = False) -> None:
        """``follow`` in the main thread until SIGINT or SIGTERM (or, when asked, the run's end)."""
        stop = threading.Event()

        def request_stop(signum: int, frame: object) -> None:
            stop.set()
            self.wake()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        self.follow(stop, until_finished=until_finished)

    def wake(self) -> None:
        """Ask for a pass now (stop handlers)."""
        if self._follower:
            self._follower.wake()

    def acknowledge(self, incident_id: str, by: str, note: str) -> None:
        """Record an acknowledgement (and announce it to the notifiers told of the incident)."""
        with self._lock:
            self._working().detection.acknowledge(incident_id, by, note)
            self.version += 1

    def keep_audit_head(self) -> None:
        """Record the audit trail's head in the store now (after an entry was appended), if its chain holds."""
        with self._lock:
            if self._keep_audit_head():
                self.version += 1

    def resolve(self, incident_id: str, by: str, note: str) -> None:
        """Close an incident by hand (and announce it to the notifiers told of it)."""
        with self._lock:
            self._working().detection.resolve(incident_id, by, note)
            self.version += 1

    def drain(self, drain_s: float | None = None) -> int:
        """Stop following and give pending alerts ``drain_s`` seconds (default: a few when following); the
        number of alert messages left pending. The store stays open for reading until ``close``."""
        if self._drained is None:
            self._stop.set()
            self.wake()
            if self._thread:
                self._thread.join()
            wait = OWNER_DRAIN_S if self._thread and drain_s is None else drain_s or 0.0
            self._drained = self._close_sender(wait)
            self.notices.join()
        return self._drained

    def close(self, drain_s: float | None = None) -> int:
        """``drain``, then close the store; the number of alert messages left pending."""
        left = self.drain(drain_s)
        with contextlib.suppress(Exception):
            self.store.close()
        return left

    def _build(self) -> None:
        """Detection, alerts and the collector over the open store (detection replays what the store holds)."""
        self.live, self._follower = None, None
        live, self.sender = alerting_detection(self.store, self.settings, warn=self.warn, act=self._playbook_act())
        self.collector = Collector(self.layout.root, self.store, batch_bytes=self.settings.batch_bytes, warn=self.warn)
        self._follower = Follower(
            self.collector,
            rescan_every_s=self.settings.rescan_every_s,
            on_pass=self._on_pass,
            on_idle=self._on_idle,
            warn=self.warn,
            guard=self._lock,
        )
        self.live = live
        self.finished = False

    def _playbook_act(self) -> Acting | None:
        """``auto`` playbooks' hook on recorded incidents (docs/playbooks.md), or None in other modes."""
        playbooks = self.settings.alerts.playbooks
        if not playbooks.configured or playbooks.mode != "auto":
            return None
        return AutoPlaybook(self.layout, playbooks, self.notices, warn=self.warn).consider

    def _restart(self) -> None:
        """A new store connection, collector and detection, after a failure."""
        with self._lock:
            self.health.restarts += 1
            self._close_sender(0.0)
            with contextlib.suppress(Exception):
                self.store.close()
            self.store = Store.open(self.layout.store, schemas=SCHEMAS)
            self._build()
        if self._sending and self.sender:
            self.sender.start()

    def _close_sender(self, drain_s: float) -> int:
        """Close the sender, whatever state a failure left it in; messages left pending."""
        left = 0
        if self.sender is not None:
            with contextlib.suppress(Exception):  # a broken store cannot count what is pending
                left = self.sender.close(drain_s=drain_s if self._sending else 0.0)
        return left

    def _working(self) -> LiveDetection:
        if self.live is None or self.health.failing:
            why = f"starting again after a failure ({self.health.error})" if self.health.failing else "not detecting"
            raise BedsideError(f"the run's owner is {why}: try again once it has caught up")
        return self.live

    def _failed(self, exc: Exception) -> float:
        """Log and announce a failure, and show it; the seconds to wait before starting again."""
        if not self.settings.restart:
            raise exc
        delay = self.health.failed(describe(exc), time.time())
        self.warn(
            f"{self.layout.root.name}: following the run failed ({self.health.error}); starting again "
            f"in {delay:g} s (restarts so far: {self.health.restarts})"
        )
        self.notices.failed(self.health)
        self.version += 1
        return delay

    def _worked(self) -> None:
        if self.health.failing:
            self.health.recovered()
            self.warn(
                f"{self.layout.root.name}: following the run again after {self.health.restarts} "
                f"restart{'' if self.health.restarts == 1 else 's'}"
            )
            self.notices.recovered(self.health)

    def _on_pass(self, result: PassResult) -> None:
        with self._lock:
            self._keep_audit_head()  # first: the messages this pass routes carry the trail's newest head
            if self.live is not None:
                self.live.update(result)
            self.version += 1
        self.on_pass(result)
        self._worked()

    def _keep_audit_head(self) -> bool:
        """Check the audit trail if it changed and record its head; whether what the pages show may have changed."""
        before = self.audit.broken
        recorded = self.audit.keep_head(self.store)
        if self.audit.broken and self.audit.broken != before:
            self.warn(f"{self.layout.root.name}: the audit trail is broken: {self.audit.broken}")
        return recorded or self.audit.broken != before

    def _on_idle(self) -> None:
        """A quiet wake-up: let time pass for the detectors, and settle the run once it has ended."""
        with self._lock:
            assert self._follower is not None
            changed = self.live.tick() if self.live else []
            if not self.finished and self._follower.run_ended():
                changed += self.live.finish() if self.live else []
                self.finished = True
            if self._keep_audit_head() or changed:
                self.version += 1
        self._worked()
