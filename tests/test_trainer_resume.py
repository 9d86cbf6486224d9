"""Crash, resume and checkpoint fallback with the real trainer: two gloo ranks under torchrun."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store

STEPS, EVERY, CRASH = 30, 10, 25


def train(run: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bedside.app.cli", "train", "--nproc", "2", "--steps", str(STEPS),
               "--checkpoint-every", str(EVERY), "--out", str(run), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def corrupt_one_byte(checkpoint: Path) -> Path:
    victim = next(p for p in sorted(checkpoint.iterdir()) if p.suffix == ".distcp")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    return victim


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Store, Path]:
    run = tmp_path_factory.mktemp("resume") / "run"
    crashed = train(run, "--inject", f"crash:rank=1,step={CRASH}")
    assert crashed.returncode != 0
    victim = corrupt_one_byte(run / "checkpoints" / "step-00000020-t0")
    done = train(run, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    store = Store.open(run / "bedside.duckdb")
    Collector(run, store).ingest_available()
    yield store, victim
    store.close()


def rows(store: Store, query: str) -> list[tuple]:
    return store.cursor().execute(query).fetchall()


def test_a_corrupt_checkpoint_is_reported_and_the_previous_one_loaded(resumed) -> None:
    store, victim = resumed
    events = rows(store, "SELECT event, path, message FROM checkpoint_events WHERE event IN ('corrupt', 'loaded') "
                         "ORDER BY time")
    assert [(event, path) for event, path, _ in events] == [
        ("corrupt", "checkpoints/step-00000020-t0"), ("loaded", "checkpoints/step-00000010-t0")]
    assert victim.name in events[0][2]


def test_the_resumed_run_retrains_on_a_new_timeline_and_reproduces_the_lost_steps(resumed) -> None:
    store, _ = resumed
    assert rows(store, "SELECT timeline, min(step), max(step) FROM step_metrics GROUP BY ALL ORDER BY 1") == [
        (0, 1, CRASH - 1), (1, EVERY + 1, STEPS)]
    replayed = rows(store, "SELECT a.loss = b.loss FROM step_metrics a JOIN step_metrics b USING (step) "
                           "WHERE a.timeline = 0 AND b.timeline = 1")
    assert len(replayed) == CRASH - 1 - EVERY and all(same for (same,) in replayed)


def test_the_resumed_run_finishes_with_its_checkpoints_saved(resumed) -> None:
    store, _ = resumed
    assert rows(store, "SELECT status, timeline, last_step FROM run") == [("finished", 1, STEPS)]
    saved = rows(store, "SELECT timeline, step FROM checkpoint_events WHERE event = 'saved' ORDER BY time")
    assert saved == [(0, 10), (0, 20), (1, 20), (1, 30)]
    assert rows(store, "SELECT step, rank, fault FROM fault_labels") == [(CRASH, 1, "crash")]
