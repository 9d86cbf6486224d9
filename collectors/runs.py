"""Summaries of the runs in a directory, read from the files (no run's store needed).

The status comes from the facts read in the files' tails by the rule the store's
``run`` view applies: the ``run_status`` macro, evaluated in an in-memory store.
"""

from __future__ import annotations

import stat
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypeGuard

from .appendfile import tail_records
from .errors import RunInfoError
from .format import RUN_END_STATUSES, Kind, RunEndStatus
from .layout import RunLayout, is_run_dir, rank_of_file
from .runinfo import read_run_info
from .store import Store

TAIL_BYTES = 64 << 10


@dataclass(frozen=True)
class RunSummary:
    """One line of ``bedside runs``."""

    path: Path
    name: str
    run_id: str
    world_size: int | None
    status: str
    last_step: int | None
    last_seen: float | None
    rank_files: int


def find_runs(root: Path) -> list[Path]:
    """``root`` itself when it is a run, else its run subdirectories (one level)."""
    if is_run_dir(root):
        return [root]
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and is_run_dir(p))


def newest_runs(root: Path) -> list[Path]:
    """``find_runs``, the most recently changed run folder first."""
    return sorted(find_runs(root), key=lambda p: p.stat().st_mtime, reverse=True)


def summarize_run(run_dir: Path, now: float | None = None) -> RunSummary:
    """Status, last step and last record time of a run, from run.json and the files' tails."""
    layout = RunLayout(run_dir)
    try:
        info = read_run_info(layout)
    except RunInfoError:
        info = None
    files = [
        f
        for f in layout.source_files()
        if f.parent == layout.telemetry and rank_of_file(f) is not None and _is_regular(f)
    ]
    records = [r for f in files for r in tail_records(f, TAIL_BYTES)]
    last_seen = max((r["time"] for r in records if _is_number(r.get("time"))), default=None)
    steps = [r["step"] for r in records if r.get("kind") == Kind.STEP and _is_integer(r.get("step"))]
    rank_files = {rank_of_file(f) for f in files} - {None}
    world = info.world_size if info else (len(rank_files) or None)
    return RunSummary(
        path=run_dir,
        name=info.name if info else run_dir.name,
        run_id=info.run_id if info else "",
        world_size=world,
        status=_status(_ended_ranks(records), world or 0, last_seen, time.time() if now is None else now),
        last_step=max(steps, default=None),
        last_seen=last_seen,
        rank_files=len(files),
    )


def _is_regular(path: Path) -> bool:
    """True for a regular file (not a link, FIFO or directory); the reader checks again on its descriptor."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _ended_ranks(records: list[dict]) -> dict[int, str]:
    """Rank to run_end status, for the ranks whose latest record (by time, then seq) is a run_end.

    A run_end without a status of ``RunEndStatus`` is no record of its rank: the collector rejects it.
    """
    latest: dict[int, dict] = {}
    for record in records:
        rank = record.get("rank")
        if (
            _is_integer(rank)
            and _is_number(record.get("time"))
            and not _is_bad_end(record)
            and (rank not in latest or _place(record) >= _place(latest[rank]))
        ):
            latest[rank] = record
    return {rank: r["status"] for rank, r in latest.items() if r.get("kind") == Kind.RUN_END}


def _is_bad_end(record: dict) -> bool:
    return record.get("kind") == Kind.RUN_END and record.get("status") not in RUN_END_STATUSES


def _place(record: dict) -> tuple[float, int]:
    """Where a record stands in its rank's history: its time, then its seq."""
    seq = record.get("seq")
    return record["time"], seq if _is_integer(seq) else -1


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _status(ends: dict[int, str], world: int, last_seen: float | None, now: float) -> str:
    """The run view's status for these facts (``run_status`` of migrations/008_run_status.sql)."""
    facts = {
        "any_failed": RunEndStatus.FAILED in ends.values(),
        "any_aborted": RunEndStatus.ABORTED in ends.values(),
        "ranks_ended": len(ends),
        "world_size": world,
        "last_seen": last_seen,
        "now": now,
    }
    return str(_rule_store().fetch_named("status_of_facts", facts)["status"].iloc[0])


@cache
def _rule_store() -> Store:
    """An empty in-memory store, for its ``run_status`` macro (one per process)."""
    return Store.open(None)
