"""Control requests in the framework integrations, end to end: a tiny GPT-2 trained by each framework on two
gloo ranks under torchrun takes, through bedside's callback, a pause, a rewind (to its newest checkpoint at or
before the step asked; one before any checkpoint is rejected), a skip (exactly the step batches asked dropped,
their sample ids recorded), a quarantine it cannot apply (rejected with the reason), a checkpoint and a stop;
the answers are read from the run's store."""

from __future__ import annotations

import json

import pytest
from torch.utils.data import DistributedSampler
from torchrun_runs import acks, answered, records, rows, start, wait_for

from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="Hugging Face and Lightning runs on two torchrun ranks, taking control requests")

STEP_BATCH = 8
"""Sample ids a step reads: two ranks of four."""
STEPS = 3000
QUARANTINE_REFUSED = {
    "hf_run.py": "quarantine: a transformers Trainer reads no shards that bedside can leave out",
    "lightning_run.py": "quarantine: a Lightning fit reads no shards that bedside can leave out",
}


@pytest.fixture(scope="module", params=sorted(QUARANTINE_REFUSED))
def controlled(request, tmp_path_factory) -> dict:
    """A run that took the requests, its store, the request ids, the step it paused at and what each rank read."""
    folder = tmp_path_factory.mktemp(request.param.removesuffix(".py"))
    run, out = folder / "run", folder / "out"
    out.mkdir()
    loop, file = start(request.param, run, str(STEPS), "--control", str(out))
    try:
        wait_for(lambda: any(r["kind"] == "checkpoint" for r in records(run)), "a checkpoint", loop)
        ids = {"pause": file("pause")}
        wait_for(lambda: answered(run, ids["pause"]), "the pause", loop)
        paused_at = acks(run, ids["pause"])[-1]["step"]
        ids |= {
            "early": file("rewind", to_step=3),
            "rewind": file("rewind", to_step=paused_at - 1),
            "skip": file("skip", first_batch=paused_at + 5, last_batch=paused_at + 6),
            "quarantine": file("quarantine", shard=0),
        }
        ids["resume"] = file("resume")
        wait_for(lambda: answered(run, ids["skip"]), "the skip", loop)
        ids["checkpoint"] = file("checkpoint")
        wait_for(lambda: answered(run, ids["checkpoint"]), "the checkpoint", loop)
        ids["stop"] = file("stop")
        assert loop.wait(timeout=120) == 0, loop.communicate()[0]
    finally:
        if loop.poll() is None:
            loop.kill()
    store = Store.open(run / "bedside.duckdb")
    Collector(run, store).ingest_available()
    read = [json.loads((out / f"rank-{rank}.json").read_text())["read"] for rank in (0, 1)]
    yield {"store": store, "ids": ids, "paused_at": paused_at, "read": read, "script": request.param}
    store.close()


def answers(run: dict, name: str) -> list[tuple]:
    return rows(
        run["store"],
        "SELECT status, timeline, step, message, args FROM action_events"
        f" WHERE request_id = '{run['ids'][name]}' ORDER BY time",
    )


def test_a_rewind_loads_the_newest_checkpoint_at_or_before_the_step_and_goes_on_on_a_new_timeline(controlled) -> None:
    paused_at = controlled["paused_at"]
    saved = (paused_at - 1) // 10 * 10  # a checkpoint of the step paused at is saved after its boundary
    (requested, applied) = answers(controlled, "rewind")
    assert (requested[0], requested[1:3]) == ("requested", (0, paused_at))
    assert (applied[0], applied[1:3]) == ("applied", (1, saved))
    assert applied[3].startswith(f"rewound to the checkpoint of step {saved} (") and applied[3].endswith(
        "continuing on timeline 1"
    )
    assert rows(
        controlled["store"],
        "SELECT rank, min(step) FROM rank_step_metrics WHERE timeline = 1 GROUP BY rank ORDER BY rank",
    ) == [(0, saved + 1), (1, saved + 1)]
    (early,) = [a for a in answers(controlled, "early") if a[0] != "requested"]
    assert early[0] == "rejected" and early[3].startswith("no checkpoint at or before step 3 (checkpoints saved at")


def rank_orders(script: str, count: int) -> list[list[int]]:
    """The sample ids each rank reads, in order, without a skip: the Trainer's sequential batches dealt to the
    ranks in turn by accelerate, or the shares of torch's shuffled ``DistributedSampler`` that Lightning uses."""
    if script == "hf_run.py":
        batches = [list(range(at, at + 4)) for at in range(0, count, 4)]
        return [[i for batch in batches[rank::2] for i in batch] for rank in (0, 1)]
    return [list(DistributedSampler(range(count), num_replicas=2, rank=rank, shuffle=True)) for rank in (0, 1)]


def test_a_skip_drops_exactly_the_step_batches_asked_and_records_their_sample_ids(controlled) -> None:
    first = controlled["paused_at"] + 5
    orders = rank_orders(controlled["script"], STEP_BATCH * STEPS)
    skipped = {i for order in orders for i in order[4 * first : 4 * (first + 2)]}
    (applied,) = [a for a in answers(controlled, "skip") if a[0] == "applied"]
    assert len(json.loads(applied[4])["sample_ids"]) == 16 and set(json.loads(applied[4])["sample_ids"]) == skipped
    assert applied[3] == f"skipped batches {first} to {first + 1}: 16 samples not read"
    for order, read in zip(orders, controlled["read"], strict=True):
        kept = [i for i in order if i not in skipped]
        assert len(read) > 4 * (first + 2) and read == kept[: len(read)]


def test_what_the_framework_cannot_apply_is_rejected_and_a_checkpoint_and_a_stop_are_applied(controlled) -> None:
    assert [a[0] for a in answers(controlled, "quarantine")] == ["requested", "rejected"]
    assert answers(controlled, "quarantine")[-1][3] == QUARANTINE_REFUSED[controlled["script"]]
    for name in ("pause", "resume", "checkpoint", "stop"):
        assert [a[0] for a in answers(controlled, name)] == ["requested", "applied"], name
    assert rows(controlled["store"], "SELECT status FROM run") == [("finished",)]
