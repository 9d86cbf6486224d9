"""Delivering the outbox: the sender's threads against a real HTTP receiver (and a real command), for every
answer a receiver can give: 2xx, 5xx, 429 with Retry-After, a hang past the timeout, refused connections, a
wrong URL, and a receiver gone for longer than the give-up horizon. The outbox is that of a real run."""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import pytest
from receiver import HANG, Receiver, free_port

from bedside.app.service.alerts.config import AlertSettings, NotifierConfig, parse_settings
from bedside.app.service.alerts.delivery import MAX_RETRY_AFTER_S, deliver, retry_after
from bedside.app.service.alerts.payload import RunRef, probe_payload, schema
from bedside.app.service.alerts.router import AlertRouter
from bedside.app.service.alerts.sender import OutboxSender
from bedside.app.service.detection import StoreDetection
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

VALIDATOR = jsonschema.Draft202012Validator(schema())
TOKEN = "tok-9f8e7d-secret"
SECRET = "signing-secret-for-tests"
FAST = {"retry_base_s": 0.05, "retry_max_s": 0.2}
EVENTUALLY_S = 20.0
HORIZON_S = 3.0  # give_up_after_s of the test that lets messages go undelivered


def settings_for(notifiers: dict[str, dict[str, Any]], **alerts: Any) -> AlertSettings:
    """Settings with ``notifiers`` (min_severity info, no rate limit in the way) and fast retries."""
    common = {"min_severity": "info", "burst": 100, "timeout_s": 0.5}
    tables = {name: {**common, **keys} for name, keys in notifiers.items()}
    return parse_settings({"alerts": {**FAST, **alerts}, "notifiers": tables}, {"TOKEN": TOKEN, "SECRET": SECRET})


def webhook(receiver: Receiver, **keys: Any) -> dict[str, Any]:
    """A signed webhook on the receiver whose URL path holds a secret token."""
    return {"type": "webhook", "url": f"{receiver.url}/hook/${{TOKEN}}", "secret": "${SECRET}", **keys}


def eventually(check: Callable[[], bool], what: str, timeout: float = EVENTUALLY_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.02)


class Owner:
    """The store's owner as ``bedside watch`` runs it, in this process: detection writing the outbox and the
    sender's threads delivering it (warnings collected)."""

    def __init__(self, store: Store, settings: AlertSettings) -> None:
        self.store = store
        self.warnings: list[str] = []
        self.sender = OutboxSender(store, settings, warn=self.warnings.append)
        self.detection = StoreDetection(store, alerts=AlertRouter(store, settings, on_commit=self.sender.wake))

    def outbox(self) -> pd.DataFrame:
        return self.store.cursor().execute("SELECT * FROM outbox ORDER BY seq").df()

    def statuses(self) -> list[str]:
        return list(self.outbox()["status"])

    def settled(self) -> bool:
        """No message is pending any more."""
        return "pending" not in self.statuses()


@contextmanager
def owning(run: Path, settings: AlertSettings) -> Iterator[Owner]:
    """Ingest and detect ``run`` with the sender running; the sender is closed (no drain) on exit."""
    with Store.open(RunLayout(run).store, schemas=SCHEMAS) as store:
        owner = Owner(store, settings)
        owner.sender.start()
        try:
            Collector(run, store).ingest_available()
            owner.detection.update()
            owner.detection.finish()
            assert len(owner.outbox()) >= 3
            yield owner
        finally:
            owner.sender.close()


# -- delivered ------------------------------------------------------------------------------------------------


def test_the_outbox_is_delivered_in_order_and_once_each(tiny_faults: Path, receiver: Receiver) -> None:
    with owning(tiny_faults, settings_for({"hook": webhook(receiver)})) as owner:
        eventually(owner.settled, "every message delivered")
        rows = owner.outbox()
    assert set(rows["status"]) == {"delivered"} and set(rows["attempts"]) == {1}
    assert rows["delivered_at"].notna().all() and rows["last_error"].isna().all()
    requests = receiver.delivered()
    assert [r.key for r in requests] == list(rows["message_id"])
    assert [r.json() for r in requests] == [json.loads(p) for p in rows["payload"]]
    assert {r.path for r in requests} == {f"/hook/{TOKEN}"}
    for request in requests:
        VALIDATOR.validate(request.json())


def test_server_errors_are_retried_with_the_same_idempotency_key_until_delivered(
    tiny_faults: Path, receiver: Receiver
) -> None:
    receiver.script = [500, 502, 503, 408]
    with owning(tiny_faults, settings_for({"hook": webhook(receiver)})) as owner:
        eventually(owner.settled, "every message delivered")
        rows = owner.outbox()
    assert set(rows["status"]) == {"delivered"}
    assert rows["attempts"].iloc[0] == 5 and set(rows["attempts"].iloc[1:]) == {1}
    first = [r for r in receiver.requests if r.key == rows["message_id"].iloc[0]]
    assert [r.status for r in first] == [500, 502, 503, 408, 200]
    assert len({r.body for r in first}) == 1  # the same message each time
    assert set(receiver.delivered_keys().values()) == {1}


def test_a_429_is_retried_no_sooner_than_its_retry_after(tiny_faults: Path, receiver: Receiver) -> None:
    receiver.script = [(429, {"Retry-After": "1"})]
    with owning(tiny_faults, settings_for({"hook": webhook(receiver)})) as owner:
        eventually(owner.settled, "every message delivered")
    limited, retried = receiver.requests[:2]
    assert (limited.status, retried.status, limited.key) == (429, 200, retried.key)
    assert retried.at - limited.at >= 0.95  # the 50 ms backoff would have come back much sooner
    assert set(receiver.delivered_keys().values()) == {1}


def test_a_receiver_that_hangs_past_the_timeout_is_retried_and_delivers_once(
    tiny_faults: Path, receiver: Receiver
) -> None:
    receiver.script, receiver.hang_s = [HANG, HANG], 2.0
    with owning(tiny_faults, settings_for({"hook": webhook(receiver, timeout_s=0.3)})) as owner:
        eventually(owner.settled, "every message delivered")
        rows = owner.outbox()
    assert receiver.answered()[:3] == [HANG, HANG, 200]
    assert len({r.key for r in receiver.requests[:3]}) == 1
    assert rows["attempts"].iloc[0] == 3 and set(rows["status"]) == {"delivered"}
    assert set(receiver.delivered_keys().values()) == {1}
    assert any("failing" in w and "timed out" in w for w in owner.warnings), owner.warnings


def test_refused_connections_are_retried_until_the_receiver_is_back(tiny_faults: Path, receiver: Receiver) -> None:
    receiver.down()
    with owning(tiny_faults, settings_for({"hook": webhook(receiver)})) as owner:
        eventually(lambda: owner.outbox()["attempts"].iloc[0] >= 3, "three refused attempts")
        error = owner.outbox()["last_error"].iloc[0]
        assert error.startswith(f"cannot reach http://127.0.0.1:{receiver.port}/***") and TOKEN not in error
        receiver.up()
        eventually(owner.settled, "every message delivered once the receiver is back")
        assert set(owner.statuses()) == {"delivered"}
    assert set(receiver.delivered_keys().values()) == {1}
    failing = [w for w in owner.warnings if "failing" in w]
    assert len(failing) == 1 and TOKEN not in failing[0]  # one warning per outage, not one per attempt
    assert any("delivered again" in w for w in owner.warnings)


@pytest.mark.parametrize("status, reason", [(403, "Forbidden"), (404, "Not Found"), (410, "Gone")])
def test_a_wrong_url_or_token_is_not_retried_and_is_recorded_failed(
    tiny_faults: Path, receiver: Receiver, status: int, reason: str
) -> None:
    receiver.default = status
    with owning(tiny_faults, settings_for({"hook": webhook(receiver)})) as owner:
        eventually(owner.settled, "every message recorded")  # failed is final: nothing is sent again
        rows = owner.outbox()
    assert set(rows["status"]) == {"failed"} and set(rows["attempts"]) == {1}
    assert len(receiver.requests) == len(rows)
    for error in rows["last_error"]:
        assert error == f"HTTP {status} {reason}: the receiver refused the message; check the URL and token"
    failed = [w for w in owner.warnings if " failed: " in w]
    assert len(failed) == len(rows) and not [w for w in owner.warnings if TOKEN in w or SECRET in w]


def test_a_message_undelivered_past_the_horizon_is_given_up_as_failed(tiny_faults: Path, receiver: Receiver) -> None:
    receiver.down()
    # The horizon leaves the sender time for a first attempt on a loaded machine (0.5 s did not, now and then).
    with owning(tiny_faults, settings_for({"hook": webhook(receiver)}, give_up_after_s=HORIZON_S)) as owner:
        eventually(owner.settled, "every message given up")
        rows = owner.outbox()
    assert set(rows["status"]) == {"failed"} and rows["delivered_at"].isna().all()
    for error, attempts in zip(rows["last_error"], rows["attempts"]):
        assert error.startswith(f"gave up after {attempts} attempts over ") and TOKEN not in error
        why = "cannot reach http://127.0.0.1" if attempts else "never attempted"  # those queued behind the first
        assert f"(the horizon is {HORIZON_S:g} s): {why}" in error
    assert rows["attempts"].iloc[0] >= 1
    receiver.up()
    assert receiver.requests == []


def test_a_receiver_that_is_down_holds_only_its_own_notifier(tiny_faults: Path, receiver: Receiver) -> None:
    elsewhere = {"type": "webhook", "url": f"http://127.0.0.1:{free_port()}/gone"}
    with owning(tiny_faults, settings_for({"hook": webhook(receiver), "gone": elsewhere})) as owner:
        expected = int((owner.outbox()["notifier"] == "hook").sum())
        receiver.wait_for(expected)
        # the receiver answers before the sender records the delivery: wait for the record, not the request
        eventually(
            lambda: set(owner.outbox().query("notifier == 'hook'")["status"]) == {"delivered"},
            "every message to the live receiver recorded delivered",
        )
        eventually(lambda: (owner.outbox().query("notifier == 'gone'")["attempts"] >= 2).any(), "retries elsewhere")
        rows = owner.outbox()
    assert set(rows.query("notifier == 'hook'")["status"]) == {"delivered"}
    assert set(rows.query("notifier == 'gone'")["status"]) == {"pending"}


def test_closing_the_sender_leaves_what_is_undelivered_pending(tiny_faults: Path, receiver: Receiver) -> None:
    receiver.down()
    with owning(tiny_faults, settings_for({"hook": webhook(receiver)})) as owner:
        eventually(lambda: owner.outbox()["attempts"].iloc[0] >= 1, "a first attempt")
        left = owner.sender.close(drain_s=0.2)
        assert left == len(owner.outbox()) == owner.sender.pending()
        assert set(owner.statuses()) == {"pending"}


def test_closing_with_nothing_pending_does_not_wait_for_the_drain(tiny_faults: Path, receiver: Receiver) -> None:
    with owning(tiny_faults, settings_for({"hook": webhook(receiver)})) as owner:
        eventually(owner.settled, "every message delivered")
        closing = threading.Thread(target=owner.sender.close, kwargs={"drain_s": 600.0})
        closing.start()
        closing.join(30)
        assert not closing.is_alive()


# -- commands and logs ----------------------------------------------------------------------------------------

COMMAND = """
import json, os, pathlib, sys
folder = pathlib.Path(sys.argv[1])
calls = len(list(folder.glob("call-*"))) + 1
(folder / f"call-{calls}").write_text(os.environ["BEDSIDE_ALERT_ID"])
if calls <= 2:
    print("the pager service said no", file=sys.stderr)
    sys.exit(3)
payload = sys.stdin.read()
(folder / f"got-{calls}.json").write_text(json.dumps({"env": {k: v for k, v in os.environ.items()
                                                             if k.startswith("BEDSIDE_ALERT_")},
                                                     "stdin": json.loads(payload)}))
"""


def test_a_command_gets_the_payload_on_stdin_and_a_failing_exit_is_retried(tiny_faults: Path, tmp_path: Path) -> None:
    script, calls = tmp_path / "page.py", tmp_path / "calls"
    script.write_text(COMMAND)
    calls.mkdir()
    pager = {"type": "command", "command": [sys.executable, str(script), str(calls)], "timeout_s": 10}
    with owning(tiny_faults, settings_for({"pager": pager})) as owner:
        eventually(owner.settled, "every message delivered", timeout=60)
        rows = owner.outbox()
    assert set(rows["status"]) == {"delivered"} and rows["attempts"].iloc[0] == 3
    first_id = rows["message_id"].iloc[0]
    assert [(calls / f"call-{n}").read_text() for n in (1, 2, 3)] == [first_id] * 3
    got = [json.loads(path.read_text()) for path in sorted(calls.glob("got-*.json"), key=lambda p: int(p.stem[4:]))]
    assert [g["stdin"] for g in got] == [json.loads(p) for p in rows["payload"]]
    for g, (_, row) in zip(got, rows.iterrows()):
        VALIDATOR.validate(g["stdin"])
        assert g["env"] == {
            "BEDSIDE_ALERT_ID": row["message_id"],
            "BEDSIDE_ALERT_EVENT": row["event"],
            "BEDSIDE_ALERT_SEVERITY": row["severity"],
        }
    [failing] = [w for w in owner.warnings if "failing" in w]
    assert f"command {sys.executable} exited with 3: the pager service said no" in failing


def test_a_command_that_runs_past_its_timeout_is_retried(tiny_faults: Path, tmp_path: Path) -> None:
    marker = tmp_path / "slow-once"
    slow = (
        f"import pathlib, sys, time\np = pathlib.Path({str(marker)!r})\n"
        "if not p.exists():\n    p.write_text('x')\n    time.sleep(30)\nsys.stdin.read()\n"
    )
    pager = {"type": "command", "command": [sys.executable, "-c", slow], "timeout_s": 1}
    with owning(tiny_faults, settings_for({"pager": pager})) as owner:
        eventually(owner.settled, "every message delivered", timeout=60)
        rows = owner.outbox()
    assert set(rows["status"]) == {"delivered"} and rows["attempts"].iloc[0] == 2
    assert any("did not finish within 1 s" in w for w in owner.warnings), owner.warnings


def test_a_log_notifier_appends_one_line_per_message(tiny_faults: Path, tmp_path: Path) -> None:
    log = tmp_path / "alerts.log"
    with owning(tiny_faults, settings_for({"journal": {"type": "log", "path": str(log)}})) as owner:
        eventually(owner.settled, "every message written")
        rows = owner.outbox()
    lines = log.read_text().splitlines()
    assert lines == [f"bedside: alert: {json.loads(p)['text']}" for p in rows["payload"]]


# -- timing rules ---------------------------------------------------------------------------------------------


def test_retry_after_reads_seconds_or_an_http_date_and_is_capped() -> None:
    now = 1_796_000_000.0
    assert retry_after("7", now=lambda: now) == 7.0
    assert retry_after("Wed, 21 Oct 2026 07:28:00 GMT", now=lambda: 1_792_567_660.0) == pytest.approx(20.0)
    assert retry_after("-5") == 0.0
    assert retry_after("999999") == MAX_RETRY_AFTER_S
    assert retry_after(None) is None and retry_after("") is None and retry_after("soon") is None


def test_backoff_doubles_from_the_base_up_to_the_cap_with_jitter() -> None:
    settings = AlertSettings(retry_base_s=1.0, retry_max_s=10.0)
    with Store.open(None, schemas=SCHEMAS) as store:
        sender = OutboxSender(store, settings, rng=random.Random(5))
        for attempts, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (30, 10.0)]:
            waits = [sender.backoff_s(attempts) for _ in range(50)]
            assert all(0.5 * ceiling <= w < ceiling for w in waits)
            assert len(set(waits)) == 50


def test_a_redirect_is_refused_not_followed_as_a_get(receiver: Receiver) -> None:
    receiver.script = [(301, {"Location": f"{receiver.url}/elsewhere"})]
    notifier = NotifierConfig(name="hook", type="webhook", url=f"{receiver.url}/hook", timeout_s=2.0)
    outcome = deliver(notifier, probe_payload("id-1", RunRef("r", "run"), notifier="hook", now=0.0))
    assert not outcome.delivered and not outcome.retry and "redirects" in outcome.detail
    assert [r.path for r in receiver.requests] == ["/hook"]
