"""Rank 0's side of ``RUN/control/``: take new requests, read and verify them, and answer for duplicates.

At each look rank 0 stats ``RUN/control/requests/`` (it lists the folder only when its mtime
changed) and takes each new request by moving its file to ``RUN/control/processed/`` before
anything is applied; a request whose id was already taken is a duplicate.

Anyone who can write into ``requests/`` can drop anything there, so only regular files of at most
``MAX_REQUEST_BYTES`` are read, opened without following links and without blocking (a FIFO, a
link to ``/dev/zero``, a directory are refused unread), and only requests signed with the run's
control key for this run's id (``controlkey.py``) are applied. A request refused for what it is,
rather than for what it asks, is kept as ``processed/<id>.refused-<ns>.json``. Whoever can write
``control/`` can swap ``requests/`` or ``processed/`` for a link (to the run folder, say): both
folders are opened without following a link and every entry is moved and read relative to them, so
nothing outside them is ever touched; a folder that is no folder is refused, said once. An entry no
request can be (a hidden or non-``.json`` name) is a writer's file in flight while young, and set
aside once ``STRAY_AGE_S`` old, so junk cannot stay to be listed again at every step; a look
examines at most ``MAX_ENTRIES_PER_LOOK`` entries and takes at most ``MAX_TAKEN_PER_LOOK`` requests
(the rest wait for the next step boundary), so no number of files makes one step slow.

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
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .bounded import MAX_NAME_CHARS, BoundedInputError, file_name_part, finite_number, parse_json, short
from .control import MAX_LIFETIME_S
from .controlkey import ControlKeyError, ensure_control_key, request_signature_problem, run_identity
from .layout import RunLayout
from .safefile import file_type, read_small_file

_SETTLE_NS = 50_000_000  # a folder changed this recently may change again within its mtime's resolution
_DUPLICATE = ".duplicate-"  # processed/<id>.duplicate-<ns>.json: a request filed again under a taken id
_REFUSED = ".refused-"  # processed/<id>.refused-<ns>.json: not a readable, signed request (never retaken)
MAX_REQUEST_BYTES = 64 << 10
MAX_ENTRIES_PER_LOOK = 256  # entries of requests/ examined at one step boundary; the rest wait for the next
MAX_TAKEN_PER_LOOK = 32  # requests taken (moved and read) at one step boundary; the rest wait for the next
STRAY_AGE_S = 60.0  # an entry no request can be, this old, is no writer's file in flight: it is set aside
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
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
        self._problem: str | None = None  # the folders' problem last answered (said once while it lasts)

    def poll(self, handled: set[str]) -> list[Request]:
        """Requests filed since the last look (and those to retake), taken, oldest first; one stat when
        nothing changed. An id in ``handled`` or already taken is a duplicate."""
        requests, self._retaken = self._retaken + self._take_new(handled), []
        return sorted(requests, key=lambda r: (r.requested_at, r.request_id))

    def retake(self, handled: set[str]) -> None:
        """After a restart: the next ``poll`` hands over again the taken requests that ``handled`` (the
        restored state's) lacks."""
        try:
            with self._folders() as (_, processed):
                names = [
                    name
                    for name in os.listdir(processed)
                    if name.endswith(".json") and name[:-5] not in handled and _DUPLICATE not in name
                    if _REFUSED not in name
                ]
                self._retaken = [replace(_read(processed, name, self.key, self.run_id), retaken=True) for name in names]
        except (OSError, _FolderRefused):
            self._retaken = []  # nothing to hand over from a control/ that is missing or refused

    def _take_new(self, handled: set[str]) -> list[Request]:
        try:
            mtime = os.stat(self.requests, follow_symlinks=False).st_mtime_ns
        except FileNotFoundError:
            return []
        except OSError as error:
            return self._folder_problem(f"{self.requests.name}/ cannot be read: {error.strerror}")
        if mtime == self._seen_mtime:
            return []
        self._seen_mtime = None if 0 <= time.time_ns() - mtime <= _SETTLE_NS else mtime
        try:
            with self._folders() as (requests, processed):
                taken, complete = self._take_from(requests, processed, handled)
        except FileNotFoundError:
            return []
        except (OSError, _FolderRefused) as error:
            return self._folder_problem(str(error) if isinstance(error, _FolderRefused) else error.strerror or "")
        self._problem = None
        if not complete:
            self._seen_mtime = None  # look again at the next boundary
        return taken

    def _folder_problem(self, problem: str) -> list[Request]:
        """A problem with the folders themselves, answered once (not at every step while it lasts)."""
        self._seen_mtime = None
        if problem == self._problem:
            return []
        self._problem = problem
        return [Request("requests", problem=problem)]

    @contextmanager
    def _folders(self) -> Iterator[tuple[int, int]]:
        """``requests/`` and ``processed/`` (created when missing) open, neither reached through a link."""
        descriptors: list[int] = []
        try:
            control = _open_folder(self.requests.parent, None, descriptors)
            requests = _open_folder(self.requests.name, control, descriptors)
            with suppress(FileExistsError):
                os.mkdir(self.processed.name, dir_fd=control)
            yield requests, _open_folder(self.processed.name, control, descriptors)
        finally:
            for descriptor in descriptors:
                os.close(descriptor)

    def _take_from(self, requests: int, processed: int, handled: set[str]) -> tuple[list[Request], bool]:
        """The requests taken from the open ``requests/``, and whether every entry was dealt with (strays set
        aside, no cap reached)."""
        taken: list[Request] = []
        complete = True
        with os.scandir(requests) as entries:
            for examined, entry in enumerate(entries):
                if examined == MAX_ENTRIES_PER_LOOK or len(taken) == MAX_TAKEN_PER_LOOK:
                    return taken, False
                if entry.name.startswith(".") or not entry.name.endswith(".json"):
                    gone, request = self._set_aside_stray(requests, processed, entry.name)
                    complete &= gone
                else:
                    request = self._take_safely(requests, processed, entry.name, handled)
                if request is not None:
                    taken.append(request)
        return taken, complete

    def _set_aside_stray(self, requests: int, processed: int, name: str) -> tuple[bool, Request | None]:
        """Set aside an entry that no request can be once it is ``STRAY_AGE_S`` old: whether it is gone, and
        the answer for it (None when it is young, or went away meanwhile)."""
        try:
            age_s = time.time() - os.stat(name, dir_fd=requests, follow_symlinks=False).st_mtime
            if age_s < STRAY_AGE_S:
                return False, None  # perhaps a writer's hidden file, about to be renamed into a request
            problem = f"not a request: {short(name, 80)} is no <request id>.json name ({age_s:.0f} s old)"
            return True, self._set_aside(requests, processed, name, _id_of(name), problem)
        except Exception as error:  # nothing an entry is can leave the boundary
            return True, Request(_id_of(name), problem=f"could not be set aside: {type(error).__name__}")

    def _take_safely(self, requests: int, processed: int, name: str, handled: set[str]) -> Request | None:
        """``_take``, which no request can make raise: whatever goes wrong is that request's problem, so
        nothing a writer of ``requests/`` drops there can leave the loop's step boundary."""
        try:
            return self._take(requests, processed, name, handled)
        except Exception as error:  # any failure refuses this request, never the run
            return Request(
                _id_of(name), problem=f"could not be handled: {type(error).__name__}: {short(str(error), 200)}"
            )

    def _take(self, requests: int, processed: int, name: str, handled: set[str]) -> Request | None:
        """Move a request into ``processed/`` and read it there; None when its author withdrew it meanwhile."""
        request_id = _id_of(name)
        if f"{request_id}.json" != name:
            problem = f"a request file name must be a request id, got {name!r}"
            return self._set_aside(requests, processed, name, request_id, problem)
        target = name
        taken = _exists(name, processed)
        duplicate = request_id in handled or taken
        if taken:
            target = f"{request_id}{_DUPLICATE}{time.time_ns()}.json"
        try:  # renames the entry itself: a FIFO or a link is never opened here
            os.replace(name, target, src_dir_fd=requests, dst_dir_fd=processed)
        except FileNotFoundError:
            return None
        except OSError as error:
            return Request(request_id, problem=f"cannot be taken from {self.requests.name}/: {error.strerror}")
        if duplicate:
            return Request(request_id, problem=f"duplicate: request {request_id} was already received")
        request = _read(processed, target, self.key, self.run_id, now=time.time())
        if request.problem is not None:
            os.replace(target, _refused(request_id), src_dir_fd=processed, dst_dir_fd=processed)
        return request

    def _set_aside(self, requests: int, processed: int, name: str, request_id: str, problem: str) -> Request | None:
        """Refuse the entry ``name`` unread, moved to ``processed/`` under a safe, bounded name."""
        try:
            os.replace(name, _refused(request_id), src_dir_fd=requests, dst_dir_fd=processed)
        except FileNotFoundError:
            return None
        return Request(request_id, problem=problem)


class _FolderRefused(Exception):
    """``control/``, ``requests/`` or ``processed/`` is not a folder this inbox may use; the message says why."""


def _open_folder(name: str | Path, parent: int | None, descriptors: list[int]) -> int:
    """The folder ``name`` (in the open folder ``parent``) open, never through a link; kept in ``descriptors``."""
    try:
        descriptor = os.open(name, _FOLDER_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as error:
        try:
            kind = file_type(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        except OSError:
            kind = "not a folder"
        raise _FolderRefused(f"{Path(name).name}/ is {kind}, not a folder: refused ({error.strerror})") from None
    descriptors.append(descriptor)
    return descriptor


def _exists(name: str, folder: int) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _refused(request_id: str) -> str:
    """The name a refused entry is kept under in ``processed/`` (never handed over again after a restart)."""
    return f"{request_id}{_REFUSED}{time.time_ns()}.json"


def _read(folder: int, name: str, key: bytes | str, run_id: str, now: float | None = None) -> Request:
    """The request in ``name`` in the open ``folder``, or one carrying the problem that makes it unreadable,
    unsigned, another run's, or (checked when ``now`` is given: a first take, not a retake after a restart)
    expired or from the future."""
    request_id = name.removesuffix(".json")
    try:
        body = parse_json(read_small_file(Path(name), MAX_REQUEST_BYTES, dir_fd=folder), name)
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


def _id_of(name: str) -> str:
    """The request id a file name stands for, or (a name no request id has) a safe, bounded stand-in."""
    stem = name.removesuffix(".json")
    return stem if _REQUEST_ID.fullmatch(stem) else file_name_part(f"bad-name-{stem}")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
