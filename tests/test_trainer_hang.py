"""Ranks that stop: the hang and crash hooks in a bare process, and a hung rank in a real two-rank
gloo run of `bedside train`, which the test ends as an operator would (SIGTERM to it): each rank
records that it was stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from bedside.app.train import train_command
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

STEPS, HANG = 30, 6
SETTLE_S = 1.0  # several of the writer's flush periods: what a rank recorded before the hang is on disk

HANG_OR_CRASH = """
import sys, time
from bedside.collectors.writer import RunLogger
from bedside.trainer.faults import FaultPlan
logger = RunLogger(sys.argv[1], rank=0, world_size=1)
faults = FaultPlan.parse([sys.argv[2]], rank=0, world_size=1, logger=logger)
for step in range(1, 4):
    faults.before_compute(step)
    print(step, flush=True)
"""


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def written(path: Path) -> bool:
    """The file holds at least one complete line."""
    return path.exists() and path.read_text().endswith("\n")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def command_line(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def start_rank(tmp_path: Path, spec: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HANG_OR_CRASH, str(tmp_path), spec], stdout=subprocess.PIPE, text=True
    )


def test_a_hang_stops_stepping_and_stays_alive_and_a_crash_exits_with_its_code(tmp_path: Path, read_records) -> None:
    hung, crashed = (
        start_rank(tmp_path / "hang", "hang:rank=0,step=2"),
        start_rank(tmp_path / "crash", "crash:rank=0,step=3,code=7"),
    )
    try:
        assert crashed.wait(timeout=60) == 7 and crashed.stdout.read().split() == ["1", "2"]
        assert hung.stdout.readline() == "1\n"
        truth = tmp_path / "hang" / "ground_truth" / "rank-00000.jsonl"
        wait_for(lambda: written(truth), "the hang's ground truth", timeout=30)
        time.sleep(0.3)
        assert hung.poll() is None and [r["fault"] for r in read_records(truth)] == ["hang"]
    finally:
        hung.kill()
        hung.wait()
    assert [
        (r["step"], r["fault"]) for r in read_records(tmp_path / "crash" / "ground_truth" / "rank-00000.jsonl")
    ] == [(3, "crash")]


# -- a hung rank in a real run ----------------------------------------------------------------
class HungRun(NamedTuple):
    store: Store
    alive_while_hung: bool  # the launcher and both ranks, once the hang had fired
    own_sessions: bool  # each rank leads a session of its own, as torchrun's ranks do
    forked_server: bool  # both ranks' parent is one fork of the launcher (no interpreter imported torch for them)
    returncode: int  # the launcher's, after the test's SIGTERM
    left_running: list[int]  # rank processes still alive after the launcher exited


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory) -> HungRun:
    """Rank 1 hangs at step HANG; once its ground truth is on disk, `bedside train` gets SIGTERM."""
    run = tmp_path_factory.mktemp("hang") / "run"
    layout = RunLayout(run)
    job = subprocess.Popen(
        train_command(
            ["--nproc", "2", "--steps", str(STEPS), "--out", str(run), "--inject", f"hang:rank=1,step={HANG}"]
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        wait_for(lambda: written(layout.ground_truth_file(1)), "the hang's ground truth")
        time.sleep(SETTLE_S)
        ranks = [json.loads(layout.rank_file(rank).read_text().split("\n", 1)[0])["pid"] for rank in (0, 1)]
        alive_while_hung = job.poll() is None and all(map(alive, ranks))
        own_sessions = [os.getsid(pid) for pid in ranks] == ranks
        servers = {parent(pid) for pid in ranks}
        forked_server = len(servers) == 1 and all(
            parent(server) == job.pid and command_line(server) == command_line(job.pid) for server in servers
        )
    finally:
        job.terminate()
        job.wait(timeout=120)
    store = Store.open(layout.store)
    Collector(run, store).ingest_available()
    yield HungRun(
        store, alive_while_hung, own_sessions, forked_server, job.returncode, [pid for pid in ranks if alive(pid)]
    )
    store.close()


@pytest.mark.slow(reason="a hung two-rank run of `bedside train`, stopped with SIGTERM")
def test_a_hung_rank_keeps_the_job_alive_until_sigterm_to_the_launcher_ends_every_rank(hung_run: HungRun) -> None:
    assert hung_run.alive_while_hung and hung_run.own_sessions and hung_run.forked_server
    assert hung_run.returncode == 128 + signal.SIGTERM and hung_run.left_running == []


def test_the_hung_rank_and_its_peer_stop_recording_at_the_step_before_and_end_when_stopped(hung_run: HungRun) -> None:
    """No step after the hang; the SIGTERM that ends the job is recorded by each rank as its end."""
    cursor = hung_run.store.cursor()
    assert cursor.execute("SELECT rank, max(step) FROM rank_step_metrics GROUP BY rank ORDER BY rank").fetchall() == [
        (0, HANG - 1),
        (1, HANG - 1),
    ]
    assert cursor.execute("SELECT max(step) FROM step_metrics").fetchall() == [(HANG - 1,)]
    ends = cursor.execute(
        "SELECT rank, payload ->> 'status', payload ->> 'message' FROM event_log WHERE kind = 'run_end' ORDER BY rank"
    ).fetchall()
    assert [(rank, status) for rank, status, _ in ends] == [(0, "failed"), (1, "failed")]
    assert all("SIGTERM" in message for *_, message in ends)
    assert cursor.execute("SELECT step, rank, fault FROM fault_labels").fetchall() == [(HANG, 1, "hang")]
