"""Delivering one message to one notifier: an HTTP POST or a command, and what came of it.

Outcomes say whether to retry: 5xx, 408, timeouts and refused connections are worth
another try (after 429's Retry-After when given); other 4xx and a missing program are
not. Every text an outcome carries has the notifier's secrets masked.
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bedside.collectors.display_text import visible

from .config import NotifierConfig
from .render import discord_message, slack_message

SIGNATURE_HEADER = "X-Bedside-Signature-256"
IDEMPOTENCY_HEADER = "Idempotency-Key"
USER_AGENT = "bedside-alerts/1"
MAX_RETRY_AFTER_S = 3600.0
_RETRYABLE_STATUS = (408, 425, 429)


@dataclass(frozen=True)
class Outcome:
    """What one delivery attempt came to."""

    delivered: bool
    detail: str
    retry: bool = False
    retry_after_s: float | None = None


def deliver(notifier: NotifierConfig, payload: dict[str, Any]) -> Outcome:
    """Send ``payload`` to ``notifier`` once, within its timeout."""
    outcome = _SENDERS[notifier.type](notifier, payload)
    return Outcome(outcome.delivered, notifier.scrub(outcome.detail), outcome.retry, outcome.retry_after_s)


def body_of(notifier: NotifierConfig, payload: dict[str, Any]) -> bytes:
    """The bytes a notifier sends for ``payload`` (Slack and Discord render it; the rest get it as is)."""
    message = {"slack": slack_message, "discord": discord_message}.get(notifier.type, lambda p: p)(payload)
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: str, body: bytes) -> str:
    """The value of the signature header: ``sha256=`` and the hex HMAC-SHA256 of the body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _post(notifier: NotifierConfig, payload: dict[str, Any]) -> Outcome:
    body = body_of(notifier, payload)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        IDEMPOTENCY_HEADER: payload["id"],
        **notifier.headers,
    }
    if notifier.secret:
        headers[SIGNATURE_HEADER] = signature(notifier.secret, body)
    url = notifier.url + ("?wait=true" if notifier.type == "discord" and "?" not in notifier.url else "")
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=notifier.timeout_s) as response:
            response.read()
            return Outcome(True, f"HTTP {response.status}")
    except urllib.error.HTTPError as exc:
        return _http_error(exc)
    except urllib.error.URLError as exc:
        return Outcome(False, f"cannot reach {notifier.destination}: {exc.reason}", retry=True)
    except (TimeoutError, ConnectionError, http.client.HTTPException, OSError) as exc:
        return Outcome(False, f"{notifier.destination}: {type(exc).__name__}: {exc}", retry=True)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: following it would re-send the POST as a GET without its body."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _http_error(exc: urllib.error.HTTPError) -> Outcome:
    detail = f"HTTP {exc.code} {exc.reason}".strip()
    if 300 <= exc.code < 400:
        return Outcome(False, f"{detail}: the receiver redirects; configure the URL it redirects to")
    if exc.code >= 500 or exc.code in _RETRYABLE_STATUS:
        return Outcome(False, detail, retry=True, retry_after_s=retry_after(exc.headers.get("Retry-After")))
    hint = "; check the URL and token" if exc.code in (401, 403, 404, 410) else ""
    return Outcome(False, f"{detail}: the receiver refused the message{hint}")


def retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), capped; None when absent or bad."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - now()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _run_command(notifier: NotifierConfig, payload: dict[str, Any]) -> Outcome:
    env_extra = {
        "BEDSIDE_ALERT_ID": payload["id"],
        "BEDSIDE_ALERT_EVENT": payload["event"],
        "BEDSIDE_ALERT_SEVERITY": payload["severity"],
    }
    try:
        done = subprocess.run(
            notifier.command,
            input=body_of(notifier, payload),
            capture_output=True,
            timeout=notifier.timeout_s,
            env={**os.environ, **env_extra},
        )
    except FileNotFoundError:
        return Outcome(False, f"program {notifier.command[0]!r} not found")
    except subprocess.TimeoutExpired:
        return Outcome(False, f"{notifier.destination} did not finish within {notifier.timeout_s:g} s", retry=True)
    if done.returncode:
        said = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return Outcome(False, f"{notifier.destination} exited with {done.returncode}: {said[0][:200]}", retry=True)
    return Outcome(True, "exit 0")


def _write_log(notifier: NotifierConfig, payload: dict[str, Any]) -> Outcome:
    line = f"bedside: alert: {visible(payload['text'])}\n"
    if notifier.path is None:
        sys.stderr.write(line)
        return Outcome(True, "stderr")
    try:
        with open(notifier.path, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError as exc:
        return Outcome(False, f"cannot append to {notifier.path}: {exc.strerror or exc}", retry=True)
    return Outcome(True, str(notifier.path))


_SENDERS: dict[str, Callable[[NotifierConfig, dict[str, Any]], Outcome]] = {
    "slack": _post,
    "discord": _post,
    "webhook": _post,
    "command": _run_command,
    "log": _write_log,
}
