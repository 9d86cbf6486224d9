"""A run written by a framework's training script on two gloo ranks under torchrun, collected into a store, and
its rank files read while it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bedside.collectors.control import request_action
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

HERE = Path(__file__).parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
FRAMEWORK_STEPS = 12
"""A framework run's length: ``hf_run.py`` and ``lightning_run.py`` evaluate and save every ``steps // 2`` steps,
the kit checksums every 5, so two of each on cadences that do not coincide."""


def train_and_collect(script: str, run: Path, steps: int, *, args: tuple[str, ...] = (), nproc: int = 2) -> Store:
    """Run ``tests/SCRIPT [ARGS] RUN STEPS`` on ``nproc`` ranks, then ingest the run into its store (opened for writing)."""
    done = subprocess.run(
        [*TORCHRUN[:-1], str(nproc), str(HERE / script), *args, str(run), str(steps)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    store = Store.open(run / "bedside.duckdb")
    Collector(run, store).ingest_available()
    return store


def rows(store: Store, query: str) -> list[tuple]:
    return store.cursor().execute(query).fetchall()


def records(run: Path, rank: int = 0) -> list[dict]:
    path = RunLayout(run).rank_file(rank)
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def acks(run: Path, request_id: str) -> list[dict]:
    return [r for r in records(run) if r["kind"] == "action" and r["request_id"] == request_id]


def wait_for(condition, what: str, loop: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert loop.poll() is None, f"the loop ended before {what}: {loop.communicate()[0]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def answered(run: Path, request_id: str) -> bool:
    return any(r["status"] != "requested" for r in acks(run, request_id))


def start(script: str, run: Path, *args: str) -> tuple[subprocess.Popen, Callable[..., str]]:
    """``tests/SCRIPT RUN ARGS...`` started on two ranks, and a function that files a signed request for RUN
    (``file("skip", first_batch=3, last_batch=4)``: its request id)."""
    loop = subprocess.Popen(
        [*TORCHRUN, str(HERE / script), str(run), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    layout = RunLayout(run)

    def file(action: str, **action_args: Any) -> str:
        return request_action(layout, action, action_args, operator="tester", reason="test")

    return loop, file


def assert_replica_signals(store: Store, steps: int, checksum_every: int) -> None:
    """The SDC detector's inputs, and the straggler detector's split of backward into the rank's own compute and
    its wait for the all-reduce: every step a positive local gradient norm on each rank, the two ranks' norms
    apart (each of its own half of the batch), and on every checksum step one checksum both DDP replicas share,
    a new one each time (the parameters moved)."""
    norms = rows(
        store,
        "SELECT rank, count(local_grad_norm), min(local_grad_norm) FROM rank_step_metrics GROUP BY rank ORDER BY rank",
    )
    assert rows(
        store,
        "SELECT rank, count(comm_time), bool_and(compute_time + comm_time <= step_time AND comm_time >= 0)"
        " FROM rank_step_metrics GROUP BY rank ORDER BY rank",
    ) == [(0, steps, True), (1, steps, True)]
    assert [(rank, count) for rank, count, _ in norms] == [(0, steps), (1, steps)] and min(n for *_, n in norms) > 0
    assert rows(
        store,
        "SELECT count(*) FROM rank_step_metrics a JOIN rank_step_metrics b ON a.step = b.step"
        " WHERE a.rank = 0 AND b.rank = 1 AND a.local_grad_norm <> b.local_grad_norm",
    ) == [(steps,)]
    checksums = rows(
        store,
        "SELECT step, count(*), count(DISTINCT param_checksum) FROM rank_step_metrics"
        " WHERE param_checksum IS NOT NULL GROUP BY step ORDER BY step",
    )
    assert checksums == [(step, 2, 1) for step in range(checksum_every, steps + 1, checksum_every)]
    assert rows(store, "SELECT count(DISTINCT param_checksum) FROM rank_step_metrics") == [(len(checksums),)]
