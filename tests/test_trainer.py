"""The instrumented trainer end to end: two gloo ranks under torchrun, then the store."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store
from bedside.trainer.config import OptimConfig, preset
from bedside.trainer.schedule import lr_at

pytestmark = pytest.mark.slow(reason="the module fixture trains two-rank runs under torchrun")

STEPS = 40


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Store:
    run = tmp_path_factory.mktemp("train") / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "bedside.app.cli", "train", "--nproc", "2", "--steps", str(STEPS), "--out", str(run)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    store = Store.open(run / "bedside.duckdb")
    Collector(run, store).ingest_available()
    yield store
    store.close()


def rows(store: Store, query: str) -> list[tuple]:
    return store.cursor().execute(query).fetchall()


def test_every_step_is_recorded_once_by_the_job_and_by_each_rank(trained_run: Store) -> None:
    assert rows(trained_run, "SELECT count(*), min(step), max(step) FROM step_metrics") == [(STEPS, 1, STEPS)]
    assert rows(trained_run, "SELECT rank, count(*) FROM rank_step_metrics GROUP BY rank ORDER BY rank") == [
        (0, STEPS),
        (1, STEPS),
    ]
    assert rows(trained_run, "SELECT status, world_size FROM run") == [("finished", 2)]
    assert rows(trained_run, "SELECT count(*) FROM rejected") == [(0,)]


def test_the_loss_falls_and_evals_report_the_excess_over_the_entropy_floor(trained_run: Store) -> None:
    [(first, last)] = rows(
        trained_run, "SELECT avg(loss) FILTER (step <= 5), avg(loss) FILTER (step > 35) FROM step_metrics"
    )
    assert last < first - 0.3
    evals = rows(trained_run, "SELECT name, value, cum_tokens FROM eval_scores ORDER BY step, name")
    names = {name for name, _, _ in evals}
    assert names == {"loss", "accuracy", "excess_loss"}
    assert all(value > 0 for name, value, _ in evals if name == "excess_loss")


def test_ranks_record_phases_local_grad_norms_and_identical_parameter_checksums(trained_run: Store) -> None:
    [(missing,)] = rows(
        trained_run,
        "SELECT count(*) FROM rank_step_metrics WHERE step_time IS NULL OR "
        "compute_time IS NULL OR comm_time IS NULL OR local_grad_norm IS NULL",
    )
    assert missing == 0
    checksums = rows(
        trained_run,
        "SELECT step, count(DISTINCT param_checksum), count(*) FROM rank_step_metrics "
        "WHERE param_checksum IS NOT NULL GROUP BY step ORDER BY step",
    )
    assert [step for step, _, _ in checksums] == list(range(10, STEPS + 1, 10))
    assert all(distinct == 1 and ranks == 2 for _, distinct, ranks in checksums)


def test_each_step_records_tokens_flops_and_the_shards_it_read(trained_run: Store) -> None:
    [(tokens, flops, shards)] = rows(trained_run, "SELECT tokens, flops, shards FROM step_metrics WHERE step = 1")
    config = preset("tiny_cpu")
    assert tokens == config.tokens_per_step and flops > 6 * tokens
    assert shards is not None and len(shards) > 2
    assert rows(trained_run, "SELECT count(*) FROM ranks WHERE declared_by = 'run.json'") == [(2,)]


def test_the_learning_rate_warms_up_then_decays_to_its_floor() -> None:
    optim = OptimConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(5, optim, 100) == pytest.approx(0.5)
    assert lr_at(10, optim, 100) == pytest.approx(1.0)
    assert lr_at(100, optim, 100) == pytest.approx(0.1)
    assert lr_at(55, optim, 100) == pytest.approx(0.55)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--preset", "nope"), "unknown preset 'nope'; known: tiny_cpu"),
        (("--inject", "straggler:rank=5,from=3"), "rank 5 is out of range for world size 2"),
    ],
    ids=["unknown preset", "fault on a rank outside the run"],
)
def test_bad_training_options_are_refused_once_before_any_rank_starts(tmp_path, args: tuple, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bedside.app.cli", "train", "--out", str(tmp_path / "run"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("bedside: error:") == 1 and message in done.stderr
    assert not (tmp_path / "run").exists()
