"""The recorded sample runs stay readable by the current collector, with their ground truth."""
from __future__ import annotations

import shutil
from pathlib import Path

from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


def test_the_tiny_faults_run_ingests_cleanly_with_each_fault_labelled(tmp_path: Path) -> None:
    run = shutil.copytree(SAMPLES / "tiny-faults", tmp_path / "tiny-faults")
    with Store.open(run / "bedside.duckdb") as store:
        Collector(run, store).ingest_available()
        cursor = store.cursor()
        assert cursor.execute("SELECT count(*) FROM rejected").fetchall() == [(0,)]
        assert cursor.execute("SELECT status, world_size, last_step FROM run").fetchall() == [("finished", 2, 200)]
        faults = cursor.execute("SELECT fault FROM fault_labels ORDER BY step").fetchall()
        assert [f for (f,) in faults] == ["straggler", "bad_shard", "grad_bitflip", "param_bitflip", "nan"]
