"""The recorded sample runs stay readable by the current collector, with their ground truth."""

from __future__ import annotations

import shutil
from pathlib import Path

from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


def ingested(name: str, tmp_path: Path) -> Store:
    """A copy of a sample run, ingested into a fresh store."""
    run = shutil.copytree(SAMPLES / name, tmp_path / name)
    store = Store.open(run / "bedside.duckdb")
    Collector(run, store).ingest_available()
    return store


def test_the_tiny_faults_run_ingests_cleanly_with_each_fault_labelled(tmp_path: Path) -> None:
    with ingested("tiny-faults", tmp_path) as store:
        cursor = store.cursor()
        assert cursor.execute("SELECT count(*) FROM rejected").fetchall() == [(0,)]
        assert cursor.execute("SELECT status, world_size, last_step FROM run").fetchall() == [("finished", 2, 200)]
        faults = cursor.execute("SELECT fault FROM fault_labels ORDER BY step").fetchall()
        assert [f for (f,) in faults] == ["bad_shard", "straggler", "grad_bitflip", "param_bitflip", "nan"]
        kinds = cursor.execute("SELECT args ->> 'expected_kind' FROM fault_labels ORDER BY step").fetchall()
        assert [k for (k,) in kinds] == ["loss_spike", "straggler", "sdc", "sdc", "nonfinite"]


def test_the_tiny_rewind_run_keeps_both_timelines_and_the_operators_actions(tmp_path: Path) -> None:
    with ingested("tiny-rewind", tmp_path) as store:
        cursor = store.cursor()
        assert cursor.execute("SELECT count(*) FROM rejected").fetchall() == [(0,)]
        assert cursor.execute("SELECT timeline, min(step) FROM step_metrics GROUP BY ALL ORDER BY 1").fetchall() == [
            (0, 1),
            (1, 61),
        ]
        applied = cursor.execute("SELECT action FROM action_events WHERE status = 'applied' ORDER BY time").fetchall()
        assert [a for (a,) in applied] == ["rewind", "quarantine", "quarantine"]
        faults = cursor.execute("SELECT fault FROM fault_labels ORDER BY step").fetchall()
        assert [f for (f,) in faults] == ["bad_shard", "repeat_batch"]
