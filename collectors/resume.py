"""Opening a run directory that already holds telemetry: refuse, or resume on a new timeline.

A second run written into the same directory on timeline 0 would read as one run that went
back to step 0, and the detectors would call the second copy a divergence. ``RunLogger``
therefore refuses a rank file that already holds records unless it is told ``resume=True``.

Resuming continues on a new timeline, the same on every rank, one past the newest timeline
any rank file's tail carries. Rank 0 decides, reading every rank file's tail before it writes
anything, and records the decision in ``RUN/resume.json`` (written atomically). Every other
rank waits for a decision newer than its own file: one whose timeline is past every timeline
in that file, or, for a rank that has no file yet (a job relaunched with more ranks), one
written after this process started (less ``CLOCK_SKEW_S`` for the clocks of other hosts).
The ranks need no collective of their own, so the writer stays free of torch.distributed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .appendfile import tail_records
from .atomicjson import write_json_atomic
from .errors import BedsideError
from .layout import RunLayout

RESUME_FILE = "resume.json"
DEFAULT_RESUME_WAIT_S = 120.0
CLOCK_SKEW_S = 60.0
POLL_S = 0.05
STARTED = time.time()
"""When this process loaded the writer: a decision older than that belongs to an earlier launch."""


class RunExistsError(BedsideError, FileExistsError):
    """A rank's file already holds telemetry and the logger was not asked to resume."""


class ResumeTimeoutError(BedsideError, TimeoutError):
    """Rank 0 did not record the resumed timeline in time."""


def refusal(layout: RunLayout, rank: int, last: dict[str, Any]) -> RunExistsError:
    """The error for a rank file that already holds ``last`` as its newest record."""
    ranks = sorted(layout.telemetry.glob("rank-*.jsonl"))
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(last.get("time", 0))))
    return RunExistsError(
        f"{layout.root} already holds a run: {len(ranks)} rank file(s) in telemetry/, and rank {rank}'s last "
        f"record is a {last.get('kind')} record of step {last.get('step')} on timeline {last.get('timeline')} "
        f"({when}). Writing again would add a second copy of the run from step 0. Either continue it with "
        f"RunLogger({str(layout.root)!r}, resume=True), which starts a new timeline, or log to a new directory."
    )


def newest_timeline(layout: RunLayout) -> int | None:
    """The newest timeline in the tail of any rank file, None when no rank file holds a record."""
    timelines = [
        record["timeline"]
        for path in layout.telemetry.glob("rank-*.jsonl")
        for record in tail_records(path)
        if isinstance(record.get("timeline"), int)
    ]
    return max(timelines) if timelines else None


def decide_timeline(layout: RunLayout) -> int:
    """Rank 0: the resumed run's timeline, recorded for the other ranks."""
    newest = newest_timeline(layout)
    timeline = 0 if newest is None else newest + 1
    write_json_atomic(layout.root / RESUME_FILE, {"timeline": timeline, "previous": newest, "time": time.time()})
    return timeline


def await_timeline(layout: RunLayout, rank: int, wait_s: float) -> int:
    """Any other rank: the timeline rank 0 decided for this launch, once it is recorded."""
    own = [r["timeline"] for r in tail_records(layout.rank_file(rank)) if isinstance(r.get("timeline"), int)]
    deadline = time.monotonic() + wait_s
    while True:
        decision = _read_decision(layout.root / RESUME_FILE)
        if decision is not None and _is_current(decision, own):
            return int(decision["timeline"])
        if time.monotonic() > deadline:
            raise ResumeTimeoutError(
                f"rank {rank} waited {wait_s:g} s for rank 0 to record the resumed timeline in "
                f"{layout.root / RESUME_FILE}: open rank 0's RunLogger with resume=True too, or pass timeline="
            )
        time.sleep(POLL_S)


def _is_current(decision: dict[str, Any], own_timelines: list[int] | None) -> bool:
    if own_timelines:
        return int(decision["timeline"]) > max(own_timelines)
    return float(decision["time"]) >= STARTED - CLOCK_SKEW_S


def _read_decision(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(value, dict)
        and isinstance(value.get("timeline"), int)
        and isinstance(value.get("time"), (int, float))
    )
    return value if ok else None
