"""Alerts end to end: ``bedside watch`` as a process through a receiver's outage (5xx, 429 with Retry-After,
hangs, refused connections) while it keeps ingesting, a ``kill -9`` with messages pending, the log notifier
without a configuration, and ``bedside alert test``. The same outage in-process shows the store growing
while every delivery fails."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pandas as pd
import pytest
from receiver import HANG, Receiver

from bedside.app.service.alerts.config import load_settings
from bedside.app.service.alerts.router import AlertRouter
from bedside.app.service.alerts.sender import OutboxSender
from bedside.app.service.detection import StoreDetection
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

TOKEN = "tok-5a4b3c-secret"
SECRET = "watch-signing-secret"
ENVIRON = {"BEDSIDE_TEST_TOKEN": TOKEN, "BEDSIDE_TEST_SECRET": SECRET}
SPLIT_STEP = 120
"""The tiny_faults run is written up to this step before watching starts, the rest during the outage."""
OUTAGE = [500, 500, (429, {"Retry-After": "1"}), HANG]
RETRY_MAX_S = 0.3
EVENTUALLY_S = 30.0
WATCH_EXIT_S = 60.0


def eventually(check: Callable[[], bool], what: str, timeout: float = EVENTUALLY_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.02)


def split_run(run: Path, step: int = SPLIT_STEP) -> Callable[[], None]:
    """Cut each rank file before its first line past ``step``; the function that appends the rest."""
    rests = {}
    for path in sorted((run / "telemetry").glob("rank-*.jsonl")):
        lines = path.read_bytes().splitlines(keepends=True)
        cut = next(i for i, line in enumerate(lines) if json.loads(line)["step"] > step)
        path.write_bytes(b"".join(lines[:cut]))
        rests[path] = b"".join(lines[cut:])

    def append_rest() -> None:
        for path, rest in rests.items():
            with open(path, "ab") as fh:
                fh.write(rest)

    return append_rest


def write_config(folder: Path, receiver: Receiver, **alerts: float) -> Path:
    """A bedside.toml with one signed webhook on ``receiver`` (secret token in its path), fast retries."""
    keys = {"retry_base_s": 0.05, "retry_max_s": RETRY_MAX_S, **alerts}
    path = folder / "bedside.toml"
    path.write_text(
        "[alerts]\n"
        + "".join(f"{k} = {v}\n" for k, v in keys.items())
        + f'''
[notifiers.hook]
type = "webhook"
url = "{receiver.url}/hook/${{BEDSIDE_TEST_TOKEN}}"
secret = "${{BEDSIDE_TEST_SECRET}}"
min_severity = "info"
burst = 100
timeout_s = 0.5

[notifiers.journal]
type = "log"
path = "{folder / "alerts.log"}"
min_severity = "critical"
'''
    )
    return path


class Lines:
    """What a process writes to a pipe, read line by line by a thread as it comes."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.append(line)

    def wait_for(self, text: str) -> None:
        eventually(lambda: any(text in line for line in self.lines), f"{text!r} in {self.lines[-8:]}")

    def text(self) -> str:
        """Everything, once the process has exited."""
        self._thread.join(10)
        return "".join(self.lines)


def start_watch(start_bedside, run: Path, *options: str) -> tuple[subprocess.Popen, Lines]:
    """``bedside watch RUN`` with the secrets of the configuration in its environment; its stderr, as it comes."""
    watch = start_bedside(
        "watch",
        run,
        "--rescan-every",
        "0.2",
        *options,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENVIRON},
    )
    return watch, Lines(watch.stderr)


def stop(watch: subprocess.Popen, how: int = signal.SIGTERM) -> int:
    watch.send_signal(how)
    return watch.wait(WATCH_EXIT_S)


def read_store(run: Path, sql: str) -> pd.DataFrame:
    with Store.open(RunLayout(run).store, read_only=True, schemas=SCHEMAS) as store:
        return store.cursor().execute(sql).df()


def signed(request) -> bool:
    """The body's HMAC-SHA256 under the shared secret, computed here from the documentation."""
    expected = "sha256=" + hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, request.headers.get("X-Bedside-Signature-256", ""))


def assert_each_message_delivered_once(run: Path, receiver: Receiver, *, kills: int = 0) -> pd.DataFrame:
    """Every webhook message of the outbox was delivered, signed, in order, and answered 2xx once, but for a
    message in flight when the owner was SIGKILLed between the receiver's answer and the outbox's mark: that one
    is sent again with the same Idempotency-Key, for the receiver to drop (docs/alerts.md, Delivery), so each of
    ``kills`` may repeat one message once; the outbox rows."""
    rows = read_store(run, "SELECT * FROM outbox WHERE notifier = 'hook' ORDER BY seq")
    assert len(rows) >= 3
    assert set(rows["status"]) == {"delivered"}, rows[["message_id", "status", "attempts", "last_error"]]
    keys = receiver.delivered_keys()
    assert set(keys) == set(rows["message_id"]), keys
    assert set(keys.values()) <= {1, 2} and sum(keys.values()) - len(keys) <= kills, keys
    assert all(signed(r) for r in receiver.delivered())
    assert list(dict.fromkeys(r.key for r in receiver.delivered())) == list(rows["message_id"])  # in order
    return rows


# -- bedside watch through an outage --------------------------------------------------------------------------


def test_watch_delivers_every_incident_through_an_outage_and_keeps_ingesting_meanwhile(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver, start_bedside
) -> None:
    append_rest = split_run(tiny_faults)
    config = write_config(tmp_path, receiver)
    receiver.script, receiver.default, receiver.hang_s = list(OUTAGE), 503, 1.5
    watch, stderr = start_watch(start_bedside, tiny_faults, "--config", str(config), "--drain", "30")
    receiver.wait_for_requests(len(OUTAGE) + 1)  # the scripted answers, then 503s
    receiver.down()
    append_rest()
    stderr.wait_for("at step 185")  # a finding of the appended telemetry: ingested and detected, still down
    time.sleep(4 * RETRY_MAX_S)  # down for longer than the longest backoff: attempts meet refused connections
    assert receiver.delivered() == []
    recovered = time.time()
    receiver.default = 200
    receiver.up()
    receiver.wait_for(1)
    assert stop(watch) == 0
    said = stderr.text()

    rows = assert_each_message_delivered_once(tiny_faults, receiver)
    answered = receiver.answered()
    assert answered[: len(OUTAGE)] == [500, 500, 429, HANG] and 503 in answered
    limited = receiver.requests[2]
    assert receiver.requests[3].at - limited.at >= 0.95  # Retry-After: 1 was honoured
    first = rows["message_id"].iloc[0]
    reached = [r.status for r in receiver.requests if r.key == first]
    assert rows["attempts"].iloc[0] > len(reached)  # the attempts that found the receiver down

    [[ingested_until, rank_steps]] = read_store(
        tiny_faults, "SELECT (SELECT max(updated_at) FROM sources), (SELECT count(*) FROM rank_steps)"
    ).values
    assert rank_steps == 400 and ingested_until < recovered
    later = rows[rows["incident_id"] == "nonfinite@0:150"]
    assert len(later) and (later["created_at"] < recovered).all()
    assert TOKEN not in said and SECRET not in said and "still pending" not in said
    assert "failing" in said and "delivered again" in said
    critical = read_store(
        tiny_faults, "SELECT payload->>'$.text' AS text FROM outbox WHERE notifier = 'journal' ORDER BY seq"
    )["text"]
    assert (tmp_path / "alerts.log").read_text().splitlines() == [f"bedside: alert: {t}" for t in critical]


def test_the_same_outage_in_process_leaves_ingestion_and_detection_unblocked(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver
) -> None:
    append_rest = split_run(tiny_faults)
    settings = load_settings(write_config(tmp_path, receiver), ENVIRON)
    receiver.script, receiver.default, receiver.hang_s = list(OUTAGE), 503, 1.5
    with Store.open(RunLayout(tiny_faults).store, schemas=SCHEMAS) as store:
        sender = OutboxSender(store, settings)
        detection = StoreDetection(store, alerts=AlertRouter(store, settings, on_commit=sender.wake))
        collector = Collector(tiny_faults, store)

        def ingest() -> tuple[int, int]:
            collector.ingest_available()
            detection.update()
            return (
                store.cursor()
                .execute("SELECT (SELECT count(*) FROM rank_steps), (SELECT count(*) FROM outbox)")
                .fetchone()
            )

        sender.start()
        try:
            rank_steps, messages = ingest()
            assert messages >= 2
            receiver.wait_for_requests(len(OUTAGE) + 1)
            receiver.down()
            append_rest()
            more_rank_steps, more_messages = ingest()
            assert more_rank_steps == 400 > rank_steps and more_messages > messages
            detection.finish()
            eventually(
                lambda: str(
                    store.cursor().execute("SELECT last_error FROM outbox ORDER BY seq LIMIT 1").fetchone()[0]
                ).startswith("cannot reach"),
                "an attempt refused",
            )
            assert receiver.delivered() == []
            receiver.default = 200
            receiver.up()
            eventually(lambda: sender.pending() == 0, "every message delivered")
        finally:
            sender.close()
    assert_each_message_delivered_once(tiny_faults, receiver)


@pytest.mark.slow(reason="two bedside watch processes over a whole sample run, the first killed mid-delivery")
def test_messages_pending_when_watch_is_killed_are_delivered_once_after_a_restart(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver, start_bedside
) -> None:
    config = write_config(tmp_path, receiver)
    receiver.down()
    watch, stderr = start_watch(start_bedside, tiny_faults, "--config", str(config))
    stderr.wait_for("at step 185")  # printed after the findings and their messages were committed
    stderr.wait_for("failing: cannot reach")
    assert stop(watch, signal.SIGKILL) == -signal.SIGKILL
    killed = time.time()
    receiver.up()

    again, stderr = start_watch(
        start_bedside, tiny_faults, "--config", str(config), "--until-finished", "--drain", "30"
    )
    assert again.wait(WATCH_EXIT_S) == 0, stderr.text()
    rows = assert_each_message_delivered_once(tiny_faults, receiver)
    assert (rows["created_at"] < killed).sum() >= 3  # written by the killed watch
    assert "still pending" not in stderr.text()


@pytest.mark.slow(reason="two bedside watch runs over a whole sample run, the receiver down for the first")
def test_watch_stopped_during_an_outage_says_what_is_left_and_the_next_watch_sends_it(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver, start_bedside
) -> None:
    config = write_config(tmp_path, receiver)
    receiver.down()
    watch, stderr = start_watch(
        start_bedside, tiny_faults, "--config", str(config), "--until-finished", "--drain", "0.5"
    )
    assert watch.wait(WATCH_EXIT_S) == 0
    assert "alert messages are still pending: delivered when bedside watch or serve next runs" in stderr.text()
    pending = read_store(tiny_faults, "SELECT message_id FROM outbox WHERE status = 'pending'")["message_id"]
    receiver.up()
    again, stderr = start_watch(
        start_bedside, tiny_faults, "--config", str(config), "--until-finished", "--drain", "30"
    )
    assert again.wait(WATCH_EXIT_S) == 0, stderr.text()
    assert set(pending) <= set(assert_each_message_delivered_once(tiny_faults, receiver)["message_id"])


# -- bedside watch without or with a bad configuration --------------------------------------------------------


def test_watch_without_a_configuration_writes_incidents_to_stderr(tiny_faults: Path, bedside) -> None:
    done = bedside("watch", tiny_faults, "--until-finished", "--quiet", "--rescan-every", "0.2", "--drain", "5")
    assert done.returncode == 0, done.stderr
    alerts = [line for line in done.stderr.splitlines() if line.startswith("bedside: alert: ")]
    rows = read_store(
        tiny_faults, "SELECT notifier, severity, status, payload->>'$.text' AS text FROM outbox ORDER BY seq"
    )
    assert len(rows) >= 1 and set(rows["notifier"]) == {"log"} and set(rows["status"]) == {"delivered"}
    assert set(rows["severity"]) <= {"warning", "critical"}  # the default notifier's threshold
    assert alerts == [f"bedside: alert: {text}" for text in rows["text"]]
    assert any("[CRITICAL] tiny-faults: New incident: Training instability" in line for line in alerts)


def test_watch_with_a_bad_configuration_stops_before_anything_runs(tiny_faults: Path, tmp_path: Path, bedside) -> None:
    (tiny_faults / "bedside.toml").write_text('[notifiers.team]\ntype = "slack"\nurl = "${BEDSIDE_UNSET_VARIABLE}"\n')
    done = bedside("watch", tiny_faults, "--until-finished")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"bedside: error: {tiny_faults / 'bedside.toml'}: notifiers.team.url: environment "
        "variable BEDSIDE_UNSET_VARIABLE is not set"
    )
    assert not RunLayout(tiny_faults).store.exists()


# -- bedside alert test ---------------------------------------------------------------------------------------


def test_alert_test_sends_one_message_to_the_notifier_named(tmp_path: Path, receiver: Receiver, bedside) -> None:
    config = write_config(tmp_path, receiver)
    done = bedside("alert", "test", "--config", config, "--notifier", "hook", env=ENVIRON)
    assert done.returncode == 0, done.stderr
    [request] = receiver.requests
    assert request.path == f"/hook/{TOKEN}" and signed(request)
    assert (request.json()["event"], request.json()["run"]) == ("test", {"id": "", "name": "bedside"})
    assert done.stdout.startswith(f"hook (webhook, http://127.0.0.1:{receiver.port}/***): delivered in ")
    assert done.stdout.rstrip().endswith(": HTTP 200")
    assert TOKEN not in done.stdout + done.stderr


def test_alert_test_of_a_run_uses_the_configuration_beside_it_and_names_the_run(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver, bedside
) -> None:
    write_config(tmp_path, receiver)  # in the folder that holds the run
    done = bedside("alert", "test", tiny_faults, env=ENVIRON)
    assert done.returncode == 0, done.stderr
    assert [r.json()["run"] for r in receiver.requests] == [{"id": "912eef7d1259", "name": "tiny-faults"}]
    assert "journal (log, " in done.stdout and "delivered" in done.stdout


def test_alert_test_against_a_receiver_that_is_down_fails_without_showing_the_secret(
    tmp_path: Path, receiver: Receiver, bedside
) -> None:
    config = write_config(tmp_path, receiver)
    receiver.down()
    done = bedside("alert", "test", "--config", config, "--notifier", "hook", env=ENVIRON)
    assert done.returncode == 2
    assert f"hook (webhook, http://127.0.0.1:{receiver.port}/***): FAILED in " in done.stdout
    assert "cannot reach" in done.stdout
    assert done.stderr.strip() == "bedside: error: 1 of 1 notifiers could not be reached"
    assert TOKEN not in done.stdout + done.stderr


def test_alert_test_of_an_unknown_notifier_names_those_configured(tmp_path: Path, receiver: Receiver, bedside) -> None:
    config = write_config(tmp_path, receiver)
    done = bedside("alert", "test", "--config", config, "--notifier", "team-slack", env=ENVIRON)
    assert done.returncode == 2 and receiver.requests == []
    assert done.stderr.strip() == (
        f"bedside: error: {config}: no notifier named 'team-slack' (configured: hook, journal)"
    )


def test_alert_test_without_a_configuration_says_where_it_looked(tmp_path: Path, bedside, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    done = bedside("alert", "test")
    assert done.returncode == 2
    assert done.stderr.strip() == "bedside: error: no bedside.toml found: pass --config FILE (see docs/alerts.md)"
