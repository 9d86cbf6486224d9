"""Goodput: every second of a run's wall time in one category, and the FLOPs of progress kept or lost.

Over the sample run with a rewind (timeline 0's steps 61-85 abandoned), and over runs written record by record
with known times: a crash and a resume from a checkpoint (the steps trained again), a pause by the on-call, an
eval and a checkpoint save between steps."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from bedside.collectors.store import Store

SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "sample_runs"
T0 = 1_800_000_000.0


def goodput(store: Store) -> dict[str, dict]:
    frame = store.cursor().execute("SELECT * FROM goodput").df()
    return {row["category"]: row for row in frame.to_dict("records")}


def test_the_rewound_sample_run_is_split_into_kept_and_abandoned_progress(tmp_path: Path, ingest) -> None:
    run = shutil.copytree(SAMPLE_RUNS / "tiny-rewind", tmp_path / "run", ignore=shutil.ignore_patterns("*.duckdb*"))
    store = ingest(run)
    rows = goodput(store)
    assert rows["abandoned_timeline"]["steps"] == 25  # timeline 0's steps 61-85: the rewind went back to step 60
    assert rows["productive"]["steps"] == 160  # 1-60 on timeline 0, then 61-160 on timeline 1
    sql = store.cursor().execute
    [(flops,)] = sql("SELECT sum(flops) FROM step_metrics WHERE timeline = 0 AND step > 60").fetchall()
    assert rows["abandoned_timeline"]["flops"] == pytest.approx(flops)
    [(first, last)] = sql("SELECT min(time), max(time) FROM (SELECT time FROM steps UNION ALL "
                          "SELECT time FROM events UNION ALL SELECT time FROM checkpoints)").fetchall()  # fmt: skip
    assert sum(row["seconds"] for row in rows.values()) == pytest.approx(last - first)
    assert sum(row["share"] for row in rows.values()) == pytest.approx(1.0)
    assert {"checkpoint_restore", "checkpoint_save", "eval", "startup"} <= set(rows)
    assert [row["category"] for row in rows.values() if row["useful"]] == ["productive"]


def steps(write: Callable, first: int, last: int, start: float, *, seconds: float = 1.0, timeline: int = 0) -> float:
    """Job step records (rank 0) and both ranks' phases for ``first``..``last``, one every ``seconds``; the time
    of the last."""
    time = start
    for step in range(first, last + 1):
        time += seconds
        envelope = {"time": time, "step": step, "timeline": timeline, "seq": 0}
        write([{**envelope, "kind": "step", "rank": 0, "metrics": {"loss": 1.0, "flops": 10.0, "tokens": 4.0}}])
        for rank in (0, 1):
            metrics = {"step_time": 0.8 * seconds, "data_time": 0.1 * seconds}
            write([{**envelope, "kind": "rank_step", "rank": rank, "metrics": metrics}], rank=rank)
    return time


def started(write: Callable, time: float) -> None:
    for rank in (0, 1):
        write([{"kind": "rank_info", "time": time, "rank": rank, "step": 0, "timeline": 0, "seq": 0, "host": "h"}],
              rank=rank)  # fmt: skip


def event(write: Callable, kind: str, time: float, step: int, **fields) -> None:
    write([{"kind": kind, "time": time, "rank": 0, "step": step, "timeline": 0, "seq": 0, **fields}])


def test_a_crash_and_resume_counts_the_steps_trained_again_and_the_time_down(
    run_dir: Path, write_lines, ingest
) -> None:
    started(write_lines, T0)
    end = steps(write_lines, 1, 10, T0 + 5)  # startup 5 s; a checkpoint of step 5 saved on the way
    event(write_lines, "checkpoint", T0 + 10.5, 5, event="save_started")
    # the job dies after step 10; a new job starts 100 s later and loads the checkpoint of step 5
    started(write_lines, end + 100)
    event(write_lines, "checkpoint", end + 110, 5, event="loaded")
    last = steps(write_lines, 6, 12, end + 110)
    event(write_lines, "run_end", last + 2, 12, status="finished")
    rows = goodput(ingest(run_dir))
    assert rows["redone_after_restart"]["steps"] == 5  # the first attempts at steps 6-10
    assert rows["redone_after_restart"]["flops"] == 50.0
    assert rows["productive"]["steps"] == 12
    assert rows["restart"]["seconds"] == pytest.approx(100 + 10 + 0.2)  # down, the new job's start, its load
    assert rows["startup"]["seconds"] == pytest.approx(5 + 0.2)
    assert rows["checkpoint_save"]["seconds"] == pytest.approx(0.2)
    assert rows["after_last_step"]["seconds"] == pytest.approx(2.0)
    assert rows["data_loading"]["seconds"] == pytest.approx(12 * 0.1)
    assert rows["productive"]["seconds"] == pytest.approx(12 * 0.7)
    assert sum(row["seconds"] for row in rows.values()) == pytest.approx(last + 2 - T0)


def test_a_pause_by_the_on_call_and_an_eval_are_time_between_steps(run_dir: Path, write_lines, ingest) -> None:
    started(write_lines, T0)
    time = steps(write_lines, 1, 4, T0)
    for status_time, action in ((time + 0.5, "pause"), (time + 60.5, "resume")):
        event(write_lines, "action", status_time, 4, action=action, status="applied", request_id=f"req-{action}")
    time = steps(write_lines, 5, 5, time + 61)
    event(write_lines, "eval", time + 3, 5, metrics={"loss": 2.0})
    time = steps(write_lines, 6, 6, time + 5)
    rows = goodput(ingest(run_dir))
    assert rows["paused"]["seconds"] == pytest.approx(61 + 1 - 0.8)
    assert rows["eval"]["seconds"] == pytest.approx(5 + 1 - 0.8)
    assert rows["productive"]["steps"] == 6 and "abandoned_timeline" not in rows


def test_a_run_without_phases_takes_its_median_interval_as_a_step(run_dir: Path, write_lines, ingest) -> None:
    time = T0
    event(write_lines, "rank_info", T0, 0, host="h")
    for step, gap in enumerate([2.0, 2.0, 2.0, 30.0, 2.0], start=1):  # one slow stretch: a stall between steps
        time += gap
        event(write_lines, "step", time, step, metrics={"loss": 1.0})
    rows = goodput(ingest(run_dir))
    assert rows["productive"]["seconds"] == pytest.approx(10.0)
    assert rows["other"]["seconds"] == pytest.approx(28.0) and "startup" not in rows
