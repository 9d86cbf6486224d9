"""The control channel with the real trainer: requests filed with ``bedside action`` into a live
two-rank gloo run are applied by every rank at the same step, rejected with a reason, or
rejected as duplicates; a paused run stays paused across a crash and a restart; plus the
request writer's checks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bedside.app.cli import main as bedside
from bedside.app.train import train_command
from bedside.collectors.control import ACTIONS, REQUEST_LIFETIME_S, build_request, check_args, request_action
from bedside.collectors.control_inbox import RETAKEN_NOTE
from bedside.collectors.controlkey import (
    ensure_control_key,
    read_control_key,
    request_signature_problem,
    run_identity,
    sign_request,
)
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="module fixtures train two-rank runs under torchrun, one crashed and resumed")

STEPS, EVERY, FILE_AT = 100, 10, 25
SKIPPED = (40, 44)


def action(run: Path, *args: str) -> str:
    """Run ``bedside action RUN ...``; the request id it prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bedside(["action", str(run), *args, "--operator", "tester"]) == 0
    return out.getvalue().splitlines()[0]


def wait_for(condition, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def reached_step(run: Path, step: int) -> bool:
    path = RunLayout(run).rank_file(0)
    if not path.exists():
        return False
    lines = path.read_text().splitlines()
    return any(json.loads(line).get("step", 0) >= step for line in lines[-20:] if line.endswith("}"))


def start_training(run: Path, *options: str) -> subprocess.Popen:
    """``bedside train --nproc 2 --out RUN ...``, in the background."""
    return subprocess.Popen(
        train_command(["--nproc", "2", "--out", str(run), *options]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def stop(trainer: subprocess.Popen) -> None:
    """End a run that is still going as an operator would: SIGTERM to torchrun, which stops its ranks."""
    if trainer.poll() is None:
        trainer.terminate()
        trainer.communicate(timeout=120)


def finish_and_collect(trainer: subprocess.Popen, run: Path) -> Store:
    """Wait for the run to end successfully; its store, with everything ingested."""
    output, _ = trainer.communicate(timeout=120)
    assert trainer.returncode == 0, output[-3000:]
    store = Store.open(run / "bedside.duckdb")
    Collector(run, store).ingest_available()
    return store


@pytest.fixture(scope="module")
def controlled(tmp_path_factory) -> tuple[Store, dict[str, str]]:
    run = tmp_path_factory.mktemp("control") / "run"
    # Every checkpoint kept: on a loaded machine the run can pass step 50 before the rewind to 20 is read, and
    # with the preset's three kept it would be rejected for want of a checkpoint.
    trainer = start_training(
        run, "--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--keep-checkpoints", str(STEPS // EVERY)
    )
    try:
        wait_for(lambda: reached_step(run, FILE_AT), f"step {FILE_AT}")
        ids = {  # the skip first: it must outlive the rewind, however many steps apart the two are taken
            "skip": action(
                run, "skip", "--first-batch", str(SKIPPED[0]), "--last-batch", str(SKIPPED[1]), "--reason", "bad data"
            ),
            "rewind": action(run, "rewind", "--to-step", "20", "--reason", "loss spike"),
            "too_early": action(run, "rewind", "--to-step", "1", "--reason", "start over"),
            "forward": action(run, "rewind", "--to-step", "500", "--reason", "typo"),
            "bad_time": file_by_hand(run, "req-by-hand", requested_at="now"),
        }
        processed = RunLayout(run).control_processed / f"{ids['rewind']}.json"
        wait_for(processed.exists, "the rewind to be processed")
        (RunLayout(run).control_requests / processed.name).write_text(processed.read_text())  # filed again
        store = finish_and_collect(trainer, run)
    finally:
        stop(trainer)
    yield store, ids
    store.close()


def file_by_hand(run: Path, request_id: str, **fields: object) -> str:
    """A request written (and signed with the run's key) without our writer, as a third party might."""
    body = {
        "request_id": request_id,
        "run_id": run_identity(RunLayout(run)),
        "action": "pause",
        "args": {},
        "operator": "script",
        "reason": "test",
        **fields,
    }
    body["signature"] = sign_request(body, read_control_key(RunLayout(run)))
    requests = RunLayout(run).control_requests
    (requests / f".{request_id}.tmp").write_text(json.dumps(body))
    (requests / f".{request_id}.tmp").rename(requests / f"{request_id}.json")
    return request_id


def rows(store: Store, query: str, *params) -> list[tuple]:
    return store.cursor().execute(query, list(params)).fetchall()


def test_each_request_is_acknowledged_as_requested_then_applied_or_rejected_with_a_reason(controlled) -> None:
    store, ids = controlled
    acks = rows(
        store,
        "SELECT request_id, action, status, operator, reason, message FROM action_events ORDER BY time, status DESC",
    )
    by_id = {name: [row[2:] for row in acks if row[0] == request_id] for name, request_id in ids.items()}
    assert [status for status, *_ in by_id["skip"]] == ["requested", "applied"]
    assert by_id["skip"][1][1:3] == ("tester", "bad data")
    assert by_id["too_early"][-1][0] == "rejected"
    assert by_id["too_early"][-1][3] == "no checkpoint at or before step 1"
    status, *_, message = by_id["forward"][-1]
    assert status == "rejected" and message.startswith("cannot rewind forward: to_step 500 is after the current step")
    assert by_id["bad_time"][-1][0] == "rejected"
    assert by_id["bad_time"][-1][3] == "refused: requested_at must be a number, got 'now'"
    assert [status for status, *_ in by_id["rewind"]][:2] == ["requested", "applied"]
    assert "timeline 1" in by_id["rewind"][1][3]


def test_a_duplicate_request_id_is_applied_once_and_rejected_once(controlled) -> None:
    store, ids = controlled
    statuses = rows(
        store, "SELECT status, message FROM action_events WHERE request_id = ? ORDER BY time", ids["rewind"]
    )
    assert [status for status, _ in statuses] == ["requested", "applied", "requested", "rejected"]
    assert "duplicate" in statuses[-1][1]


def test_the_rewind_starts_a_new_timeline_at_step_21_on_every_rank_at_the_same_step(controlled) -> None:
    store, _ = controlled
    assert rows(
        store, "SELECT rank, min(step) FROM rank_step_metrics WHERE timeline = 1 GROUP BY rank ORDER BY rank"
    ) == [(0, 21), (1, 21)]
    left = rows(store, "SELECT DISTINCT max(step) FROM rank_step_metrics WHERE timeline = 0 GROUP BY rank")
    assert len(left) == 1 and left[0][0] >= FILE_AT
    assert rows(store, "SELECT status, timeline, last_step FROM run") == [("finished", 1, STEPS)]


def test_each_eval_counts_the_compute_of_every_timeline_the_abandoned_branch_included(controlled) -> None:
    """After the rewind, an eval's cum_tokens and cum_flops are what the job spent (the format's compute axis), not
    the checkpoint's count plus the new branch's: the same as the store's spent_tokens over every timeline."""
    store, _ = controlled
    pairs = rows(
        store,
        "SELECT e.timeline, e.cum_tokens, s.spent_tokens, e.cum_flops, s.spent_flops FROM eval_scores e "
        "JOIN step_metrics s USING (timeline, step) WHERE e.name = 'loss' ORDER BY e.time",
    )
    assert 1 in {timeline for timeline, *_ in pairs}  # evals after the rewind
    for _, cum_tokens, spent_tokens, cum_flops, spent_flops in pairs:
        assert cum_tokens == spent_tokens and cum_flops == pytest.approx(spent_flops, rel=1e-9)


def test_the_skipped_batches_are_never_trained_on_the_live_timeline(controlled) -> None:
    """The skip, filed before the rewind, holds on the timeline the rewind starts (its checkpoint predates it).
    Filed after it, the skip raced the rewound run to batch 40 on a loaded machine."""
    store, _ = controlled
    batches = [
        int(b) for (b,) in rows(store, "SELECT extra['batch'] FROM step_metrics WHERE timeline = 1 ORDER BY step")
    ]
    first, last = SKIPPED
    assert batches == list(range(20, first)) + list(range(last + 1, last + 1 + STEPS - first))


# -- the request writer ---------------------------------------------------------------
def test_a_request_is_one_signed_json_file_with_a_unique_id(tmp_path) -> None:
    layout = RunLayout(tmp_path)
    write_run_info(layout, RunInfo(name="run", world_size=1))
    key = ensure_control_key(layout)
    ids = {request_action(layout, "rewind", {"to_step": 5}, operator="ana", reason="spike") for _ in range(20)}
    assert len(ids) == 20 and sorted(p.stem for p in layout.control_requests.iterdir()) == sorted(ids)
    body = json.loads((layout.control_requests / f"{min(ids)}.json").read_text())
    assert body.keys() == {
        "request_id",
        "run_id",
        "action",
        "args",
        "operator",
        "reason",
        "requested_at",
        "expires_at",
        "signature",
    }
    assert body["expires_at"] - body["requested_at"] == pytest.approx(REQUEST_LIFETIME_S)
    assert body["run_id"] == run_identity(layout)
    assert request_signature_problem(body, key, run_identity(layout)) is None
    assert (body["action"], body["args"], body["operator"], body["reason"]) == (
        "rewind",
        {"to_step": 5},
        "ana",
        "spike",
    )


@pytest.mark.parametrize("action_name", ACTIONS)
def test_every_action_accepts_its_arguments(action_name: str) -> None:
    args = {"rewind": {"to_step": 3}, "skip": {"first_batch": 2, "last_batch": 2}, "quarantine": {"shard": 1}}
    assert build_request(action_name, args.get(action_name, {}), operator="a", reason="r")["action"] == action_name


@pytest.mark.parametrize(
    ("action_name", "args", "problem"),
    [
        ("explode", {}, "unknown action 'explode'"),
        ("rewind", {}, "rewind needs to_step"),
        ("rewind", {"to_step": -1}, "to_step must be an integer >= 0, got -1"),
        ("rewind", {"to_step": "5"}, "to_step must be an integer >= 0, got '5'"),
        ("rewind", {"to_step": True}, "to_step must be an integer >= 0, got True"),
        ("skip", {"first_batch": 3}, "skip needs last_batch"),
        ("skip", {"first_batch": 5, "last_batch": 4}, "skip needs first_batch <= last_batch, got 5 > 4"),
        ("quarantine", {"shard": 1, "to_step": 2}, "quarantine takes shard, not to_step"),
        ("pause", {"shard": 1}, "pause takes no arguments, not shard"),
    ],
)
def test_a_bad_request_is_refused_with_a_clear_reason(action_name: str, args: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=f"^{problem}"):
        check_args(action_name, args)


@pytest.mark.parametrize(("operator", "reason", "problem"), [("ana", " ", "a reason"), ("", "why", "an operator")])
def test_a_request_needs_a_reason_and_an_operator(operator: str, reason: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        build_request("pause", {}, operator=operator, reason=reason)


def test_the_command_line_refuses_a_missing_run_and_bad_arguments(tmp_path, capsys) -> None:
    assert bedside(["action", str(tmp_path / "nope"), "pause", "--reason", "x"]) == 2
    (tmp_path / "telemetry").mkdir()
    assert bedside(["action", str(tmp_path), "skip", "--first-batch", "4", "--reason", "x"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors == [
        f"bedside: error: no run directory at {tmp_path / 'nope'}",
        "bedside: error: skip needs --last-batch",
    ]
    assert not RunLayout(tmp_path).control_requests.exists()


@pytest.fixture(scope="module")
def paused_then_stopped(tmp_path_factory) -> tuple[Store, dict[str, str]]:
    """pause, then (while paused) checkpoint and quarantine, resume, stop."""
    run = tmp_path_factory.mktemp("pause") / "run"
    trainer = start_training(run, "--steps", "1000")
    processed = RunLayout(run).control_processed
    try:
        wait_for(lambda: reached_step(run, 10), "step 10")
        ids = {"pause": action(run, "pause", "--reason", "look at it")}
        wait_for(lambda: (processed / f"{ids['pause']}.json").exists(), "the pause")
        time.sleep(2.5)
        ids["checkpoint"] = action(run, "checkpoint", "--reason", "keep this")
        ids["quarantine"] = action(run, "quarantine", "--shard", "1", "--reason", "bad shard")
        ids["resume"] = action(run, "resume", "--reason", "carry on")
        wait_for(lambda: (processed / f"{ids['resume']}.json").exists(), "the resume")
        ids["stop"] = action(run, "stop", "--reason", "enough")
        store = finish_and_collect(trainer, run)
    finally:
        stop(trainer)
    yield store, ids
    store.close()


def test_a_paused_run_heartbeats_applies_requests_and_resumes_where_it_stopped(paused_then_stopped) -> None:
    store, _ids = paused_then_stopped
    applied = dict(rows(store, "SELECT action, step FROM action_events WHERE status = 'applied'"))
    assert applied["pause"] == applied["checkpoint"] == applied["quarantine"] == applied["resume"]
    paused_at = applied["pause"]
    beats = rows(
        store,
        "SELECT rank, count(*) FROM event_log WHERE kind = 'heartbeat' AND step = ? GROUP BY rank ORDER BY rank",
        paused_at,
    )
    assert [rank for rank, _ in beats] == [0, 1] and all(n >= 2 for _, n in beats)
    assert ("saved", paused_at) in rows(store, "SELECT event, step FROM checkpoint_events")
    before = rows(store, "SELECT shards FROM step_metrics WHERE step <= ?", paused_at)
    after = rows(store, "SELECT shards FROM step_metrics WHERE step > ?", paused_at)
    assert any(1 in json.loads(read) for (read,) in before)
    assert after and all(1 not in json.loads(read) for (read,) in after)


def test_stop_saves_a_checkpoint_and_ends_the_run_as_aborted_with_the_reason(paused_then_stopped) -> None:
    store, _ = paused_then_stopped
    ((status, last_step),) = rows(store, "SELECT status, last_step FROM run")
    assert status == "aborted" and last_step < 1000
    assert ("saved", last_step) in rows(store, "SELECT event, step FROM checkpoint_events")
    ends = rows(store, "SELECT rank, message FROM event_log WHERE kind = 'run_end' ORDER BY rank")
    assert [rank for rank, _ in ends] == [0, 1]
    assert all(message.startswith("stopped by tester at step") and message.endswith(": enough") for _, message in ends)


# -- a pause across crashes ------------------------------------------------------------------
def records(run: Path, rank: int = 0) -> list[dict]:
    """The complete records of a rank's telemetry file so far."""
    path = RunLayout(run).rank_file(rank)
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def applied(run: Path, request_id: str) -> list[dict]:
    return [r for r in records(run) if r.get("request_id") == request_id and r["status"] == "applied"]


def restored_paused(run: Path) -> bool:
    """Rank 0 said it came back paused, and has heartbeated since."""
    found = records(run)
    said = [r["time"] for r in found if r["kind"] == "log" and r["message"].startswith("restored paused")]
    return bool(said) and any(r["kind"] == "heartbeat" and r["time"] > said[-1] for r in found)


def saved_since(run: Path, when: float) -> bool:
    """A checkpoint was published (its manifest written) after ``when``."""
    manifests = RunLayout(run).checkpoints.glob("step-*/manifest.json")
    return any(m.parent.suffix != ".partial" and m.stat().st_mtime > when for m in manifests)


def crash_rank_1(trainer: subprocess.Popen, run: Path) -> None:
    """Kill rank 1 as a lost node would (SIGKILL); torchrun then stops rank 0 and fails."""
    os.kill([r["pid"] for r in records(run, 1) if r["kind"] == "rank_info"][-1], signal.SIGKILL)
    output, _ = trainer.communicate(timeout=120)
    assert trainer.returncode != 0, output[-3000:]


@pytest.fixture(scope="module")
def paused_across_crashes(tmp_path_factory) -> tuple[Store, dict[str, str]]:
    """Paused, crashed; restarted from a checkpoint saved before the pause (the pause is taken again),
    checkpointed while paused, crashed; restarted from that checkpoint (paused), resumed, finished."""
    run = tmp_path_factory.mktemp("pause-crash") / "run"
    options = ("--steps", "60", "--checkpoint-every", "10")
    ids: dict[str, str] = {}
    trainer = start_training(run, *options)
    try:
        wait_for(lambda: reached_step(run, 12), "step 12")
        ids["pause"] = action(run, "pause", "--reason", "look at it")
        wait_for(lambda: applied(run, ids["pause"]), "the pause")
        crash_rank_1(trainer, run)
        trainer = start_training(run, *options, "--resume")
        wait_for(lambda: len(applied(run, ids["pause"])) == 2, "the pause, taken again")
        filed = time.time()
        ids["checkpoint"] = action(run, "checkpoint", "--reason", "keep the paused state")
        wait_for(lambda: saved_since(run, filed), "the checkpoint")
        crash_rank_1(trainer, run)
        trainer = start_training(run, *options, "--resume")
        wait_for(lambda: restored_paused(run), "the run restored paused")
        ids["resume"] = action(run, "resume", "--reason", "carry on")
        store = finish_and_collect(trainer, run)
    finally:
        stop(trainer)
    yield store, ids
    store.close()


def test_a_pause_lost_with_a_crash_is_taken_again_after_the_restart(paused_across_crashes) -> None:
    store, ids = paused_across_crashes
    pause = rows(
        store,
        "SELECT status, step, message FROM action_events WHERE request_id = ? ORDER BY time, status DESC",
        ids["pause"],
    )
    assert [status for status, *_ in pause] == ["requested", "applied", "requested", "applied"]
    assert pause[2][2] == RETAKEN_NOTE
    [(loaded,)] = rows(store, "SELECT step FROM checkpoint_events WHERE event = 'loaded' ORDER BY time LIMIT 1")
    assert pause[3][1] == loaded <= pause[1][1]


def test_a_run_restarted_from_a_checkpoint_saved_while_paused_comes_back_paused(paused_across_crashes) -> None:
    store, ids = paused_across_crashes
    ((timeline, step, restarted),) = rows(
        store, "SELECT timeline, step, time FROM event_log WHERE kind = 'log' AND message LIKE 'restored paused%'"
    )
    [(resumed,)] = rows(
        store, "SELECT time FROM action_events WHERE request_id = ? AND status = 'applied'", ids["resume"]
    )
    beats = rows(
        store,
        "SELECT DISTINCT rank FROM event_log WHERE kind = 'heartbeat' AND timeline = ? AND step = ? "
        "AND time BETWEEN ? AND ? ORDER BY rank",
        timeline,
        step,
        restarted,
        resumed,
    )
    assert beats == [(0,), (1,)]
    first_trained = rows(
        store,
        "SELECT step, time > ? FROM step_metrics WHERE timeline = ? AND time > ? ORDER BY time LIMIT 1",
        resumed,
        timeline,
        restarted,
    )
    assert first_trained == [(step + 1, True)]
    assert rows(store, "SELECT status, last_step FROM run") == [("finished", 60)]
