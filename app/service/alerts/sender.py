"""Delivering the outbox: one thread per notifier, in order, with timeouts, retries, backoff and a horizon.

A notifier's messages go out in the order they were written. A failed attempt that is
worth retrying holds that notifier's queue (the receiver is down or asking us to slow
down) for an exponential backoff with jitter, or for 429's Retry-After; a message older
than the horizon is given up and recorded as failed. The store is touched only to read
the next message and to record each attempt, never while waiting on the network, so the
collector and detectors never wait for a receiver.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from bedside.collectors.store import Store

from .config import AlertSettings, NotifierConfig
from .delivery import Outcome, deliver

IDLE_POLL_S = 2.0
"""How often an idle worker looks at the outbox without being woken (a safety net)."""
STORE_RETRY_S = 1.0


class OutboxSender:
    """Delivers every configured notifier's pending messages until closed."""

    def __init__(
        self,
        store: Store,
        settings: AlertSettings,
        *,
        warn: Callable[[str], None] = lambda m: None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.warn = warn
        self.clock = clock
        self.rng = rng or random.Random()
        self._stop = threading.Event()
        self._drain_until = 0.0
        self._workers = [_Worker(self, notifier) for notifier in settings.notifiers]

    def start(self) -> None:
        for worker in self._workers:
            worker.start()

    def wake(self) -> None:
        """New messages were committed."""
        for worker in self._workers:
            worker.wake.set()

    def close(self, drain_s: float = 0.0) -> int:
        """Stop, after delivering for up to ``drain_s`` what is due; the number of messages left pending."""
        self._drain_until = self.clock() + drain_s
        self._stop.set()
        self.wake()
        for worker in self._workers:
            if worker.is_alive():
                worker.join(drain_s + worker.notifier.timeout_s + 1.0)
        return self.pending()

    def pending(self) -> int:
        names = [n.name for n in self.settings.notifiers]
        return int(self.store.fetch_named("outbox_pending", {"notifiers": names})["pending"][0]) if names else 0

    def backoff_s(self, attempts: int) -> float:
        """Seconds before the next try after ``attempts`` failures: doubling, capped, with jitter."""
        ceiling = min(self.settings.retry_max_s, self.settings.retry_base_s * 2 ** (attempts - 1))
        return ceiling * self.rng.uniform(0.5, 1.0)

    def stopping_before(self, when: float) -> bool:
        """Whether the sender is closing and ``when`` falls after its drain deadline."""
        return self._stop.is_set() and when > self._drain_until


class _Worker(threading.Thread):
    """Delivers one notifier's messages."""

    def __init__(self, sender: OutboxSender, notifier: NotifierConfig) -> None:
        super().__init__(name=f"alerts-{notifier.name}", daemon=True)
        self.sender = sender
        self.notifier = notifier
        self.wake = threading.Event()
        self._failing = False

    def run(self) -> None:
        while True:
            self.wake.clear()
            try:
                message = self._next()
            except Exception as exc:  # the store is busy or closing: never let the thread die quietly
                if self.sender._stop.is_set():
                    return
                self.sender.warn(f"alerts to {self.notifier.name}: cannot read the outbox ({exc}); retrying")
                self.wake.wait(STORE_RETRY_S)
                continue
            now = self.sender.clock()
            due = message["next_attempt_at"] if message else now + IDLE_POLL_S
            if self.sender.stopping_before(due) or (message is None and self.sender._stop.is_set()):
                return  # closing, and nothing is due before the drain deadline (or nothing is left to drain)
            if message is None or due > now:
                self.wake.wait(due - now)
                continue
            self._attempt(message, now)

    def _next(self) -> dict[str, Any] | None:
        rows = self.sender.store.fetch_named("outbox_next", {"notifier": self.notifier.name})
        return None if rows.empty else rows.iloc[0].to_dict()

    def _attempt(self, message: dict[str, Any], now: float) -> None:
        settings = self.sender.settings
        attempts = int(message["attempts"])
        if now - message["created_at"] > settings.give_up_after_s:
            last_error = message["last_error"] or "never attempted"
            outcome = Outcome(
                False,
                f"gave up after {attempts} attempts over {now - message['created_at']:.0f} s "
                f"(the horizon is {settings.give_up_after_s:g} s): {last_error}",
            )
            self._record(message, "failed", 0, now, outcome.detail)
            self._say(message, outcome)
            return
        outcome = deliver(self.notifier, json.loads(message["payload"]))
        if outcome.delivered:
            self._record(message, "delivered", 1, now, None, delivered_at=self.sender.clock())
        elif outcome.retry:
            delay = outcome.retry_after_s if outcome.retry_after_s is not None else self.sender.backoff_s(attempts + 1)
            answered = self.sender.clock()  # a Retry-After counts from the response, not from the request
            self._record(message, "pending", 1, answered + delay, outcome.detail)
        else:
            self._record(message, "failed", 1, now, outcome.detail)
        self._say(message, outcome)

    def _record(
        self,
        message: dict[str, Any],
        status: str,
        attempted: int,
        next_attempt_at: float,
        error: str | None,
        delivered_at: float | None = None,
    ) -> None:
        params = {
            "message_id": message["message_id"],
            "status": status,
            "attempted": attempted,
            "next_attempt_at": next_attempt_at,
            "delivered_at": delivered_at,
            "last_error": error,
        }
        while True:
            try:
                self.sender.store.execute_named("outbox_mark", params)
                return
            except Exception as exc:  # a write conflict or a closing store: the attempt must still be recorded
                if self.sender._stop.is_set() and self.sender.clock() > self.sender._drain_until:
                    return
                self.sender.warn(f"alerts to {self.notifier.name}: cannot record an attempt ({exc}); retrying")
                time.sleep(STORE_RETRY_S)

    def _say(self, message: dict[str, Any], outcome: Outcome) -> None:
        """Warn when deliveries to this notifier start failing, and when they recover."""
        if outcome.delivered and self._failing:
            self.sender.warn(f"alerts to {self.notifier.name} delivered again")
        elif outcome.retry and not self._failing:
            self.sender.warn(
                f"alerts to {self.notifier.name} ({self.notifier.destination}) failing: {outcome.detail}; retrying"
            )
        elif not outcome.delivered and not outcome.retry:
            self.sender.warn(
                f"alert {message['message_id']} to {self.notifier.name} "
                f"({self.notifier.destination}) failed: {outcome.detail}"
            )
        self._failing = not outcome.delivered and outcome.retry
