"""A run written by a framework's training script on two gloo ranks under torchrun, collected into a store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store

HERE = Path(__file__).parent


def train_and_collect(script: str, run: Path, steps: int, *, args: tuple[str, ...] = (), nproc: int = 2) -> Store:
    """Run ``tests/SCRIPT [ARGS] RUN STEPS`` on ``nproc`` ranks, then ingest the run into its store (opened for writing)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    done = subprocess.run(
        [*torchrun, str(HERE / script), *args, str(run), str(steps)],
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
