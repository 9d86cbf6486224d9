"""A store is data, never code: a view or macro planted in a real store file (by whoever can write it) never
changes what a read returns, and no connection to a store can read a file, load an extension or unlock its
settings. Each route is tried: ``bedside.open(...).sql``, ``bedside query`` as a process, and the SQL page with
its CSV download. A snapshot copies only regular files, of bounded size."""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from dashboard_app import assert_rendered, open_page, serving, texts

import bedside
from bedside.app.dashboard import registry
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.errors import QueryError, StoreTamperedError
from bedside.collectors.layout import RunLayout
from bedside.collectors.query import MAX_WAL_BYTES
from bedside.collectors.store import Store

MARKER = "planted-secret-0123456789abcdef"
"""The control key the processes of these tests hold in their environment: it must never come back."""
ENVIRON = "SELECT content FROM read_text('/proc/self/environ')"
PLANTS = {
    "our view reads the environment": f"CREATE OR REPLACE VIEW run AS SELECT content AS name FROM ({ENVIRON})",
    "our macro reads the environment": (
        f"CREATE OR REPLACE MACRO run_status(any_failed, any_aborted, ranks_ended, world_size, last_seen, now) AS "
        f"({ENVIRON})"
    ),
    "a macro shadows a built-in function": f"CREATE MACRO to_timestamp(t) AS ({ENVIRON})",
    "a view stands in for a table": f"DROP TABLE rank_topology; CREATE VIEW rank_topology AS {ENVIRON}",
    "a user type": "CREATE TYPE json AS VARCHAR",
}
"""What someone with write access to a store file plants, by what it is."""
OUR_NAMES = {"our view reads the environment", "our macro reads the environment"}
USER_SQL = {
    "read_text": "SELECT * FROM read_text('/etc/hostname')",
    "read_csv": "SELECT * FROM read_csv('/etc/hostname')",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "set": "SET enable_external_access = true",
    "attach": "ATTACH '/tmp/bedside-attached.duckdb' AS evil",
}
SNAPSHOT_FILE_LIMIT = 256 << 20
"""The most a process reading a snapshot may write to one file here: copying /dev/zero stops there."""


def plant(run: Path, statement: str) -> None:
    """Write ``statement`` into the run's store as an attacker would: a plain DuckDB connection to the file."""
    con = duckdb.connect(str(RunLayout(run).store))
    con.execute(statement)
    con.close()


def environment_text(text: str) -> bool:
    """Whether ``text`` holds any of this process's environment (or the marker of a child's)."""
    return MARKER in text or "PATH=" in text or "\x00" in text


@pytest.fixture(params=list(PLANTS), ids=list(PLANTS))
def planted(request: pytest.FixtureRequest, collected_tiny_faults: Path) -> tuple[Path, str]:
    """tiny-faults collected by the real CLI, then one plant written into its store."""
    plant(collected_tiny_faults, PLANTS[request.param])
    return collected_tiny_faults, request.param


def test_a_store_connection_reaches_no_file_extension_or_setting(collected_tiny_faults: Path) -> None:
    """The connection-level wall, under the console's statement check: even SQL run on a store's own connection
    (which only our named queries use) cannot read a file, install or load an extension, attach a database or
    unlock its configuration."""
    store_path = RunLayout(collected_tiny_faults).store
    for read_only in (True, False):
        with Store.open(store_path, read_only=read_only, schemas=SCHEMAS) as store:
            for name, statement in USER_SQL.items():
                with pytest.raises(duckdb.Error) as refused:
                    store.cursor().execute(statement).fetchall()
                assert any(
                    reason in str(refused.value)
                    for reason in (
                        "disabled by configuration",
                        "disabled through configuration",
                        "configuration has been locked",
                    )
                ), (name, str(refused.value))
    assert not Path("/tmp/bedside-attached.duckdb").exists()


def test_bedside_open_ignores_a_planted_store_and_says_why(planted: tuple[Path, str]) -> None:
    run_dir, what = planted
    with pytest.warns(RuntimeWarning, match="holds code bedside did not write") as warned:
        run = bedside.open(run_dir)
    assert "A store is data, never code" in str(warned[0].message)
    with run:
        assert run.source == "raw telemetry"
        for frame in (run.sql("SELECT * FROM run"), run.run(), run.sql("SELECT * FROM step_metrics LIMIT 5")):
            assert not environment_text(frame.to_csv()), what
        assert run.run()["name"].iloc[0] == "tiny-faults"


def test_bedside_query_ignores_a_planted_store_and_says_why(planted: tuple[Path, str], bedside: Callable) -> None:
    run_dir, what = planted
    done = bedside("query", run_dir, "SELECT * FROM run", "--format", "csv", env={"BEDSIDE_CONTROL_KEY": MARKER})
    assert done.returncode == 0, done.stderr
    assert not environment_text(done.stdout + done.stderr), what
    assert "holds code bedside did not write" in done.stderr and "tiny-faults" in done.stdout


@pytest.fixture
def served_planted(planted: tuple[Path, str]) -> Iterator[tuple[Path, str]]:
    """The planted run served by the dashboard in this process (which takes its store when it can)."""
    run_dir, what = planted
    for _ in serving(run_dir.parent):
        yield run_dir, what


def test_the_sql_page_and_its_csv_never_return_the_environment(served_planted: tuple[Path, str]) -> None:
    """The owner puts our views and macros back over those of our names, and refuses the rest (shown read-only
    from the raw telemetry, the reason in the banner); either way the page and its CSV read the real run."""
    run, what = served_planted
    owner = registry.desk().owner(run)
    assert (owner is not None) == (what in OUR_NAMES), registry.desk().refused
    app = open_page("sql", run="tiny-faults")
    app.text_area(key="sql").input("SELECT name, status FROM run")
    app = app.button(key="run_sql").click().run()
    assert_rendered(app)
    assert not environment_text(texts(app)) and "tiny-faults" in texts(app), what
    if owner is None:
        assert "holds code bedside did not write" in texts(app)
    out = io.BytesIO()
    registry.desk().data(run).user_csv("SELECT * FROM run", out)
    assert not environment_text(out.getvalue().decode()) and "tiny-faults" in out.getvalue().decode()


def test_the_owner_puts_our_view_back_in_the_file(collected_tiny_faults: Path) -> None:
    store_path = RunLayout(collected_tiny_faults).store
    with Store.open(store_path, read_only=True) as store:
        ours = store.cursor().execute("SELECT sql FROM duckdb_views() WHERE view_name = 'run'").fetchall()
    plant(collected_tiny_faults, PLANTS["our view reads the environment"])
    with pytest.raises(StoreTamperedError, match=r"view 'run' is not bedside's\): it is not read"):
        Store.open(store_path, read_only=True)
    Store.open(store_path, schemas=SCHEMAS).close()
    with Store.open(store_path, read_only=True) as store:
        assert store.cursor().execute("SELECT sql FROM duckdb_views() WHERE view_name = 'run'").fetchall() == ours


def test_a_view_added_to_the_file_is_not_offered_to_the_console(collected_tiny_faults: Path) -> None:
    plant(collected_tiny_faults, "CREATE VIEW secrets AS SELECT 1 AS a")
    with bedside.open(collected_tiny_faults) as run:
        assert run.source == "snapshot"
        with pytest.raises(QueryError, match="no view named 'secrets'"):
            run.sql("SELECT * FROM secrets")


def limited_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (SNAPSHOT_FILE_LIMIT, SNAPSHOT_FILE_LIMIT))


def open_in_a_process(run: Path) -> subprocess.CompletedProcess:
    """``bedside.open(run)`` in a process that may write no file past ``SNAPSHOT_FILE_LIMIT``; it prints the
    source and the warnings."""
    script = (
        "import sys, warnings, bedside\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught, bedside.open(sys.argv[1]) as run:\n"
        "    print(run.source, len(run.steps()))\n"
        "print('\\n'.join(str(w.message) for w in caught))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limited_file_size,
    )


@pytest.mark.parametrize("wal", ["a link to /dev/zero", "a FIFO", "a sparse file past the limit"])
def test_a_snapshot_copies_only_a_regular_log_of_bounded_size(collected_tiny_faults: Path, wal: str) -> None:
    store_path = RunLayout(collected_tiny_faults).store
    log = store_path.with_name(store_path.name + ".wal")
    log.unlink(missing_ok=True)
    if wal == "a link to /dev/zero":
        log.symlink_to("/dev/zero")
    elif wal == "a FIFO":
        os.mkfifo(log)
    else:
        with log.open("wb") as handle:
            handle.truncate(max(store_path.stat().st_size, MAX_WAL_BYTES) + 1)
    done = open_in_a_process(collected_tiny_faults)
    assert done.returncode == 0, done.stderr
    source, warning = done.stdout.splitlines()[0], "\n".join(done.stdout.splitlines()[1:])
    assert source.startswith("raw telemetry ") and f"{log}: " in warning, done.stdout
    reason = {
        "a link to /dev/zero": "a symbolic link",
        "a FIFO": "a FIFO",
        "a sparse file past the limit": "over the limit",
    }
    assert reason[wal] in warning


SPECIAL_FILES = {
    "a FIFO": ("a FIFO", lambda path: os.mkfifo(path)),
    "a link to /dev/zero": ("a symbolic link", lambda path: path.symlink_to("/dev/zero")),
    "a link to a regular file": ("a symbolic link", lambda path: path.symlink_to(path.with_name("elsewhere"))),
    "a directory": ("a directory", lambda path: path.mkdir()),
}
"""What someone who can write the run folder puts where the store or its log belongs, and what it is called."""


@pytest.mark.parametrize(
    ("file", "special"),
    [
        ("bedside.duckdb", "a FIFO"),
        ("bedside.duckdb.wal", "a FIFO"),
        ("bedside.duckdb.wal", "a link to /dev/zero"),
        ("bedside.duckdb", "a link to a regular file"),
        ("bedside.duckdb.wal", "a directory"),
    ],
)
def test_a_store_or_log_that_is_no_regular_file_is_refused_unopened(
    collected_tiny_faults: Path, bedside: Callable, file: str, special: str
) -> None:
    """DuckDB opens the store by name: a FIFO blocked query, collect and watch in open() until killed, a link was
    read and written through. Each is refused before DuckDB opens it, and named; a reader falls back to the
    telemetry, the owner stops with the error, and ``collect --rebuild`` moves it aside."""
    run = collected_tiny_faults
    target = run / file
    target.unlink(missing_ok=True)
    (run / "elsewhere").write_bytes(b"not a store")
    kind, make = SPECIAL_FILES[special]
    make(target)
    role = "the store" if file == "bedside.duckdb" else "the store's write-ahead log"
    named = f"{target} ({role}) is {kind}, not a regular file"
    read = bedside("query", run, "SELECT count(*) AS n FROM step_metrics", timeout=30)
    assert read.returncode == 0 and read.stdout.split()[-1] == "200", read.stderr
    assert named in read.stderr and "raw telemetry" in read.stderr
    for command in (("collect",), ("watch", "--until-finished")):
        owned = bedside(*command, run, "--quiet", timeout=30)
        assert owned.returncode == 2 and named in owned.stderr and f"collect {run} --rebuild" in owned.stderr
    assert (run / "elsewhere").read_bytes() == b"not a store"  # nothing written through a link
    rebuilt = bedside("collect", run, "--rebuild", "--quiet", timeout=30)
    assert rebuilt.returncode == 0 and "moved the store aside" in rebuilt.stderr, rebuilt.stderr
    assert RunLayout(run).store.is_file() and not RunLayout(run).store.is_symlink()
