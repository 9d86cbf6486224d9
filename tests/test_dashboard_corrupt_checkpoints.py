"""A checkpoint the trainer later found corrupt is not offered as good by the dashboard's queries: the checkpoints
table marks it corrupt (matched by path, since the trainer reports ``corrupt`` at the step it has reached), the newest
good checkpoint skips it, and the action form's rewind prefill never picks it. Real telemetry from RunLogger, ingested
into a real store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from bedside.app.dashboard.actions import prefilled_args
from bedside.collectors import RunLogger
from bedside.collectors.store import Store


def path_of(step: int) -> str:
    return f"checkpoints/step-{step:08d}-t0"


def write_run(run: Path, last_step: int, saved: list[int], corrupt: dict[int, int]) -> None:
    """Rank 0 of a one-rank run: steps 1..``last_step``, checkpoints ``saved`` at their steps, and for each
    ``step: saved_step`` of ``corrupt`` a ``corrupt`` event at ``step`` naming the checkpoint of ``saved_step``."""
    with RunLogger(run, rank=0, world_size=1, local_rank=0) as log:
        for step in range(1, last_step + 1):
            log.step(step, loss=2.0, step_time_s=0.1)
            if step in saved:
                log.checkpoint(step, "save_started")
                log.checkpoint(step, "saved", path=path_of(step), duration_s=0.5, bytes=1000)
            if step in corrupt:
                log.checkpoint(step, "corrupt", path=path_of(corrupt[step]), message="manifest.json: missing")


def states(store: Store) -> dict[int, str]:
    return dict(store.fetch_named("dash_checkpoints")[["step", "state"]].itertuples(index=False, name=None))


def rewind_prefill(store: Store, before: int) -> int:
    incident = pd.Series({"start_step": before, "end_step": before + 2})
    return prefilled_args("rewind", {}, incident, store.fetch_named("dash_checkpoints"))["to_step"]


def test_a_checkpoint_found_corrupt_after_it_was_saved_is_not_good(run_dir: Path, ingest: Callable[..., Store]) -> None:
    """Before, step 20 stayed 'saved' (the corrupt event made a row of its own at step 25) and was offered."""
    write_run(run_dir, 28, saved=[10, 20], corrupt={25: 20})
    store = ingest(run_dir)
    assert states(store) == {10: "saved", 20: "corrupt"}
    assert store.fetch_named("dash_good_checkpoint")["checkpoint_step"].tolist() == [10]
    assert rewind_prefill(store, 26) == 10


def test_retention_reporting_a_corrupt_one_at_a_new_save_marks_the_old_one_not_the_new(
    run_dir: Path, ingest: Callable[..., Store]
) -> None:
    """The trainer reports what retention found corrupt at the step of the save that ran it: before, the new
    checkpoint of step 30 read 'corrupt' and the corrupt one of step 20 was offered for a rewind."""
    write_run(run_dir, 34, saved=[10, 20, 30], corrupt={30: 20})
    store = ingest(run_dir)
    assert states(store) == {10: "saved", 20: "corrupt", 30: "saved"}
    assert store.fetch_named("dash_good_checkpoint")["checkpoint_step"].tolist() == [30]
    assert rewind_prefill(store, 30) == 10 and rewind_prefill(store, 33) == 30


def test_a_corrupt_report_naming_no_checkpoint_seen_is_a_row_of_its_own(
    run_dir: Path, ingest: Callable[..., Store]
) -> None:
    write_run(run_dir, 12, saved=[10], corrupt={5: 3})  # the checkpoint of step 3 predates this telemetry
    store = ingest(run_dir)
    assert states(store) == {5: "corrupt", 10: "saved"}
    assert rewind_prefill(store, 12) == 10
