"""The control channel on the trainer's side: read action requests, agree, apply, acknowledge.

At every step boundary rank 0 stats ``RUN/control/requests/`` (it lists the folder only
when its mtime changed), every rank joins one broadcast of the number of new requests,
and only when there are some rank 0 broadcasts the parsed requests. So every rank
applies the same requests, in request order, at the same step. Rank 0 acknowledges each
one in telemetry (``action`` records: requested, then applied or rejected with the
reason) and moves its file to ``RUN/control/processed/``; a request whose id was already
processed is rejected as a duplicate. Format: docs/telemetry-format.md, "Control requests".
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from .manifest import CheckpointError

if TYPE_CHECKING:
    from .checkpointing import Checkpointing
    from .trainer import Trainer

PAUSE_POLL_S = 1.0
_SETTLE_NS = 50_000_000  # a folder changed this recently may change again within its mtime's resolution


class Rejected(Exception):
    """A request the trainer does not apply; the message is the reason it gives."""


@dataclass(frozen=True)
class Request:
    """One parsed request; ``problem`` is set when it must be rejected unread (bad file, duplicate)."""

    request_id: str
    action: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    operator: str | None = None
    reason: str | None = None
    requested_at: float = 0.0
    problem: str | None = None
    duplicate: bool = False


class RequestInbox:
    """Rank 0's view of ``control/requests/``: new requests, cheaply; handled ones archived."""

    def __init__(self, requests: Path, processed: Path) -> None:
        self.requests, self.processed = requests, processed
        self._seen_mtime: int | None = None

    def poll(self) -> list[Request]:
        """Requests filed since the last look, oldest first (one stat when nothing changed)."""
        try:
            mtime = os.stat(self.requests).st_mtime_ns
        except FileNotFoundError:
            return []
        if mtime == self._seen_mtime:
            return []
        self._seen_mtime = mtime if time.time_ns() - mtime > _SETTLE_NS else None
        files = [p for p in self.requests.iterdir() if p.suffix == ".json" and not p.name.startswith(".")]
        return sorted((self._read(path) for path in files), key=lambda r: (r.requested_at, r.request_id))

    def archive(self, request: Request) -> None:
        """Move a handled request to ``processed/`` (a duplicate keeps the original there)."""
        self.processed.mkdir(parents=True, exist_ok=True)
        name = f"{request.request_id}.duplicate-{time.time_ns()}.json" if request.duplicate \
            else f"{request.request_id}.json"
        try:
            os.replace(self.requests / f"{request.request_id}.json", self.processed / name)
        except FileNotFoundError:  # withdrawn by its author meanwhile: nothing to move
            pass

    def _read(self, path: Path) -> Request:
        request_id = path.stem
        if (self.processed / path.name).exists():
            return Request(request_id, problem=f"duplicate: request {request_id} was already processed",
                           duplicate=True)
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as error:
            return Request(request_id, problem=f"unreadable request: {error}")
        if body.get("request_id") != request_id:
            return Request(request_id, problem=f"request_id {body.get('request_id')!r} does not match its file name")
        args = body.get("args") or {}
        try:
            requested_at = float(body.get("requested_at") or 0.0)
        except (TypeError, ValueError):
            return Request(request_id, problem=f"requested_at must be unix seconds, got {body.get('requested_at')!r}")
        return Request(request_id, action=str(body.get("action", "")), args=args if isinstance(args, dict) else {},
                       operator=body.get("operator"), reason=body.get("reason"), requested_at=requested_at)


class ControlChannel:
    """Applies control requests to a Trainer at step boundaries (every rank calls ``at_step_boundary``)."""

    def __init__(self, trainer: Trainer, checkpointing: Checkpointing) -> None:
        self.trainer, self.checkpointing = trainer, checkpointing
        self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")  # a CPU channel
        layout = trainer.log.layout
        self.inbox = RequestInbox(layout.control_requests, layout.control_processed) if trainer.rank == 0 else None
        self.paused = False
        self.stop_reason: str | None = None
        self._count = torch.zeros(1, dtype=torch.int64)
        self._apply: dict[str, Callable[[Request], str]] = {
            "rewind": self._rewind, "skip": self._skip, "quarantine": self._quarantine,
            "checkpoint": self._checkpoint, "pause": self._pause, "resume": self._resume, "stop": self._stop}

    def at_step_boundary(self) -> bool:
        """Apply what was requested (waiting while paused); False once the run must stop."""
        self._handle(self._receive())
        while self.paused and self.stop_reason is None:
            if self.inbox is not None:  # rank 0 sets the pace; the others wait in the broadcast
                time.sleep(PAUSE_POLL_S)
            self.trainer.log.heartbeat(self.trainer.step)
            self._handle(self._receive())
        return self.stop_reason is None

    def close(self) -> None:
        """At the end of the run: reject what is still filed, so that every request gets an answer."""
        for request in self._receive():
            self._acknowledge(request, "requested")
            self._acknowledge(request, "rejected", "the run finished before it could be applied")
            if self.inbox is not None:
                self.inbox.archive(request)

    def _receive(self) -> list[Request]:
        requests = self.inbox.poll() if self.inbox is not None else []
        self._count[0] = len(requests)
        dist.broadcast(self._count, src=0, group=self.group)
        if int(self._count[0]) == 0:
            return []
        box: list[Any] = [requests]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _handle(self, requests: list[Request]) -> None:
        for request in requests:
            self._acknowledge(request, "requested")
            try:
                if request.problem:
                    raise Rejected(request.problem)
                if request.action not in self._apply:
                    raise Rejected(f"unknown action {request.action!r}")
                status, message = "applied", self._apply[request.action](request)
            except Rejected as error:
                status, message = "rejected", str(error)
            self._acknowledge(request, status, message)
            if self.inbox is not None:
                self.inbox.archive(request)

    def _acknowledge(self, request: Request, status: str, message: str | None = None) -> None:
        if self.trainer.rank == 0:
            self.trainer.log.event("action", self.trainer.step, action=request.action or "unknown", status=status,
                                   request_id=request.request_id, operator=request.operator,
                                   reason=request.reason, message=message, args=request.args)

    # -- the actions (every rank, same outcome) ---------------------------------------
    def _rewind(self, request: Request) -> str:
        to_step = _int_arg(request, "to_step")
        trainer, sampler = self.trainer, self.trainer.sampler
        if to_step > trainer.step:
            raise Rejected(f"cannot rewind forward: to_step {to_step} is after the current step {trainer.step}")
        edits = sampler.skip_ranges, sampler.quarantined_shards  # operators' edits outlive a rewind
        before = (trainer.timeline, trainer.step)
        try:
            loaded = self.checkpointing.rewind(to_step)
        except CheckpointError as error:
            raise Rejected(f"the checkpoint could not be loaded: {error}") from None
        if loaded is None:
            raise Rejected(f"no checkpoint at or before step {to_step}")
        for first, last in edits[0]:
            sampler.skip(first, last)
        for shard in edits[1]:
            sampler.quarantine(shard)
        return (f"rewound from step {before[1]} of timeline {before[0]} to the checkpoint of step {trainer.step} "
                f"({loaded.path.name}); continuing on timeline {trainer.timeline}")

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
        if self.paused:
            raise Rejected("already paused")
        self.paused = True
        return f"paused after step {self.trainer.step}"

    def _resume(self, request: Request) -> str:
        if not self.paused:
            raise Rejected("not paused")
        self.paused = False
        return f"resumed after step {self.trainer.step}"

    def _stop(self, request: Request) -> str:
        self.stop_reason = f"stopped by {request.operator or 'an operator'} at step {self.trainer.step}: " \
                           f"{request.reason or 'no reason given'}"
        return f"stopping after step {self.trainer.step}: a final checkpoint, then run_end aborted"


def _int_arg(request: Request, name: str) -> int:
    value = request.args.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Rejected(f"{request.action} needs {name} as an integer >= 0, got {value!r}")
    return value
