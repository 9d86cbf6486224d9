"""Rank 0's side of ``RUN/control/``: take new requests, read and verify them, and answer for duplicates.

At each look rank 0 stats ``RUN/control/requests/`` (it lists the folder only when its mtime
changed) and takes each new request by moving its file to ``RUN/control/processed/`` before
anything is applied; a request whose id was already taken is a duplicate.

Anyone who can write into ``requests/`` can drop anything there, so only regular files of at most
``MAX_REQUEST_BYTES`` are read, opened without following links and without blocking (a FIFO, a
link to ``/dev/zero``, a directory are refused unread), and only requests signed with the run's
control key for this run's id (``controlkey.py``) are applied. A request refused for what it is,
rather than for what it asks, is kept as ``processed/<id>.refused-<ns>.json``.

``ControlState`` (the ids handled and the pause) belongs in the loop's checkpoints. After a
restart, each request taken since the restored checkpoint was saved is handed over again
(``retake``): applied again when its effect is loop state (``REPEATABLE_ACTIONS``: that effect
was lost with the restart), otherwise rejected with the reason. Torch-free: the kit's
``ControlClient`` (``kit/actions.py``) does the broadcast. Format: docs/telemetry-format.md,
"Control requests".
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .bounded import MAX_NAME_CHARS, BoundedInputError, file_name_part, finite_number, parse_json, short
from .control import MAX_LIFETIME_S
from .controlkey import ControlKeyError, ensure_control_key, request_signature_problem, run_identity
from .layout import RunLayout
from .safefile import read_small_file

_SETTLE_NS = 50_000_000  # a folder changed this recently may change again within its mtime's resolution
_DUPLICATE = ".duplicate-"  # processed/<id>.duplicate-<ns>.json: a request filed again under a taken id
_REFUSED = ".refused-"  # processed/<id>.refused-<ns>.json: not a readable, signed request (never retaken)
MAX_REQUEST_BYTES = 64 << 10
CLOCK_SKEW_S = 300.0  # a request filed this far ahead of rank 0's clock is refused: its times cannot be trusted
_REQUEST_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}")
# Actions whose effect is loop state, lost when a restart restores a checkpoint saved before them: applied
# again. checkpoint and stop act on the process that received them, at that moment: not repeated.
REPEATABLE_ACTIONS = frozenset({"rewind", "skip", "quarantine", "pause", "resume"})
RETAKEN_NOTE = "handled again: the run restarted from a checkpoint saved before this request was handled"


class Rejected(Exception):
    """A request the loop does not apply; the message is the reason it gives."""


@dataclass(frozen=True)
class Request:
    """One parsed request; ``problem`` is set when it must be rejected unread (bad file, duplicate),
    ``retaken`` when a restart hands it over again."""

    request_id: str
    action: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    operator: str | None = None
    reason: str | None = None
    requested_at: float = 0.0
    problem: str | None = None
    retaken: bool = False


@dataclass
class ControlState:
    """The control requests' part of a loop's state: the ids of the requests handled, and the pause."""

    handled: set[str] = field(default_factory=set)
    paused: bool = False

    def state_dict(self) -> dict[str, Any]:
        return {"handled": sorted(self.handled), "paused": self.paused}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take ``state_dict()``'s ids and pause, in place (those who hold this state see the change)."""
        self.handled, self.paused = set(state["handled"]), bool(state["paused"])


def open_inbox(layout: RunLayout) -> tuple[RequestInbox, str | None]:
    """Rank 0's inbox for the run at ``layout``, with the run's control key (created now when there is
    none) and run id; and, when either is missing, why every request will be refused (else None)."""
    key: bytes | str
    try:
        key = ensure_control_key(layout)
    except ControlKeyError as error:
        key = f"the loop has no usable control key: {error}"
    try:
        run_id = run_identity(layout)
    except ControlKeyError as error:
        run_id, key = "", key if isinstance(key, str) else f"the loop {error}"
    inbox = RequestInbox(layout.control_requests, layout.control_processed, key, run_id)
    return inbox, key if isinstance(key, str) else None


class RequestInbox:
    """Rank 0's view of ``control/``: new requests, cheaply, taken into ``processed/`` before they are applied."""

    def __init__(self, requests: Path, processed: Path, key: bytes | str, run_id: str) -> None:
        """``key`` is the control key, or (a string) why there is none: then every request is refused with it;
        only requests filed for ``run_id`` are taken."""
        self.requests, self.processed, self.key, self.run_id = requests, processed, key, run_id
        self._seen_mtime: int | None = None
        self._retaken: list[Request] = []

    def poll(self, handled: set[str]) -> list[Request]:
        """Requests filed since the last look (and those to retake), taken, oldest first; one stat when
        nothing changed. An id in ``handled`` or already taken is a duplicate."""
        requests, self._retaken = self._retaken + self._take_new(handled), []
        return sorted(requests, key=lambda r: (r.requested_at, r.request_id))

    def retake(self, handled: set[str]) -> None:
        """After a restart: the next ``poll`` hands over again the taken requests that ``handled`` (the
        restored state's) lacks."""
        files = [
            p
            for p in self.processed.glob("*.json")
            if p.stem not in handled and _DUPLICATE not in p.name and _REFUSED not in p.name
        ]
        self._retaken = [replace(_read(path, self.key, self.run_id), retaken=True) for path in files]

    def _take_new(self, handled: set[str]) -> list[Request]:
        try:
            mtime = os.stat(self.requests).st_mtime_ns
        except FileNotFoundError:
            return []
        if mtime == self._seen_mtime:
            return []
        self._seen_mtime = mtime if time.time_ns() - mtime > _SETTLE_NS else None
        try:
            files = [p for p in self.requests.iterdir() if p.suffix == ".json" and not p.name.startswith(".")]
        except OSError as error:
            self._seen_mtime = None
            return [Request("requests", problem=f"{self.requests.name}/ cannot be listed: {error.strerror}")]
        return [request for path in files if (request := self._take_safely(path, handled)) is not None]

    def _take_safely(self, path: Path, handled: set[str]) -> Request | None:
        """``_take``, which no request can make raise: whatever goes wrong is that request's problem, so
        nothing a writer of ``requests/`` drops there can leave the loop's step boundary."""
        try:
            return self._take(path, handled)
        except Exception as error:  # any failure refuses this request, never the run
            return Request(
                _id_of(path), problem=f"could not be handled: {type(error).__name__}: {short(str(error), 200)}"
            )

    def _take(self, path: Path, handled: set[str]) -> Request | None:
        """Move a request into ``processed/`` and read it there; None when its author withdrew it meanwhile."""
        request_id = _id_of(path)
        if request_id != path.stem:
            return self._set_aside(path, request_id, f"a request file name must be a request id, got {path.name!r}")
        target = self.processed / path.name
        taken = os.path.lexists(target)
        duplicate = request_id in handled or taken
        if taken:
            target = self.processed / f"{request_id}{_DUPLICATE}{time.time_ns()}.json"
        self.processed.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, target)  # renames the entry itself: a FIFO or a link is never opened here
        except FileNotFoundError:
            return None
        except OSError as error:
            return Request(request_id, problem=f"cannot be taken from {path.parent.name}/: {error.strerror}")
        if duplicate:
            return Request(request_id, problem=f"duplicate: request {request_id} was already received")
        request = _read(target, self.key, self.run_id, now=time.time())
        if request.problem is not None:
            os.replace(target, self._refused(request_id))
        return request

    def _set_aside(self, path: Path, request_id: str, problem: str) -> Request | None:
        """Refuse the entry at ``path`` unread, moved to ``processed/`` under a safe, bounded name."""
        self.processed.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, self._refused(request_id))
        except FileNotFoundError:
            return None
        return Request(request_id, problem=problem)

    def _refused(self, request_id: str) -> Path:
        """Where a refused entry is kept (never handed over again after a restart)."""
        return self.processed / f"{request_id}{_REFUSED}{time.time_ns()}.json"


def _read(path: Path, key: bytes | str, run_id: str, now: float | None = None) -> Request:
    """The request in ``path``, or one carrying the problem that makes it unreadable, unsigned, another run's,
    or (checked when ``now`` is given: a first take, not a retake after a restart) expired or from the future."""
    request_id = path.stem
    try:
        body = parse_json(read_small_file(path, MAX_REQUEST_BYTES), path.name)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        return Request(request_id, problem=f"unreadable request: {error}")
    if problem := key if isinstance(key, str) else request_signature_problem(body, key, run_id):
        return Request(request_id, problem=f"refused: {problem}")
    if body.get("request_id") != request_id:
        return Request(request_id, problem=f"request_id {short(body.get('request_id'))} does not match its file name")
    args = body.get("args") or {}
    try:
        requested_at = finite_number(body.get("requested_at"), "requested_at")
        if now is not None:
            _check_times(requested_at, body.get("expires_at"), now)
    except BoundedInputError as error:
        return Request(request_id, problem=f"refused: {error}")
    return Request(
        request_id,
        action=str(body.get("action", "")),
        args=args if isinstance(args, dict) else {},
        operator=_text(body.get("operator")),
        reason=_text(body.get("reason")),
        requested_at=requested_at,
    )


def _check_times(requested_at: float, expires_at: Any, now: float) -> None:
    """BoundedInputError unless the request was filed no later than ``now`` (within ``CLOCK_SKEW_S``), carries an
    expiry within ``MAX_LIFETIME_S`` of its filing, and has not expired."""
    if requested_at > now + CLOCK_SKEW_S:
        raise BoundedInputError(f"requested_at is {requested_at - now:.0f} s ahead of this host's clock")
    if expires_at is None:
        raise BoundedInputError("it carries no expires_at: a signed request must say until when it is valid")
    expires = finite_number(expires_at, "expires_at")
    if not requested_at < expires <= requested_at + MAX_LIFETIME_S:
        raise BoundedInputError(f"expires_at must be after requested_at and within {MAX_LIFETIME_S:.0f} s of it")
    if now > expires:
        raise BoundedInputError(f"expired {now - expires:.0f} s ago (valid for {expires - requested_at:.0f} s)")


def _id_of(path: Path) -> str:
    """The request id a file name stands for, or (a name no request id has) a safe, bounded stand-in."""
    return path.stem if _REQUEST_ID.fullmatch(path.stem) else file_name_part(f"bad-name-{path.stem}")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
