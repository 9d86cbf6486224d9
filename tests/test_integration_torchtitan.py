"""The torchtitan logger, called as torchtitan's ``MetricsProcessor`` calls its logger (torchtitan itself cannot be
installed here): the metric names of its ``log()`` calls, every ``log_freq`` steps, then ``close()``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bedside.collectors import RunLogger
from bedside.collectors.ingest import Collector
from bedside.collectors.integrations.torchtitan import TorchtitanLogger
from bedside.collectors.store import Store


def titan_metrics(rng: random.Random, tokens_seen: int) -> dict[str, float]:
    """One training log of torchtitan's metrics processor, with its names."""
    loss = 4 + rng.gauss(0, 0.1)
    return {
        "loss_metrics/global_avg_loss": loss,
        "loss_metrics/global_max_loss": loss + abs(rng.gauss(0, 0.2)),
        "grad_norm": abs(rng.gauss(1, 0.1)),
        "throughput(tps)": 9000 + rng.gauss(0, 100),
        "tflops": 120.0,
        "mfu(%)": 38.5,
        "time_metrics/end_to_end(s)": 0.5,
        "time_metrics/data_loading(s)": 0.01,
        "time_metrics/data_loading(%)": 2.0,
        "memory/max_active(GiB)": 40.0,
        "lr": 3e-4,
        "n_tokens_seen": tokens_seen,
    }


@pytest.mark.parametrize(("log_freq", "logs", "seed"), [(1, 7, 0), (10, 4, 1)])
def test_training_and_validation_logs_become_steps_and_evals(
    tmp_path: Path, log_freq: int, logs: int, seed: int
) -> None:
    rng, run = random.Random(seed), tmp_path / "run"
    titan = TorchtitanLogger(run, rank=0, world_size=1, name="titan")
    tokens_per_step = rng.randrange(1000, 5000)
    for i in range(1, logs + 1):
        titan.log(titan_metrics(rng, i * log_freq * tokens_per_step), step=i * log_freq)
    titan.log({"validation_metrics/loss": 3.9, "validation_metrics/perplexity": 49.4}, step=logs * log_freq)
    titan.close()
    with Store.open(run / "bedside.duckdb") as store:
        Collector(run, store).ingest_available()
        cursor = store.cursor()
        steps = cursor.execute(
            "SELECT step, tokens, loss > 3, grad_norm > 0, lr FROM step_metrics ORDER BY step"
        ).fetchall()
        assert steps == [(i * log_freq, log_freq * tokens_per_step, True, True, 3e-4) for i in range(1, logs + 1)]
        extra = cursor.execute("SELECT extra['mfu_pct'], extra['step_time_mean'] FROM steps LIMIT 1").fetchall()
        assert extra == [(38.5, 0.5)]
        evals = cursor.execute("SELECT step, name, value, cum_tokens FROM eval_scores ORDER BY name").fetchall()
        last = logs * log_freq
        assert evals == [
            (last, "loss", 3.9, last * tokens_per_step),
            (last, "perplexity", 49.4, last * tokens_per_step),
        ]
        assert cursor.execute("SELECT status FROM run").fetchall() == [("finished",)]
        assert cursor.execute("SELECT count(*) FROM rejected").fetchall() == [(0,)]


def test_a_value_that_is_not_a_number_is_refused_and_nothing_recorded_is_lost(tmp_path: Path) -> None:
    run = tmp_path / "run"
    titan = TorchtitanLogger(run, rank=0, world_size=1)
    titan.log({"loss_metrics/global_avg_loss": 4.0}, step=1)
    with pytest.raises((TypeError, ValueError), match="must be numbers"):
        titan.log({"mfu(%)": "high"}, step=2)
    titan.close()
    with Store.open(run / "bedside.duckdb") as store:
        Collector(run, store).ingest_available()
        assert store.cursor().execute("SELECT step, loss FROM step_metrics").fetchall() == [(1, 4.0)]


def test_either_a_run_directory_or_a_logger(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="either a run directory or a RunLogger"):
        TorchtitanLogger()
    held = RunLogger(tmp_path / "run", rank=0, world_size=1)
    with pytest.raises(ValueError, match="not both"):
        TorchtitanLogger(tmp_path / "run", logger=held)
    titan = TorchtitanLogger(logger=held)
    titan.log({"loss_metrics/global_avg_loss": 3.5}, step=4)
    titan.close()
    assert '"loss":3.5' in (tmp_path / "run/telemetry/rank-00000.jsonl").read_text()
