"""The Hugging Face callback end to end: a tiny GPT-2 trained by ``transformers.Trainer`` on two gloo ranks under
torchrun, then the run collected into a store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from torchrun_runs import FRAMEWORK_STEPS as STEPS
from torchrun_runs import assert_replica_signals, rows, train_and_collect

from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="Hugging Face Trainer runs on two torchrun ranks")


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory) -> Iterator[Store]:
    store = train_and_collect("hf_run.py", tmp_path_factory.mktemp("hf") / "run", STEPS)
    yield store
    store.close()


def test_every_rank_writes_its_step_times_and_the_job_rank_the_steps(hf_run: Store) -> None:
    store, steps = hf_run, STEPS
    per_rank = rows(
        store,
        "SELECT rank, count(*), count(compute_time), count(optimizer_time), bool_and(step_time >= compute_time),"
        " bool_and(cpu_wait_time >= 0) FROM rank_step_metrics GROUP BY rank ORDER BY rank",
    )
    assert per_rank == [(0, steps, steps, steps, True, True), (1, steps, steps, steps, True, True)]
    assert rows(store, "SELECT count(*), count(loss), count(grad_norm), count(lr), sum(tokens) FROM step_metrics") == [
        (steps, steps, steps, steps, steps * 2 * 4 * 16)
    ]
    assert rows(store, "SELECT status, world_size FROM run") == [("finished", 2)]
    assert rows(store, "SELECT count(*) FROM rejected") == [(0,)]


def test_evaluations_carry_the_compute_spent_and_saves_are_checkpoint_records(hf_run: Store) -> None:
    store, steps = hf_run, STEPS
    evals = rows(store, "SELECT step, name, cum_tokens, cum_flops > 0 FROM eval_scores ORDER BY step")
    assert evals == [(steps // 2, "loss", steps // 2 * 128, True), (steps // 2 * 2, "loss", steps // 2 * 2 * 128, True)]
    saved = rows(store, "SELECT step, event, path FROM checkpoint_events ORDER BY step")
    assert [(step, event) for step, event, _ in saved] == [(steps // 2, "saved"), (steps // 2 * 2, "saved")]
    assert all(Path(path).is_dir() for _, _, path in saved)


def test_every_rank_carries_its_local_gradient_norm_and_the_replicas_share_each_checksum(hf_run: Store) -> None:
    store, steps = hf_run, STEPS
    assert_replica_signals(store, steps, checksum_every=5)
