"""Which incident changes become messages: thresholds and kinds per notifier, one message per incident with
follow-ups only when it rises, clears, reopens or is acknowledged, token buckets and digests in a flood, and
replays after a restart that say nothing twice. Real findings, incidents, router and store files throughout;
the findings come from a scripted detector (told what to report), or from the real detectors over a real run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pandas as pd
import pytest

from bedside.app.service.alerts.config import AlertSettings, parse_settings
from bedside.app.service.alerts.payload import schema
from bedside.app.service.alerts.router import AlertRouter
from bedside.app.service.detection import StoreDetection
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.errors import BedsideError
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store
from bedside.detectors.detector import Detector
from bedside.detectors.finding import Finding
from bedside.detectors.limits import ranges
from bedside.detectors.registry import finding_kinds
from bedside.detectors.telemetry import TelemetryBatch

VALIDATOR = jsonschema.Draft202012Validator(schema())
T0 = 1_796_000_000.0
SEVERITIES = ("info", "warning", "critical")


class Scripted(Detector):
    """Reports the findings it is given at the next update or tick: the runner, incident book, router and store
    that take them are the real ones."""

    name = "scripted"
    kinds = tuple(finding_kinds().values())  # it reports whatever it is given
    limits = ranges()

    def __init__(self) -> None:
        super().__init__()
        self.queue: list[Finding] = []

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        return self._take()

    def tick(self, now: float) -> list[Finding]:
        return self._take()

    def _take(self) -> list[Finding]:
        taken, self.queue = self.queue, []
        return taken


def finding(
    kind: str,
    start: int,
    severity: str = "warning",
    *,
    active: bool = True,
    ranks: tuple[int, ...] = (),
    timeline: int = 0,
    end: int | None = None,
) -> Finding:
    return Finding(
        kind=kind,
        severity=severity,
        timeline=timeline,
        start_step=start,
        end_step=end or start,
        ranks=ranks,
        score=5.0,
        summary=f"{kind} at step {start}",
        evidence={"z": 5.0},
        active=active,
        detector="scripted",
    )


def alert_settings(alerts: dict[str, Any] | None = None, **notifiers: dict[str, Any]) -> AlertSettings:
    """Settings of log notifiers (routing never delivers), each given as its table's keys."""
    tables = {name: {"type": "log", "min_severity": "info", **keys} for name, keys in notifiers.items()}
    return parse_settings({"alerts": alerts or {}, "notifiers": tables}, {})


class Desk:
    """A store file with a detection session and its alert router, as the store's owner runs them."""

    def __init__(self, path: Path, settings: AlertSettings) -> None:
        self.store = Store.open(path, schemas=SCHEMAS)
        self.detector = Scripted()
        self.router = AlertRouter(self.store, settings)
        self.detection = StoreDetection(self.store, [self.detector], alerts=self.router)

    def say(self, *findings: Finding, at: float) -> None:
        """The detector reports ``findings`` at time ``at`` (then the router's digest clock ticks)."""
        self.detector.queue += findings
        self.detection.tick(at)

    def outbox(self, notifier: str | None = None) -> pd.DataFrame:
        """The outbox in write order (every payload checked against the schema)."""
        rows = self.store.cursor().execute("SELECT * FROM outbox ORDER BY seq").df()
        for payload in rows["payload"]:
            VALIDATOR.validate(json.loads(payload))
        return rows if notifier is None else rows[rows["notifier"] == notifier].reset_index(drop=True)

    def told(self, notifier: str) -> list[tuple[str | None, str]]:
        """(incident, event) of each message for ``notifier``, in order."""
        rows = self.outbox(notifier)
        return list(zip(rows["incident_id"], rows["event"]))

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def open_desk(tmp_path: Path) -> Iterator:
    """Open a Desk on tmp_path/run/bedside.duckdb (again after a close: a restart); closed at teardown."""
    desks: list[Desk] = []

    def open_(settings: AlertSettings) -> Desk:
        (tmp_path / "run").mkdir(exist_ok=True)
        desks.append(Desk(tmp_path / "run" / "bedside.duckdb", settings))
        return desks[-1]

    yield open_
    for desk in desks:
        desk.close()


def payload(row: pd.Series) -> dict[str, Any]:
    return json.loads(row["payload"])


# -- who is told ----------------------------------------------------------------------------------------------


def test_each_notifier_gets_the_incidents_at_or_above_its_severity_and_with_its_kinds(open_desk) -> None:
    desk = open_desk(
        alert_settings(
            everything={},
            warnings={"min_severity": "warning"},
            pages={"min_severity": "critical"},
            numerics={"kinds": ["nonfinite", "sdc"]},
        )
    )
    desk.say(
        finding("loss_spike", 100, "info"),
        finding("straggler", 100, ranks=(1,)),
        finding("nonfinite", 100, "critical", timeline=1),
        at=T0,
    )
    spike, straggler, nan = "loss_spike@0:100", "straggler@0:100/r1", "nonfinite@1:100"
    assert sorted(desk.told("everything")) == sorted([(spike, "opened"), (straggler, "opened"), (nan, "opened")])
    assert sorted(desk.told("warnings")) == sorted([(straggler, "opened"), (nan, "opened")])
    assert desk.told("pages") == [(nan, "opened")]
    assert desk.told("numerics") == [(nan, "opened")]
    assert set(desk.outbox()["status"]) == {"pending"}


def test_an_incident_is_sent_once_it_rises_to_a_notifier_s_threshold_or_gains_its_kind(open_desk) -> None:
    desk = open_desk(alert_settings(pages={"min_severity": "critical"}, numerics={"kinds": ["nonfinite"]}))
    desk.say(finding("loss_spike", 100), at=T0)
    assert desk.outbox().empty
    desk.say(finding("grad_spike", 102, "critical"), at=T0 + 1)
    assert desk.told("pages") == [("loss_spike@0:100", "opened")] and desk.told("numerics") == []
    assert payload(desk.outbox("pages").iloc[0])["incident"]["severity"] == "critical"
    desk.say(finding("nonfinite", 104, "info"), at=T0 + 2)
    assert desk.told("numerics") == [("loss_spike@0:100", "opened")]
    assert desk.told("pages") == [("loss_spike@0:100", "opened")]


# -- one message per incident ---------------------------------------------------------------------------------


def test_later_findings_send_nothing_until_the_incident_rises_clears_or_reopens(open_desk) -> None:
    desk = open_desk(alert_settings(ops={}))
    incident = "loss_spike@0:100"
    desk.say(finding("loss_spike", 100), at=T0)
    desk.say(finding("loss_spike", 100, end=110), finding("grad_spike", 105), at=T0 + 1)
    desk.say(finding("grad_spike", 105, "info", end=106), at=T0 + 2)
    assert desk.told("ops") == [(incident, "opened")]
    desk.say(finding("nonfinite", 108, "critical"), at=T0 + 3)
    desk.say(finding("nonfinite", 109, "critical", ranks=(1,)), at=T0 + 4)
    assert desk.told("ops") == [(incident, "opened"), (incident, "escalated")]
    desk.say(
        *[
            finding(f.kind, f.start_step, f.severity.value, ranks=f.ranks, end=f.end_step, active=False)
            for f in desk.detection.runner.ordered()
        ],
        at=T0 + 5,
    )
    desk.say(at=T0 + 6)
    desk.say(finding("loss_spike", 115), at=T0 + 7)
    rows = desk.outbox("ops")
    assert list(rows["event"]) == ["opened", "escalated", "resolved", "reopened"]
    assert list(rows["message_id"]) == [f"run/ops/{incident}/{e}/1" for e in rows["event"]]
    assert [payload(r)["incident"]["findings"] for _, r in rows.iterrows()] == [1, 3, 4, 5]
    assert list(rows["incident_status"]) == ["open", "open", "resolved", "open"]
    assert list(rows["severity"]) == ["warning", "critical", "critical", "critical"]


def test_an_incident_that_opens_and_clears_in_one_pass_is_sent_once_already_resolved(open_desk) -> None:
    desk = open_desk(alert_settings(ops={}))
    desk.say(finding("straggler", 50, ranks=(3,), end=80, active=False), at=T0)
    [row] = [r for _, r in desk.outbox("ops").iterrows()]
    assert (row["event"], row["incident_status"]) == ("opened", "resolved")


def test_an_acknowledgement_is_announced_to_the_notifiers_that_were_told_of_the_incident(open_desk) -> None:
    desk = open_desk(alert_settings(ops={}, pages={"min_severity": "critical"}))
    desk.say(finding("loss_spike", 100), at=T0)
    desk.detection.acknowledge("loss_spike@0:100", "alice", "looking at shard 3", now=T0 + 1)
    assert desk.told("ops") == [("loss_spike@0:100", "opened"), ("loss_spike@0:100", "acknowledged")]
    assert desk.told("pages") == []
    ack = payload(desk.outbox("ops").iloc[1])["incident"]
    assert (ack["status"], ack["acknowledged_by"], ack["ack_note"]) == ("acknowledged", "alice", "looking at shard 3")
    [[status]] = (
        desk.store.cursor().execute("SELECT status FROM incidents WHERE incident_id = 'loss_spike@0:100'").fetchall()
    )
    assert status == "acknowledged"

    desk.say(finding("nonfinite", 101, "critical"), at=T0 + 2)
    [opened] = [payload(r)["incident"] for _, r in desk.outbox("pages").iterrows()]
    assert (opened["status"], opened["acknowledged_by"]) == ("acknowledged", "alice")
    assert desk.told("ops")[-1] == ("loss_spike@0:100", "escalated")


def test_acknowledging_a_resolved_or_unknown_incident_sends_nothing(open_desk) -> None:
    desk = open_desk(alert_settings(ops={}))
    desk.say(finding("straggler", 50, ranks=(3,), active=False), at=T0)
    before = len(desk.outbox())
    desk.detection.acknowledge("straggler@0:50/r3", "bob", now=T0 + 1)
    with pytest.raises(BedsideError, match="no incident"):
        desk.detection.acknowledge("hang@0:1", "bob", now=T0 + 1)
    with pytest.raises(BedsideError, match="name"):
        desk.detection.acknowledge("straggler@0:50/r3", "  ", now=T0 + 1)
    assert len(desk.outbox()) == before == 1


def test_resolving_by_hand_is_announced_once_and_later_findings_open_a_new_incident(open_desk) -> None:
    desk = open_desk(alert_settings(ops={}))
    desk.say(finding("straggler", 100, ranks=(3,)), at=T0)
    desk.detection.resolve("straggler@0:100/r3", "carol", "rank 3's host was drained", now=T0 + 1)
    assert desk.told("ops") == [("straggler@0:100/r3", "opened"), ("straggler@0:100/r3", "resolved")]
    closed = payload(desk.outbox("ops").iloc[1])["incident"]
    assert (closed["status"], closed["resolved_by"], closed["resolve_note"]) == (
        "resolved",
        "carol",
        "rank 3's host was drained",
    )
    [[status, who]] = (
        desk.store.cursor()
        .execute("SELECT status, resolved_by FROM incidents WHERE incident_id = 'straggler@0:100/r3'")
        .fetchall()
    )
    assert (status, who) == ("resolved", "carol")

    desk.say(finding("straggler", 100, ranks=(3,), end=140), finding("straggler", 120, ranks=(5,)), at=T0 + 2)
    assert desk.told("ops")[2:] == [("straggler@0:120/r5", "opened")]  # the closed one stays quiet

    desk.close()
    desk = open_desk(alert_settings(ops={}))  # a restart keeps it closed
    desk.say(finding("straggler", 125, ranks=(6,)), at=T0 + 3)
    assert ("straggler@0:100/r3", "reopened") not in desk.told("ops")


def test_a_finding_that_joins_with_an_earlier_onset_moves_the_stored_incident_s_start(open_desk) -> None:
    desk = open_desk(alert_settings(ops={}))
    desk.say(finding("nonfinite", 150, "critical"), at=T0)
    desk.say(finding("sdc", 140, end=145), at=T0 + 1)
    [[start, end, findings]] = (
        desk.store.cursor().execute("SELECT start_step, end_step, findings FROM incidents").fetchall()
    )
    assert (start, end, findings) == (140, 150, 2)


def test_resolving_needs_a_known_incident_and_a_name(open_desk) -> None:
    desk = open_desk(alert_settings(ops={}))
    desk.say(finding("loss_spike", 10), at=T0)
    with pytest.raises(BedsideError, match="no incident"):
        desk.detection.resolve("hang@0:1", "carol", "why")
    with pytest.raises(BedsideError, match="name"):
        desk.detection.resolve("loss_spike@0:10", " ", "why")


# -- floods ---------------------------------------------------------------------------------------------------


def test_a_burst_of_200_findings_gives_one_message_bounded_follow_ups_and_a_digest(open_desk) -> None:
    desk = open_desk(alert_settings({"digest_window_s": 60, "digest_min_findings": 10}, ops={}))
    ceilings = np.repeat([1, 2, 3], [5, 5, 10])[:, None]  # info only, then warnings too, then criticals too
    levels = np.random.default_rng(7).integers(0, ceilings, (20, 10))
    burst = [
        [finding("nonfinite", 100 + 10 * i + j, SEVERITIES[level], ranks=(j,)) for j, level in enumerate(row)]
        for i, row in enumerate(levels)
    ]
    for i, batch in enumerate(burst):
        desk.say(*batch, at=T0 + i * 0.5)
    incident_messages = desk.told("ops")
    rises = len(set(np.maximum.accumulate(levels.max(axis=1)))) - 1
    assert incident_messages == [("nonfinite@0:100/r0", "opened")] + [("nonfinite@0:100/r0", "escalated")] * rises
    assert rises == 2

    desk.say(at=T0 + 30)
    assert len(desk.outbox("ops")) == len(incident_messages)  # the window is not over yet
    desk.say(at=T0 + 61)
    rows = desk.outbox("ops")
    [digest] = [payload(r) for _, r in rows.iterrows() if r["event"] == "digest"]
    quiet = 200 - 10 * len(incident_messages)  # those of the batches that made no message of their own
    assert (digest["digest"]["findings"], digest["digest"]["held_messages"], digest["severity"]) == (
        quiet,
        0,
        "critical",
    )
    assert digest["text"].startswith(f"[CRITICAL] run: {quiet} more findings in the last 1 minute")
    desk.say(at=T0 + 200)
    assert len(desk.outbox("ops")) == len(incident_messages) + 1


def test_a_few_quiet_findings_in_a_window_make_no_digest(open_desk) -> None:
    desk = open_desk(alert_settings({"digest_window_s": 60, "digest_min_findings": 10}, ops={}))
    for i in range(5):
        desk.say(finding("straggler", 100 + 10 * i, ranks=(2,)), at=T0 + i)
    desk.say(at=T0 + 100)
    assert desk.told("ops") == [("straggler@0:100/r2", "opened")]


def test_the_token_bucket_holds_messages_beyond_its_burst_and_the_digest_lists_them(open_desk) -> None:
    desk = open_desk(alert_settings({"digest_window_s": 60}, ops={"burst": 3, "per_minute": 6}, calm={"burst": 10}))
    desk.say(*[finding("straggler", 1000 * i, ranks=(i,)) for i in range(6)], at=T0)
    rows = desk.outbox("ops")
    assert list(rows["status"]) == ["pending"] * 3 + ["held"] * 3
    held = list(rows["message_id"][rows["status"] == "held"])
    assert set(desk.outbox("calm")["status"]) == {"pending"}

    desk.detection.acknowledge("straggler@0:0/r0", "carol", now=T0 + 1)
    assert desk.outbox("ops").iloc[-1][["event", "status"]].tolist() == ["acknowledged", "pending"]

    desk.say(at=T0 + 61)
    rows = desk.outbox("ops")
    [digest] = [r for _, r in rows.iterrows() if r["event"] == "digest"]
    assert digest["status"] == "pending"
    listed = payload(digest)["digest"]
    assert (listed["held_messages"], listed["more_incidents"]) == (3, 0)
    assert [i["id"] for i in listed["incidents"]] == [f"straggler@0:{1000 * i}/r{i}" for i in range(3, 6)]
    covered = rows[rows["message_id"].isin(held)]
    assert set(covered["status"]) == {"digested"} and set(covered["digest_id"]) == {digest["message_id"]}

    desk.say(finding("straggler", 9000, ranks=(9,)), at=T0 + 62)
    assert desk.outbox("ops").iloc[-1][["incident_id", "status"]].tolist() == ["straggler@0:9000/r9", "pending"]


def test_held_messages_are_digested_by_the_router_of_a_restarted_owner(open_desk) -> None:
    settings = alert_settings({"digest_window_s": 60}, ops={"burst": 1, "per_minute": 1})
    desk = open_desk(settings)
    desk.say(*[finding("straggler", 1000 * i, ranks=(i,)) for i in range(3)], at=T0)
    assert list(desk.outbox("ops")["status"]) == ["pending", "held", "held"]
    desk.close()

    again = open_desk(settings)
    again.say(at=T0 + 61)
    rows = again.outbox("ops")
    assert list(rows["status"]) == ["pending", "digested", "digested", "pending"]
    assert payload(rows.iloc[-1])["digest"]["held_messages"] == 2


# -- restarts and history -------------------------------------------------------------------------------------


def detect_run(
    run: Path, settings: AlertSettings | None, *, batch_bytes: int | None = None, ack: str | None = None
) -> pd.DataFrame:
    """Ingest and detect ``run`` (streaming with ``batch_bytes``) in a new store session with alerts per
    ``settings`` (none when None); acknowledge ``ack``; the outbox after it."""
    with Store.open(RunLayout(run).store, schemas=SCHEMAS) as store:
        router = AlertRouter(store, settings) if settings else None
        detection = StoreDetection(store, alerts=router)
        collector = Collector(run, store, **({"batch_bytes": batch_bytes} if batch_bytes else {}))
        collector.ingest_available(on_pass=lambda result: detection.update(caught_up=not result.backlog))
        detection.update()
        detection.finish()
        if ack:
            detection.acknowledge(ack, "dana", "rolling back")
        return store.cursor().execute("SELECT * FROM outbox ORDER BY seq").df()


@pytest.mark.slow(reason="detects a whole sample run three times, twice in 4 KiB batches")
def test_a_restarted_owner_replays_the_run_and_sends_nothing_twice(tiny_faults: Path) -> None:
    settings = alert_settings({"digest_window_s": 3600}, ops={"burst": 100})
    first = detect_run(tiny_faults, settings, batch_bytes=4096, ack="nonfinite@0:150")
    assert {"opened", "resolved", "acknowledged"} <= set(first["event"])
    assert len(first) == len(set(first["message_id"]))
    again = detect_run(tiny_faults, settings)
    pd.testing.assert_frame_equal(first, again)
    assert detect_run(tiny_faults, settings, batch_bytes=4096).equals(first)


def test_incidents_closed_before_alerts_were_configured_are_history_and_open_ones_are_sent(tiny_faults: Path) -> None:
    assert detect_run(tiny_faults, None).empty
    with Store.open(RunLayout(tiny_faults).store, read_only=True, schemas=SCHEMAS) as store:
        statuses = dict(store.cursor().execute("SELECT incident_id, status FROM incidents").fetchall())
    assert "resolved" in statuses.values() and "open" in statuses.values()
    rows = detect_run(tiny_faults, alert_settings(ops={"burst": 100}))
    opened = [i for i, status in statuses.items() if status == "open"]
    assert sorted(rows["incident_id"]) == sorted(opened)
    assert set(rows["event"]) == {"opened"} and set(rows["incident_status"]) == {"open"}


class SettledAtTheEnd(Detector):
    """A detector whose finding stays active until the data ends (a condition only ``finish`` settles)."""

    name = "settled_at_the_end"
    kinds = (finding_kinds()["straggler"],)
    limits = ranges()

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        return [finding("straggler", 10, ranks=(1,))] if len(batch) else []

    def finish(self) -> list[Finding]:
        return [finding("straggler", 10, ranks=(1,), active=False)]


def detect_settled(run: Path, settings: AlertSettings | None) -> pd.DataFrame:
    with Store.open(RunLayout(run).store, schemas=SCHEMAS) as store:
        Collector(run, store).ingest_available()
        router = AlertRouter(store, settings) if settings else None
        detection = StoreDetection(store, [SettledAtTheEnd()], alerts=router)
        detection.update()
        detection.finish()
        return store.cursor().execute("SELECT message_id, status FROM outbox ORDER BY seq").df()


def test_a_replay_passing_through_a_state_already_announced_says_nothing(tiny_faults: Path) -> None:
    settings = alert_settings(ops={})
    first = detect_settled(tiny_faults, settings)
    assert list(first["message_id"]) == [f"912eef7d1259/ops/straggler@0:10/r1/{e}/1" for e in ("opened", "resolved")]
    assert detect_settled(tiny_faults, settings).equals(first)


def test_a_replay_passing_through_an_open_state_does_not_announce_history(tiny_faults: Path) -> None:
    assert detect_settled(tiny_faults, None).empty
    assert detect_settled(tiny_faults, alert_settings(ops={})).empty


def test_after_a_restart_the_replay_is_silent_but_news_is_still_sent(open_desk) -> None:
    settings = alert_settings(ops={})
    desk = open_desk(settings)
    desk.say(finding("loss_spike", 100), at=T0)
    desk.say(finding("loss_spike", 100, end=104, active=False), at=T0 + 1)
    desk.close()

    again = open_desk(settings)
    again.say(finding("loss_spike", 100), at=T0 + 10)  # the replay passes through the open state
    again.say(finding("loss_spike", 100, end=104, active=False), at=T0 + 11)
    assert again.told("ops") == [("loss_spike@0:100", "opened"), ("loss_spike@0:100", "resolved")]
    again.say(finding("nonfinite", 110, "critical"), at=T0 + 12)
    again.say(finding("nonfinite", 110, "critical", end=112, active=False), at=T0 + 13)
    assert [e for _, e in again.told("ops")] == ["opened", "resolved", "reopened", "resolved"]
    assert again.outbox("ops")["message_id"].iloc[-1] == "run/ops/loss_spike@0:100/resolved/2"


def test_alerts_need_the_store_s_owner(tiny_faults: Path) -> None:
    detect_run(tiny_faults, None)
    with Store.open(RunLayout(tiny_faults).store, read_only=True, schemas=SCHEMAS) as store:
        with pytest.raises(BedsideError, match="owner"):
            StoreDetection(store, alerts=AlertRouter(store, alert_settings(ops={})))
