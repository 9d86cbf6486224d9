"""FSDP2 (``--parallelism fsdp``) end to end: two gloo ranks under torchrun, against DDP and across a resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="FSDP2 runs under torchrun, one crashed and resumed")

STEPS, EVERY, CRASH = 30, 10, 15


def train(run: Path, parallelism: str, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "bedside.app.cli",
        "train",
        "--nproc",
        "2",
        "--steps",
        str(STEPS),
        "--parallelism",
        parallelism,
        "--out",
        str(run),
        *extra,
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


def ingested(run: Path) -> Store:
    store = Store.open(run / "bedside.duckdb")
    Collector(run, store).ingest_available()
    return store


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Store]:
    root = tmp_path_factory.mktemp("fsdp")
    stores = {}
    for parallelism in ("fsdp", "ddp"):
        done = train(root / parallelism, parallelism)
        assert done.returncode == 0, done.stderr[-3000:]
        stores[parallelism] = ingested(root / parallelism)
    yield stores
    for store in stores.values():
        store.close()


def rows(store: Store, query: str) -> list[tuple]:
    return store.cursor().execute(query).fetchall()


def test_fsdp_records_every_step_with_phases_local_norms_and_per_shard_checksums(runs) -> None:
    store = runs["fsdp"]
    assert rows(store, "SELECT status, world_size FROM run") == [("finished", 2)]
    assert rows(store, "SELECT count(*), min(step), max(step) FROM step_metrics") == [(STEPS, 1, STEPS)]
    assert rows(
        store,
        "SELECT count(*) FROM rank_step_metrics WHERE compute_time > 0 AND comm_time >= 0 AND local_grad_norm > 0",
    ) == [(2 * STEPS,)]
    checksums = rows(
        store,
        "SELECT step, count(DISTINCT param_checksum), count(*) FROM rank_step_metrics "
        "WHERE param_checksum IS NOT NULL GROUP BY step ORDER BY step",
    )
    assert checksums == [(step, 2, 2) for step in range(10, STEPS + 1, 10)]  # each rank its own shards
    assert rows(store, "SELECT count(*) FROM rejected") == [(0,)]
    assert rows(store, "SELECT config->>'parallelism' FROM run") == [("fsdp",)]


def test_fsdp_loss_falls_and_matches_ddp_step_for_step(runs) -> None:
    [(first, last)] = rows(
        runs["fsdp"], "SELECT avg(loss) FILTER (step <= 5), avg(loss) FILTER (step > 25) FROM step_metrics"
    )
    assert last < first - 0.2
    fsdp, ddp = (
        [loss for (loss,) in rows(runs[p], "SELECT loss FROM step_metrics ORDER BY step")] for p in ("fsdp", "ddp")
    )
    assert max(abs(a - b) for a, b in zip(fsdp[:20], ddp[:20])) < 1e-3


def test_fsdp_local_gradient_norms_before_reduction_match_ddp(runs) -> None:
    query = "SELECT local_grad_norm FROM rank_step_metrics WHERE step <= 5 ORDER BY step, rank"
    fsdp, ddp = ([norm for (norm,) in rows(runs[p], query)] for p in ("fsdp", "ddp"))
    assert fsdp == pytest.approx(ddp, rel=1e-3)


def test_fsdp_resumes_after_a_crash_and_replays_the_lost_steps(tmp_path) -> None:
    run = tmp_path / "run"
    assert (
        train(run, "fsdp", "--checkpoint-every", str(EVERY), "--inject", f"crash:rank=1,step={CRASH}").returncode != 0
    )
    done = train(run, "fsdp", "--checkpoint-every", str(EVERY), "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    store = ingested(run)
    try:
        assert rows(store, "SELECT event, path FROM checkpoint_events WHERE event = 'loaded'") == [
            ("loaded", "checkpoints/step-00000010-t0")
        ]
        assert rows(store, "SELECT timeline, min(step), max(step) FROM step_metrics GROUP BY ALL ORDER BY 1") == [
            (0, 1, CRASH - 1),
            (1, EVERY + 1, STEPS),
        ]
        replayed = rows(
            store,
            "SELECT a.loss = b.loss FROM step_metrics a JOIN step_metrics b USING (step) "
            "WHERE a.timeline = 0 AND b.timeline = 1",
        )
        assert len(replayed) == CRASH - 1 - EVERY and all(same for (same,) in replayed)
        assert rows(store, "SELECT status, last_step FROM run") == [("finished", STEPS)]
    finally:
        store.close()
