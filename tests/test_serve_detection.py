"""Detection covers every row of a store, whoever ingested it: a run collected by ``bedside collect`` and then
served (or watched) shows its incidents, not a green "No incidents.", and the page says when detectors ran."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from dashboard_app import assert_rendered, from_store, open_page, serve, table, tiles
from test_alerts_watch import read_store

from bedside.app.dashboard import registry


@pytest.fixture
def collected(tiny_faults: Path, bedside: Callable) -> Path:
    """tiny_faults (a bad shard, a straggler, bit flips, a NaN) ingested by ``bedside collect`` alone."""
    done = bedside("collect", tiny_faults, "--quiet")
    assert done.returncode == 0, done.stderr
    assert read_store(tiny_faults, "SELECT count(*) AS n FROM incidents")["n"][0] == 0
    return tiny_faults


def test_serve_detects_the_rows_bedside_collect_ingested(collected: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve(collected)
    try:
        app = open_page("incidents", run=collected.name)
        assert_rendered(app)
        assert not app.success  # no green "No incidents."
        stored = from_store(collected, "SELECT incident_id, status FROM incidents")
        assert len(stored) >= 3
        assert sorted(table(app, "severity", "title", "id")["id"]) == sorted(stored["incident_id"])
        open_count = int((stored["status"] != "resolved").sum())
        assert tiles(open_page("overview", run=collected.name))["Open incidents"] == str(open_count)
    finally:
        registry.close_all()


def test_watch_detects_the_rows_bedside_collect_ingested(collected: Path, bedside: Callable) -> None:
    done = bedside("watch", collected, "--until-finished", "--quiet")
    assert done.returncode == 0, done.stderr
    kinds = set(read_store(collected, "SELECT DISTINCT kind FROM findings")["kind"])
    assert {"nonfinite", "straggler"} <= kinds
