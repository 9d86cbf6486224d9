"""A request filed through bedside and then deleted or hidden from ``control/requests/`` is not applied, and says
so: ``bedside detect`` opens an ``unanswered_request`` finding for it once the run went on past it, and the store's
``control_requests`` view holds it as ``not answered``, while a request the loop answered holds its answer. The
run's telemetry is rank 0's own format, written with times around the filings; the filings are real audit
entries (``bedside action`` and ``audit.record``)."""

from __future__ import annotations

import json
import time

from bedside.collectors import audit
from bedside.collectors.control import build_request
from bedside.collectors.controlkey import ensure_control_key, run_identity, sign_request
from bedside.collectors.format import STEP_METRICS, encode_line
from bedside.collectors.layout import RunLayout


def telemetry(layout: RunLayout, t0: float, steps: int, period_s: float, actions: list[dict]) -> None:
    """Rank 0's steps from ``t0`` every ``period_s``, and ``actions`` records, in time order."""
    records = [
        {
            "kind": "step",
            "time": t0 + period_s * step,
            "rank": 0,
            "step": step,
            "timeline": 0,
            "metrics": dict(zip(STEP_METRICS, (2.0 + 5.0 / step, 1.0, 3e-4, 4096.0, 1e12))),
        }
        for step in range(1, steps + 1)
    ]
    records += [{"kind": "action", "rank": 0, "timeline": 0, **a} for a in actions]
    records.sort(key=lambda r: r["time"])
    layout.telemetry.mkdir(parents=True, exist_ok=True)
    text = "".join(encode_line({**r, "seq": seq}) for seq, r in enumerate(records))
    layout.rank_file(0).write_text(text)


def test_a_deleted_and_a_hidden_request_are_reported_not_applied_and_an_answered_one_is_not(
    control_run: RunLayout, bedside
) -> None:
    now = time.time()
    done = bedside("action", str(control_run.root), "pause", "--reason", "look", "--operator", "ana")
    assert done.returncode == 0, done.stderr
    answered = done.stdout.split()[0]
    done = bedside(
        "action", str(control_run.root), "rewind", "--to-step", "3", "--reason", "spike", "--operator", "ana"
    )
    assert done.returncode == 0, done.stderr
    deleted = done.stdout.split()[0]
    (control_run.control_requests / f"{deleted}.json").unlink()  # whoever can write requests/ can delete it
    hidden = build_request("stop", {}, operator="bo", reason="end it")
    hidden = {**hidden, "run_id": run_identity(control_run)}
    hidden["signature"] = sign_request(hidden, ensure_control_key(control_run))
    audit.record(control_run, operator="bo", what="stop", reason="end it", request_id=hidden["request_id"])
    (control_run.control_requests / f".{hidden['request_id']}.json").write_text(
        json.dumps(hidden)
    )  # a dot-file: unread
    filed_by = time.time()  # the filings above take seconds each on a loaded machine
    telemetry(
        control_run,
        now - 5.0,
        steps=60 + int(filed_by - now),  # the run goes on for 55 s and 55 steps past the last filing
        period_s=1.0,
        actions=[
            {"time": now + 1.5, "step": 6, "action": "pause", "status": "requested", "request_id": answered},
            {"time": now + 1.6, "step": 6, "action": "pause", "status": "applied", "request_id": answered},
        ],
    )
    done = bedside("detect", str(control_run.root), "--json")
    assert done.returncode == 0, done.stderr
    findings = [json.loads(line) for line in done.stdout.splitlines()]
    lost = {f["evidence"]["request_id"]: f for f in findings if f["kind"] == "unanswered_request"}
    assert sorted(lost) == sorted([deleted, hidden["request_id"]])
    assert lost[deleted]["severity"] == "warning" and "was not applied" in lost[deleted]["summary"]
    done = bedside(
        "query", str(control_run.root), "SELECT request_id, status FROM control_requests ORDER BY request_id"
    )
    assert done.returncode == 0, done.stderr
    statuses = dict(line.split(None, 1) for line in done.stdout.splitlines()[1:])
    assert statuses == {answered: "applied", deleted: "not answered", hidden["request_id"]: "not answered"}
