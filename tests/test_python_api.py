"""``bedside.open(RUN)``: the documented views as DataFrames, read-only, while ``bedside watch`` holds the store;
SQL only through the console's sandbox; clear errors; the example of docs/python.md runs as written."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import bedside_processes, copy_of_tiny_faults

import bedside
from bedside.app.api import NoStoreError
from bedside.collectors.errors import QueryError, RunDirError, StoreError, StoreLockedError
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store
from bedside.collectors.writer import RunLogger

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python.md"
WATCH_WAIT_S = 120.0


def eventually(check: Callable[[], bool], what: str, timeout_s: float = WATCH_WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def watch_until_incidents(run: Path, start: Callable[..., subprocess.Popen]) -> tuple[Path, subprocess.Popen]:
    """``run`` with ``bedside watch`` owning its store, once the owner has found its incidents."""
    watch = start("watch", run, "--rescan-every", "0.2", "--quiet", stderr=subprocess.DEVNULL)

    def owned_with_incidents() -> bool:
        assert watch.poll() is None, "bedside watch exited"
        if not RunLayout(run).store.exists():
            return False
        with bedside.open(run) as opened:
            return opened.source == "snapshot" and not opened.incidents().empty

    eventually(owned_with_incidents, "bedside watch to ingest tiny-faults and open incidents")
    return run, watch


@pytest.fixture
def watched(tiny_faults: Path, start_bedside) -> tuple[Path, subprocess.Popen]:
    """tiny-faults watched, for a test that adds to it."""
    return watch_until_incidents(tiny_faults, start_bedside)


@pytest.fixture(scope="module")
def watched_for_reading(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.Popen]]:
    """tiny-faults watched, shared by the tests that only read it (each checks that it wrote nothing)."""
    with bedside_processes() as start:
        yield watch_until_incidents(copy_of_tiny_faults(tmp_path_factory.mktemp("watched")), start)


def test_the_views_read_while_watch_holds_the_store(watched_for_reading) -> None:
    run_dir, watch = watched_for_reading
    with pytest.raises(StoreLockedError):  # what a plain read-only connection meets
        Store.open(RunLayout(run_dir).store, read_only=True).close()
    with bedside.open(run_dir) as run:
        assert run.source == "snapshot"
        steps, ranks, evals = run.steps(), run.rank_steps(), run.evals()
        assert len(steps) > 0 and set(ranks["rank"]) == {0, 1} and len(evals) > 0
        assert steps[["timeline", "step"]].equals(steps[["timeline", "step"]].sort_values(["timeline", "step"]))
        assert run.run()["name"].iloc[0] == "tiny-faults"
        findings, incidents = run.findings(), run.incidents()
        assert not findings.empty and set(findings["severity"]) <= {"info", "warning", "critical"}
        assert set(findings["incident_id"].dropna()) <= set(incidents["incident_id"])
        counted = run.sql("SELECT count(*) AS n FROM step_metrics")
        assert int(counted["n"].iloc[0]) == len(steps)
    assert watch.poll() is None  # the owner never noticed


def test_refresh_sees_what_the_owner_ingested_since(watched) -> None:
    run_dir, _ = watched
    run = bedside.open(run_dir)
    before = run.steps()
    last = int(before["step"].max())
    with RunLogger(run_dir, rank=0, world_size=2, resume=True, timeline=9) as log:
        log.step(last + 1, loss=1.0, tokens=10)

    def seen() -> bool:
        return ((run.refresh().steps()["timeline"]) == 9).any()

    eventually(seen, "the new step in a refreshed snapshot")
    assert len(run.steps()) == len(before) + 1
    run.close()


@pytest.mark.parametrize(
    ("query", "refusal"),
    [
        ("DELETE FROM step_metrics", "only SELECT"),
        ("CREATE TABLE x AS SELECT 1", "only SELECT"),
        ("WITH gone AS (DELETE FROM finding_rows RETURNING *) SELECT * FROM gone", None),
        ("SELECT * FROM read_csv('/etc/passwd')", "reads files"),
        ("SELECT * FROM outbox", "no view named"),
        ("ATTACH '/tmp/x.duckdb' AS x", "only SELECT"),
    ],
)
def test_sql_goes_through_the_console_and_never_writes(watched_for_reading, query: str, refusal: str | None) -> None:
    run_dir, _ = watched_for_reading
    with bedside.open(run_dir) as run:
        findings = run.findings()
        with pytest.raises(QueryError, match=refusal):
            run.sql(query)
        assert run.findings().equals(findings)
        assert len(run.refresh().findings()) >= len(findings)


def test_a_store_nobody_holds_is_read_without_being_held(collected_tiny_faults: Path) -> None:
    run_dir = collected_tiny_faults
    with bedside.open(run_dir) as run:
        assert run.source == "snapshot" and not run.steps().empty
        Store.open(RunLayout(run_dir).store).close()  # an owner can still take the store


def test_a_damaged_store_falls_back_to_the_telemetry_with_a_warning(collected_tiny_faults: Path) -> None:
    run_dir = collected_tiny_faults
    store = RunLayout(run_dir).store
    data = bytearray(store.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64 * 1024] = b"\xff" * (64 * 1024)
    store.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="findings and incidents are empty"):
        run = bedside.open(run_dir)
    assert run.source == "raw telemetry" and not run.steps().empty and run.findings().empty
    run.close()


def test_clear_errors(tmp_path: Path, tiny_faults: Path, collected_tiny_faults: Path) -> None:
    with pytest.raises(RunDirError, match="no run directory"):
        bedside.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RunDirError, match="not a run directory"):
        bedside.open(tmp_path / "plain")
    with pytest.raises(NoStoreError, match=r"no store yet .*bedside collect"):
        bedside.open(tiny_faults)
    run = bedside.open(collected_tiny_faults)
    run.close()
    with pytest.raises(StoreError, match="closed"):
        run.steps()


def test_closing_deletes_the_snapshot(collected_tiny_faults: Path) -> None:
    run = bedside.open(collected_tiny_faults)
    folder = Path(run._folder.name)
    assert (folder / "bedside.duckdb").exists()
    run.close()
    assert not folder.exists()


def test_version_is_the_installed_distribution_s() -> None:
    assert bedside.__version__ == version("bedside")


def test_the_example_of_docs_python_md_runs_as_written(collected_tiny_faults: Path, capsys) -> None:
    namespace = {"RUN": str(collected_tiny_faults)}
    for code in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        exec(code, namespace)
    out = capsys.readouterr().out
    assert "snapshot" in out and "only SELECT queries are allowed here, got DELETE" in out
