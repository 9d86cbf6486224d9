"""Megatron-LM logs, written by a fixture in training_log's documented line format, import and show incidents."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from bedside.collectors.errors import ImportFormatError
from bedside.collectors.importers import import_megatron
from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store

SPIKE, NAN = 0.6, 0.8  # where the loss spike and the NaN fall, as fractions of the run


def iteration_line(step: int, total: int, loss: float, ms: float, stamp: str) -> str:
    """One line as Megatron-LM's training_log prints it (a NaN loss is left out and counted)."""
    line = f" [{stamp}] iteration {step:8d}/{total:8d} | consumed samples: {step * 256:12d} |"
    line += f" elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 181.2 |"
    line += f" learning rate: {3e-4:.6E} | global batch size: {256:5d} |"
    if not math.isnan(loss):
        line += f" lm loss: {loss:.6E} |"
    line += f" loss scale: 1.0 | grad norm: {0.9:.3f} | num zeros: 0.0 |"
    line += f" number of skipped iterations: {0:3d} | number of nan iterations: {int(math.isnan(loss)):3d} |"
    return line


def write_log(path: Path, steps: int, noise: float, seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    spike, nan = int(steps * SPIKE), int(steps * NAN)
    lines = ["using world size: 8, data-parallel size: 8", "> building GPT model ..."]
    for step in range(1, steps + 1):
        loss = 4.0 * step**-0.15 * math.exp(noise * rng.standard_normal())
        loss = math.nan if step == nan else loss * (3.0 if step == spike else 1.0)
        stamp = f"2026-05-01 10:{step // 60 % 60:02d}:{step % 60:02d}"
        lines.append(iteration_line(step, 500000, loss, 1200 * math.exp(0.02 * rng.standard_normal()), stamp))
        if step % 50 == 0:
            lines += [
                "-" * 40,
                f" validation loss at iteration {step} | lm loss value: 2.1E+00 | lm loss PPL: 8.2E+00 |",
            ]
        if step % 37 == 0:
            lines.append("(min, max) time across ranks (ms):\n    forward-backward ...: (1100.21, 1150.40)")
    path.write_text("\n".join(lines) + "\n")
    return spike, nan


@pytest.mark.parametrize("steps, noise, seed", [(300, 0.01, 0), (700, 0.03, 1)])
def test_a_megatron_log_imports_and_its_spike_and_nan_are_found(tmp_path, steps, noise, seed):
    from bedside.app.service.detection import detect_run

    spike, nan = write_log(tmp_path / "train.log", steps, noise, seed)
    summary = import_megatron(tmp_path / "train.log", tmp_path / "run")
    assert summary.records["step"] == steps and summary.records["eval"] == steps // 50
    with Store.open(tmp_path / "run" / "bedside.duckdb") as store:
        assert Collector(tmp_path / "run", store).ingest_available().rejected == 0
        rows = store.cursor().execute("SELECT step, loss, lr FROM step_metrics ORDER BY step").fetchall()
    assert [r[0] for r in rows] == list(range(1, steps + 1)) and rows[0][2] == pytest.approx(3e-4)
    findings = detect_run(tmp_path / "run")
    kinds = {(f.kind, f.start_step) for f in findings}
    assert any(k == "loss_spike" and abs(s - spike) <= 2 for k, s in kinds), kinds
    assert any(k == "nonfinite" and abs(s - nan) <= 2 for k, s in kinds), kinds


def test_a_line_that_looks_like_an_iteration_but_does_not_parse_is_named(tmp_path):
    write_log(tmp_path / "train.log", 20, 0.01, 0)
    lines = (tmp_path / "train.log").read_text().splitlines()
    lines[5] = lines[5].replace("lm loss: ", "lm loss: oops")
    (tmp_path / "train.log").write_text("\n".join(lines))
    with pytest.raises(ImportFormatError, match=re.escape("train.log, line 6: lm loss must be a number")):
        import_megatron(tmp_path / "train.log", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_symlink_is_refused(tmp_path):
    write_log(tmp_path / "train.log", 20, 0.01, 0)
    (tmp_path / "link.log").symlink_to(tmp_path / "train.log")
    with pytest.raises(ImportFormatError, match="symbolic link"):
        import_megatron(tmp_path / "link.log", tmp_path / "run")


def test_the_cli_imports_a_megatron_log_and_query_reads_it(tmp_path, bedside):
    write_log(tmp_path / "train.log", 120, 0.02, 2)
    done = bedside("import", "megatron", tmp_path / "train.log", "--out", tmp_path / "run", "--quiet")
    assert done.returncode == 0, done.stderr
    found = bedside(
        "query", tmp_path / "run", "SELECT count(*) AS n, max(step) AS last FROM step_metrics", "--format", "json"
    )
    assert json.loads(found.stdout) == [{"n": 120, "last": 120}]


def requeued_log(path: Path, chronicles: list[range]) -> None:
    """A log a job appended to on each start: each chronicle's iterations, resumed from its checkpoint; the last
    ends as Megatron's pretrain() does, with a validation and a test evaluation at its last iteration."""
    lines = []
    for chronicle in chronicles:
        lines.append("using world size: 8, data-parallel size: 8")
        for step in chronicle:
            lines.append(iteration_line(step, 500000, 4.0 * step**-0.15, 1200.0, f"2026-05-01 10:00:{step % 60:02d}"))
            if step % 10 == 0:
                lines.append(f" validation loss at iteration {step} | lm loss value: 2.1E+00 | lm loss PPL: 8.2E+00 |")
    end = chronicles[-1][-1]
    lines.append(
        f" validation loss at iteration {end} on validation set | lm loss value: 2.0E+00 | lm loss PPL: 7.4E+00 |"
    )
    lines.append(f" validation loss at iteration {end} on test set | lm loss value: 2.2E+00 | lm loss PPL: 9.0E+00 |")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "chronicles",
    [
        [range(1, 31), range(21, 41)],  # killed after 30, requeued from the checkpoint of 20
        [range(1, 3), range(2, 6), range(2, 9)],  # pasted chronicles that each repeat iteration 2
    ],
)
def test_a_requeued_jobs_log_is_one_run_with_a_timeline_per_start(tmp_path, chronicles):
    requeued_log(tmp_path / "train.log", chronicles)
    summary = import_megatron(tmp_path / "train.log", tmp_path / "run")
    [warning] = [w for w in summary.warnings if "restart" in w]
    assert warning.startswith(
        f"{len(chronicles) - 1} restart(s) from an earlier step, each the start of a new timeline"
    )
    for before, after in itertools.pairwise(chronicles):
        assert f"(step {after[0]} after {before[-1]})" in warning
    with Store.open(tmp_path / "run" / "bedside.duckdb") as store:
        assert Collector(tmp_path / "run", store).ingest_available().rejected == 0
        steps = store.cursor().execute("SELECT timeline, step FROM step_metrics ORDER BY timeline, step").fetchall()
        evals = store.cursor().execute("SELECT timeline, step FROM evals ORDER BY timeline, step").fetchall()
    assert steps == [(t, s) for t, chronicle in enumerate(chronicles) for s in chronicle]
    evaluated = [(t, s) for t, chronicle in enumerate(chronicles) for s in chronicle if s % 10 == 0]
    end = (len(chronicles) - 1, chronicles[-1][-1])
    assert evals == sorted({*evaluated, end})  # the end's evaluations, on the last timeline, are one eval record
