"""The SQL console (``collectors/store/console.py``): a viewer's SQL runs in a sandbox that cannot write.

Every attack of ``sql_attacks.py`` is refused against a store open for writing, as the dashboard's
owner holds it, and the store is unchanged after all of them; statements that slip past the
statement check still cannot reach the store; results are capped and time-limited.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from dashboard_app import copy_run as copy_sample_run
from sql_attacks import ATTACKS

from bedside.app.service.detection import detect_run
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.errors import QueryError
from bedside.collectors.layout import RunLayout
from bedside.collectors.query import ReadView, open_for_reading
from bedside.collectors.store import Store, open_sandbox
from bedside.collectors.store.console import ConsoleLimits, console_views, run_console_query

SECRET = "root:x:0:0:the secret line"


def owned_store(run: Path) -> Iterator[Store]:
    """``run`` ingested and detected, its store open for writing as ``bedside serve`` holds it."""
    detect_run(run)
    store = Store.open(RunLayout(run).store, schemas=SCHEMAS)
    yield store
    store.close()


@pytest.fixture
def owned(tiny_faults: Path) -> Iterator[Store]:
    """A private copy of tiny-faults as ``bedside serve`` holds it, for a test that writes."""
    yield from owned_store(tiny_faults)


@pytest.fixture(scope="module")
def owned_once(tmp_path_factory) -> Iterator[Store]:
    """One copy of tiny-faults as ``bedside serve`` holds it, for the attacks: each checks that it changed nothing."""
    yield from owned_store(copy_sample_run("tiny-faults", tmp_path_factory.mktemp("owned")))


@pytest.fixture(scope="module")
def raw_view(tmp_path_factory) -> Iterator[ReadView]:
    """What ``bedside query`` reads from a run with no store: its views rebuilt in memory from the telemetry."""
    view = open_for_reading(copy_sample_run("tiny-faults", tmp_path_factory.mktemp("raw")))
    assert view.source == "raw telemetry"
    yield view
    view.store.close()


def fingerprint(store: Store) -> dict[str, str]:
    """A digest of every table's rows and of the schema: any write shows."""
    cur = store.cursor()
    tables = [
        name
        for (name,) in cur.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() ORDER BY 1"
        ).fetchall()
    ]
    digest = {
        name: hashlib.sha256(
            repr(sorted(map(repr, cur.execute(f'SELECT * FROM "{name}"').fetchall()))).encode()
        ).hexdigest()
        for name in tables
    }
    digest["schema"] = repr(
        cur.execute("SELECT sql FROM duckdb_views() WHERE NOT internal ORDER BY view_name").fetchall()
    )
    return digest


def attack_text(sql: str, tmp_path: Path, store_path: Path) -> str:
    secret = tmp_path / "secret.csv"
    secret.write_text(SECRET + "\n")
    return sql.format(secret=secret, store=store_path, out=tmp_path / "out.csv")


@pytest.mark.parametrize("name", list(ATTACKS))
def test_every_attack_is_refused_with_a_reason_and_changes_nothing(
    owned_once: Store, tmp_path: Path, name: str
) -> None:
    before = fingerprint(owned_once)
    with pytest.raises(QueryError) as refused:
        run_console_query(owned_once, attack_text(ATTACKS[name], tmp_path, owned_once.path))
    assert str(refused.value).strip() and "Traceback" not in str(refused.value)
    assert SECRET not in str(refused.value)
    assert fingerprint(owned_once) == before
    assert not (tmp_path / "out.csv").exists()


def test_what_slips_past_the_statement_check_still_cannot_reach_the_store(owned: Store, tmp_path: Path) -> None:
    """The sandbox is the wall, not the check: run writes in it directly, with a view streamed in."""
    before = fingerprint(owned)
    sandbox = open_sandbox()
    cursor = owned.cursor()
    sandbox.register("step_metrics", cursor.sql("SELECT * FROM step_metrics").to_arrow_reader())
    hidden = {"name_in_this_frame": "a Python object the sandbox must not see"}  # replacement scans are off
    assert hidden
    for sql in (
        "WITH x AS (DELETE FROM step_metrics RETURNING *) SELECT * FROM x",
        "DROP VIEW step_metrics",
        "CREATE TABLE steps AS SELECT 1",
        "DELETE FROM steps",
        "CHECKPOINT",
    ):
        with contextlib.suppress(duckdb.Error):  # these may run, on the sandbox's own empty database
            sandbox.execute(sql).fetchall()
    for sql, refusal in (
        (f"ATTACH '{owned.path}' AS store2", "conflict|Permission"),
        ("SET enable_external_access = true", "Cannot change configuration"),
        ("SELECT * FROM hidden", "does not exist"),
        (f"SELECT * FROM read_csv('{owned.path}')", "Permission"),
    ):
        with pytest.raises(duckdb.Error, match=refusal):
            sandbox.execute(sql).fetchall()
    sandbox.close()
    cursor.close()
    assert fingerprint(owned) == before


def test_reads_of_the_documented_views_work_and_see_the_live_store(owned: Store) -> None:
    result = run_console_query(owned, "SELECT count(*) AS n, max(step) AS last FROM step_metrics")
    [[n, last]] = result.frame.values.tolist()
    assert (n, last, result.truncated) == (200, 200, False)
    joined = run_console_query(
        owned,
        "WITH s AS (SELECT step, loss FROM step_metrics) "
        "SELECT count(*) FROM s a JOIN step_metrics b USING (step) "
        "WHERE b.step > (SELECT min(step) FROM step_metrics)",
    )
    assert int(joined.frame.iloc[0, 0]) > 0  # a view named three times is read whole, not streamed once
    shouted = run_console_query(owned, "SELECT count(*) FROM STEP_METRICS")  # names ignore case, as in SQL
    assert int(shouted.frame.iloc[0, 0]) == 200
    assert "outbox" not in console_views(owned) and {"incidents", "alerts", "rejected"} <= set(console_views(owned))
    with owned.transaction() as con:
        con.execute("DELETE FROM steps WHERE step > 150")  # the owner writes; the next query sees it
    assert int(run_console_query(owned, "SELECT max(step) FROM step_metrics").frame.iloc[0, 0]) == 150


def test_results_are_cut_at_the_row_and_byte_caps_and_say_so(owned: Store) -> None:
    rows = run_console_query(owned, "SELECT * FROM rank_step_metrics", ConsoleLimits(max_rows=50))
    assert (len(rows.frame), rows.truncated) == (50, True)
    assert "cut at 50 rows" in rows.cut_note(ConsoleLimits(max_rows=50))
    wide = run_console_query(
        owned, "SELECT repeat('x', 10000) AS blob FROM range(1000)", ConsoleLimits(max_bytes=1 << 20)
    )
    assert wide.truncated and 0 < len(wide.frame) < 200
    whole = run_console_query(owned, "SELECT * FROM step_metrics", ConsoleLimits(max_rows=200))
    assert (len(whole.frame), whole.truncated, whole.cut_note(ConsoleLimits())) == (200, False, "")


def test_a_query_past_its_time_limit_is_stopped(owned: Store) -> None:
    with pytest.raises(QueryError, match=r"stopped after 0.5 s"):
        run_console_query(
            owned, "SELECT count(*) FROM range(1000000000000) a, step_metrics", ConsoleLimits(timeout_s=0.5)
        )
    assert int(run_console_query(owned, "SELECT count(*) FROM step_metrics").frame.iloc[0, 0]) == 200


@pytest.mark.parametrize("name", list(ATTACKS))
def test_bedside_query_refuses_every_attack_from_the_raw_telemetry_too(
    raw_view: ReadView, tmp_path: Path, name: str
) -> None:
    """No store: the read view is rebuilt in memory from the JSONL (once for the module), and the same sandbox
    runs the query (the real CLI types a few of each family below)."""
    with pytest.raises(QueryError):
        run_console_query(raw_view.store, attack_text(ATTACKS[name], tmp_path, tmp_path / "bedside.duckdb"))
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.slow(reason="six CLI processes: one bedside query per attack family")
def test_bedside_query_refuses_attacks_in_one_line(collected_tiny_faults: Path, tmp_path: Path, bedside) -> None:
    """The real CLI on a collected store, a few attacks of each family."""
    for name in (
        "delete in a CTE",
        "explain analyze delete",
        "attach the store",
        "read_csv",
        "the outbox",
        "two statements",
    ):
        done = bedside(
            "query", collected_tiny_faults, attack_text(ATTACKS[name], tmp_path, RunLayout(collected_tiny_faults).store)
        )
        assert (done.returncode, done.stdout) == (2, ""), (name, done.stderr)
        assert done.stderr.startswith("bedside: error: ") and len(done.stderr.splitlines()) == 1, done.stderr
        assert SECRET not in done.stderr
    done = bedside("query", collected_tiny_faults, "SELECT step FROM step_metrics ORDER BY step", "--max-rows", "3")
    assert done.returncode == 0 and done.stdout.split() == ["step", "1", "2", "3"]
    assert "result cut at 3 rows" in done.stderr
