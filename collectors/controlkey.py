"""The control key: the secret that signs action requests, so a file dropped into ``control/requests/``
by someone who does not hold it is rejected.

The key is ``$BEDSIDE_CONTROL_KEY`` when that is set (at least 16 characters), else the file
``RUN/control/key`` (mode 0600), which rank 0 of the trainer creates when the run starts. Whoever
files a request (``bedside action``, the dashboard) reads the key through ``read_control_key``; the
trainer checks ``request_signature_problem``. A signature is HMAC-SHA256, in hex, over the request's
canonical JSON (every field but ``signature``, keys sorted, no spaces, ASCII). That JSON holds the
``run_id`` of the run it was filed for (``run_identity``: run.json's), so a request copied into another
run's ``control/requests/`` is refused there even when both runs share one key. Format:
docs/telemetry-format.md, "Control requests"; threat model: docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import BedsideError, RunInfoError
from .layout import RunLayout
from .runinfo import read_run_info
from .safefile import UnsafeFileError, read_small_file

KEY_ENV = "BEDSIDE_CONTROL_KEY"
KEY_FILE = "key"
MIN_KEY_CHARS = 16
SIGNATURE = "signature"
RUN_ID = "run_id"
_MAX_KEY_BYTES = 4096


class ControlKeyError(BedsideError):
    """No usable control key: missing, unreadable, too short, or a file others could have written."""


def key_path(layout: RunLayout) -> Path:
    return layout.control / KEY_FILE


def read_control_key(layout: RunLayout) -> bytes:
    """The run's control key, for signing a request; ControlKeyError saying how to get access."""
    if (from_env := _key_from_env()) is not None:
        return from_env
    path = key_path(layout)
    if not os.path.lexists(path):
        raise ControlKeyError(
            f"no control key: {path} does not exist (the trainer creates it when the run starts) "
            f"and {KEY_ENV} is not set"
        )
    return _read_key_file(path)


def ensure_control_key(layout: RunLayout) -> bytes:
    """The trainer's side: the key from the environment, else ``RUN/control/key``, created (0600) when missing.

    A key file that is not owned by this user or that others may write is refused: anyone could have put it there.
    """
    if (from_env := _key_from_env()) is not None:
        return from_env
    path = key_path(layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        key, info = _read_key_file(path), os.lstat(path)
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise ControlKeyError(
                f"{path} is not owned by this user or is writable by others (mode "
                f"{info.st_mode & 0o777:o}): refused; remove it and restart"
            ) from None
        return key
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return _read_key_file(path)


def run_identity(layout: RunLayout) -> str:
    """The run id a request for this run is bound to (run.json's); ControlKeyError when the run has none."""
    try:
        info = read_run_info(layout)
    except RunInfoError as error:
        raise ControlKeyError(f"cannot tell which run this is: {error}") from None
    if info is None:
        raise ControlKeyError(
            f"cannot tell which run this is: {layout.run_info} does not exist (rank 0 of the "
            "trainer writes it when the run starts)"
        )
    return info.run_id


def canonical_request(request: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: every field but ``signature``, as compact sorted ASCII JSON."""
    body = {name: value for name, value in request.items() if name != SIGNATURE}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def sign_request(request: Mapping[str, Any], key: bytes) -> str:
    """The request's signature (HMAC-SHA256 of its canonical JSON, hex)."""
    return hmac.new(key, canonical_request(request), hashlib.sha256).hexdigest()


def request_signature_problem(request: Mapping[str, Any], key: bytes, run_id: str) -> str | None:
    """Why ``request`` is not signed with ``key`` for the run ``run_id``, or None when it is."""
    given = request.get(SIGNATURE)
    if given is None:
        return "unsigned: a request must carry the signature made with the run's control key"
    if not isinstance(given, str):
        return f"signature must be a hex string, got {type(given).__name__}"
    try:
        expected = sign_request(request, key)
    except (TypeError, ValueError) as error:
        return f"cannot be signed: {error}"
    if not hmac.compare_digest(given.encode("ascii", "replace"), expected.encode()):
        return "bad signature: not made with the run's control key, or the request was altered after signing"
    if (bound := request.get(RUN_ID)) != run_id:
        if bound is None:
            return f"not bound to a run: a request must carry the run_id it was filed for (this run is {run_id!r})"
        return f"filed for run {bound!r}, not for this run {run_id!r}: a request is valid only for its own run"
    return None


_held: str | None = None
"""The key a serving process took out of its environment (``hold_control_key``), used as ``$BEDSIDE_CONTROL_KEY``."""


def hold_control_key(value: str) -> None:
    """Keep ``value`` as this process's ``$BEDSIDE_CONTROL_KEY`` once it is gone from the environment (``bedside
    serve``: app/serve_secrets.py)."""
    global _held
    _held = value


def _key_from_env() -> bytes | None:
    value = _held if _held is not None else os.environ.get(KEY_ENV)
    if not value:
        return None
    if len(value.strip()) < MIN_KEY_CHARS:
        raise ControlKeyError(f"{KEY_ENV} is too short: at least {MIN_KEY_CHARS} characters")
    return value.strip().encode()


def _read_key_file(path: Path) -> bytes:
    try:
        key = read_small_file(path, _MAX_KEY_BYTES).strip()
    except UnsafeFileError as error:
        raise ControlKeyError(
            f"cannot read the control key {path}: {error} (filing a request needs read access to it, or {KEY_ENV})"
        ) from None
    if len(key) < MIN_KEY_CHARS:
        raise ControlKeyError(f"the control key {path} is too short: at least {MIN_KEY_CHARS} characters")
    return key
