"""A run directory written again: refused with the ways out, or resumed on a timeline every rank agrees on;
job-level metrics from more than one rank are warned about once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from bedside.collectors.layout import RunLayout
from bedside.collectors.resume import RESUME_FILE, ResumeTimeoutError, RunExistsError
from bedside.collectors.writer import RunLogger

RANK = """
import sys
from bedside.collectors.writer import RunLogger

run_dir, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with RunLogger(run_dir, rank=rank, world_size=world, resume=True, resume_wait_s=60) as log:
    for step in range(5):
        log.rank_step(step, step_time=0.1)
        if rank == 0:
            log.step(step, loss=2.0 - step / 10)
print(log.timeline)
"""


def write_steps(run: Path, *, rank: int = 0, world: int = 1, steps: int = 5, **kwargs) -> RunLogger:
    with RunLogger(run, rank=rank, world_size=world, **kwargs) as log:
        for step in range(steps):
            log.rank_step(step, step_time=0.1)
            if rank == 0:
                log.step(step, loss=2.0 - step / 10)
    return log


def timelines(path: Path, kind: str = "step") -> list[tuple[int, int]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["timeline"], r["step"]) for r in records if r["kind"] == kind]


def start_rank(run: Path, rank: int, world: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RANK, str(run), str(rank), str(world)], stdout=subprocess.PIPE, text=True
    )


def finished(proc: subprocess.Popen) -> int:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    return int(out.strip().splitlines()[-1])


def test_a_second_run_into_the_same_directory_is_refused_with_the_ways_out(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_steps(run)
    before = RunLayout(run).rank_file(0).read_bytes()
    with pytest.raises(RunExistsError) as refused:
        RunLogger(run, rank=0, world_size=1)
    message = str(refused.value)
    assert str(run) in message and "1 rank file" in message
    assert "run_end record of step 4 on timeline 0" in message
    assert "resume=True" in message and "new directory" in message
    assert RunLayout(run).rank_file(0).read_bytes() == before  # nothing written


def test_a_resumed_run_continues_on_the_next_timeline(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_steps(run)
    log = write_steps(run, resume=True)
    assert log.timeline == 1
    steps = timelines(RunLayout(run).rank_file(0))
    assert steps == [(0, s) for s in range(5)] + [(1, s) for s in range(5)]
    assert json.loads((run / RESUME_FILE).read_text())["timeline"] == 1
    assert write_steps(run, resume=True).timeline == 2


def test_a_restarted_rank_left_off_at_its_furthest_step_not_at_its_last_record(tmp_path: Path) -> None:
    # A save of step 20 that finishes after steps 21-23 were taken, then the run's end, are the last records: a
    # restart that took where it left off from the last record resumed on the same timeline and wrote 21-23 twice.
    run = tmp_path / "run"
    with RunLogger(run, rank=0, world_size=1, timeline=1) as log:
        for step in range(18, 24):
            log.step(step, loss=1.0)
        log.checkpoint(20, "saved", path="checkpoints/step-00000020-t1")
    assert json.loads(RunLayout(run).rank_file(0).read_text().splitlines()[-1])["step"] == 20
    assert write_steps(run, resume=True, timeline=1, steps=0).left_off == (1, 23)
    assert RunLogger(tmp_path / "new", rank=0, world_size=1).left_off is None


def test_a_caller_that_knows_its_timeline_resumes_on_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_steps(run)
    assert write_steps(run, resume=True, timeline=7).timeline == 7


def test_ranks_agree_on_one_past_the_newest_timeline_of_any_rank_even_after_rank_zero_wrote(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for rank in range(3):
        write_steps(run, rank=rank, world=3, timeline=2 if rank == 1 else 0)  # rank 1 saw a rewind the others missed
    lead = start_rank(run, 0, 3)
    assert finished(lead) == 3  # rank 0 wrote its new records before any other rank opened
    assert [finished(p) for p in [start_rank(run, r, 3) for r in (1, 2)]] == [3, 3]
    for rank in range(3):
        assert timelines(RunLayout(run).rank_file(rank), "rank_step")[-5:] == [(3, s) for s in range(5)]


def test_a_rank_new_to_the_run_takes_rank_zeros_timeline(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_steps(run, rank=0, world=1)
    procs = [start_rank(run, rank, 2) for rank in (1, 0)]  # rank 1 has no file and starts first
    assert [finished(p) for p in procs] == [1, 1]


def test_another_rank_waits_for_rank_zero_and_says_so_when_it_never_comes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_steps(run, rank=1, world=2)
    started = time.monotonic()
    with pytest.raises(ResumeTimeoutError, match="rank 0"):
        RunLogger(run, rank=1, world_size=2, resume=True, resume_wait_s=0.3)
    assert time.monotonic() - started < 10


def test_job_level_steps_from_a_second_rank_warn_once_naming_it(tmp_path: Path) -> None:
    with RunLogger(tmp_path / "run", rank=2, world_size=4) as log:
        with pytest.warns(RuntimeWarning, match=r"rank 2.*job_rank=0.*counted once per copy") as caught:
            log.step(1, loss=1.0, tokens=100)
            log.step(2, loss=1.0, tokens=100)
        assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert timelines(RunLayout(tmp_path / "run").rank_file(2)) == [(0, 1), (0, 2)]  # still recorded


@pytest.mark.parametrize(("rank", "job_rank"), [(0, 0), (3, 3)])
def test_the_job_rank_logs_steps_without_a_warning(tmp_path: Path, rank: int, job_rank: int) -> None:
    with RunLogger(tmp_path / "run", rank=rank, world_size=4, job_rank=job_rank) as log:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            log.step(1, loss=1.0)
