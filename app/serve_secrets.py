"""A serving process keeps no secret in its environment: the control key and the operator token are taken
from it at start, and the process starts again without them.

Deleting a variable from ``os.environ`` hides it from child processes but not from ``/proc/PID/environ``,
which shows the environment the process was started with to anyone who may read the process's files.
So ``bedside serve`` started with ``BEDSIDE_CONTROL_KEY`` or ``BEDSIDE_OPERATOR_TOKEN`` writes them into a
pipe, executes itself again with neither in its environment (only the pipe's descriptor number), and the
new process image reads them from the pipe and closes it. docs/security.md, "A store is data, never code".
"""

from __future__ import annotations

import json
import os
import sys

from bedside.collectors.controlkey import KEY_ENV

from .dashboard.auth import TOKEN_ENV

SECRET_ENVS = (KEY_ENV, TOKEN_ENV)
FD_ENV = "BEDSIDE_SECRETS_FD"
"""Set only between the two images of one ``bedside serve``: the descriptor its secrets are read from."""
MAX_SECRETS_BYTES = 16 << 10  # well under a pipe's buffer, so the write never waits for the reader


def take_secrets(*, start_again: bool) -> dict[str, str]:
    """The secrets this process was given, by variable name, none of them left in ``os.environ``; with
    ``start_again`` (a command line, not a call from Python), a process whose environment held any executes
    itself again without them and the new image returns them."""
    if FD_ENV in os.environ:
        return _read_handed(int(os.environ.pop(FD_ENV)))
    given = {name: os.environ.pop(name) for name in SECRET_ENVS if name in os.environ}
    if given and start_again:
        data = json.dumps(given).encode()
        if len(data) > MAX_SECRETS_BYTES:
            raise ValueError(f"the secrets in the environment are {len(data)} bytes, more than {MAX_SECRETS_BYTES}")
        readable, writable = os.pipe()
        os.write(writable, data)
        os.close(writable)
        os.set_inheritable(readable, True)
        argv = [sys.executable, "-m", "bedside.app.cli", *sys.argv[1:]]
        os.execve(sys.executable, argv, {**os.environ, FD_ENV: str(readable)})
    return given


def _read_handed(descriptor: int) -> dict[str, str]:
    with os.fdopen(descriptor, "rb") as pipe:
        data = pipe.read(MAX_SECRETS_BYTES + 1)
    secrets = json.loads(data)
    return {name: str(secrets[name]) for name in SECRET_ENVS if name in secrets}
