"""The audit trail read as bytes from outside: a line holding NaN, nesting 100,000 deep, a number of 5,000 digits or
1e400, a line past the entry limit, and a trail that is a symbolic link to /dev/zero or a FIFO are each reported
(the first broken link, its line and why; a file refused unread) by ``bedside audit verify`` in a new process,
which never hangs or runs out of memory; ``bedside watch`` over a FIFO trail keeps ingesting and alerting, says
the trail is broken and stops on SIGTERM. Real files, the real CLI, a real HTTP receiver."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from receiver import Receiver

from bedside.collectors import audit
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

VERIFY_TIMEOUT_S = 60
"""Far longer than a verify takes; a hang or a read of /dev/zero runs into it."""
WATCH_EXIT_S = 60


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    """A run with a trail of three entries and no store."""
    layout = RunLayout(tmp_path / "run")
    (layout.root / "telemetry").mkdir(parents=True)
    for n in range(3):
        audit.record(layout, operator="ana", what="acknowledge", reason=f"reason {n}", incident_id=f"inc-{n}")
    return layout


def verify(bedside, layout: RunLayout, *options: str) -> subprocess.CompletedProcess:
    return bedside("audit", "verify", layout.root, *options, timeout=VERIFY_TIMEOUT_S)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        pytest.param(b'{"seq":3,"loss":NaN}', "NaN is not a number JSON allows", id="NaN"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "JSON nested deeper than 64 levels", id="100k deep"),
        pytest.param(b'{"seq":' + b"7" * 5000 + b"}", "a number of 5000 characters, more than 64", id="5000 digits"),
        pytest.param(b'{"seq":3,"time":1e400}', "the number 1e400 is out of range", id="1e400"),
        pytest.param(b'{"seq":3,"time":-1e400}', "the number -1e400 is out of range", id="-1e400"),
    ],
)
def test_a_hostile_line_is_the_first_broken_link_with_its_line_and_reason(
    layout: RunLayout, bedside, line: bytes, why: str
) -> None:
    path = audit.audit_path(layout)
    good = path.read_bytes()
    path.write_bytes(good + line + b"\n" + good.splitlines(keepends=True)[0])
    done = verify(bedside, layout, "--no-head")
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith(
        f"audit trail of {layout.root} is broken: line 4 is not a JSON entry ({why}): a torn write, or altered by hand"
    ), done.stdout
    assert done.stderr == ""


def test_a_line_longer_than_an_entry_may_be_is_refused_unparsed(layout: RunLayout, bedside) -> None:
    path = audit.audit_path(layout)
    with open(path, "ab") as trail:
        trail.write(b'"' + b"x" * audit.MAX_ENTRY_BYTES + b'"\n')
    done = verify(bedside, layout, "--no-head")
    assert done.returncode == 1, done.stderr
    assert (
        f"is broken: line 4 is {audit.MAX_ENTRY_BYTES + 2} bytes, more than an entry may hold "
        f"({audit.MAX_ENTRY_BYTES}): refused" in done.stdout
    )


def test_an_entry_longer_than_the_limit_is_never_written(layout: RunLayout) -> None:
    with pytest.raises(ValueError, match="more than 262144: shorten the reason"):
        audit.record(layout, operator="ana", what="resolve", reason="x" * audit.MAX_ENTRY_BYTES)
    assert audit.verify(layout).intact and len(audit.verify(layout).entries) == 3


@pytest.mark.parametrize("kind", ["a symbolic link to /dev/zero", "a FIFO", "a directory"])
def test_a_trail_that_is_no_regular_file_is_refused_unread(layout: RunLayout, bedside, kind: str) -> None:
    path = audit.audit_path(layout)
    path.unlink()
    if kind == "a FIFO":
        os.mkfifo(path)
        said = "a FIFO"
    elif kind == "a directory":
        path.mkdir()
        said = "a directory"
    else:
        path.symlink_to("/dev/zero")
        said = "a symbolic link"
    done = verify(bedside, layout, "--no-head")
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith(
        f"audit trail of {layout.root} is broken: control/audit.jsonl: {said}, not a regular file: refused unread"
    ), done.stdout
    with pytest.raises(OSError, match=f"control/audit.jsonl: {said}, not a regular file: nothing recorded"):
        audit.record(layout, operator="ana", what="acknowledge", reason="into it")


def test_bedside_action_refuses_to_file_a_request_its_trail_cannot_record(tiny_faults: Path, bedside) -> None:
    layout = RunLayout(tiny_faults)
    layout.control.mkdir(exist_ok=True)
    os.mkfifo(audit.audit_path(layout))
    done = bedside("action", tiny_faults, "pause", "--reason", "look", "--operator", "ana", timeout=VERIFY_TIMEOUT_S)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "bedside: error: control/audit.jsonl: a FIFO, not a regular file: nothing filed or recorded"
    )
    assert not list(layout.control_requests.glob("*.json"))


def test_watch_over_a_fifo_trail_keeps_ingesting_and_alerting_and_stops_on_sigterm(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver, start_bedside
) -> None:
    layout = RunLayout(tiny_faults)
    layout.control.mkdir(exist_ok=True)
    os.mkfifo(audit.audit_path(layout))
    config = tmp_path / "bedside.toml"
    config.write_text(
        f'[notifiers.hook]\ntype = "webhook"\nurl = "{receiver.url}/hook"\nmin_severity = "info"\nburst = 100\n'
    )
    watch = start_bedside(
        "watch", tiny_faults, "--config", config, "--rescan-every", "0.2", stderr=subprocess.PIPE, text=True
    )
    receiver.wait_for(3)
    watch.send_signal(signal.SIGTERM)
    assert watch.wait(WATCH_EXIT_S) == 0
    said = watch.stderr.read()
    assert "the audit trail is broken: control/audit.jsonl: a FIFO, not a regular file: refused unread" in said
    with Store.open(layout.store, read_only=True) as store:
        assert store.cursor().execute("SELECT count(*) FROM rank_steps").fetchone()[0] == 400
