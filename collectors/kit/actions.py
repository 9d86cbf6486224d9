"""Control requests in any training loop: the same actions on every rank at the same step, each answered once.

Every rank calls ``ControlClient.actions(step)`` (or ``at_step_boundary(step)``) at each step
boundary. Rank 0 looks into the run's inbox (``control_inbox.py``: one ``stat`` when nothing was
filed); every rank joins one broadcast of the number of requests taken, and only when there are
some rank 0 broadcasts them. Rank 0 acknowledges each in telemetry (``action`` records:
``requested`` when taken, then ``applied`` or ``rejected`` with the reason); a request that is
unreadable, unsigned, a duplicate or not to be repeated after a restart is rejected before the loop
sees it, and one the loop leaves unanswered is rejected at the next boundary.

Rank 0's heartbeats say a control reader is polling (``control: true``), written at the first
boundary and then every ``CONTROL_HEARTBEAT_S``: ``bedside action`` warns when it sees none.
The ids handled and the pause are the client's state (``state_dict``): keep it in the loop's
checkpoints, so that a restart hands over again only what the restored state lacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..control import ACTION_ARGS
from ..control_inbox import (
    REPEATABLE_ACTIONS,
    RETAKEN_NOTE,
    ControlState,
    Rejected,
    Request,
    RequestInbox,
    open_inbox,
)
from ..writer import RunLogger

PAUSE_POLL_S = 1.0
CONTROL_HEARTBEAT_S = 10.0
Handler = Callable[["Action"], str | None]
"""A loop's handler of one action: what was done (None: "applied"), or ``Rejected(reason)`` raised."""


@dataclass
class Action:
    """One request handed to the loop, the same on every rank; answer it once with ``applied`` or ``rejected``."""

    request: Request
    step: int
    """The step its answer is recorded at: a rewind's handler sets the step it restored."""
    client: ControlClient = field(repr=False)
    status: str | None = None
    """None while open; then ``applied`` or ``rejected`` (``deferred``: a helper answers it later)."""
    details: dict[str, Any] = field(default_factory=dict)
    """What its answer adds to its ``args`` (a deferred skip: the sample ids dropped so far)."""

    @property
    def action(self) -> str:
        return self.request.action

    @property
    def args(self) -> dict[str, Any]:
        return self.request.args

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def operator(self) -> str | None:
        return self.request.operator

    @property
    def reason(self) -> str | None:
        return self.request.reason

    @property
    def retaken(self) -> bool:
        return self.request.retaken

    def applied(self, message: str = "applied", **details: Any) -> None:
        """Acknowledge it as done (rank 0 writes the record; ``details`` join its ``args``)."""
        self._answer("applied", message, details)

    def rejected(self, reason: str) -> None:
        """Acknowledge it as not done, and why (with its ``details``: what a deferred one did meanwhile)."""
        self._answer("rejected", reason, {})

    def defer(self) -> None:
        """Leave the answer to a helper that applies it later (``SkippingSampler``), at a later step."""
        if self.status is not None:
            raise ValueError(f"request {self.request_id} is already {self.status}")
        self.status = "deferred"
        self.client.deferred[self.request_id] = self

    def _answer(self, status: str, message: str, details: dict[str, Any]) -> None:
        if self.status not in (None, "deferred"):
            raise ValueError(f"request {self.request_id} is already {self.status}: an action is answered once")
        self.status = status
        self.client.deferred.pop(self.request_id, None)
        args = {**self.request.args, **self.details, **details}
        self.client.acknowledge(self.request, status, message, args, step=self.step)


class ControlClient:
    """A loop's reader of control requests; every rank makes one (the constructor may make a gloo group).

    Handlers (``on_rewind``, ``on_skip``, ``on_quarantine``, ``on_checkpoint``, ``on_stop``, or
    ``handlers={"name": fn}``) serve ``at_step_boundary``; pause and resume are the client's own
    (``on_pause``/``on_resume`` are told of them). ``group``: the process group to broadcast in
    (default: the default group when it is gloo, else a new gloo group).
    """

    def __init__(
        self,
        run_logger: RunLogger,
        *,
        on_rewind: Handler | None = None,
        on_skip: Handler | None = None,
        on_quarantine: Handler | None = None,
        on_checkpoint: Handler | None = None,
        on_stop: Handler | None = None,
        on_pause: Handler | None = None,
        on_resume: Handler | None = None,
        handlers: dict[str, Handler] | None = None,
        group: Any = None,
        state: ControlState | None = None,
        pause_poll_s: float = PAUSE_POLL_S,
    ) -> None:
        self.log, self.rank = run_logger, run_logger.rank
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if self.distributed and group is None and dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo")  # a CPU channel: no device sync at the boundary
        self.group = group
        self.state = state if state is not None else ControlState()
        self.pause_poll_s = pause_poll_s
        self.stop_reason: str | None = None
        self.step = 0
        self.deferred: dict[str, Action] = {}
        self.handlers: dict[str, Handler] = {
            name: fn
            for name, fn in (
                ("rewind", on_rewind),
                ("skip", on_skip),
                ("quarantine", on_quarantine),
                ("checkpoint", on_checkpoint),
                ("stop", on_stop),
            )
            if fn is not None
        } | dict(handlers or {})
        self._told = {"pause": on_pause, "resume": on_resume}
        self._open: list[Action] = []
        self._count = torch.zeros(1, dtype=torch.int64)
        self._beat_at: float | None = None
        self.inbox = self._open_inbox() if self.rank == 0 else None

    def _open_inbox(self) -> RequestInbox:
        inbox, problem = open_inbox(self.log.layout)
        if problem is not None:
            self.log.log(0, f"{problem}; every control request will be rejected", level="error")
        return inbox

    # -- the loop's calls ---------------------------------------------------------
    def actions(self, step: int) -> list[Action]:
        """The requests to act on at ``step``, the same on every rank (every rank must call it, at every
        boundary); what the previous call handed over and was left unanswered is rejected first."""
        self.step = step
        self._reject_unanswered()
        self._beat(step)
        requests = self._receive()
        handed = []
        for request in requests:
            self.acknowledge(request, "requested", RETAKEN_NOTE if request.retaken else None)
            self.state.handled.add(request.request_id)
            action = Action(request, step, self)
            if problem := request.problem or _not_repeated(request):
                action.rejected(problem)
            else:
                handed.append(action)
        self._open = list(handed)
        return handed

    def at_step_boundary(self, step: int) -> bool:
        """Hand each request to its handler (waiting while paused, a heartbeat a poll); False once a stop was
        applied: the loop should end."""
        self._dispatch(self.actions(step))
        while self.state.paused and self.stop_reason is None:
            if self.rank == 0:  # rank 0 sets the pace; the others wait in the broadcast
                time.sleep(self.pause_poll_s)
                self._beat_at = None  # a heartbeat a poll, with the control flag
            else:
                self.log.heartbeat(self.step)
            self._dispatch(self.actions(self.step))
        return self.stop_reason is None

    def close(self, step: int, refusal: str = "the run finished before it could be applied") -> None:
        """At the end of the loop (every rank): reject what is still filed, open or deferred, so every request
        gets an answer."""
        for action in self.actions(step):
            action.rejected(refusal)
        for action in list(self.deferred.values()):
            action.step = step
            action.rejected(refusal)

    def state_dict(self) -> dict[str, Any]:
        """The ids handled and the pause: keep them in the loop's checkpoints."""
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any], step: int = 0) -> None:
        """Restore ``state_dict()`` after a restart at ``step``, and ``recover``."""
        self.state.load_state_dict(state)
        self.recover(step)

    def recover(self, step: int) -> None:
        """After a restart at ``step``: the next boundary hands over again what the restored state lacks; a run
        restored paused stays paused, and says so."""
        self.step = step
        if self.inbox is not None:
            self.inbox.retake(self.state.handled)
        if self.state.paused and self.rank == 0:
            self.log.log(step, "restored paused: file a resume request to continue", "warning")

    def acknowledge(
        self,
        request: Request,
        status: str,
        message: str | None = None,
        args: dict[str, Any] | None = None,
        *,
        step: int | None = None,
    ) -> None:
        """One ``action`` record of ``request`` (rank 0 writes it), at ``step`` (default: the current one)."""
        if self.rank == 0:
            self.log.event(
                "action",
                self.step if step is None else step,
                action=request.action or "unknown",
                status=status,
                request_id=request.request_id,
                operator=request.operator,
                reason=request.reason,
                message=message,
                args=request.args if args is None else args,
            )

    def action_for(self, request: Request) -> Action:
        """A deferred action again (a helper restoring its state after a restart), answered later."""
        action = Action(request, self.step, self, status="deferred")
        self.deferred[request.request_id] = action
        return action

    # -- inside -------------------------------------------------------------------
    def _dispatch(self, actions: Iterable[Action]) -> None:
        for action in actions:
            action.step = self.step  # an earlier rewind of this boundary moved it
            try:
                message = self._apply(action)
            except Rejected as error:
                action.rejected(str(error))
            else:
                if action.status is None:
                    action.applied(message or "applied")
            self.step = action.step

    def _apply(self, action: Action) -> str | None:
        name = action.action
        if name in self._told:
            paused = self._pause(name == "pause")
            if told := self._told[name]:
                told(action)
            return paused
        if name not in self.handlers and name != "stop":
            raise Rejected(_unhandled(name))
        message = self.handlers[name](action) if name in self.handlers else None
        return self._stop(action, message) if name == "stop" else message

    def _pause(self, pause: bool) -> str:
        if self.state.paused == pause:
            raise Rejected("already paused" if pause else "not paused")
        self.state.paused = pause
        return f"{'paused' if pause else 'resumed'} after step {self.step}"

    def _stop(self, action: Action, message: str | None) -> str:
        self.stop_reason = (
            f"stopped by {action.operator or 'an operator'} at step {self.step}: {action.reason or 'no reason given'}"
        )
        return message or f"stopping after step {self.step}"

    def _reject_unanswered(self) -> None:
        for action in self._open:
            if action.status is None:
                action.step = self.step
                action.rejected(_unhandled(action.action))
        self._open = []

    def _beat(self, step: int) -> None:
        """Rank 0's heartbeat that says a control reader polls: now and then, never at every step."""
        now = time.monotonic()
        if self.rank == 0 and (self._beat_at is None or now - self._beat_at >= CONTROL_HEARTBEAT_S):
            self._beat_at = now
            self.log.heartbeat(step, control=True)

    def _receive(self) -> list[Request]:
        requests = self.inbox.poll(self.state.handled) if self.inbox is not None else []
        if not self.distributed:
            return requests
        self._count[0] = len(requests)
        dist.broadcast(self._count, src=0, group=self.group)
        if int(self._count[0]) == 0:
            return []
        box: list[Any] = [requests]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def _not_repeated(request: Request) -> str | None:
    if request.retaken and request.action not in REPEATABLE_ACTIONS:
        return f"not repeated after a restart: a {request.action} request acts on the process that received it"
    return None


def _unhandled(action: str) -> str:
    """Why an action the loop did not answer is rejected."""
    if action not in ACTION_ARGS:
        return f"unknown action {action!r}"
    return f"no handler for {action!r} in this loop: it was not applied"


def int_arg(action: Action, name: str) -> int:
    """The argument ``name`` of ``action`` as an integer >= 0, or ``Rejected`` naming what it is."""
    value = action.args.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Rejected(f"{action.action} needs {name} as an integer >= 0, got {value!r}")
    return value
