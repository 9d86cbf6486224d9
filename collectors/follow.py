"""Follow a live run: watchdog file events, with a periodic rescan as a safety net.

Network filesystems drop inotify events (or never send them), so the follower
also rescans every ``rescan_every_s``; events only make ingestion prompt. Between
rescans a pass looks only at the files that events named, so its cost follows the
files that changed, not the files in the run (events an inotify queue overflow
drops wait for the next rescan). Only writes, creations and moves are asked of
inotify: the opens and closes of every append would triple the kernel's queue.
When file events cannot be had at all (inotify's watch or instance limit), the
follower warns once and keeps to the rescans.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from watchdog.events import (
    DirCreatedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from .defaults import DEFAULT_RESCAN_EVERY_S
from .format import RUN_END_STATUSES
from .ingest import Collector, PassResult
from .layout import SOURCE_DIRS, STORE_NAME
from .store import sql

# Stopping an observer while an event is in flight makes watchdog's inotify
# emitter log a spurious error; the periodic rescan covers any event it drops.
logging.getLogger("watchdog.observers.inotify").setLevel(logging.CRITICAL)


WANTED_EVENTS = [FileModifiedEvent, FileCreatedEvent, FileMovedEvent, DirCreatedEvent]
"""What the follower wakes on (and the inotify mask asks for): never our own reads' opens and closes."""


class _Wake(FileSystemEventHandler):
    """Sets an event when a telemetry file or run.json changes, noting the telemetry files that did."""

    def __init__(self, wake: threading.Event, changed: ChangedFiles, source_dir: bool) -> None:
        self._wake = wake
        self._changed = changed
        self._source_dir = source_dir

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = [os.fsdecode(p) for p in (event.src_path, event.dest_path) if p]
        if all(os.path.basename(p).startswith(STORE_NAME) for p in paths):
            return
        if event.is_directory:
            self._changed.look_everywhere()
        elif self._source_dir:
            self._changed.add(paths)
        self._wake.set()


class ChangedFiles:
    """The telemetry files that events named since the last take (thread-safe), or 'every file' after a new folder."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: set[str] = set()
        self._everywhere = False

    def add(self, paths: list[str]) -> None:
        with self._lock:
            self._paths.update(paths)

    def look_everywhere(self) -> None:
        with self._lock:
            self._everywhere = True

    def take(self) -> set[Path] | None:
        """The files named since the last take, or None: look at every file."""
        with self._lock:
            paths, everywhere = self._paths, self._everywhere
            self._paths, self._everywhere = set(), False
        return None if everywhere else {Path(p) for p in paths}


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
        guard: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.collector = collector
        self.guard = guard or contextlib.nullcontext()  # held while the store's connection is in use
        self.rescan_every_s = rescan_every_s
        self.on_pass = on_pass
        self.on_idle = on_idle
        self.warn = warn
        self._observer_factory = observer_factory
        self._observer: BaseObserver | None = None
        self._events_failed = False
        self._wake = threading.Event()
        self._changed = ChangedFiles()
        self._rescanned_at = float("-inf")
        self._watched: set[str] = set()

    def run(self, stop: threading.Event, *, until_finished: bool = False) -> None:
        """Ingest on every file event and every rescan until ``stop`` is set.

        ``on_pass`` follows every committed pass; ``on_idle`` every wake-up that found
        nothing new (so that a quiet run is noticed). A pass looks at the files that events
        named; every file once ``rescan_every_s`` has passed since the last rescan, when
        events were lost, and always without file events.
        """
        self._start_events()
        try:
            while not stop.is_set():
                self._watch_new_dirs()
                self._wake.clear()
                with self.guard:
                    result = self.collector.ingest_available(
                        on_pass=self.on_pass, stop=stop, changed=self._files_to_look_at()
                    )
                if result.bytes == 0:
                    with self.guard:
                        ended = until_finished and self.run_ended()
                    if ended:
                        return
                    self.on_idle()
                self._wake.wait(self.rescan_every_s)
        finally:
            self._stop_events()

    def wake(self) -> None:
        """Ask for a pass now (used by stop handlers)."""
        self._wake.set()

    def _files_to_look_at(self) -> set[Path] | None:
        """The files events named since the last pass, or None (every file) when a rescan is due."""
        changed = self._changed.take()
        now = time.monotonic()
        if changed is None or self._events_failed or now - self._rescanned_at >= self.rescan_every_s:
            self._rescanned_at = now
            return None
        return changed

    def run_ended(self) -> bool:
        """True once every rank has written run_end (or one reported failure)."""
        rows = self.collector.store.connection().execute(sql("run_status")).fetchall()
        return bool(rows) and rows[0][0] in RUN_END_STATUSES

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
        assert self._observer is not None
        root = self.collector.layout.root
        try:
            handler = _Wake(self._wake, self._changed, source_dir=folder.name in SOURCE_DIRS and folder != root)
            self._observer.schedule(handler, str(folder), recursive=False, event_filter=WANTED_EVENTS)
        except OSError as exc:
            self._events_unavailable(exc)
            return
        self._watched.add(str(folder))

    def _events_unavailable(self, exc: OSError) -> None:
        """Give up on file events (warning once); the rescans every ``rescan_every_s`` carry on."""
        if not self._events_failed:
            self.warn(f"no file events ({exc.strerror or exc}); polling every {self.rescan_every_s:g} s instead")
        self._events_failed = True
