"""What the dashboard serves: the runs, their owners in this process, and who may act.

``bedside serve`` builds one ``Desk`` (the target, the alert settings, live mode, the operator
token's hash) and installs it before Streamlit starts, in the same process; every page reads it
with ``desk()``. A run whose store another process holds (``bedside watch``) is shown read-only
from its raw telemetry.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bedside.collectors.errors import BedsideError, StoreCorruptError, StoreError
from bedside.collectors.runs import newest_runs

from ..service.alerts.config import AlertSettings, settings_for
from ..service.log import warn
from ..service.owner import OwnerSettings, RunOwner
from ..service.owner_health import OwnerHealth
from .auth import Lockout, TokenHash
from .data import RunData

DEFAULT_REFRESH_S = 5.0
ADOPT_EVERY_S = 2.0
RETAKE_AFTER_S = 10.0
"""How long after finding a run's store held by another process this one tries to take it again."""


@dataclass
class Desk:
    """The runs one dashboard process serves, with an owner for each store it could take."""

    target: Path
    settings: AlertSettings
    live: bool
    operator_token: TokenHash | None  # only its salted hash is kept
    refresh_s: float = DEFAULT_REFRESH_S
    owners: dict[Path, RunOwner] = field(default_factory=dict)
    refused: dict[Path, tuple[float, str]] = field(default_factory=dict)  # when, and why, a store was held
    damaged: dict[Path, str] = field(default_factory=dict)  # stores refused as damaged, and the error
    views: dict[Path, RunData] = field(default_factory=dict)
    lockout: Lockout = field(default_factory=Lockout)  # wrong tokens from any session

    def __post_init__(self) -> None:
        if not self.refresh_s > 0:
            raise BedsideError(f"the dashboard's refresh period must be > 0 seconds, not {self.refresh_s!r}")
        self._lock = threading.Lock()

    @classmethod
    def for_target(
        cls,
        target: Path,
        *,
        config: Path | None = None,
        live: bool = False,
        token: str = "",
        refresh_s: float = DEFAULT_REFRESH_S,
    ) -> Desk:
        """The desk of ``target``: alerts from ``config``, else a run's bedside.toml, else its parent's (for a
        runs directory, the directory's own); ``token`` unlocks actions (only its salted hash is kept)."""
        return cls(
            target=target,
            settings=settings_for(config, target),
            live=live,
            operator_token=TokenHash.configured(token) if token else None,
            refresh_s=refresh_s,
        )

    def runs(self) -> list[Path]:
        """The run directories served: the target itself, or the runs in it, newest first."""
        return newest_runs(self.target)

    def data(self, run_dir: Path) -> RunData:
        """The run's data layer (one per run and process, shared by every browser session); a read-only one
        is replaced as soon as this process can take the store."""
        run_dir = run_dir.resolve()
        owner = self.owner(run_dir)
        with self._lock:
            view = self.views.get(run_dir)
            if view is None or (view.owner is None and owner is not None):
                if view:
                    view.close()
                self.views[run_dir] = RunData(run_dir, owner, refresh_s=self.refresh_s)
            return self.views[run_dir]

    def owner(self, run_dir: Path) -> RunOwner | None:
        """The run's owner in this process, taking the store on first use; None when another process holds it."""
        run_dir = run_dir.resolve()
        with self._lock:
            if run_dir in self.owners:
                return self.owners[run_dir]
            if time.monotonic() - self.refused.get(run_dir, (-RETAKE_AFTER_S, ""))[0] < RETAKE_AFTER_S:
                return None
            self._release_view(run_dir)  # a read-only view of ours would keep the store from us
            try:
                owner = RunOwner(run_dir, OwnerSettings(alerts=self.settings), warn=warn)
            except StoreError as exc:  # held by another process, or damaged: shown read-only, taken when it can be
                self.refused[run_dir] = (time.monotonic(), str(exc))
                self.damaged.pop(run_dir, None)
                if isinstance(exc, StoreCorruptError):
                    self.damaged[run_dir] = str(exc)
                return None
            self.refused.pop(run_dir, None)
            self.damaged.pop(run_dir, None)
            owner.catch_up()
            if self.live:
                owner.start()
            self.owners[run_dir] = owner
            return owner

    def adopt_runs(self, stop: threading.Event, every_s: float = ADOPT_EVERY_S) -> None:
        """Take every run's store as soon as it appears, until ``stop`` (so that alerts fire with nobody looking)."""
        while not stop.is_set():
            for run_dir in self.runs():
                self.owner(run_dir)
            stop.wait(every_s)

    def troubles(self) -> list[tuple[str, str]]:
        """(run, what is wrong) for every run whose owner failed and is starting again, or whose store is
        damaged: the banner every page shows."""
        with self._lock:
            failing = [
                (run.name, owner_trouble(owner.health)) for run, owner in self.owners.items() if owner.health.failing
            ]
            damaged = [(run.name, why) for run, why in self.damaged.items()]
        return failing + damaged

    def can_act(self, token: str) -> bool:
        """Whether ``token`` is the operator token (never, when none is configured)."""
        return self.operator_token is not None and self.operator_token.matches(token)

    def close(self) -> None:
        with self._lock:
            for owner in self.owners.values():
                owner.close()
            for view in self.views.values():
                view.close()
            self.owners.clear()
            self.views.clear()

    def _release_view(self, run_dir: Path) -> None:
        view = self.views.get(run_dir)
        if view is not None and view.owner is None:
            view.close()


def owner_trouble(health: OwnerHealth) -> str:
    """A failing owner in one sentence: what failed, when, the restarts so far and the next try."""
    assert health.failed_at is not None
    retry = f"; next try in {max(0.0, (health.next_retry_at or 0) - time.time()):.0f} s" if health.next_retry_at else ""
    return (
        f"ingestion and detection stopped {time.time() - health.failed_at:.0f} s ago: {health.error} "
        f"(restarts so far: {health.restarts}{retry})"
    )


_INSTALLED: list[Desk] = []  # at most one: the desk this process serves
_INSTALLED_LOCK = threading.Lock()


def install(desk: Desk) -> Desk:
    """Make ``desk`` the one this process serves (``bedside serve`` before Streamlit starts; tests before AppTest).

    A desk with the same settings as the installed one keeps the installed one (its owners and caches); another
    closes it and takes its place."""
    with _INSTALLED_LOCK:
        if _INSTALLED and _same(_INSTALLED[0], desk):
            return _INSTALLED[0]
        for old in _INSTALLED:
            old.close()
        _INSTALLED[:] = [desk]
        return desk


def desk() -> Desk:
    """The desk this process serves."""
    with _INSTALLED_LOCK:
        if not _INSTALLED:
            raise BedsideError("no run to show: start the dashboard with bedside serve RUN")
        return _INSTALLED[0]


def _same(one: Desk, other: Desk) -> bool:
    return (one.target, one.settings, one.live, one.operator_token, one.refresh_s) == (
        other.target,
        other.settings,
        other.live,
        other.operator_token,
        other.refresh_s,
    )


def close_all() -> None:
    """Close every owner (at server shutdown) and forget the installed desk."""
    with _INSTALLED_LOCK:
        for each in _INSTALLED:
            each.close()
        _INSTALLED.clear()
