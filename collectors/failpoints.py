"""Failpoints: a process that kills itself at a named point of the code, so a crash test can land a SIGKILL inside
the narrowest window on purpose instead of hoping a random kill finds it (the idea of fail-rs and FoundationDB's
buggify, with one action).

``BEDSIDE_FAILPOINTS="store.commit=5"`` makes the process SIGKILL itself the 5th time it reaches
``store.commit`` (a write transaction's rows are in, its COMMIT not yet run). Unset, as in every real run, a
failpoint costs one test of an empty dict.
"""

from __future__ import annotations

import os
import signal

ENV = "BEDSIDE_FAILPOINTS"


def _armed(spec: str) -> dict[str, int]:
    """``name=N,...`` -> {name: N}; a malformed entry is an error at import, never a silent no-op."""
    armed = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = entry.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            raise ValueError(f"{ENV}: {entry!r} is not NAME=N with N >= 1")
        armed[name] = int(count)
    return armed


_ARMED = _armed(os.environ.get(ENV, ""))
_REACHED: dict[str, int] = {}


def reach(name: str) -> None:
    """Count a pass through failpoint ``name``; SIGKILL this process at the pass its setting names."""
    if not _ARMED or name not in _ARMED:
        return
    _REACHED[name] = _REACHED.get(name, 0) + 1
    if _REACHED[name] == _ARMED[name]:
        os.kill(os.getpid(), signal.SIGKILL)
