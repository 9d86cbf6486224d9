"""TensorBoard log dirs written by torch's SummaryWriter import as runs (per-rank subdirectories as ranks), and an
injected loss spike becomes an incident; truncated files, symbolic links, folders nested too deep and clashing names
are named."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from bedside.collectors.bounded import BoundedInputError
from bedside.collectors.errors import ImportFormatError
from bedside.collectors.importers import import_tensorboard
from bedside.collectors.importers.source import MAX_FOLDER_DEPTH, FolderScan
from bedside.collectors.store import Store

STEPS, SPIKE = 300, 180


def loss_curve(seed: int) -> list[float]:
    """A falling, noisy loss with a threefold spike at ``SPIKE``."""
    rng = np.random.default_rng(seed)
    curve = [4.0 * (s + 1) ** -0.15 * math.exp(0.01 * rng.standard_normal()) for s in range(STEPS)]
    curve[SPIKE] *= 3.0
    return curve


def write_single(folder: Path) -> None:
    """One writer as a training script uses it: loss, lr, grad norm, a val loss, a user metric, a histogram, and a
    scalar as TensorFlow 2's ``tf.summary.scalar`` writes it (a tensor of the scalars plugin)."""
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(folder)) as writer:
        for step, loss in enumerate(loss_curve(0)):
            writer.file_writer.add_summary(scalar_pb("tf2/throughput", 100.0 + step), step)
            writer.add_scalar("train/loss", loss, step)
            writer.add_scalar("train/learning_rate", 3e-4, step)
            writer.add_scalar("grad_norm", 0.9, step)
            writer.add_scalar("tokens_per_s", 1000.0 + step, step)
            if step % 50 == 49:
                writer.add_scalar("val_loss", loss * 0.9, step)
        writer.add_histogram("weights", np.arange(10.0), 0)


def write_ranked(folder: Path, ranks: int = 2, steps: int = 40) -> None:
    """One writer per rank in ``rank_N`` subdirectories: each rank's own loss and step time."""
    from torch.utils.tensorboard import SummaryWriter

    for rank in range(ranks):
        with SummaryWriter(str(folder / f"rank_{rank}")) as writer:
            for step in range(steps):
                writer.add_scalar("train/loss", 2.0 - 0.01 * step + 0.001 * rank, step)
                writer.add_scalar("step_time", 0.5 + 0.1 * rank, step)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tb") / "logs"
    write_single(root / "single")
    write_ranked(root / "ranked")
    return root


@pytest.fixture(scope="module")
def imported(logdir, tmp_path_factory) -> tuple[Path, dict[str, object]]:
    out = tmp_path_factory.mktemp("tb-out") / "runs"
    summaries = {s.out.name: s for s in import_tensorboard(logdir, out)}
    return out, summaries


def query(run: Path, sql: str) -> list[tuple]:
    with Store.open(run / "bedside.duckdb") as store:
        return store.cursor().execute(sql).fetchall()


def test_every_run_under_the_log_dir_is_imported(imported):
    summaries = imported[1]
    assert sorted(summaries) == ["ranked", "single"]
    single = summaries["single"]
    assert single.records == {"rank_info": 1, "step": STEPS, "eval": STEPS // 50}
    assert single.warnings == ("1 non-scalar values (histograms, images, text, ...) not imported",)
    assert summaries["ranked"].ranks == 2


def test_the_spike_becomes_an_incident_and_names_reach_canonical_metrics(imported):
    from bedside.app.service.detection import detect_run

    run = imported[0] / "single"
    findings = detect_run(run)
    assert any(f.kind == "loss_spike" and abs(f.start_step - SPIKE) <= 2 for f in findings), findings
    incidents = query(run, "SELECT kinds, start_step FROM incidents")
    assert any("loss_spike" in str(kinds) and abs(start - SPIKE) <= 2 for kinds, start in incidents), incidents
    rows = query(run, "SELECT step, loss, lr, grad_norm FROM step_metrics ORDER BY step")
    assert [r[0] for r in rows] == list(range(STEPS))
    assert rows[SPIKE][1] == pytest.approx(loss_curve(0)[SPIKE], rel=1e-6)
    assert (rows[0][2], rows[0][3]) == (3e-4, 0.9)  # float32 read back as the decimal that was logged
    evals = query(run, "SELECT step, name FROM eval_scores ORDER BY step")
    assert evals == [(s, "loss") for s in range(49, STEPS, 50)]
    user = query(run, "SELECT name, kind, value FROM metrics WHERE name LIKE 't%' AND step = 7 ORDER BY name")
    assert user == [("tf2/throughput", "step", 107.0), ("tokens_per_s", "step", 1007.0)]


def test_rank_subdirectories_become_ranks(imported):
    from bedside.app.service.detection import detect_run

    run = imported[0] / "ranked"
    detect_run(run)  # ingests, as detection does
    times = query(run, "SELECT rank, avg(step_time) FROM rank_step_metrics GROUP BY rank ORDER BY rank")
    assert times == [(0, pytest.approx(0.5)), (1, pytest.approx(0.6))]
    assert query(run, "SELECT count(*), min(loss) FROM step_metrics") == [(40, pytest.approx(1.61))]
    local = query(run, "SELECT DISTINCT rank, kind FROM metrics WHERE name = 'local_loss'")
    assert local == [(1, "rank_step")]


def test_a_truncated_event_file_imports_what_was_written_and_says_what_was_lost(tmp_path):
    write_ranked(tmp_path / "logs", ranks=1, steps=30)
    (event,) = (tmp_path / "logs" / "rank_0").iterdir()
    event.write_bytes(event.read_bytes()[:-5])  # the writer died in the middle of its last record
    (summary,) = import_tensorboard(tmp_path / "logs", tmp_path / "run")
    assert summary.records["step"] == 30 and summary.records["rank_step"] == 29
    (lost,) = summary.warnings
    assert "the last record is truncated" in lost and f"{30 * 2} records before it were read" in lost


def test_a_record_that_fails_its_checksum_is_skipped_and_counted(tmp_path):
    write_ranked(tmp_path / "logs", ranks=1, steps=30)
    (event,) = (tmp_path / "logs" / "rank_0").iterdir()
    data = event.read_bytes()
    at = data.index(b"step_time", len(data) // 2)
    event.write_bytes(data[:at] + b"S" + data[at + 1 :])
    (summary,) = import_tensorboard(tmp_path / "logs", tmp_path / "run")
    assert summary.records["rank_step"] == 29 and summary.records["step"] == 30
    assert summary.warnings == (f"{event}: 1 record skipped (failed the checksum)",)


def test_megatron_tensorboard_names_reach_canonical_metrics(tmp_path):
    """Megatron-LM's writer: ``lm loss``, ``grad-norm``, ``learning-rate``, ``iteration-time`` (seconds) per
    iteration, and copies of each against the samples consumed, which are left out."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path / "tb")) as writer:
        for step in range(1, 21):
            for tag, value in (("lm loss", 2.0), ("grad-norm", 0.9), ("learning-rate", 3e-4), ("iteration-time", 1.2)):
                writer.add_scalar(tag, value, step)
                writer.add_scalar(f"{tag} vs samples", value, step * 256)
            if step % 10 == 0:
                writer.add_scalar("lm loss validation", 2.1, step)
    (summary,) = import_tensorboard(tmp_path / "tb", tmp_path / "run")
    assert summary.records == {"rank_info": 1, "step": 20, "rank_step": 20, "eval": 2}
    assert summary.warnings[0].startswith("left out as mapped: grad-norm vs samples, iteration-time vs samples")
    records = [json.loads(x) for x in (tmp_path / "run/telemetry/rank-00000.jsonl").read_text().splitlines()]
    assert records[1]["metrics"] == {"loss": 2.0, "grad_norm": 0.9, "lr": 3e-4}
    assert records[2]["kind"] == "rank_step" and records[2]["metrics"] == {"step_time": 1.2}


def test_a_restart_from_an_earlier_step_starts_a_new_timeline(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for start, stop in ((0, 20), (10, 25)):  # killed at 19, resumed from the checkpoint of step 10
        with SummaryWriter(str(tmp_path / "logs"), filename_suffix=f".{start}") as writer:
            for step in range(start, stop):
                writer.add_scalar("train/loss", 1.0, step)
    import_tensorboard(tmp_path / "logs", tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run/telemetry/rank-00000.jsonl").read_text().splitlines()]
    steps = [(r["timeline"], r["step"]) for r in records if r["kind"] == "step"]
    assert steps == [(0, s) for s in range(20)] + [(1, s) for s in range(10, 25)]


def test_a_symbolic_link_is_refused_and_nothing_is_written(tmp_path, logdir):
    (tmp_path / "logs").mkdir()
    target = next((logdir / "single").iterdir())
    os.symlink(target, tmp_path / "logs" / target.name)
    with pytest.raises(ImportFormatError, match="a symbolic link, not a regular file: refused unread"):
        import_tensorboard(tmp_path / "logs", tmp_path / "run")
    assert not (tmp_path / "run").exists()
    (tmp_path / "logs" / target.name).unlink()
    os.symlink(logdir / "single", tmp_path / "logs" / "linked")
    with pytest.raises(ImportFormatError, match="linked: a symbolic link to a directory, not followed: refused"):
        import_tensorboard(tmp_path / "logs", tmp_path / "run")


def test_a_loop_of_links_is_refused_or_passed_over_and_never_followed(tmp_path):
    write_ranked(tmp_path / "logs", ranks=1, steps=3)
    os.symlink(".", tmp_path / "logs" / "rank_0" / "loop")
    with pytest.raises(ImportFormatError, match="rank_0/loop: a symbolic link to a directory, not followed"):
        import_tensorboard(tmp_path / "logs", tmp_path / "run")
    (tmp_path / "logs" / "rank_0" / "loop").unlink()
    os.symlink("itself", tmp_path / "logs" / "itself")  # leads nowhere: no folder, no event file
    os.symlink("nowhere", tmp_path / "logs" / "dangling")
    (summary,) = import_tensorboard(tmp_path / "logs", tmp_path / "run")
    assert summary.steps == 3


def nest(root: Path, levels: int) -> list[Path]:
    """``levels`` folders named ``a``, each in the one before, below ``root``: the folders, outermost first."""
    chain = [root / "a"]
    for _ in range(levels - 1):
        chain.append(chain[-1] / "a")
    for folder in chain:
        folder.mkdir()
    return chain


def test_folders_nested_past_the_limit_are_refused_by_name_and_nothing_is_written(tmp_path, bedside):
    """1,100 nested empty folders made the recursive os.walk end in a RecursionError traceback."""
    write_ranked(tmp_path / "logs", ranks=1, steps=3)
    chain = nest(tmp_path / "logs", 1_100)
    try:
        done = bedside("import", "tensorboard", tmp_path / "logs", "--out", tmp_path / "run", "--quiet")
    finally:
        for folder in reversed(chain):  # shutil.rmtree recurses as deep as the folders nest
            folder.rmdir()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"logs: folders nest more than {MAX_FOLDER_DEPTH} levels deep (MAX_FOLDER_DEPTH), at a/a/" in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_run_at_the_deepest_level_read_is_found(tmp_path):
    deep = tmp_path / "logs" / Path(*["a"] * (MAX_FOLDER_DEPTH - 1))
    write_ranked(deep, ranks=1, steps=3)  # its rank_0 is MAX_FOLDER_DEPTH levels below logs
    (summary,) = import_tensorboard(tmp_path / "logs", tmp_path / "run")
    assert (
        summary.steps == 3
        and json.loads((tmp_path / "run" / "run.json").read_text())["name"]
        == deep.relative_to(tmp_path / "logs").as_posix()
    )


def test_a_source_folder_of_more_entries_than_the_limit_is_refused(tmp_path):
    for name in ("a", "b/c", "b/d"):
        (tmp_path / "logs" / name).mkdir(parents=True)
    assert [listing.folder.name for listing in FolderScan(tmp_path / "logs", max_entries=4).walk()] == [
        "logs", "a", "b", "c", "d"
    ]  # fmt: skip
    with pytest.raises(BoundedInputError, match=r"logs: more than 3 files and folders in it .*\(MAX_FOLDER_ENTRIES\)"):
        list(FolderScan(tmp_path / "logs", max_entries=3).walk())


def test_two_names_for_one_metric_are_named(tmp_path, logdir):
    with pytest.raises(ImportFormatError, match=r"grad_norm and train/loss \(at .*\) both become loss at step 0"):
        import_tensorboard(logdir / "single", tmp_path / "run", names={"grad_norm": "loss"})
    with pytest.raises(ImportFormatError, match="no TensorBoard event files"):
        import_tensorboard(tmp_path, tmp_path / "run")


def test_the_cli_maps_names_and_leaves_metrics_out(tmp_path, logdir, bedside):
    done = bedside(
        "import", "tensorboard", logdir / "single", "--out", tmp_path / "run", "--quiet",
        "--map", "tokens_per_s=throughput", "--map", "val_loss=",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "left out as mapped: val_loss" in done.stderr
    found = bedside("query", tmp_path / "run", "SELECT DISTINCT name FROM metrics ORDER BY name", "--format", "json")
    assert [r["name"] for r in json.loads(found.stdout)] == ["grad_norm", "loss", "lr", "tf2/throughput", "throughput"]
    twice = bedside("import", "tensorboard", logdir, "--out", tmp_path / "x", "--map", "a=b", "--map", "a=c")
    assert twice.returncode == 2 and "a is mapped to two names, b and c" in twice.stderr


def test_the_cli_imports_every_run_of_a_log_dir_and_runs_lists_them(tmp_path, logdir, bedside):
    done = bedside("import", "tensorboard", logdir, "--out", tmp_path / "runs", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "1 non-scalar values (histograms, images, text, ...) not imported" in done.stderr
    listed = bedside("runs", tmp_path / "runs", "--format", "json")
    assert sorted(r["name"] for r in json.loads(listed.stdout)) == ["ranked", "single"]
    again = bedside("import", "tensorboard", logdir, "--out", tmp_path / "runs", "--name", "x")
    assert again.returncode == 2 and "holds 2 runs (ranked, single); a name names one run" in again.stderr


def test_the_dashboard_shows_an_imported_run_and_its_spike(imported):
    from dashboard_app import assert_rendered, open_page, serve, table

    from bedside.app.dashboard import registry
    from bedside.app.service.detection import detect_run

    detect_run(imported[0] / "single")
    serve(imported[0])
    try:
        overview = open_page("overview", run="single")
        assert_rendered(overview)
        incidents = open_page("incidents", run="single")
        assert_rendered(incidents)
        listed = table(incidents, "severity", "status", "onset", "id")
        assert any(str(i).startswith("loss_spike@0:") for i in listed["id"]), listed
    finally:
        registry.close_all()
