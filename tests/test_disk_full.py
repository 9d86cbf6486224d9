"""A full disk under ``bedside watch`` (RLIMIT_FSIZE on the real process): the failure is logged and announced,
watch keeps starting again with backoff instead of stopping silently, and once the limit is gone (a new process)
every line is in the store exactly once. ``collect --follow`` under the same limit stops with one error line."""

from __future__ import annotations

import resource
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from test_alerts_watch import Lines, eventually, read_store, split_run

from bedside.app.simulation import SimulationConfig, simulate_run

FILE_LIMIT = 1 << 20
"""Largest file the limited process may write: the store's first part fits, the rest of the run does not."""
SPLIT_STEP = 300
STEPS, RANKS = 3000, 4


@pytest.fixture
def long_run(tmp_path: Path) -> Path:
    """A clean simulated run of 4 ranks x 3,000 steps (about 3.6 MB of telemetry)."""
    run = tmp_path / "run"
    simulate_run(SimulationConfig(ranks=RANKS, steps=STEPS, nuisances=False), run)
    return run


def limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def start_limited(start_bedside: Callable[..., subprocess.Popen], *args: str | Path) -> tuple[subprocess.Popen, Lines]:
    process = start_bedside(
        *args, "--rescan-every", "0.2", preexec_fn=limit_file_size, stderr=subprocess.PIPE, text=True
    )
    return process, Lines(process.stderr)


def assert_every_line_once(run: Path) -> None:
    counts = read_store(
        run,
        "SELECT count(*) AS n, count(DISTINCT (source_id, line_offset)) AS once, "
        "count(DISTINCT (rank, step)) AS steps FROM rank_steps",
    )
    assert counts.to_dict("records") == [{"n": STEPS * RANKS, "once": STEPS * RANKS, "steps": STEPS * RANKS}]
    assert read_store(run, "SELECT count(*) AS n FROM steps")["n"][0] == STEPS


def test_watch_on_a_full_disk_reports_retries_and_a_new_process_loses_nothing(
    long_run: Path, start_bedside, bedside
) -> None:
    append_rest = split_run(long_run, SPLIT_STEP)
    watch, err = start_limited(start_bedside, "watch", long_run)
    err.wait_for("ingested")
    append_rest()
    err.wait_for("File too large")
    err.wait_for("bedside: alert: [CRITICAL]")  # the log notifier: watch's default without a configuration
    err.wait_for("starting again in 2 s (restarts so far: 1)")  # it retried, and failed again: the limit holds
    assert watch.poll() is None, "watch stopped on a full disk"
    watch.send_signal(signal.SIGTERM)
    assert watch.wait(60) == 0
    assert "Traceback" not in err.text()

    done = bedside("collect", long_run)
    assert done.returncode == 0, done.stderr
    assert_every_line_once(long_run)


def test_collect_follow_on_a_full_disk_stops_with_one_error_line(long_run: Path, start_bedside, bedside) -> None:
    append_rest = split_run(long_run, SPLIT_STEP)
    collect, err = start_limited(start_bedside, "collect", long_run, "--follow", "--no-detect")
    err.wait_for("ingested")
    append_rest()
    assert collect.wait(60) == 2
    lines = err.text().splitlines()
    assert "Traceback" not in err.text()
    assert lines[-1].startswith("bedside: error: ") and "File too large" in lines[-1]
    eventually(lambda: bedside("collect", long_run).returncode == 0, "collect without the limit")
    assert_every_line_once(long_run)
