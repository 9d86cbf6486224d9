"""The Lightning callback end to end: a tiny GPT-2 fitted by ``lightning.pytorch.Trainer`` with DDP on two gloo
ranks under torchrun, then the run collected into a store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from torchrun_runs import FRAMEWORK_STEPS as STEPS
from torchrun_runs import assert_replica_signals, rows, train_and_collect

from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="Lightning fits on two torchrun ranks")


@pytest.fixture(scope="module")
def fitted_run(tmp_path_factory) -> Iterator[Store]:
    store = train_and_collect("lightning_run.py", tmp_path_factory.mktemp("lightning") / "run", STEPS)
    yield store
    store.close()


def test_every_rank_writes_rank_step_and_one_rank_the_job_step(fitted_run: Store) -> None:
    store, steps = fitted_run, STEPS
    per_rank = rows(
        store,
        "SELECT rank, count(*), count(compute_time), count(optimizer_time), count(extra['local_loss']),"
        " count(cpu_wait_time) FROM rank_step_metrics GROUP BY rank ORDER BY rank",
    )
    assert per_rank == [(0, steps, steps, steps, steps, steps), (1, steps, steps, steps, steps, steps)]
    job = rows(store, "SELECT count(*), count(DISTINCT rank), count(loss), count(grad_norm), min(grad_norm) FROM steps")
    assert job[0][:4] == (steps, 1, steps, steps) and job[0][4] > 0
    assert rows(store, "SELECT status, world_size FROM run") == [("finished", 2)]
    assert rows(store, "SELECT count(*) FROM rejected") == [(0,)]


def test_validation_ends_are_evals_and_saves_are_checkpoint_records(fitted_run: Store) -> None:
    store, steps = fitted_run, STEPS
    half = steps // 2
    assert rows(store, "SELECT step, name FROM eval_scores ORDER BY step") == [
        (half, "val_loss"),
        (2 * half, "val_loss"),
    ]
    saves = rows(store, "SELECT step, event FROM checkpoint_events ORDER BY step")
    assert (2 * half, "save_started") in saves


def test_every_rank_carries_its_local_gradient_norm_and_the_replicas_share_each_checksum(fitted_run: Store) -> None:
    store, steps = fitted_run, STEPS
    assert_replica_signals(store, steps, checksum_every=5)
