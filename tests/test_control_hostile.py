"""Hostile entries in ``control/requests/``: a FIFO, a link to ``/dev/zero``, a directory, an oversized, unsigned,
forged or replayed request, or one signed for another run. Rank 0's inbox refuses each with a reason and never blocks;
``bedside action`` signs with the run's control key for the run's id and refuses to file without them; and a live
two-rank gloo run with all of them planted trains to its end, then resumes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bedside.app.cli import main as bedside
from bedside.collectors.control import build_request, request_action
from bedside.collectors.control_inbox import (
    MAX_ENTRIES_PER_LOOK,
    MAX_REQUEST_BYTES,
    MAX_TAKEN_PER_LOOK,
    STRAY_AGE_S,
    Request,
    RequestInbox,
)
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
            "unreadable request: req-x.json: key 'action' is given twice",
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


# -- no request can raise out of the inbox ----------------------------------------------------------------------

LONG_NAME = "r" * 250


@pytest.mark.parametrize(
    ("name", "body", "problem"),
    [
        ("req-deep", "[" * 5000, "unreadable request: req-deep.json: JSON nested deeper than 64 levels"),
        (
            "req-digits",
            '{"request_id": "req-digits", "requested_at": ' + "9" * 401 + "}",
            "unreadable request: req-digits.json: a number of 401 characters, more than 64",
        ),
        ("req-nan", '{"request_id": "req-nan", "requested_at": NaN}', "NaN is not a number JSON allows"),
        ("req-binary", b"\xff\xfe{}", "unreadable request: req-binary.json: not UTF-8 (byte 0)"),
        (LONG_NAME, "{}", f"a request file name must be a request id, got '{LONG_NAME}.json'"),
        ("req x;$(id)", "{}", "a request file name must be a request id, got 'req x;$(id).json'"),
    ],
    ids=["nested-5000-deep", "401-digits", "nan", "not-utf8", "name-of-250", "name-with-spaces"],
)
def test_a_request_the_parser_or_the_file_system_chokes_on_is_refused_and_set_aside(
    layout: RunLayout, name: str, body: str | bytes, problem: str
) -> None:
    """Before, 5,000 ``[`` raised RecursionError out of the inbox (rank 0 died, and again on resume), and a name of
    250 characters made the rename to ``.refused-<ns>.json`` fail with ENAMETOOLONG."""
    path = layout.control_requests / f"{name}.json"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    inbox = inbox_of(layout)
    [request] = poll(inbox).values()
    assert problem in request.problem
    assert list(layout.control_requests.iterdir()) == []
    [kept] = layout.control_processed.iterdir()
    assert ".refused-" in kept.name and len(kept.name) < 180
    inbox.retake(set())  # a restart reads processed/ again: nothing there is handed over, nothing raises
    assert poll(inbox) == {}


def test_a_processed_folder_that_cannot_be_made_refuses_the_request_and_the_poll_returns(layout: RunLayout) -> None:
    layout.control_processed.write_text("a file where the folder should be")
    plant(layout, "req-good", signed(layout, "req-good"))
    inbox = inbox_of(layout)
    [request] = poll(inbox).values()
    assert request.problem == "processed/ is a regular file, not a folder: refused (Not a directory)"
    assert poll(inbox) == {}  # said once while it lasts, not at every step
    assert (layout.control_requests / "req-good.json").exists()


@pytest.mark.parametrize("folder", ["requests", "processed", "control"])
def test_a_control_folder_swapped_for_a_link_is_refused_and_nothing_outside_it_is_touched(
    layout: RunLayout, folder: str
) -> None:
    """Before, ``requests/`` as a link to the run folder made rank 0 move ``run.json`` into ``processed/`` (and
    ``bedside action`` could no longer file anything); a link for ``processed/`` would have received the requests."""
    plant(layout, "req-good", signed(layout, "req-good"))
    elsewhere = layout.root.parent / "elsewhere"
    shutil.copytree(layout.control if folder == "control" else layout.control_requests, elsewhere)
    (elsewhere / "victim.json").write_text("{}")
    swapped = {"requests": layout.control_requests, "processed": layout.control_processed}.get(folder, layout.control)
    if swapped.exists():
        shutil.rmtree(swapped)
    swapped.symlink_to(elsewhere if folder != "requests" else layout.root)
    before = sorted(p.name for p in layout.root.iterdir()), sorted(p.name for p in elsewhere.rglob("*"))
    inbox = inbox_of(layout)
    [request] = poll(inbox).values()
    assert request.problem.startswith(f"{folder}/ is a symbolic link, not a folder: refused")
    assert (sorted(p.name for p in layout.root.iterdir()), sorted(p.name for p in elsewhere.rglob("*"))) == before
    assert poll(inbox) == {}


def test_junk_that_no_request_can_be_is_set_aside_once_old_and_a_look_is_bounded(layout: RunLayout) -> None:
    """Before, hidden and non-``.json`` entries stayed in ``requests/`` for good and every change of the folder (or
    a future mtime, with no change at all) listed them all again at every step: 100,000 of them cost 250 ms a step."""
    old = time.time() - 2 * STRAY_AGE_S
    for i in range(MAX_ENTRIES_PER_LOOK + 10):
        junk = layout.control_requests / (f".hidden-{i}" if i % 2 else f"junk-{i}.txt")
        junk.write_text("x")
        os.utime(junk, (old, old))
    fresh = layout.control_requests / ".req-new.json.tmp-1"  # a writer's file in flight: left alone
    fresh.write_text("{")
    inbox = inbox_of(layout)
    answered = [poll(inbox) for _ in range(MAX_ENTRIES_PER_LOOK // MAX_TAKEN_PER_LOOK + 1)]  # the folder is unchanged
    assert [len(each) for each in answered] == [MAX_TAKEN_PER_LOOK] * (len(answered) - 1) + [10]
    assert all(r.problem.startswith("not a request: ") for each in answered for r in each.values())
    assert [p.name for p in layout.control_requests.iterdir()] == [fresh.name]
    assert len(list(layout.control_processed.iterdir())) == MAX_ENTRIES_PER_LOOK + 10
    fresh.unlink()
    future = time.time() + 3600
    os.utime(layout.control_requests, (future, future))
    assert poll(inbox) == {}
    assert inbox._seen_mtime == layout.control_requests.stat().st_mtime_ns  # remembered: not listed at every step
    plant(layout, "req-late", "{}")  # filed now: the folder's mtime moves back from the future, and it is seen
    assert list(poll(inbox)) == ["req-late"]


def test_a_flood_of_requests_is_taken_a_bounded_number_per_step(layout: RunLayout) -> None:
    for i in range(MAX_TAKEN_PER_LOOK + 5):
        plant(layout, f"req-{i}", "{}")
    inbox = inbox_of(layout)
    assert len(poll(inbox)) == MAX_TAKEN_PER_LOOK
    assert len(poll(inbox)) == 5


def signed_at(layout: RunLayout, request_id: str, **times: object) -> dict:
    """A request signed with the run's key whose times are ``times`` (a field set to None is left out)."""
    body = {**signed(layout, request_id), **times}
    body = {k: v for k, v in body.items() if k != "signature" and v is not None}
    return {**body, "signature": sign_request(body, ensure_control_key(layout))}


OFFSETS = {  # request times as seconds from the moment the test runs (None: left out)
    "expired": ({"requested_at": -7200, "expires_at": -3600}, r"refused: expired 360\d s ago \(valid for 3600 s\)"),
    "no-expiry": ({"requested_at": 0, "expires_at": None}, "refused: it carries no expires_at"),
    "from-the-future": ({"requested_at": 3600, "expires_at": 7200}, r"refused: requested_at is 3\d\d\d s ahead"),
    "valid-for-a-month": (
        {"requested_at": 0, "expires_at": 30 * 86400},
        r"refused: expires_at must be after requested_at and within 604800 s",
    ),
}


@pytest.mark.parametrize(("offsets", "problem"), OFFSETS.values(), ids=OFFSETS.keys())
def test_a_signed_request_out_of_its_time_is_refused(layout: RunLayout, offsets: dict, problem: str) -> None:
    """Before, requested_at was never checked and a request stayed valid forever: a rewind filed for a run that
    was down applied whenever the run came back."""
    now = time.time()
    times = {name: None if offset is None else now + offset for name, offset in offsets.items()}
    plant(layout, "req-t", signed_at(layout, "req-t", **times))
    assert re.match(problem, poll(inbox_of(layout))["req-t"].problem)


def test_a_signed_request_whose_time_is_no_number_is_refused(layout: RunLayout) -> None:
    plant(layout, "req-t", signed_at(layout, "req-t", requested_at="yesterday"))
    assert poll(inbox_of(layout))["req-t"].problem == "refused: requested_at must be a number, got 'yesterday'"


def test_a_request_taken_before_a_restart_is_handed_over_again_after_it_expired(layout: RunLayout) -> None:
    """Its expiry is checked when it is first taken; a restart that lost its effect applies it again."""
    body = signed_at(layout, "req-old", requested_at=time.time() - 5, expires_at=time.time() + 1)
    plant(layout, "req-old", body)
    inbox = inbox_of(layout)
    assert poll(inbox)["req-old"].problem is None
    os.utime(layout.control_processed / "req-old.json")
    time.sleep(1.1)
    inbox.retake(set())
    assert poll(inbox)["req-old"].problem is None


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
    (requests / "req-deep.json").write_text("[" * 5000)  # killed rank 0, and again on resume
    (requests / f"{LONG_NAME}.json").write_text("{}")  # its refused name was too long to rename to
    expired = signed_at(layout, "req-expired", requested_at=time.time() - 7200, expires_at=time.time() - 3600)
    (requests / "req-expired.json").write_text(json.dumps(expired))  # a rewind to step 3, an hour out of date
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
    yield PlantedRun(store, out.getvalue().split()[0], other_request, other_run)
    store.close()


def test_a_run_with_a_fifo_a_link_to_dev_zero_and_forged_stops_trains_to_its_end_and_resumes(planted_run) -> None:
    cursor = planted_run.store.cursor()
    assert cursor.execute("SELECT status, last_step FROM run").fetchall() == [("finished", MORE)]
    answers = cursor.execute(
        "SELECT request_id, message FROM action_events WHERE status = 'rejected' ORDER BY request_id"
    ).fetchall()
    expired = [message for request_id, message in answers if request_id == "req-expired"]
    assert len(expired) == 1 and expired[0].startswith("refused: expired ")
    answers = [answer for answer in answers if answer[0] != "req-expired"]
    [(this_run,)] = cursor.execute("SELECT run_id FROM run_info").fetchall()
    assert answers == sorted(
        [
            ("req-fifo", "unreadable request: a FIFO, not a regular file: refused unread"),
            ("req-forged", "refused: unsigned: a request must carry the signature made with the run's control key"),
            ("req-zero", "unreadable request: a symbolic link, not a regular file: refused unread"),
            ("req-deep", "unreadable request: req-deep.json: JSON nested deeper than 64 levels"),
            (f"bad-name-{LONG_NAME}"[:128], f"a request file name must be a request id, got '{LONG_NAME}.json'"),
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
