"""An owner whose following fails is seen and starts again: a real live owner of ``bedside serve`` on a real
store, broken for real (a table renamed away through a second cursor, as a stray DDL or a damaged catalog would),
shows the failure in a banner on every page, logs it, tells the webhook (signed) once, retries with backoff, and,
once the table is back, ingests what the trainer wrote meanwhile with no row lost or counted twice."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import jsonschema
import pytest
from dashboard_app import PAGES, open_page, serve
from receiver import Receiver
from test_alerts_watch import ENVIRON, eventually, signed, split_run, write_config

from bedside.app.dashboard import registry
from bedside.app.service.alerts.payload import schema
from bedside.app.service.owner import RunOwner

VALIDATOR = jsonschema.Draft202012Validator(schema())
STOPPED = "ingestion and detection stopped"


@pytest.fixture
def live_owner(
    tiny_faults: Path, tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[RunOwner, Callable[[], None]]]:
    """The desk of ``bedside serve`` on the first part of tiny_faults, live (its owner follows in a thread), with a
    signed webhook on ``receiver``: the owner once it has caught up, and what appends the rest of the run."""
    append_rest = split_run(tiny_faults)
    config = write_config(tmp_path, receiver)
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    serve(tiny_faults, live=True, config=config)
    owner = registry.desk().owner(tiny_faults)
    assert owner is not None
    eventually(lambda: owner.detected_at is not None, "the owner caught up")
    yield owner, append_rest
    registry.close_all()


def owner_messages(receiver: Receiver, event: str) -> list:
    return [r for r in receiver.delivered() if r.json()["event"] == event]


def rename(owner: RunOwner, table: str, to: str) -> bool:
    """Rename a table through a cursor of the owner's store (its current connection: a restart replaces it)."""
    try:
        owner.store.cursor().execute(f"ALTER TABLE {table} RENAME TO {to}")
    except duckdb.Error:
        return False
    return True


def test_a_failing_owner_is_shown_logged_alerted_retried_and_loses_nothing(
    tiny_faults: Path,
    live_owner: tuple[RunOwner, Callable[[], None]],
    receiver: Receiver,
    capsys: pytest.CaptureFixture,
) -> None:
    owner, append_rest = live_owner
    assert rename(owner, "rank_steps", "rank_steps_away")
    append_rest()  # the trainer keeps writing
    owner.wake()
    eventually(lambda: owner.health.failing, "the owner saw the failure")
    assert "rank_steps" in owner.health.error

    for page in PAGES:  # the banner is above every page
        banner = [e.value for e in open_page(page, run=tiny_faults.name).error]
        assert any(STOPPED in text and "rank_steps" in text for text in banner), (page, banner)
    eventually(lambda: len(owner_messages(receiver, "owner_failed")) == 1, "owner_failed at the webhook")
    [failed] = owner_messages(receiver, "owner_failed")
    VALIDATOR.validate(failed.json())
    assert signed(failed) and failed.json()["severity"] == "critical"
    assert "rank_steps" in failed.json()["owner"]["error"]
    eventually(lambda: owner.health.restarts >= 1 and owner.health.failures >= 2, "a restart that failed again")
    assert len(owner_messages(receiver, "owner_failed")) == 1  # once per failure streak, not per retry
    assert "following the run failed" in capsys.readouterr().err

    eventually(lambda: rename(owner, "rank_steps_away", "rank_steps"), "the table is back")
    eventually(lambda: not owner.health.failing, "the owner works again")
    eventually(lambda: len(owner_messages(receiver, "owner_recovered")) == 1, "owner_recovered at the webhook")
    VALIDATOR.validate(owner_messages(receiver, "owner_recovered")[0].json())
    eventually(
        lambda: (
            owner.store.cursor()
            .execute(
                "SELECT (SELECT count(*) FROM rank_steps), (SELECT count(DISTINCT (source_id, line_offset)) FROM rank_steps),"
                " (SELECT count(*) FROM steps)"
            )
            .fetchone()
            == (400, 400, 200)
        ),
        "every row once",
    )
    assert not [e.value for e in open_page("overview", run=tiny_faults.name).error if STOPPED in e.value]
