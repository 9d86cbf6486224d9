"""Whether anything will read a control request filed now: the run has not ended, and a control reader polls.

A loop that reads requests (the kit's ``ControlClient``) says so in rank 0's heartbeats
(``control: true``) at its first step boundary and every 10 s after. A request filed for a run
that has ended, or that no reader has polled for ``READER_STALE_S``, waits until a loop takes it,
if one ever does: ``bedside action`` and the dashboard warn (and file it all the same).
"""

from __future__ import annotations

import time
from pathlib import Path

from .appendfile import tail_records
from .format import RUN_END_STATUSES, Kind
from .layout import RunLayout
from .runs import summarize_run

READER_STALE_S = 120.0
"""A control heartbeat older than this is stale (the age after which a run counts as stalled)."""
TAIL_BYTES = 4 << 20
"""How much of rank 0's telemetry, from its end, is searched for the newest control heartbeat."""


def reader_warning(status: str, last_beat: float | None, now: float) -> str | None:
    """Why a request filed now may never be applied (the run's ``status``, the newest control heartbeat's
    unix time), or None when a reader polls."""
    if status in RUN_END_STATUSES:
        return (
            f"the run has {status} (run_end): no loop is left to read the request; "
            f"a resumed run with a control reader would take it"
        )
    if last_beat is None:
        return (
            "no control reader: no heartbeat of rank 0 says a loop polls this run's requests "
            "(the loop needs the kit's ControlClient); the request waits until one does"
        )
    if now - last_beat > READER_STALE_S:
        return (
            f"the control reader is stale: its last heartbeat was {now - last_beat:.0f} s ago "
            f"(more than {READER_STALE_S:.0f} s); the request waits until the loop reads it again"
        )
    return None


def last_control_beat(path: Path) -> float | None:
    """The unix time of the newest heartbeat with ``control: true`` in the end of a telemetry file."""
    beats = [
        r["time"]
        for r in tail_records(path, TAIL_BYTES)
        if r.get("kind") == Kind.HEARTBEAT and r.get("control") is True and isinstance(r.get("time"), (int, float))
    ]
    return max(beats, default=None)


def run_reader_warning(layout: RunLayout, now: float | None = None) -> str | None:
    """``reader_warning`` of the run at ``layout``, from its files' tails (no store needed)."""
    now = time.time() if now is None else now
    status = summarize_run(layout.root, now).status
    return reader_warning(status, last_control_beat(layout.rank_file(0)), now)


ANSWERS = ("applied", "rejected")
"""The statuses that end a request: rank 0 writes one of them once."""


def request_answer(layout: RunLayout, request_id: str) -> dict | None:
    """Rank 0's newest ``action`` record of ``request_id`` in the end of its telemetry (``requested``, then
    ``applied`` or ``rejected``), or None when it has written none."""
    answers = [
        r
        for r in tail_records(layout.rank_file(0), TAIL_BYTES)
        if r.get("kind") == Kind.ACTION and r.get("request_id") == request_id and isinstance(r.get("status"), str)
    ]
    return answers[-1] if answers else None  # the file's order is the order rank 0 wrote them


def await_answer(layout: RunLayout, request_id: str, wait_s: float, poll_s: float = 0.25) -> dict | None:
    """Rank 0's answer to ``request_id`` (``applied`` or ``rejected``) as soon as it is written, within ``wait_s``;
    its newest record (``requested``: taken, not yet answered) or None when the time ran out first."""
    deadline = time.monotonic() + wait_s
    while True:
        answer = request_answer(layout, request_id)
        if (answer is not None and answer["status"] in ANSWERS) or time.monotonic() >= deadline:
            return answer
        time.sleep(poll_s)
