"""W&B runs import: offline run directories written by the real ``wandb`` (offline mode, no network), and the
UI's CSV and history JSONL / Parquet shapes; an injected loss spike becomes an incident in each."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bedside.collectors.errors import ImportFormatError
from bedside.collectors.importers import import_wandb
from bedside.collectors.importers.wandb_records import read_wandb_records
from bedside.collectors.store import Store

STEPS, SPIKE, START = 300, 180, 1796000000.0

LOG_RUNS = """
import math, sys
import numpy as np
import wandb
steps, spike = int(sys.argv[2]), int(sys.argv[3])
for name, factor in (("spiky", 3.0), ("calm", 1.0)):
    run = wandb.init(mode="offline", dir=sys.argv[1], project="import-test", name=name)
    rng = np.random.default_rng(0)
    for step in range(steps):
        loss = 4.0 * (step + 1) ** -0.15 * math.exp(0.01 * rng.standard_normal()) * (factor if step == spike else 1.0)
        row = {"train/loss": loss, "train/learning_rate": 3e-4, "train/grad_norm": 0.9, "gpu": {"util": 0.5}}
        if step % 50 == 49:
            row["eval/loss"] = loss * 0.9
        if step == 3:
            row["weights"] = wandb.Histogram(np.arange(10.0))
        wandb.log(row, step=step)
    run.finish()
"""


def loss_curve() -> list[float]:
    """The spiky run's loss, as LOG_RUNS draws it."""
    rng = np.random.default_rng(0)
    curve = [4.0 * (s + 1) ** -0.15 * math.exp(0.01 * rng.standard_normal()) for s in range(STEPS)]
    curve[SPIKE] *= 3.0
    return curve


def history_rows() -> list[dict]:
    """The spiky run's history as ``run.scan_history()`` yields it (``_step``, ``_runtime``, ``_timestamp``)."""
    rows = []
    for step, loss in enumerate(loss_curve()):
        row = {"_step": step, "_runtime": 0.1 * step, "_timestamp": START + 0.1 * step, "train/loss": loss}
        rows.append(row | {"train/learning_rate": 3e-4, "eval/loss": loss * 0.9 if step % 50 == 49 else None})
    return rows


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> Path:
    """A directory holding ``wandb/offline-run-*`` of two runs logged by the real wandb."""
    root = tmp_path_factory.mktemp("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    env |= {"WANDB_CONFIG_DIR": str(root / "config"), "WANDB_CACHE_DIR": str(root / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", LOG_RUNS, str(root), str(STEPS), str(SPIKE)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """The spiky run as the UI's CSV (with a second run and the min/max band columns), JSONL and Parquet."""
    folder = tmp_path_factory.mktemp("exports")
    rows = history_rows()
    wide = pd.DataFrame({"Step": [r["_step"] for r in rows], "Relative Time (Process)": [r["_runtime"] for r in rows]})
    for run, factor in (("spiky", 1.0), ("calm-sun-2", 0.5)):
        loss = [r["train/loss"] * factor for r in rows]
        wide[f"{run} - train/loss"] = loss
        wide[f"{run} - train/loss__MIN"], wide[f"{run} - train/loss__MAX"] = loss, loss
    wide.to_csv(folder / "export.csv", index=False)
    (folder / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(folder / "history.parquet")
    return {"csv": folder / "export.csv", "jsonl": folder / "history.jsonl", "parquet": folder / "history.parquet"}


def query(run: Path, sql: str) -> list[tuple]:
    with Store.open(run / "bedside.duckdb") as store:
        return store.cursor().execute(sql).fetchall()


def assert_spike_incident(run: Path) -> None:
    from bedside.app.service.detection import detect_run

    findings = detect_run(run)
    assert any(f.kind == "loss_spike" and abs(f.start_step - SPIKE) <= 2 for f in findings), findings
    incidents = query(run, "SELECT kinds, start_step FROM incidents")
    assert any("loss_spike" in str(kinds) and abs(start - SPIKE) <= 2 for kinds, start in incidents), incidents


def test_offline_runs_import_each_into_its_folder_and_the_spike_is_an_incident(offline, tmp_path):
    summaries = import_wandb(offline, tmp_path / "runs")
    assert len(summaries) == 2 and all(s.format == "wandb-offline" for s in summaries)
    spiky = next(s for s in summaries if json.loads((s.out / "run.json").read_text())["name"] == "spiky")
    assert spiky.records == {"rank_info": 1, "step": STEPS, "eval": STEPS // 50}
    assert spiky.warnings == ("1 media, histogram, table or list values not imported",)
    assert_spike_incident(spiky.out)
    rows = query(spiky.out, "SELECT step, loss, lr, grad_norm, time FROM step_metrics ORDER BY step")
    assert [r[0] for r in rows] == list(range(STEPS)) and rows[SPIKE][1] == pytest.approx(loss_curve()[SPIKE])
    assert (rows[0][2], rows[0][3]) == (3e-4, 0.9) and rows[0][4] > 1.7e9
    assert query(spiky.out, "SELECT DISTINCT name FROM eval_scores") == [("loss",)]
    assert query(spiky.out, "SELECT count(*) FROM metrics WHERE name = 'gpu.util'") == [(STEPS,)]


def test_a_run_directory_or_its_run_file_imports_as_one_run(offline, tmp_path):
    run_dir = sorted((offline / "wandb").glob("offline-run-*"))[0]
    (summary,) = import_wandb(run_dir, tmp_path / "a")
    assert summary.out == tmp_path / "a" and summary.steps == STEPS
    (file_summary,) = import_wandb(next(run_dir.glob("run-*.wandb")), tmp_path / "b")
    assert file_summary.records == summary.records


def test_a_truncated_run_file_imports_what_was_written_and_says_what_was_lost(offline, tmp_path):
    source = next((offline / "wandb").glob("offline-run-*/run-*.wandb"))
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(source.read_bytes()[: len(source.read_bytes()) // 2])
    (summary,) = import_wandb(cut, tmp_path / "run")
    assert 0 < summary.steps < STEPS
    (lost, *_) = [w for w in summary.warnings if "truncated" in w or "incomplete" in w]
    assert str(cut) in lost and "records before it were read" in lost


def test_a_run_file_cut_at_a_record_s_end_says_it_is_incomplete(offline, tmp_path):
    """Nothing is torn there, so only the missing exit record tells: before, such a cut imported silently (and the
    test above failed whenever its cut fell on a record's end)."""
    data = next((offline / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    whole = len(read_wandb_records(data, "whole").records)
    at = next(
        n
        for n in range(len(data) // 2, len(data))
        if not (framed := read_wandb_records(data[:n], "cut")).lost and 0 < len(framed.records) < whole
    )
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(data[:at])
    (summary,) = import_wandb(cut, tmp_path / "run")
    assert [w for w in summary.warnings if "ends without the run's exit record" in w]


@pytest.mark.parametrize("shape", ["csv", "jsonl", "parquet"])
def test_exports_import_and_the_spike_is_an_incident(exports, tmp_path, shape):
    summaries = import_wandb(exports[shape], tmp_path / "runs")
    assert {s.format for s in summaries} == {f"wandb-{shape}"}
    spiky = next(s for s in summaries if s.out.name == "spiky" or shape != "csv")
    assert len(summaries) == (2 if shape == "csv" else 1)
    assert_spike_incident(spiky.out)
    losses = [r[0] for r in query(spiky.out, "SELECT loss FROM step_metrics ORDER BY step")]
    assert losses == pytest.approx(loss_curve())
    if shape == "csv":
        assert spiky.warnings == (f"{exports['csv']}: columns not of a run left out: Relative Time (Process)",)
    else:
        times = query(spiky.out, "SELECT min(time), count(*) FROM step_metrics")
        assert times == [(START, STEPS)]
        assert query(spiky.out, "SELECT count(*) FROM eval_scores") == [(STEPS // 50,)]


def test_a_nan_loss_is_kept_and_an_empty_value_is_not_logged(tmp_path):
    rows = [{"_step": 0, "train/loss": 1.0, "lr": 0.1}, {"_step": 1, "train/loss": math.nan, "lr": None}]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "h.parquet")  # null stays null, NaN stays NaN
    import_wandb(tmp_path / "h.parquet", tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run/telemetry/rank-00000.jsonl").read_text().splitlines()]
    assert [r["metrics"] for r in lines if r["kind"] == "step"] == [{"loss": 1.0, "lr": 0.1}, {"loss": "NaN"}]


def test_a_hugging_face_run_is_stepped_by_its_global_step(tmp_path):
    """The Trainer's W&B callback logs train and eval calls apart, each with train/global_step; _step counts calls."""
    rows = [{"_step": 0, "train/epoch": 0}]  # a call before training: no global step
    for call, step in enumerate(range(10, 60, 10)):
        rows.append({"_step": 2 * call + 1, "train/loss": 2.0 - step / 100, "train/global_step": step})
        rows.append({"_step": 2 * call + 2, "eval/loss": 2.1 - step / 100, "train/global_step": step})
    (tmp_path / "h.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (summary,) = import_wandb(tmp_path / "h.jsonl", tmp_path / "run")
    assert summary.warnings == (f"{tmp_path / 'h.jsonl'}: 1 history rows without train/global_step left out",)
    lines = [json.loads(x) for x in (tmp_path / "run/telemetry/rank-00000.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in lines[1:3]] == [("step", 10), ("eval", 10)]
    assert [r["step"] for r in lines if r["kind"] == "step"] == [10, 20, 30, 40, 50]


def test_bad_rows_are_named(tmp_path):
    (tmp_path / "h.jsonl").write_text('{"_step": 0, "train/loss": 1.0}\n{"_step": 1, "train/loss": "diverged"}\n')
    with pytest.raises(ImportFormatError, match=r"h\.jsonl, line 2: train/loss at step 1 is 'diverged', not a number"):
        import_wandb(tmp_path / "h.jsonl", tmp_path / "run")
    (tmp_path / "h.jsonl").write_text('{"train/loss": 1.0}\n')
    with pytest.raises(ImportFormatError, match=r"h\.jsonl, line 1: no _step"):
        import_wandb(tmp_path / "h.jsonl", tmp_path / "run")
    (tmp_path / "runs.csv").write_text("Name,State,loss\nspiky,finished,1.0\n")
    with pytest.raises(ImportFormatError, match=r"runs\.csv, line 1: no Step column"):
        import_wandb(tmp_path / "runs.csv", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_damaged_chunk_loses_its_record_only(offline, tmp_path):
    from wandb.proto.wandb_internal_pb2 import Record

    from bedside.collectors.importers.wandb_records import read_wandb_records

    source = next((offline / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    framed = read_wandb_records(source, "run")
    history = [r for r in framed.records if Record.FromString(r).WhichOneof("record_type") == "history"]
    at = source.index(history[150]) + 5  # inside the chunk of step 150's record
    (tmp_path / "run-x.wandb").write_bytes(source[:at] + bytes([source[at] ^ 1]) + source[at + 1 :])
    (summary,) = import_wandb(tmp_path / "run-x.wandb", tmp_path / "run")
    assert summary.steps == STEPS - 1
    assert f"{tmp_path / 'run-x.wandb'}: 1 damaged chunk skipped, with the records they held" in summary.warnings


def test_a_link_to_a_folder_of_runs_is_refused_not_followed(offline, tmp_path):
    """W&B's own ``latest-run`` link is passed over; a ``wandb`` or run folder that is a link is named."""
    os.symlink(offline / "wandb", tmp_path / "wandb")
    with pytest.raises(ImportFormatError, match="wandb: a symbolic link to a directory, not followed: refused"):
        import_wandb(tmp_path, tmp_path / "runs")
    (tmp_path / "wandb").unlink()
    os.symlink(next((offline / "wandb").glob("offline-run-*")), tmp_path / "run-1")
    with pytest.raises(ImportFormatError, match="run-1: a symbolic link to a directory, not followed: refused"):
        import_wandb(tmp_path, tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_a_fifo_is_refused_unread(tmp_path):
    os.mkfifo(tmp_path / "history.jsonl")
    with pytest.raises(ImportFormatError, match="a FIFO, not a regular file: refused unread"):
        import_wandb(tmp_path / "history.jsonl", tmp_path / "run")


def test_the_cli_imports_a_history_export_with_a_map(exports, tmp_path, bedside):
    done = bedside(
        "import", "wandb", exports["jsonl"], "--out", tmp_path / "run", "--quiet",
        "--map", "train/loss=my_loss", "--map", "train/learning_rate=",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "left out as mapped: train/learning_rate" in done.stderr
    found = bedside("query", tmp_path / "run", "SELECT DISTINCT name FROM metrics ORDER BY name", "--format", "json")
    assert [r["name"] for r in json.loads(found.stdout)] == ["eval/loss", "my_loss"]


@pytest.mark.parametrize(
    ("library", "importer", "file"),
    [("tensorboard", "import_tensorboard", "events.out.tfevents.1"), ("wandb", "import_wandb", "run-x.wandb")],
)
def test_without_the_library_the_error_names_the_extra(tmp_path, library, importer, file):
    (tmp_path / file).write_bytes(b"")
    script = (
        f"import sys; sys.modules[{library!r}] = None\n"
        f"from pathlib import Path\nfrom bedside.collectors.importers import {importer}\n"
        f"{importer}(Path({str(tmp_path / file if library == 'wandb' else tmp_path)!r}), Path({str(tmp_path / 'run')!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert f"pip install 'bedside[{library}]'" in done.stderr, done.stderr
