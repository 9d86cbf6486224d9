"""Crash, resume and checkpoint fallback with the real trainer: two gloo ranks under torchrun;
control requests across a crash and a resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bedside.collectors.control import request_action
from bedside.collectors.control_inbox import RETAKEN_NOTE
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(
    reason="each module fixture trains a two-rank run, crashes it and resumes it under torchrun"
)

STEPS, EVERY, CRASH = 30, 10, 25


def train(run: Path, *extra: str) -> subprocess.CompletedProcess:
    """``bedside train`` over two ranks, to its end (a crash included)."""
    command = [
        sys.executable,
        "-m",
        "bedside.app.cli",
        "train",
        "--nproc",
        "2",
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--out",
        str(run),
        *extra,
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


def corrupt_one_byte(checkpoint: Path) -> Path:
    victim = next(p for p in sorted(checkpoint.iterdir()) if p.suffix == ".distcp")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    return victim


def collect(run: Path) -> Store:
    store = Store.open(run / "bedside.duckdb")
    Collector(run, store).ingest_available()
    return store


def resume_to_the_end(run: Path) -> Store:
    """``bedside train --resume``, which must finish; the run's store, with everything ingested."""
    done = train(run, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    return collect(run)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> Path:
    """A run whose rank 1 crashed at step 25 (checkpoints at 10 and 20 on timeline 0), trained once: each fixture
    below resumes its own copy (a run's folder holds no absolute path: it can be moved or copied)."""
    run = tmp_path_factory.mktemp("crashed") / "run"
    assert train(run, "--inject", f"crash:rank=1,step={CRASH}").returncode != 0
    return run


def copy_of(run: Path, tmp_path_factory) -> Path:
    return Path(shutil.copytree(run, tmp_path_factory.mktemp("copy") / "run", symlinks=True))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, crashed: Path) -> tuple[Store, Path, Path]:
    run = copy_of(crashed, tmp_path_factory)
    victim = corrupt_one_byte(run / "checkpoints" / "step-00000020-t0")
    store = resume_to_the_end(run)
    yield store, victim, run
    store.close()


def rows(store: Store, query: str, *params) -> list[tuple]:
    return store.cursor().execute(query, list(params)).fetchall()


def test_a_corrupt_checkpoint_is_reported_and_the_previous_one_loaded(resumed) -> None:
    store, victim, _ = resumed
    events = rows(
        store, "SELECT event, path, message FROM checkpoint_events WHERE event IN ('corrupt', 'loaded') ORDER BY time"
    )
    assert [(event, path) for event, path, _ in events] == [
        ("corrupt", "checkpoints/step-00000020-t0"),
        ("loaded", "checkpoints/step-00000010-t0"),
    ]
    assert victim.name in events[0][2]


def test_the_resumed_run_retrains_on_a_new_timeline_and_reproduces_the_lost_steps(resumed) -> None:
    store, *_ = resumed
    assert rows(store, "SELECT timeline, min(step), max(step) FROM step_metrics GROUP BY ALL ORDER BY 1") == [
        (0, 1, CRASH - 1),
        (1, EVERY + 1, STEPS),
    ]
    replayed = rows(
        store,
        "SELECT a.loss = b.loss FROM step_metrics a JOIN step_metrics b USING (step) "
        "WHERE a.timeline = 0 AND b.timeline = 1",
    )
    assert len(replayed) == CRASH - 1 - EVERY and all(same for (same,) in replayed)


def test_the_resumed_run_finishes_with_its_checkpoints_saved(resumed) -> None:
    store, *_ = resumed
    assert rows(store, "SELECT status, timeline, last_step FROM run") == [("finished", 1, STEPS)]
    saved = rows(store, "SELECT timeline, step FROM checkpoint_events WHERE event = 'saved' ORDER BY time")
    # Step 10's save is reported when step 20's starts; step 20's when the loop next finds it done, which on a loaded
    # machine can be after rank 1 crashes at step 25 (its files are there: the test above corrupts one of them).
    assert saved[-2:] == [(1, 20), (1, 30)] and saved[:-2] in ([(0, 10), (0, 20)], [(0, 10)])
    assert rows(store, "SELECT step, rank, fault FROM fault_labels") == [(CRASH, 1, "crash")]


def test_run_json_records_the_mesh_and_each_ranks_coordinates(resumed) -> None:
    """Data parallel only: a mesh of dp=2, tp=1, pp=1, rank r at dp=r (kept by the relaunch)."""
    *_, run = resumed
    info = json.loads((run / "run.json").read_text())
    assert info["world_size"] == 2 and info["mesh"] == {"dp": 2, "tp": 1, "pp": 1}
    assert [(p["rank"], p["dp"], p["tp"], p["pp"]) for p in info["topology"]] == [(0, 0, 0, 0), (1, 1, 0, 0)]


# -- a request across crashes: applied once to the history the run continues -----------------
@pytest.fixture(scope="module")
def rewound_across_crashes(tmp_path_factory, crashed: Path) -> tuple[Store, str]:
    """A rewind to step 10, filed after a crash at step 25 (checkpoints at 10 and 20 on timeline 0), then:

    1. resumed from step 20 (timeline 1): the rewind is applied (timeline 2), and rank 1 crashes at step
       15, before any checkpoint holds the rewind;
    2. resumed from step 20 of timeline 0 again: the rewind's effect was lost, so it is applied again
       (timelines 3, then 4), saved at step 20, and rank 0 crashes at step 29 once that save is published;
    3. the request's file is put back where a crash between applying and archiving it would leave it,
       and the run resumed from step 20 of timeline 4, whose state holds the rewind: it is not applied.
    """
    run = copy_of(crashed, tmp_path_factory)
    layout = RunLayout(run)
    rewind = request_action(layout, "rewind", {"to_step": EVERY}, operator="tester", reason="before the spike")
    for crash in ("rank=1,step=15", "rank=0,step=29,save=kept"):
        assert train(run, "--resume", "--inject", f"crash:{crash}").returncode != 0
    assert (layout.checkpoints / "step-00000020-t4").is_dir()
    os.replace(layout.control_processed / f"{rewind}.json", layout.control_requests / f"{rewind}.json")
    store = resume_to_the_end(run)
    yield store, rewind
    store.close()


def test_a_request_whose_effect_a_crash_lost_is_applied_again_and_never_twice(rewound_across_crashes) -> None:
    store, rewind = rewound_across_crashes
    assert rows(store, "SELECT timeline, min(step), max(step) FROM step_metrics GROUP BY ALL ORDER BY 1") == [
        (0, 1, CRASH - 1),
        (2, EVERY + 1, 14),
        (4, EVERY + 1, 28),
        (5, 21, STEPS),
    ]
    acks = rows(
        store,
        "SELECT timeline, status, message FROM action_events WHERE request_id = ? ORDER BY time, status DESC",
        rewind,
    )
    assert [(timeline, status) for timeline, status, _ in acks] == [
        (1, "requested"),
        (2, "applied"),
        (3, "requested"),
        (4, "applied"),
        (5, "requested"),
        (5, "rejected"),
    ]
    assert acks[2][2] == RETAKEN_NOTE and acks[5][2] == f"duplicate: request {rewind} was already received"
    assert rows(store, "SELECT status, timeline, last_step FROM run") == [("finished", 5, STEPS)]


# -- every checkpoint corrupt: a fresh start on a new timeline ------------------------------------------------------
@pytest.fixture(scope="module")
def restarted_from_scratch(tmp_path_factory) -> tuple[Store, Path]:
    """A finished run whose three checkpoints were all damaged, resumed: nothing good to load."""
    run = tmp_path_factory.mktemp("all-corrupt") / "run"
    assert train(run).returncode == 0
    for checkpoint in sorted((run / "checkpoints").iterdir()):
        corrupt_one_byte(checkpoint)
    store = resume_to_the_end(run)
    yield store, run
    store.close()


def test_a_restart_with_every_checkpoint_corrupt_retrains_on_a_new_timeline(restarted_from_scratch) -> None:
    store, _ = restarted_from_scratch
    assert rows(store, "SELECT timeline, step FROM step_metrics GROUP BY ALL HAVING count(*) > 1") == []
    assert rows(store, "SELECT timeline, min(step), max(step) FROM step_metrics GROUP BY ALL ORDER BY 1") == [
        (0, 1, STEPS),
        (1, 1, STEPS),
    ]
    [(message,)] = rows(store, "SELECT message FROM event_log WHERE kind = 'log' AND message LIKE 'no good%'")
    assert message == "no good checkpoint to resume from: starting from step 0 on timeline 1"
    assert rows(store, "SELECT status, timeline, last_step FROM run") == [("finished", 1, STEPS)]


def test_the_corrupt_checkpoints_are_reported_and_make_way_for_the_new_good_ones(restarted_from_scratch) -> None:
    store, run = restarted_from_scratch
    corrupt = [f"checkpoints/step-{step:08d}-t0" for step in (30, 20, 10)]
    assert rows(store, "SELECT path FROM checkpoint_events WHERE event = 'corrupt' ORDER BY time") == [
        (path,) for path in corrupt
    ]
    assert sorted(
        path for (path,) in rows(store, "SELECT path FROM checkpoint_events WHERE event = 'deleted'")
    ) == sorted(corrupt)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step-{step:08d}-t1" for step in (10, 20, 30)]


def test_the_corrupt_checkpoints_raise_a_critical_finding_with_their_paths(restarted_from_scratch, bedside) -> None:
    *_, run = restarted_from_scratch
    result = bedside("detect", run, "--json")
    assert result.returncode == 0, result.stderr
    [finding] = [f for f in map(json.loads, result.stdout.splitlines()) if f["kind"] == "checkpoint_corrupt"]
    assert finding["severity"] == "critical" and finding["evidence"]["count"] == 3
    assert [c["path"] for c in finding["evidence"]["checkpoints"]] == [
        f"checkpoints/step-{step:08d}-t0" for step in (30, 20, 10)
    ]
    assert all("does not match the manifest" in c["reason"] for c in finding["evidence"]["checkpoints"])
    assert finding["evidence"]["cleared_at_step"] == EVERY  # the first checkpoint saved on the new timeline
