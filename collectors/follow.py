"""Follow a live run: watchdog file events, with a periodic rescan as a safety net.

Network filesystems drop inotify events (or never send them), so the follower
also rescans every ``rescan_every_s``; events only make ingestion prompt. When
file events cannot be had at all (inotify's watch or instance limit), the
follower warns once and keeps to the rescans.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from watchdog.events import EVENT_TYPE_CLOSED_NO_WRITE, EVENT_TYPE_OPENED, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from .ingest import Collector, PassResult
from .layout import SOURCE_DIRS, STORE_NAME
from .store import sql

DEFAULT_RESCAN_EVERY_S = 2.0

# Stopping an observer while an event is in flight makes watchdog's inotify
# emitter log a spurious error; the periodic rescan covers any event it drops.
logging.getLogger("watchdog.observers.inotify").setLevel(logging.CRITICAL)
ENDED_STATUSES = ("finished", "failed", "aborted")
_READ_ONLY_EVENTS = (EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE)
"""Events our own reads cause: waking on them would make the follower spin."""


class _Wake(FileSystemEventHandler):
    """Sets an event when a telemetry file or run.json changes (not when it is merely read)."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        own_store = os.path.basename(os.fsdecode(event.src_path)).startswith(STORE_NAME)
        if event.event_type not in _READ_ONLY_EVENTS and not own_store:
            self._wake.set()


class Follower:
    """Keeps a store caught up with a run directory until stopped (or the run ends)."""

    def __init__(
        self,
        collector: Collector,
        *,
        rescan_every_s: float = DEFAULT_RESCAN_EVERY_S,
        on_pass: Callable[[PassResult], None] = lambda result: None,
        on_idle: Callable[[], None] = lambda: None,
        warn: Callable[[str], None] = lambda message: None,
        observer_factory: Callable[[], BaseObserver] = Observer,
    ) -> None:
        self.collector = collector
        self.rescan_every_s = rescan_every_s
        self.on_pass = on_pass
        self.on_idle = on_idle
        self.warn = warn
        self._observer_factory = observer_factory
        self._observer: BaseObserver | None = None
        self._events_failed = False
        self._wake = threading.Event()
        self._watched: set[str] = set()

    def run(self, stop: threading.Event, *, until_finished: bool = False) -> None:
        """Ingest on every file event and every rescan until ``stop`` is set.

        ``on_pass`` follows every committed pass; ``on_idle`` every wake-up that found
        nothing new (so that a quiet run is noticed).
        """
        self._start_events()
        try:
            while not stop.is_set():
                self._watch_new_dirs()
                self._wake.clear()
                result = self.collector.ingest_available(on_pass=self.on_pass, stop=stop)
                if result.bytes == 0:
                    if until_finished and self.run_ended():
                        return
                    self.on_idle()
                self._wake.wait(self.rescan_every_s)
        finally:
            self._stop_events()

    def wake(self) -> None:
        """Ask for a pass now (used by stop handlers)."""
        self._wake.set()

    def run_ended(self) -> bool:
        """True once every rank has written run_end (or one reported failure)."""
        rows = self.collector.store.connection().execute(sql("run_status")).fetchall()
        return bool(rows) and rows[0][0] in ENDED_STATUSES

    def _start_events(self) -> None:
        try:
            self._observer = self._observer_factory()
            self._observer.start()
        except OSError as exc:
            self._events_unavailable(exc)

    def _stop_events(self) -> None:
        if self._observer is None:
            return
        self._observer.stop()
        if self._observer.is_alive():
            self._observer.join()

    def _watch_new_dirs(self) -> None:
        root = self.collector.layout.root
        folders = [root] + [root / name for name in SOURCE_DIRS]
        for folder in folders:
            if not self._events_failed and folder.is_dir() and str(folder) not in self._watched:
                self._watch(folder)

    def _watch(self, folder: Path) -> None:
        try:
            self._observer.schedule(_Wake(self._wake), str(folder), recursive=False)
        except OSError as exc:
            self._events_unavailable(exc)
            return
        self._watched.add(str(folder))

    def _events_unavailable(self, exc: OSError) -> None:
        """Give up on file events (warning once); the rescans every ``rescan_every_s`` carry on."""
        if not self._events_failed:
            self.warn(f"no file events ({exc.strerror or exc}); polling every {self.rescan_every_s:g} s instead")
        self._events_failed = True
