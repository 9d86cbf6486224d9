"""The health of a run's owner (the process following the run): its last failure, restarts and next retry, and
the notices that tell the notifiers when it fails and when it works again.

A notice goes straight to each notifier, not through the store's outbox: the store may be what failed (a full
disk, a damaged block, a dropped table). It is sent once per failure streak, whatever the notifier's severity
and kind filters (a run nobody watches any more concerns every channel), and once more on recovery.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bedside.app.service.alerts.config import AlertSettings, NotifierConfig
from bedside.app.service.alerts.delivery import deliver
from bedside.app.service.alerts.payload import RunRef, owner_payload
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import read_run_info

RETRY_BASE_S = 1.0
RETRY_MAX_S = 60.0
"""An owner that failed starts again after 1, 2, 4, ... seconds, at most a minute apart."""
NOTICE_ATTEMPTS = 3
NOTICE_JOIN_S = 10.0


@dataclass
class OwnerHealth:
    """What the dashboard's banner and the notices say about one owner."""

    retry_base_s: float = RETRY_BASE_S
    retry_max_s: float = RETRY_MAX_S
    error: str = ""
    failed_at: float | None = None
    failures: int = 0
    """Failures in a row since the owner last worked (0: healthy)."""
    restarts: int = 0
    next_retry_at: float | None = None

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, error: str, now: float) -> float:
        """Record a failure; the seconds to wait before the next start (capped exponential backoff)."""
        self.failures += 1
        self.error, self.failed_at = error, now
        delay = min(self.retry_max_s, self.retry_base_s * 2 ** (self.failures - 1))
        self.next_retry_at = now + delay
        return delay

    def recovered(self) -> None:
        self.failures = 0
        self.next_retry_at = None


def describe(exc: BaseException) -> str:
    """An exception in one line: its type and its first line."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class HealthNotices:
    """Tells every notifier of ``settings`` that the owner of ``run_dir`` failed, or recovered."""

    def __init__(self, run_dir: RunLayout, settings: AlertSettings, *, warn: Callable[[str], None]) -> None:
        self.layout = run_dir
        self.settings = settings
        self.warn = warn
        self._threads: list[threading.Thread] = []

    def failed(self, health: OwnerHealth) -> None:
        """The first failure of a streak is announced; the retries that follow are only logged."""
        if health.failures == 1:
            self._send(health)

    def recovered(self, health: OwnerHealth) -> None:
        self._send(health)

    def join(self, timeout_s: float = NOTICE_JOIN_S) -> None:
        """Wait for notices in flight (at shutdown)."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _send(self, health: OwnerHealth) -> None:
        assert health.failed_at is not None
        failed_at = health.failed_at
        state = "failed" if health.next_retry_at else "recovered"

        def payload(notifier: NotifierConfig, run: RunRef, now: float) -> dict:
            return owner_payload(
                f"{run.run_id or run.name}/{notifier.name}/owner/{state}/{int(failed_at * 1000)}",
                run,
                notifier=notifier.name,
                error=health.error,
                failed_at=failed_at,
                restarts=health.restarts,
                next_retry_at=health.next_retry_at,
                now=now,
            )

        self.announce(payload)

    def announce(self, payload: Callable[[NotifierConfig, RunRef, float], dict]) -> None:
        """Send ``payload(notifier, run, now)`` straight to every notifier, each in its own thread, whatever its
        severity and kind filters (up to ``NOTICE_ATTEMPTS`` attempts). A notifier gets its notices in the order
        they were announced: each waits for the one before it to that notifier (a playbook's "stopped" never
        reaches a chat before the recovery it stops after)."""
        run, now = self._run(), time.time()
        for notifier in self.settings.notifiers:
            before = next((t for t in reversed(self._threads) if t.name == f"notice-{notifier.name}"), None)
            thread = threading.Thread(
                target=self._deliver,
                args=(notifier, payload(notifier, run, now), before),
                daemon=True,
                name=f"notice-{notifier.name}",
            )
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _deliver(self, notifier: NotifierConfig, payload: dict, before: threading.Thread | None) -> None:
        if before is not None:
            before.join()
        for attempt in range(NOTICE_ATTEMPTS):
            outcome = deliver(notifier, payload)
            if outcome.delivered or not outcome.retry:
                break
            time.sleep(outcome.retry_after_s or self.settings.retry_base_s * 2**attempt)
        if not outcome.delivered:
            self.warn(
                f"{notifier.name}: could not deliver {payload['event']} of {payload['run']['name']}: {outcome.detail}"
            )

    def _run(self) -> RunRef:
        try:
            info = read_run_info(self.layout)
        except BedsideError:
            info = None
        return RunRef(info.run_id, info.name) if info else RunRef("", self.layout.root.name)
