"""A damaged store (cut short, or a data block overwritten) on a real run collected by the real CLI: every
command says so in one line with exit status 2, ``collect`` appends nothing to it, the dashboard shows the damage
in its banner above pages read from the raw telemetry, and ``collect --rebuild`` brings back every row."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from dashboard_app import PAGES, assert_rendered, open_page, serve

from bedside.app.dashboard import registry
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

BLOCK_SIZE = 256 << 10
HEADER_SIZE = 3 * 4096
"""DuckDB's file layout: three header blocks of 4 KiB, then blocks of 256 KiB, each starting with its checksum."""
COMMANDS = [("collect",), ("detect",), ("watch", "--until-finished"), ("query", "SELECT * FROM rank_step_metrics")]


def rank_steps_block(store_path: Path) -> int:
    """Where in the file the first block of the rank_steps table's data starts."""
    with Store.open(store_path, read_only=True, schemas=SCHEMAS) as store:
        [[block]] = (
            store.cursor()
            .execute("SELECT min(block_id) FROM pragma_storage_info('rank_steps') WHERE block_id >= 0")
            .fetchall()
        )
    return HEADER_SIZE + int(block) * BLOCK_SIZE


def cut_short(path: Path, at: int) -> None:
    os.truncate(path, at)


def overwrite(path: Path, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at + 64)
        fh.write(bytes(range(256)) * 16)


@pytest.fixture(params=[cut_short, overwrite], ids=["cut-short", "overwritten"])
def damaged(request: pytest.FixtureRequest, collected_tiny_faults: Path) -> Path:
    """tiny_faults collected by ``bedside collect``, then its store damaged where the rank_steps rows are."""
    store = RunLayout(collected_tiny_faults).store
    request.param(store, rank_steps_block(store))
    return collected_tiny_faults


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_says_the_store_is_damaged_in_one_line(
    damaged: Path, bedside: Callable, command: tuple[str, ...]
) -> None:
    before = RunLayout(damaged).store.read_bytes()
    done = bedside(command[0], damaged, *command[1:])
    if command[0] == "query" and done.returncode == 0:  # damage met while checking the store's code at open: the
        # reader falls back to the raw telemetry and says why
        assert (
            done.stderr.startswith("bedside: warning: the store is damaged; read ") and "Traceback" not in done.stderr
        )
        return
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if not line.startswith("bedside: warning:")]
    assert line.startswith("bedside: error: ") and "Traceback" not in done.stderr
    if command[0] != "query":  # a writer checks the whole store first, and names the way out
        assert "is damaged" in line and f"bedside collect {damaged} --rebuild" in line
    assert RunLayout(damaged).store.read_bytes() == before  # nothing appended, nothing "repaired" by a checkpoint


def test_the_dashboard_shows_the_damage_on_every_page_and_the_way_out(
    damaged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve(damaged)
    try:
        assert registry.desk().owner(damaged) is None  # bedside serve tries every store before it serves
        for page in PAGES:
            app = open_page(page, run=damaged.name)
            assert_rendered(app)  # read from the raw telemetry, not from the damaged blocks
            banner = [e.value for e in app.error]
            assert any("is damaged" in text and "--rebuild" in text for text in banner), (page, banner)
    finally:
        registry.close_all()


def test_rebuild_moves_the_damaged_store_aside_and_recovers_every_row(damaged: Path, bedside: Callable) -> None:
    done = bedside("collect", damaged, "--rebuild")
    assert done.returncode == 0, done.stderr
    assert "moved the store aside" in done.stderr
    [aside] = damaged.glob("bedside.duckdb.damaged-*[0-9Z]")
    with Store.open(RunLayout(damaged).store, read_only=True, schemas=SCHEMAS) as store:
        counts = (
            store.cursor()
            .execute(
                "SELECT (SELECT count(*) FROM rank_steps), (SELECT count(DISTINCT (source_id, line_offset)) "
                "FROM rank_steps), (SELECT count(*) FROM steps), (SELECT count(*) FROM evals)"
            )
            .fetchone()
        )
    assert counts == (400, 400, 200, 4)
    assert aside.stat().st_size > 0
    assert bedside("detect", damaged).returncode == 0  # the findings are recomputed over the rebuilt store


def test_runs_lists_a_run_whose_store_is_damaged(damaged: Path, bedside: Callable) -> None:
    done = bedside("runs", damaged, "--format", "csv")
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert damaged.name in done.stdout and "finished" in done.stdout  # read from the rank files' tails
