"""``bedside action`` records each request it files in the run's audit trail, through the writer the dashboard's
actions use (``audit.file_request``), and ``bedside audit verify``, run in a new process, accepts the trail.
A request that is refused leaves no entry."""

from __future__ import annotations

import contextlib
import io
import json

from bedside.app.cli import main as bedside_here
from bedside.collectors import audit
from bedside.collectors.layout import RunLayout


def action(layout: RunLayout, *args: str) -> str:
    """``bedside action RUN ...`` in this process; the request id it prints."""
    return action_lines(layout, *args)[0]


def action_lines(layout: RunLayout, *args: str) -> list[str]:
    """``bedside action RUN ...`` in this process; the lines it prints (the request id, the audit trail's head)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bedside_here(["action", str(layout.root), *args]) == 0
    return out.getvalue().splitlines()


def entries(layout: RunLayout) -> list[dict]:
    return [json.loads(line) for line in audit.audit_path(layout).read_text().splitlines()]


def test_each_filed_request_is_one_chained_entry_of_the_audit_trail(control_run: RunLayout) -> None:
    rewind = action(control_run, "rewind", "--to-step", "40", "--reason", "loss spike", "--operator", "ana")
    pause = action(control_run, "pause", "--reason", "look first", "--operator", "bob")
    first, second = entries(control_run)
    assert first == {
        "seq": 0,
        "time": first["time"],
        "operator": "ana",
        "what": "rewind",
        "incident_id": None,
        "request_id": rewind,
        "args": {"to_step": 40},
        "reason": "loss spike",
        "prev": audit.GENESIS,
        "hash": audit.entry_hash(first),
    }
    assert (second["seq"], second["what"], second["request_id"], second["prev"]) == (1, "pause", pause, first["hash"])
    assert sorted(p.stem for p in control_run.control_requests.glob("*.json")) == sorted([rewind, pause])


def test_audit_verify_in_a_new_process_accepts_the_trail_bedside_action_wrote(control_run: RunLayout, bedside) -> None:
    _, printed = action_lines(
        control_run,
        "skip",
        "--first-batch",
        "180",
        "--last-batch",
        "199",
        "--reason",
        "bad batches",
        "--operator",
        "ana",
    )
    head = entries(control_run)[-1]["hash"]
    assert printed == f"audit head 0:{head}"
    done = bedside("audit", "verify", control_run.root, "--head", printed.removeprefix("audit head "))
    assert done.returncode == 0, done.stderr
    assert f"1 entries, chain intact, head entry 0 {head[:16]} (checked against the head given (entry 0); " in (
        done.stdout
    )


def test_a_refused_request_files_nothing_and_leaves_no_entry(control_run: RunLayout, capsys) -> None:
    assert bedside_here(["action", str(control_run.root), "skip", "--first-batch", "4", "--reason", "x"]) == 2
    assert bedside_here(["action", str(control_run.root), "pause", "--reason", "x", "--operator", "a\u202eb"]) == 2
    assert "skip needs --last-batch" in capsys.readouterr().err
    assert not audit.audit_path(control_run).exists()
    assert list(control_run.control_requests.iterdir()) == []
