"""Control requests in a plain loop through the kit's ControlClient: on two gloo ranks under torchrun, a
rewind filed with ``request_action`` calls the loop's load function on both ranks at the same step, a skip
drops exactly the batches asked and records their sample ids, an action without a handler is rejected
with the reason, and a restart from the saved client state applies nothing again. In one process: an
action the loop leaves unanswered is rejected at the next boundary, and an action is answered once."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from torchrun_runs import HERE, TORCHRUN, acks, answered, records, start, wait_for

from bedside.app.cli import main as bedside
from bedside.collectors.control import build_request, request_action, write_request
from bedside.collectors.control_reader import run_reader_warning
from bedside.collectors.controlkey import RUN_ID, SIGNATURE, read_control_key, run_identity, sign_request
from bedside.collectors.kit import ControlClient, SkippingSampler
from bedside.collectors.layout import RunLayout
from bedside.collectors.writer import RunLogger

pytestmark = pytest.mark.slow(reason="the kit's control loop on two torchrun ranks")


def file_foreign(layout: RunLayout, action: str) -> str:
    """A signed request for an action bedside's writer does not know (a newer tool might file one)."""
    request = {**build_request("pause", {}, operator="tester", reason="a newer tool's action"), "action": action}
    request[RUN_ID] = run_identity(layout)
    request[SIGNATURE] = sign_request(request, read_control_key(layout))
    write_request(layout.control_requests, request)
    return request["request_id"]


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory) -> dict:
    """The first run (stopped by a request) and its restart; the request ids and what each rank saw."""
    folder = tmp_path_factory.mktemp("kit-loop")
    run, out = folder / "run", folder / "out"
    out.mkdir()
    loop, file = start("kit_control_loop.py", run, str(out))
    layout = RunLayout(run)
    try:
        wait_for(lambda: any(r.get("control") for r in records(run) if r["kind"] == "heartbeat"), "a reader", loop)
        ids = {"pause": file("pause")}
        wait_for(lambda: answered(run, ids["pause"]), "the pause", loop)
        paused_at = acks(run, ids["pause"])[-1]["step"]
        ids |= {
            "rewind": file("rewind", to_step=1),
            "skip": file("skip", first_batch=paused_at + 2, last_batch=paused_at + 3),
            "quarantine": file("quarantine", shard=3),
            "evict": file_foreign(layout, "evict"),
        }
        ids["resume"] = file("resume")
        wait_for(lambda: answered(run, ids["skip"]), "the skip", loop)
        ids["stop"] = file("stop")
        assert loop.wait(timeout=120) == 0, loop.communicate()[0]
    finally:
        if loop.poll() is None:
            loop.kill()
    restart = subprocess.run(
        [*TORCHRUN, str(HERE / "kit_control_loop.py"), str(run), str(out), "--restart"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert restart.returncode == 0, restart.stdout + restart.stderr
    seen = {name: json.loads((out / f"{name}.json").read_text()) for name in ("rank-0", "rank-1", "rank-0-restart")}
    return {"run": run, "ids": ids, "paused_at": paused_at, "seen": seen}


def test_a_rewind_calls_the_loops_load_function_on_both_ranks_at_the_same_step(loop_run) -> None:
    run, ids, seen = loop_run["run"], loop_run["ids"], loop_run["seen"]
    assert seen["rank-0"]["rewinds"] == seen["rank-1"]["rewinds"] == [{"at": loop_run["paused_at"], "to": 1}]
    requested, applied = acks(run, ids["rewind"])
    assert (requested["status"], applied["status"]) == ("requested", "applied")
    assert (requested["step"], applied["step"], applied["message"]) == (
        loop_run["paused_at"],
        1,
        "loaded the checkpoint of step 1",
    )


def test_a_skip_drops_exactly_the_batches_asked_and_records_their_sample_ids(loop_run) -> None:
    run, ids, seen, paused_at = loop_run["run"], loop_run["ids"], loop_run["seen"], loop_run["paused_at"]
    first, last = paused_at + 2, paused_at + 3
    skipped = list(range(4 * first, 4 * (last + 1)))
    (applied,) = [r for r in acks(run, ids["skip"]) if r["status"] == "applied"]
    assert applied["args"] == {"first_batch": first, "last_batch": last, "sample_ids": skipped}
    assert applied["message"] == f"skipped batches {first} to {last}: 8 samples not read"
    for rank in ("rank-0", "rank-1"):
        trained = [i for batch in seen[rank]["trained"] for i in batch]
        assert not set(trained) & set(skipped)
        assert trained[: 4 * first] == list(range(4 * first)) and trained[4 * first : 4 * first + 4] == list(
            range(4 * (last + 1), 4 * (last + 2))
        )


def test_actions_without_a_handler_are_rejected_with_the_reason(loop_run) -> None:
    run, ids = loop_run["run"], loop_run["ids"]
    assert [(r["status"], r.get("message")) for r in acks(run, ids["quarantine"])] == [
        ("requested", None),
        ("rejected", "no handler for 'quarantine' in this loop: it was not applied"),
    ]
    assert acks(run, ids["evict"])[-1]["message"] == "unknown action 'evict'"
    assert [r["status"] for r in acks(run, ids["stop"])] == ["requested", "applied"]


def test_a_restart_from_the_saved_client_state_applies_nothing_again(loop_run) -> None:
    run, ids, seen = loop_run["run"], loop_run["ids"], loop_run["seen"]
    assert seen["rank-0-restart"]["rewinds"] == [] and len(seen["rank-0-restart"]["trained"]) == 5
    for request_id in ids.values():
        assert {r["timeline"] for r in acks(run, request_id)} == {0}
    assert {r["timeline"] for r in records(run) if r["kind"] == "run_end"} == {0, 1}


def test_an_action_left_unanswered_is_rejected_at_the_next_boundary_and_answered_once(tmp_path) -> None:
    log = RunLogger(tmp_path / "run", name="one-rank", rank=0, world_size=1)
    client = ControlClient(log)
    request_id = request_action(log.layout, "checkpoint", operator="tester", reason="test")
    (action,) = client.actions(1)
    assert (action.action, action.request_id) == ("checkpoint", request_id)
    assert client.actions(2) == []
    with pytest.raises(ValueError, match=f"request {request_id} is already rejected: an action is answered once"):
        action.applied("too late")
    log.close()
    assert [(r["status"], r["step"], r.get("message")) for r in acks(tmp_path / "run", request_id)] == [
        ("requested", 1, None),
        ("rejected", 2, "no handler for 'checkpoint' in this loop: it was not applied"),
    ]


def file_with_the_cli(run: Path, capsys) -> tuple[int, str, str]:
    """``bedside action RUN pause``: its exit status, the request id it printed, and its stderr."""
    capsys.readouterr()
    status = bedside(["action", str(run), "pause", "--reason", "test", "--operator", "tester"])
    out, err = capsys.readouterr()
    return status, out.split()[0], err


def test_bedside_action_warns_when_the_run_has_ended_and_files_the_request_all_the_same(loop_run, capsys) -> None:
    status, request_id, err = file_with_the_cli(loop_run["run"], capsys)
    assert status == 0 and (RunLayout(loop_run["run"]).control_requests / f"{request_id}.json").exists()
    assert err == (
        "bedside: warning: the run has finished (run_end): no loop is left to read the request; "
        "a resumed run with a control reader would take it\n"
    )


def test_bedside_action_warns_when_no_control_reader_polls_or_the_last_is_stale(tmp_path, capsys) -> None:
    log = RunLogger(tmp_path / "run", name="no-reader", rank=0, world_size=1)
    client = ControlClient(log)  # makes the control key; reads nothing before its first boundary
    log.heartbeat(1)
    log.flush()
    status, request_id, err = file_with_the_cli(tmp_path / "run", capsys)
    assert status == 0 and (log.layout.control_requests / f"{request_id}.json").exists()
    assert err.startswith("bedside: warning: no control reader: no heartbeat of rank 0 says a loop polls")
    assert [a.action for a in client.actions(2)] == ["pause"]
    log.flush()
    assert file_with_the_cli(tmp_path / "run", capsys)[2] == ""
    later = time.time() + 300
    assert run_reader_warning(log.layout, now=later).startswith(
        "the control reader is stale: its last heartbeat was 300 s ago (more than 120 s)"
    )
    log.close()


def test_bedside_action_waits_for_the_answer_and_says_how_it_ended(tmp_path, capsys) -> None:
    """``--wait``: applied (exit 0), rejected with the reason (exit 1), or not answered in time (exit 4)."""
    log = RunLogger(tmp_path / "run", name="waits", rank=0, world_size=1)
    client = ControlClient(log, on_checkpoint=lambda action: "saved")
    stop = threading.Event()

    def loop() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            log.step(step, loss=1.0)
            client.at_step_boundary(step)
            log.flush()
            time.sleep(0.02)

    stepping = threading.Thread(target=loop, daemon=True)
    stepping.start()
    try:
        wait = ("--wait", "60", "--reason", "test", "--operator", "tester")
        assert bedside(["action", str(log.layout.root), "checkpoint", *wait]) == 0
        assert re.fullmatch(r"applied at step \d+ on timeline 0: saved", capsys.readouterr().out.splitlines()[-1])
        assert bedside(["action", str(log.layout.root), "quarantine", "--shard", "3", *wait]) == 1
        assert (
            capsys.readouterr()
            .out.splitlines()[-1]
            .endswith("no handler for 'quarantine' in this loop: it was not applied")
        )
    finally:
        stop.set()
        stepping.join(30)
    assert bedside(["action", str(log.layout.root), "checkpoint", "--wait", "0.5", "--reason", "x"]) == 4
    assert capsys.readouterr().out.splitlines()[-1].startswith("not applied: no answer within 0.5 s")
    log.close()


def test_a_skip_open_across_a_restart_is_answered_with_every_id_it_dropped(tmp_path) -> None:
    from torch.utils.data import BatchSampler, SequentialSampler

    def sampler_of(client: ControlClient) -> SkippingSampler:  # 50 batches of 2 an epoch
        return SkippingSampler(BatchSampler(SequentialSampler(range(100)), batch_size=2, drop_last=True), client)

    def file(first: int, last: int) -> str:
        return request_action(log.layout, "skip", {"first_batch": first, "last_batch": last}, operator="t", reason="t")

    log = RunLogger(tmp_path / "run", name="one-rank", rank=0, world_size=1)
    client = ControlClient(log)
    sampler = sampler_of(client)
    read = iter(sampler)
    assert [next(read), next(read)] == [[0, 1], [2, 3]]
    past, late, across = file(0, 1), file(1, 3), file(48, 51)
    assert client.at_step_boundary(2)
    assert [i for batch in read for i in batch] == list(range(8, 96))  # batches 2, 3, 48 and 49 dropped
    saved = {"sampler": sampler.state_dict(), "control": client.state_dict()}
    log.close()  # a crash: the skip of batches 48 to 51 is still open

    log = RunLogger(tmp_path / "run", name="one-rank", rank=0, world_size=1, resume=True)
    client = ControlClient(log)
    sampler_of(client).load_state_dict(saved["sampler"])
    client.load_state_dict(saved["control"], 48)
    client.close(48)
    log.close()
    run = tmp_path / "run"
    assert acks(run, past)[-1]["message"] == "batches 0 to 1 were already read: the next batch is 2"
    assert [r["status"] for r in acks(run, late)] == ["requested", "applied"]
    applied = acks(run, late)[-1]
    assert applied["args"] == {"first_batch": 1, "last_batch": 3, "sample_ids": [4, 5, 6, 7]}
    assert applied["message"] == "skipped batches 2 to 3: 4 samples not read (batches before 2 were already read)"
    assert [(r["status"], r["timeline"], r.get("message")) for r in acks(run, across)] == [
        ("requested", 0, None),
        ("rejected", 1, "the run finished before it could be applied"),
    ]
    assert acks(run, across)[-1]["args"]["sample_ids"] == [96, 97, 98, 99]
