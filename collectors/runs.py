"""Summaries of the runs in a directory, read from the files (no store needed)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import RunInfoError
from .layout import RunLayout, is_run_dir
from .runinfo import read_run_info

TAIL_BYTES = 64 << 10
LIVE_WITHIN_S = 120.0


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


def summarize_run(run_dir: Path, now: float | None = None) -> RunSummary:
    """Status, last step and last record time of a run, from run.json and the files' tails.

    The status follows the same rule as the store's ``run`` view.
    """
    layout = RunLayout(run_dir)
    try:
        info = read_run_info(layout)
    except RunInfoError:
        info = None
    files = sorted(layout.telemetry.glob("*.jsonl")) if layout.telemetry.is_dir() else []
    tails = [_tail_records(f) for f in files]
    times = [r["time"] for tail in tails for r in tail if isinstance(r.get("time"), (int, float))]
    last_seen = max(times, default=None)
    steps = [r["step"] for tail in tails for r in tail if r.get("kind") == "step" and isinstance(r.get("step"), int)]
    ends = {r.get("rank"): r.get("status") for tail in tails for r in tail if r.get("kind") == "run_end"}
    world = info.world_size if info else (len(files) or None)
    return RunSummary(
        path=run_dir,
        name=info.name if info else run_dir.name,
        run_id=info.run_id if info else "",
        world_size=world,
        status=_status(ends, world, last_seen, time.time() if now is None else now),
        last_step=max(steps, default=None),
        last_seen=last_seen,
        rank_files=len(files),
    )


def _status(ends: dict, world: int | None, last_seen: float | None, now: float) -> str:
    if "failed" in ends.values():
        return "failed"
    if "aborted" in ends.values():
        return "aborted"
    if ends and len(ends) >= (world or 1):
        return "finished"
    if last_seen is None:
        return "empty"
    return "live" if now - last_seen <= LIVE_WITHIN_S else "stalled"


def _tail_records(path: Path) -> list[dict]:
    """The complete, parseable records in the last ``TAIL_BYTES`` of ``path``."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - TAIL_BYTES))
        data = fh.read()
    lines = data.split(b"\n")[1:-1] if size > TAIL_BYTES else data.split(b"\n")[:-1]
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
