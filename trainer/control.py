"""The control channel on the trainer's side: take action requests, agree, apply, acknowledge.

At every step boundary rank 0 stats ``RUN/control/requests/`` (it lists the folder only
when its mtime changed) and takes each new request by moving its file to
``RUN/control/processed/`` before anything is applied; every rank joins one broadcast of
the number of requests taken, and only when there are some rank 0 broadcasts them. So
every rank applies the same requests, in request order, at the same step. Rank 0
acknowledges each one in telemetry (``action`` records: requested, then applied or
rejected with the reason); a request whose id was already taken is rejected as a duplicate.

Anyone who can write into ``requests/`` can drop anything there, so rank 0 reads only regular
files of at most ``MAX_REQUEST_BYTES``, opened without following links and without blocking
(a FIFO, a link to ``/dev/zero``, a directory are refused unread), and applies only requests
signed with the run's control key for this run's id (``bedside.collectors.controlkey``). A request
refused for what it is, rather than for what it asks, is kept as ``processed/<id>.refused-<ns>.json``.

The ids handled and the pause are trainer state (``ControlState``), saved in every
checkpoint and kept across a rewind. After a restart, each request taken since the
restored checkpoint was saved is handled again: applied again when its effect is trainer
state (``REPEATABLE_ACTIONS``: that effect was lost with the restart), otherwise rejected
with the reason. So the history a run continues holds each request once, and none goes
unanswered. Format: docs/telemetry-format.md, "Control requests".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from bedside.collectors.controlkey import ControlKeyError, ensure_control_key, request_signature_problem, run_identity
from bedside.collectors.safefile import read_small_file

from .manifest import CheckpointError

if TYPE_CHECKING:
    from .checkpointing import Checkpointing
    from .trainer import Trainer

PAUSE_POLL_S = 1.0
_SETTLE_NS = 50_000_000  # a folder changed this recently may change again within its mtime's resolution
_DUPLICATE = ".duplicate-"  # processed/<id>.duplicate-<ns>.json: a request filed again under a taken id
_REFUSED = ".refused-"  # processed/<id>.refused-<ns>.json: not a readable, signed request (never retaken)
MAX_REQUEST_BYTES = 64 << 10
# Actions whose effect is trainer state, lost when a restart restores a checkpoint saved before them: applied
# again. checkpoint and stop act on the process that received them, at that moment: not repeated.
REPEATABLE_ACTIONS = frozenset({"rewind", "skip", "quarantine", "pause", "resume"})
RETAKEN_NOTE = "handled again: the run restarted from a checkpoint saved before this request was handled"


class Rejected(Exception):
    """A request the trainer does not apply; the message is the reason it gives."""


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
    """The control channel's part of the trainer state: the ids of the requests handled, and the pause."""

    handled: set[str] = field(default_factory=set)
    paused: bool = False

    def state_dict(self) -> dict[str, Any]:
        return {"handled": sorted(self.handled), "paused": self.paused}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ControlState:
        return cls(handled=set(state["handled"]), paused=bool(state["paused"]))


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
        files = [p for p in self.requests.iterdir() if p.suffix == ".json" and not p.name.startswith(".")]
        return [request for path in files if (request := self._take(path, handled)) is not None]

    def _take(self, path: Path, handled: set[str]) -> Request | None:
        """Move a request into ``processed/`` and read it there; None when its author withdrew it meanwhile."""
        request_id, target = path.stem, self.processed / path.name
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
        request = _read(target, self.key, self.run_id)
        if request.problem is not None:
            os.replace(target, self.processed / f"{request_id}{_REFUSED}{time.time_ns()}.json")
        return request


def _read(path: Path, key: bytes | str, run_id: str) -> Request:
    """The request in ``path``, or one carrying the problem that makes it unreadable, unsigned or another run's."""
    request_id = path.stem
    try:
        body = json.loads(read_small_file(path, MAX_REQUEST_BYTES).decode("utf-8"), object_pairs_hook=_no_twice)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        return Request(request_id, problem=f"unreadable request: {error}")
    if problem := key if isinstance(key, str) else request_signature_problem(body, key, run_id):
        return Request(request_id, problem=f"refused: {problem}")
    if body.get("request_id") != request_id:
        return Request(request_id, problem=f"request_id {body.get('request_id')!r} does not match its file name")
    args = body.get("args") or {}
    try:
        requested_at = float(body.get("requested_at") or 0.0)
    except (TypeError, ValueError):
        return Request(request_id, problem=f"requested_at must be unix seconds, got {body.get('requested_at')!r}")
    return Request(
        request_id,
        action=str(body.get("action", "")),
        args=args if isinstance(args, dict) else {},
        operator=_text(body.get("operator")),
        reason=_text(body.get("reason")),
        requested_at=requested_at,
    )


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (ValueError naming the one given twice)."""
    body: dict[str, Any] = {}
    for name, value in pairs:
        if name in body:
            raise ValueError(f"key {name!r} is given twice")
        body[name] = value
    return body


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


class ControlChannel:
    """Applies control requests to a Trainer at step boundaries (every rank calls ``at_step_boundary``)."""

    def __init__(self, trainer: Trainer, checkpointing: Checkpointing) -> None:
        self.trainer, self.checkpointing = trainer, checkpointing
        self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")  # a CPU channel
        self.inbox = self._open_inbox() if trainer.rank == 0 else None
        self.stop_reason: str | None = None
        self._count = torch.zeros(1, dtype=torch.int64)
        self._apply: dict[str, Callable[[Request], str]] = {
            "rewind": self._rewind,
            "skip": self._skip,
            "quarantine": self._quarantine,
            "checkpoint": self._checkpoint,
            "pause": self._pause,
            "resume": self._resume,
            "stop": self._stop,
        }

    def _open_inbox(self) -> RequestInbox:
        """Rank 0's inbox, with the run's control key (created now when there is none) and run id."""
        layout = self.trainer.log.layout
        key: bytes | str
        try:
            key = ensure_control_key(layout)
        except ControlKeyError as error:
            key = f"the trainer has no usable control key: {error}"
        try:
            run_id = run_identity(layout)
        except ControlKeyError as error:
            run_id, key = "", key if isinstance(key, str) else f"the trainer {error}"
        if isinstance(key, str):
            self.trainer.log.log(self.trainer.step, f"{key}; every control request will be rejected", level="error")
        return RequestInbox(layout.control_requests, layout.control_processed, key, run_id)

    @property
    def state(self) -> ControlState:
        return self.trainer.control_state

    def at_step_boundary(self) -> bool:
        """Apply what was requested (waiting while paused); False once the run must stop."""
        self._handle(self._receive())
        while self.state.paused and self.stop_reason is None:
            if self.inbox is not None:  # rank 0 sets the pace; the others wait in the broadcast
                time.sleep(PAUSE_POLL_S)
            self.trainer.log.heartbeat(self.trainer.step)
            self._handle(self._receive())
        return self.stop_reason is None

    def recover(self) -> None:
        """After a restart: retake, at the next boundary, what the restored state lacks; a run restored
        paused stays paused, and says so."""
        if self.inbox is not None:
            self.inbox.retake(self.state.handled)
        if self.state.paused and self.trainer.rank == 0:
            self.trainer.log.log(
                self.trainer.step, "restored paused: file a resume request to continue", level="warning"
            )

    def close(self) -> None:
        """At the end of the run: reject what is still filed, so that every request gets an answer."""
        self._handle(self._receive(), refusal="the run finished before it could be applied")

    def _receive(self) -> list[Request]:
        requests = self.inbox.poll(self.state.handled) if self.inbox is not None else []
        self._count[0] = len(requests)
        dist.broadcast(self._count, src=0, group=self.group)
        if int(self._count[0]) == 0:
            return []
        box: list[Any] = [requests]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _handle(self, requests: list[Request], refusal: str | None = None) -> None:
        for request in requests:
            self._acknowledge(request, "requested", RETAKEN_NOTE if request.retaken else None)
            self.state.handled.add(request.request_id)
            self._acknowledge(request, *self._outcome(request, request.problem or refusal))

    def _outcome(self, request: Request, problem: str | None) -> tuple[str, str]:
        """``("applied", what was done)`` or ``("rejected", why not)``."""
        try:
            if problem:
                raise Rejected(problem)
            if request.action not in self._apply:
                raise Rejected(f"unknown action {request.action!r}")
            if request.retaken and request.action not in REPEATABLE_ACTIONS:
                raise Rejected(
                    f"not repeated after a restart: a {request.action} request acts on the process that received it"
                )
            return "applied", self._apply[request.action](request)
        except Rejected as error:
            return "rejected", str(error)

    def _acknowledge(self, request: Request, status: str, message: str | None = None) -> None:
        if self.trainer.rank == 0:
            self.trainer.log.event(
                "action",
                self.trainer.step,
                action=request.action or "unknown",
                status=status,
                request_id=request.request_id,
                operator=request.operator,
                reason=request.reason,
                message=message,
                args=request.args,
            )

    # -- the actions (every rank, same outcome) ---------------------------------------
    def _rewind(self, request: Request) -> str:
        to_step = _int_arg(request, "to_step")
        trainer, sampler = self.trainer, self.trainer.sampler
        if to_step > trainer.step:
            raise Rejected(f"cannot rewind forward: to_step {to_step} is after the current step {trainer.step}")
        # the operators' edits and the control state outlive a rewind: the checkpoint loaded predates them
        skips, shards, control = sampler.skip_ranges, sampler.quarantined_shards, trainer.control_state
        before = (trainer.timeline, trainer.step)
        try:
            loaded = self.checkpointing.rewind(to_step)
        except CheckpointError as error:
            raise Rejected(f"the checkpoint could not be loaded: {error}") from None
        if loaded is None:
            raise Rejected(f"no checkpoint at or before step {to_step}")
        trainer.control_state = control
        for first, last in skips:
            sampler.skip(first, last)
        for shard in shards:
            sampler.quarantine(shard)
        return (
            f"rewound from step {before[1]} of timeline {before[0]} to the checkpoint of step {trainer.step} "
            f"({loaded.path.name}); continuing on timeline {trainer.timeline}"
        )

    def _skip(self, request: Request) -> str:
        first, last = _int_arg(request, "first_batch"), _int_arg(request, "last_batch")
        try:
            self.trainer.sampler.skip(first, last)
        except ValueError as error:
            raise Rejected(str(error)) from None
        return f"batches {first} to {last} will not be trained (next batch {self.trainer.sampler.cursor})"

    def _quarantine(self, request: Request) -> str:
        shard = _int_arg(request, "shard")
        try:
            self.trainer.sampler.quarantine(shard)
        except ValueError as error:
            raise Rejected(str(error)) from None
        return f"shard {shard} quarantined"

    def _checkpoint(self, request: Request) -> str:
        if not self.checkpointing.save_now():
            raise Rejected(f"step {self.trainer.step} of timeline {self.trainer.timeline} is already saved")
        return f"checkpoint of step {self.trainer.step} started"

    def _pause(self, request: Request) -> str:
        if self.state.paused:
            raise Rejected("already paused")
        self.state.paused = True
        return f"paused after step {self.trainer.step}"

    def _resume(self, request: Request) -> str:
        if not self.state.paused:
            raise Rejected("not paused")
        self.state.paused = False
        return f"resumed after step {self.trainer.step}"

    def _stop(self, request: Request) -> str:
        self.stop_reason = (
            f"stopped by {request.operator or 'an operator'} at step {self.trainer.step}: "
            f"{request.reason or 'no reason given'}"
        )
        return f"stopping after step {self.trainer.step}: a final checkpoint, then run_end aborted"


def _int_arg(request: Request, name: str) -> int:
    value = request.args.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Rejected(f"{request.action} needs {name} as an integer >= 0, got {value!r}")
    return value
