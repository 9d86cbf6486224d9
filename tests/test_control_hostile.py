"""Hostile entries in ``control/requests/``: a FIFO, a link to ``/dev/zero``, a directory, an oversized, unsigned,
forged or replayed request. Rank 0's inbox refuses each with a reason and never blocks; ``bedside action`` signs with
the run's control key and refuses to file without it; and a live two-rank gloo run with all of them planted trains
to its end, then resumes."""
from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bedside.app.cli import main as bedside
from bedside.collectors.control import build_request, request_action
from bedside.collectors.controlkey import KEY_ENV, ControlKeyError, ensure_control_key, key_path, sign_request
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store
from bedside.trainer.control import MAX_REQUEST_BYTES, Request, RequestInbox

NOT_BLOCKED_S = 30.0  # a liveness bound, not a timing: a poll that blocks never returns


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    layout = RunLayout(tmp_path / "run")
    layout.control_requests.mkdir(parents=True)
    return layout


def inbox_of(layout: RunLayout, key: bytes | str | None = None) -> RequestInbox:
    return RequestInbox(layout.control_requests, layout.control_processed,
                        ensure_control_key(layout) if key is None else key)


def poll(inbox: RequestInbox, handled: set[str] | None = None) -> dict[str, Request]:
    """One poll of the inbox in a thread, which must come back (a FIFO opened for reading blocks forever)."""
    found: list[Request] = []
    worker = threading.Thread(target=lambda: found.extend(inbox.poll(handled or set())), daemon=True)
    worker.start()
    worker.join(NOT_BLOCKED_S)
    if worker.is_alive():
        for fifo in inbox.processed.glob("*"):  # free the stuck thread before failing
            if stat.S_ISFIFO(fifo.lstat().st_mode):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the inbox blocked reading a request")
    return {request.request_id: request for request in found}


def signed(layout: RunLayout, request_id: str, key: bytes | None = None, **changes: object) -> dict:
    body = {**build_request("rewind", {"to_step": 3}, operator="ana", reason="spike"), "request_id": request_id}
    body["signature"] = sign_request(body, key or ensure_control_key(layout))
    return {**body, **changes}


def plant(layout: RunLayout, name: str, body: dict | str) -> Path:
    path = layout.control_requests / f"{name}.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


# -- what is not a regular file is refused unread, and moved aside --------------------------------------------------

@pytest.mark.parametrize(("make", "problem"), [
    (lambda path: os.mkfifo(path), "a FIFO, not a regular file: refused unread"),
    (lambda path: os.symlink("/dev/zero", path), "a symbolic link, not a regular file: refused unread"),
    (lambda path: path.mkdir(), "a directory, not a regular file: refused unread"),
    (lambda path: path.write_bytes(b" " * (MAX_REQUEST_BYTES + 1)),
     f"{MAX_REQUEST_BYTES + 1} bytes, over the limit of {MAX_REQUEST_BYTES}: refused unread"),
], ids=["fifo", "link-to-dev-zero", "directory", "oversized"])
def test_what_is_not_a_small_regular_file_is_refused_unread_and_not_retried(layout: RunLayout, make,
                                                                             problem: str) -> None:
    inbox = inbox_of(layout)
    make(layout.control_requests / "planted.json")
    taken = poll(inbox)
    assert taken["planted"].problem == f"unreadable request: {problem}"
    assert list(layout.control_requests.iterdir()) == []
    [kept] = layout.control_processed.iterdir()
    assert kept.name.startswith("planted.refused-")
    inbox.retake(set())  # after a restart it is not handed over again
    assert poll(inbox) == {}


def test_a_link_to_a_genuine_request_is_not_followed(layout: RunLayout, tmp_path: Path) -> None:
    """Before, the inbox read through links: a request kept anywhere could be filed by linking to it."""
    elsewhere = tmp_path / "req-elsewhere.json"
    elsewhere.write_text(json.dumps(signed(layout, "req-elsewhere")))
    os.symlink(elsewhere, layout.control_requests / "req-elsewhere.json")
    taken = poll(inbox_of(layout))
    assert taken["req-elsewhere"].problem == "unreadable request: a symbolic link, not a regular file: refused unread"
    assert elsewhere.is_file()


# -- only requests signed with the run's key are applied ----------------------------------------------------------

def test_a_request_signed_with_the_runs_key_is_taken(layout: RunLayout) -> None:
    plant(layout, "req-good", signed(layout, "req-good"))
    request = poll(inbox_of(layout))["req-good"]
    assert request.problem is None and (request.action, request.args) == ("rewind", {"to_step": 3})


@pytest.mark.parametrize(("body", "problem"), [
    (lambda layout: {k: v for k, v in signed(layout, "req-x").items() if k != "signature"},
     "refused: unsigned: a request must carry the signature made with the run's control key"),
    (lambda layout: signed(layout, "req-x", args={"to_step": 0}),
     "refused: bad signature: not made with the run's control key, or the request was altered after signing"),
    (lambda layout: signed(layout, "req-x", key=b"someone else's key, long enough"),
     "refused: bad signature: not made with the run's control key, or the request was altered after signing"),
    (lambda layout: signed(layout, "req-x", signature=["f00"]), "refused: signature must be a hex string, got list"),
    (lambda layout: '{"request_id": "req-x", "action": "pause", "action": "stop"}',
     "unreadable request: key 'action' is given twice"),
], ids=["unsigned", "altered", "other-key", "signature-not-text", "duplicate-key"])
def test_an_unsigned_forged_or_ambiguous_request_is_refused_with_the_reason(layout: RunLayout, body,
                                                                           problem: str) -> None:
    inbox = inbox_of(layout)
    plant(layout, "req-x", body(layout))
    assert poll(inbox)["req-x"].problem == problem


def test_a_trainer_without_a_usable_key_refuses_every_request_with_the_reason(layout: RunLayout) -> None:
    plant(layout, "req-good", signed(layout, "req-good"))
    taken = poll(inbox_of(layout, key="the trainer has no usable control key: gone"))
    assert taken["req-good"].problem == "refused: the trainer has no usable control key: gone"


def test_a_replayed_request_id_is_a_duplicate(layout: RunLayout) -> None:
    inbox = inbox_of(layout)
    body = signed(layout, "req-once")
    plant(layout, "req-once", body)
    assert poll(inbox)["req-once"].problem is None
    plant(layout, "req-once", body)  # the same signed bytes again
    assert poll(inbox, {"req-once"})["req-once"].problem == "duplicate: request req-once was already received"


# -- the key ----------------------------------------------------------------------------------------------------

def test_the_trainer_creates_a_private_key_once(layout: RunLayout) -> None:
    key = ensure_control_key(layout)
    assert stat.S_IMODE(key_path(layout).stat().st_mode) == 0o600 and len(key) == 64
    assert ensure_control_key(layout) == key


def test_a_key_file_others_may_write_is_refused(layout: RunLayout) -> None:
    key_path(layout).write_text("planted by someone else, long enough\n")
    key_path(layout).chmod(0o666)
    with pytest.raises(ControlKeyError, match="writable by others"):
        ensure_control_key(layout)


def test_a_key_file_that_is_a_link_is_refused(layout: RunLayout, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("x" * 64)
    key_path(layout).symlink_to(tmp_path / "secret")
    with pytest.raises(ControlKeyError, match="a symbolic link, not a regular file"):
        ensure_control_key(layout)


def test_the_key_from_the_environment_wins_and_must_be_long_enough(layout: RunLayout, monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, "an operator's shared key")
    assert ensure_control_key(layout) == b"an operator's shared key" and not key_path(layout).exists()
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(ControlKeyError, match=f"{KEY_ENV} is too short: at least 16 characters"):
        request_action(layout, "pause", operator="ana", reason="look")


def test_bedside_action_without_the_key_files_nothing_and_says_why(layout: RunLayout, capsys) -> None:
    (layout.root / "telemetry").mkdir()
    assert bedside(["action", str(layout.root), "pause", "--reason", "look", "--operator", "ana"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"bedside: error: no control key: {key_path(layout)} does not exist (the trainer creates it when the run "
        f"starts) and {KEY_ENV} is not set")
    assert list(layout.control_requests.iterdir()) == []


# -- a live run with all of it planted --------------------------------------------------------------------------

STEPS, MORE = 40, 48


def train(run: Path, steps: int, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "bedside.app.cli", "train", "--nproc", "2", "--steps", str(steps),
               "--checkpoint-every", "8", "--out", str(run), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def finish(trainer: subprocess.Popen) -> None:
    try:
        output, _ = trainer.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        trainer.kill()
        output, _ = trainer.communicate()
        pytest.fail(f"the run froze:\n{output[-3000:]}")
    assert trainer.returncode == 0, output[-3000:]


def plant_everything(layout: RunLayout) -> None:
    requests = layout.control_requests
    requests.mkdir(parents=True, exist_ok=True)
    os.mkfifo(requests / "req-fifo.json")
    os.symlink("/dev/zero", requests / "req-zero.json")
    forged = {**build_request("stop", {}, operator="mallory", reason="forged"), "request_id": "req-forged"}
    (requests / "req-forged.json").write_text(json.dumps(forged))


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory) -> tuple[Store, str]:
    run = tmp_path_factory.mktemp("hostile") / "run"
    layout = RunLayout(run)
    trainer = train(run, STEPS)
    try:
        while not key_path(layout).exists() and trainer.poll() is None:
            threading.Event().wait(0.05)
        plant_everything(layout)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert bedside(["action", str(run), "checkpoint", "--reason", "still listening", "--operator", "t"]) == 0
        finish(trainer)
        finish(train(run, MORE, "--resume"))
    finally:
        if trainer.poll() is None:
            trainer.kill()
    store = Store.open(layout.store)
    Collector(run, store).ingest_available()
    yield store, out.getvalue().strip()
    store.close()


def test_a_run_with_a_fifo_a_link_to_dev_zero_and_a_forged_stop_trains_to_its_end_and_resumes(planted_run) -> None:
    store, _ = planted_run
    cursor = store.cursor()
    assert cursor.execute("SELECT status, last_step FROM run").fetchall() == [("finished", MORE)]
    answers = cursor.execute("SELECT request_id, message FROM action_events WHERE status = 'rejected' "
                             "ORDER BY request_id").fetchall()
    assert answers == [
        ("req-fifo", "unreadable request: a FIFO, not a regular file: refused unread"),
        ("req-forged", "refused: unsigned: a request must carry the signature made with the run's control key"),
        ("req-zero", "unreadable request: a symbolic link, not a regular file: refused unread")]


def test_the_signed_request_filed_beside_them_is_applied(planted_run) -> None:
    store, request_id = planted_run
    statuses = store.cursor().execute("SELECT status FROM action_events WHERE request_id = ? ORDER BY time",
                                      [request_id]).fetchall()
    assert statuses == [("requested",), ("applied",)]
