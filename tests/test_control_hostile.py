"""Hostile entries in ``control/requests/``: a FIFO, a link to ``/dev/zero``, a directory, an oversized, unsigned,
forged or replayed request, or one signed for another run. Rank 0's inbox refuses each with a reason and never blocks;
``bedside action`` signs with the run's control key for the run's id and refuses to file without them; and a live
two-rank gloo run with all of them planted trains to its end, then resumes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bedside.app.cli import main as bedside
from bedside.collectors.control import build_request, request_action
from bedside.collectors.control_inbox import MAX_REQUEST_BYTES, Request, RequestInbox
from bedside.collectors.controlkey import (
    KEY_ENV,
    ControlKeyError,
    ensure_control_key,
    key_path,
    run_identity,
    sign_request,
)
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="a two-rank run trained to its end and resumed with hostile requests planted")

NOT_BLOCKED_S = 30.0  # a liveness bound, not a timing: a poll that blocks never returns


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def new_run(folder: Path) -> RunLayout:
    """A run folder with its run.json (a new run id) and an empty ``control/requests/``."""
    layout = RunLayout(folder)
    layout.control_requests.mkdir(parents=True)
    write_run_info(layout, RunInfo(name=folder.name, world_size=2))
    return layout


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    return new_run(tmp_path / "run")


def inbox_of(layout: RunLayout, key: bytes | str | None = None) -> RequestInbox:
    return RequestInbox(
        layout.control_requests,
        layout.control_processed,
        ensure_control_key(layout) if key is None else key,
        run_identity(layout),
    )


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
    body = {
        **build_request("rewind", {"to_step": 3}, operator="ana", reason="spike"),
        "request_id": request_id,
        "run_id": run_identity(layout),
    }
    body["signature"] = sign_request(body, key or ensure_control_key(layout))
    return {**body, **changes}


def copy_in(request: Path, layout: RunLayout) -> None:
    """Copy a filed request into another run's ``requests/`` as a writer would (a hidden copy, then a rename)."""
    hidden = layout.control_requests / f".{request.name}"
    shutil.copyfile(request, hidden)
    os.replace(hidden, layout.control_requests / request.name)


def plant(layout: RunLayout, name: str, body: dict | str) -> Path:
    path = layout.control_requests / f"{name}.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


# -- what is not a regular file is refused unread, and moved aside --------------------------------------------------


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: os.mkfifo(path), "a FIFO, not a regular file: refused unread"),
        (lambda path: os.symlink("/dev/zero", path), "a symbolic link, not a regular file: refused unread"),
        (lambda path: path.mkdir(), "a directory, not a regular file: refused unread"),
        (
            lambda path: path.write_bytes(b" " * (MAX_REQUEST_BYTES + 1)),
            f"{MAX_REQUEST_BYTES + 1} bytes, over the limit of {MAX_REQUEST_BYTES}: refused unread",
        ),
    ],
    ids=["fifo", "link-to-dev-zero", "directory", "oversized"],
)
def test_what_is_not_a_small_regular_file_is_refused_unread_and_not_retried(
    layout: RunLayout, make, problem: str
) -> None:
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


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            lambda layout: {k: v for k, v in signed(layout, "req-x").items() if k != "signature"},
            "refused: unsigned: a request must carry the signature made with the run's control key",
        ),
        (
            lambda layout: signed(layout, "req-x", args={"to_step": 0}),
            "refused: bad signature: not made with the run's control key, or the request was altered after signing",
        ),
        (
            lambda layout: signed(layout, "req-x", key=b"someone else's key, long enough"),
            "refused: bad signature: not made with the run's control key, or the request was altered after signing",
        ),
        (
            lambda layout: signed(layout, "req-x", signature=["f00"]),
            "refused: signature must be a hex string, got list",
        ),
        (
            lambda layout: signed(layout, "req-x", run_id="another-run"),
            "refused: bad signature: not made with the run's control key, or the request was altered after signing",
        ),
        (
            lambda layout: '{"request_id": "req-x", "action": "pause", "action": "stop"}',
            "unreadable request: key 'action' is given twice",
        ),
    ],
    ids=["unsigned", "altered", "other-key", "signature-not-text", "rebound-to-another-run", "duplicate-key"],
)
def test_an_unsigned_forged_or_ambiguous_request_is_refused_with_the_reason(
    layout: RunLayout, body, problem: str
) -> None:
    inbox = inbox_of(layout)
    plant(layout, "req-x", body(layout))
    assert poll(inbox)["req-x"].problem == problem


def test_a_request_signed_for_another_run_with_the_same_key_is_refused_naming_both_runs(
    layout: RunLayout, tmp_path: Path, monkeypatch
) -> None:
    """Before, the signature covered only the key: with one key shared by two runs, run A's stop stopped run B."""
    monkeypatch.setenv(KEY_ENV, "one key shared by every run of the team")
    run_a = new_run(tmp_path / "a")
    request_id = request_action(run_a, "stop", operator="ana", reason="meant for run a")
    copy_in(run_a.control_requests / f"{request_id}.json", layout)
    assert poll(inbox_of(layout))[request_id].problem == (
        f"refused: filed for run {run_identity(run_a)!r}, not for this run {run_identity(layout)!r}: "
        "a request is valid only for its own run"
    )


def test_a_signed_request_that_names_no_run_is_refused(layout: RunLayout) -> None:
    body = {k: v for k, v in signed(layout, "req-x").items() if k not in ("run_id", "signature")}
    plant(layout, "req-x", {**body, "signature": sign_request(body, ensure_control_key(layout))})
    assert poll(inbox_of(layout))["req-x"].problem == (
        "refused: not bound to a run: a request must carry the run_id it was filed for "
        f"(this run is {run_identity(layout)!r})"
    )


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
        f"starts) and {KEY_ENV} is not set"
    )
    assert list(layout.control_requests.iterdir()) == []


def test_bedside_action_for_a_folder_without_run_json_files_nothing_and_says_why(layout: RunLayout, capsys) -> None:
    ensure_control_key(layout)
    layout.run_info.unlink()
    (layout.root / "telemetry").mkdir()  # the ranks have started writing, run.json is gone
    assert bedside(["action", str(layout.root), "pause", "--reason", "look", "--operator", "ana"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"bedside: error: cannot tell which run this is: {layout.run_info} does not exist (rank 0 of the trainer "
        "writes it when the run starts)"
    )
    assert list(layout.control_requests.iterdir()) == []


# -- a live run with all of it planted --------------------------------------------------------------------------

STEPS, MORE = 40, 48


def train(run: Path, steps: int, *extra: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "bedside.app.cli",
        "train",
        "--nproc",
        "2",
        "--steps",
        str(steps),
        "--checkpoint-every",
        "8",
        "--out",
        str(run),
        *extra,
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


def finish(trainer: subprocess.Popen) -> None:
    try:
        output, _ = trainer.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        trainer.kill()
        output, _ = trainer.communicate()
        pytest.fail(f"the run froze:\n{output[-3000:]}")
    assert trainer.returncode == 0, output[-3000:]


def plant_everything(layout: RunLayout, other_run: Path) -> tuple[str, str]:
    """A FIFO, a link to /dev/zero, an unsigned stop, and a stop signed with the same key for ``other_run``: that
    stop's id and the other run's id."""
    requests = layout.control_requests
    requests.mkdir(parents=True, exist_ok=True)
    os.mkfifo(requests / "req-fifo.json")
    os.symlink("/dev/zero", requests / "req-zero.json")
    forged = {
        **build_request("stop", {}, operator="mallory", reason="forged"),
        "request_id": "req-forged",
        "run_id": run_identity(layout),
    }
    (requests / "req-forged.json").write_text(json.dumps(forged))
    other = new_run(other_run)
    shutil.copyfile(key_path(layout), key_path(other))  # one key for both runs
    key_path(other).chmod(0o600)
    request_id = request_action(other, "stop", operator="ana", reason="meant for the other run")
    copy_in(other.control_requests / f"{request_id}.json", layout)
    return request_id, run_identity(other)


@dataclass(frozen=True)
class PlantedRun:
    """The store of the planted run, the id of the request filed beside the planted ones, and of the stop
    copied in from the other run (and that run's id)."""

    store: Store
    filed: str
    other_request: str
    other_run: str


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory) -> Iterator[PlantedRun]:
    folder = tmp_path_factory.mktemp("hostile")
    run = folder / "run"
    layout = RunLayout(run)
    trainer = train(run, STEPS)
    try:
        while not (key_path(layout).exists() and layout.run_info.exists()) and trainer.poll() is None:
            threading.Event().wait(0.05)
        other_request, other_run = plant_everything(layout, folder / "other")
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
    yield PlantedRun(store, out.getvalue().strip(), other_request, other_run)
    store.close()


def test_a_run_with_a_fifo_a_link_to_dev_zero_and_forged_stops_trains_to_its_end_and_resumes(planted_run) -> None:
    cursor = planted_run.store.cursor()
    assert cursor.execute("SELECT status, last_step FROM run").fetchall() == [("finished", MORE)]
    answers = cursor.execute(
        "SELECT request_id, message FROM action_events WHERE status = 'rejected' ORDER BY request_id"
    ).fetchall()
    [(this_run,)] = cursor.execute("SELECT run_id FROM run_info").fetchall()
    assert answers == sorted(
        [
            ("req-fifo", "unreadable request: a FIFO, not a regular file: refused unread"),
            ("req-forged", "refused: unsigned: a request must carry the signature made with the run's control key"),
            ("req-zero", "unreadable request: a symbolic link, not a regular file: refused unread"),
            (
                planted_run.other_request,
                f"refused: filed for run {planted_run.other_run!r}, not for this run "
                f"{this_run!r}: a request is valid only for its own run",
            ),
        ]
    )


def test_a_stop_signed_with_the_same_key_for_another_run_does_not_stop_this_one(planted_run) -> None:
    """Before, the copied stop was applied: the first leg ended aborted at the step where it was taken."""
    cursor = planted_run.store.cursor()
    assert cursor.execute(
        "SELECT status FROM action_events WHERE request_id = ? ORDER BY time", [planted_run.other_request]
    ).fetchall() == [("requested",), ("rejected",)]
    assert cursor.execute(
        "SELECT count(*) FROM event_log WHERE kind = 'run_end' AND payload ->> 'status' = 'aborted'"
    ).fetchall() == [(0,)]


def test_the_signed_request_filed_beside_them_is_applied(planted_run) -> None:
    statuses = (
        planted_run.store.cursor()
        .execute("SELECT status FROM action_events WHERE request_id = ? ORDER BY time", [planted_run.filed])
        .fetchall()
    )
    assert statuses == [("requested",), ("applied",)]
