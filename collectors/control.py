"""Filing control requests for a live run (the writer side of ``RUN/control/``).

One JSON file per request, ``RUN/control/requests/<request_id>.json``, written
atomically (a hidden temporary file, fsync, rename) so the trainer never reads half
a request. Each request names the run it is for (``run_id``) and is signed with the run's
control key (``controlkey.py``), so the trainer can tell it from a file anyone could drop there
or one filed for another run. The trainer reads, applies and acknowledges them
(``kit/actions.py`` over ``control_inbox.py``) and moves each handled file to ``RUN/control/processed/``. Format: docs/telemetry-format.md, "Control requests".
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .atomicjson import write_json_atomic
from .controlkey import RUN_ID, SIGNATURE, read_control_key, run_identity, sign_request
from .layout import RunLayout

ACTION_ARGS: dict[str, tuple[str, ...]] = {
    "rewind": ("to_step",),
    "skip": ("first_batch", "last_batch"),
    "quarantine": ("shard",),
    "pause": (),
    "resume": (),
    "checkpoint": (),
    "stop": (),
}
ACTIONS = tuple(ACTION_ARGS)
MAX_LIFETIME_S = 7 * 86400.0
"""The longest a signed request may stay valid (``expires_at - requested_at``); rank 0 refuses longer."""
REQUEST_LIFETIME_S = 3600.0
"""How long a request stays valid by default: a loop that takes it later refuses it as expired (an hour-old
rewind aims at a run that has moved on)."""


def request_action(
    layout: RunLayout,
    action: str,
    args: Mapping[str, Any] | None = None,
    *,
    operator: str,
    reason: str,
    lifetime_s: float = REQUEST_LIFETIME_S,
) -> str:
    """File one signed request for the run at ``layout``, valid for ``lifetime_s``; its request id. ValueError
    on a bad request, ControlKeyError (nothing filed) without access to the run's control key or its run.json."""
    request = build_request(action, args or {}, operator=operator, reason=reason, lifetime_s=lifetime_s)
    key = read_control_key(layout)
    request[RUN_ID] = run_identity(layout)
    request[SIGNATURE] = sign_request(request, key)
    write_request(layout.control_requests, request)
    return request["request_id"]


def build_request(
    action: str, args: Mapping[str, Any], *, operator: str, reason: str, lifetime_s: float = REQUEST_LIFETIME_S
) -> dict[str, Any]:
    """A checked request with a new id (unique: the time in nanoseconds and 32 random bits), valid for
    ``lifetime_s`` from now, not yet bound to a run."""
    checked = check_args(action, args)
    if not 0 < lifetime_s <= MAX_LIFETIME_S:
        raise ValueError(f"a request's lifetime must be within (0, {MAX_LIFETIME_S:.0f}] s, got {lifetime_s}")
    if not str(reason or "").strip():
        raise ValueError("a request needs a reason")
    if not str(operator or "").strip():
        raise ValueError("a request needs an operator")
    now = time.time()
    return {
        "request_id": new_request_id(),
        "action": action,
        "args": checked,
        "operator": str(operator),
        "reason": str(reason),
        "requested_at": now,
        "expires_at": now + lifetime_s,
    }


def check_args(action: str, args: Mapping[str, Any]) -> dict[str, int]:
    """``args`` of ``action`` as integers >= 0; ValueError naming what is unknown, missing or wrong."""
    if action not in ACTION_ARGS:
        raise ValueError(f"unknown action {action!r}: expected one of {', '.join(ACTIONS)}")
    expected = ACTION_ARGS[action]
    if unknown := sorted(set(args) - set(expected)):
        raise ValueError(f"{action} takes {_names(expected) or 'no arguments'}, not {', '.join(unknown)}")
    if missing := [name for name in expected if args.get(name) is None]:
        raise ValueError(f"{action} needs {', '.join(missing)}")
    checked = {name: _non_negative_int(name, args[name]) for name in expected}
    if action == "skip" and checked["first_batch"] > checked["last_batch"]:
        raise ValueError(
            f"skip needs first_batch <= last_batch, got {checked['first_batch']} > {checked['last_batch']}"
        )
    return checked


def new_request_id() -> str:
    """``req-<unix ns>-<8 hex>``: unique, and sorting by id sorts by filing time."""
    return f"req-{time.time_ns():019d}-{secrets.token_hex(4)}"


def write_request(folder: Path, request: Mapping[str, Any]) -> Path:
    """Write ``request`` as ``folder/<request_id>.json`` atomically; the path."""
    final = folder / f"{request['request_id']}.json"
    write_json_atomic(final, request)
    return final


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names)
