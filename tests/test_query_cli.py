"""The ``bedside`` CLI as a user runs it: query output, refused SQL, a held store, runs, errors, help."""

from __future__ import annotations

import argparse
import csv
import io
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bedside.app.cli import build_parser
from bedside.app.options import FORMATS
from bedside.app.output import print_frame
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store
from bedside.collectors.store.console import run_console_query
from bedside.collectors.writer import RunLogger

LOSSES = {1: 0.5, 2: 0.25, 3: 0.125}
STEP_LOSS_SQL = "SELECT step, loss FROM step_metrics ORDER BY step"
EVENTUALLY_S = 60.0


def write_run(run: Path, *, end: bool = True) -> RunLogger:
    """A one-rank run of three steps; with ``end=False`` the logger stays open (a live run)."""
    logger = RunLogger(run, rank=0, world_size=1, name=run.name)
    for step, loss in LOSSES.items():
        logger.step(step, loss=loss)
    if end:
        logger.close()
    else:
        logger.flush()
    return logger


@pytest.fixture(scope="module")
def collected_run(tmp_path_factory, bedside) -> Path:
    run = tmp_path_factory.mktemp("cli") / "run"
    write_run(run)
    collected = bedside("collect", run, "--quiet")
    assert collected.returncode == 0, collected.stderr
    return run


@pytest.fixture
def uncollected_run(run_dir: Path) -> Path:
    write_run(run_dir)
    return run_dir


def parse_table(out: str) -> list[tuple]:
    header, *lines = out.splitlines()
    assert header.split() == ["step", "loss"]
    return [(int(step), float(loss)) for step, loss in map(str.split, lines)]


def parse_csv(out: str) -> list[tuple]:
    return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(io.StringIO(out))]


def parse_json(out: str) -> list[tuple]:
    return [(r["step"], r["loss"]) for r in json.loads(out)]


@pytest.mark.parametrize(
    ("fmt", "parse"), [("table", parse_table), ("csv", parse_csv), ("json", parse_json)], ids=["table", "csv", "json"]
)
def test_query_prints_each_format(collected_run, bedside, fmt: str, parse: Callable[[str], list]) -> None:
    done = bedside("query", collected_run, STEP_LOSS_SQL, "--format", fmt)
    assert (done.returncode, done.stderr) == (0, "")
    assert parse(done.stdout) == list(LOSSES.items())


ODD_TYPES_SQL = (
    "SELECT INTERVAL 1 DAY AS i, union_value(k := 7) AS u, DATE 'infinity' AS d, [DATE 'infinity'] AS l "
    "FROM step_metrics LIMIT 1"
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_values_pandas_cannot_show_print_as_text(collected_run, bedside, fmt: str) -> None:
    """An interval or a union (no pandas formatter) and DATE 'infinity' (past Python's dates) ended in a
    traceback; each prints, as text where pandas has none."""
    done = bedside("query", collected_run, ODD_TYPES_SQL, "--format", fmt)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "2147483647" in done.stdout and "7" in done.stdout


def test_every_duckdb_type_prints_in_every_format(collected_run) -> None:
    """Each column of DuckDB's test_all_types() (its extremes and NULL), on its own and all together, through
    the console and the CLI's printer."""
    with Store.open(RunLayout(collected_run).store, read_only=True, schemas=SCHEMAS) as store:
        frame = run_console_query(store, "SELECT * FROM test_all_types()").frame
    assert len(frame.columns) > 50
    for fmt in FORMATS:
        for columns in [[name] for name in frame.columns] + [list(frame.columns)]:
            out = io.StringIO()
            print_frame(frame[columns], fmt, out)
            assert all(name in out.getvalue() for name in columns), (fmt, columns)


def assert_one_line_error(done: subprocess.CompletedProcess, fragment: str) -> None:
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("bedside: error: ")
    assert fragment in done.stderr


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        pytest.param("SELEC step FROM step_metrics", "SQL error: ", id="syntax error"),
        pytest.param("SELECT no_such_column FROM step_metrics", "SQL error: ", id="unknown column"),
        pytest.param("DELETE FROM steps", "only SELECT queries are allowed", id="delete"),
        pytest.param("CREATE TABLE t (a INTEGER)", "only SELECT queries are allowed", id="create table"),
        pytest.param("SELECT 1; SELECT 2", "exactly one SQL statement", id="two statements"),
    ],
)
def test_bad_or_writing_sql_is_refused_in_one_line(collected_run, bedside, sql: str, fragment: str) -> None:
    assert_one_line_error(bedside("query", collected_run, sql), fragment)


@pytest.mark.parametrize("run", ["collected_run", "uncollected_run"], ids=["from the store", "from raw telemetry"])
def test_query_cannot_read_files(request, bedside, run: str) -> None:
    done = bedside("query", request.getfixturevalue(run), "SELECT * FROM read_csv('/etc/passwd')")
    assert_one_line_error(done, "read_csv() reads files")
    assert "root:" not in done.stdout + done.stderr


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + EVENTUALLY_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_query_reads_the_raw_telemetry_while_a_collector_holds_the_store(
    uncollected_run, bedside, start_bedside, tmp_path
) -> None:
    log = tmp_path / "collect.log"
    with open(log, "w") as err:
        collector = start_bedside("collect", uncollected_run, "--follow", stderr=err)
    wait_for(lambda: "ingested" in log.read_text() or collector.poll() is not None)
    assert collector.poll() is None, log.read_text()
    done = bedside(
        "query", uncollected_run, "SELECT count(*) AS steps, sum(loss) AS total FROM step_metrics", "--format", "csv"
    )
    collector.send_signal(signal.SIGTERM)
    assert collector.wait(timeout=EVENTUALLY_S) == 0, log.read_text()
    assert (done.returncode, done.stdout.splitlines()) == (0, ["steps,total", "3,0.875"])
    assert "held by another process" in done.stderr and "raw telemetry" in done.stderr


def test_runs_lists_each_run_with_its_status(tmp_path, bedside) -> None:
    write_run(tmp_path / "done")
    live = write_run(tmp_path / "going", end=False)
    try:
        listed = bedside("runs", tmp_path, "--format", "csv")
    finally:
        live.close()
    assert listed.returncode == 0, listed.stderr
    runs = {
        r["name"]: (r["status"], r["last_step"], r["world_size"]) for r in csv.DictReader(io.StringIO(listed.stdout))
    }
    assert runs == {"done": ("finished", "3", "1"), "going": ("live", "3", "1")}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("collect",), "no run directory"),
        (("query", STEP_LOSS_SQL), "no run directory"),
        (("runs",), "no such directory"),
    ],
    ids=["collect", "query", "runs"],
)
def test_a_missing_directory_is_a_clean_error(tmp_path, bedside, args: tuple, fragment: str) -> None:
    command, *rest = args
    assert_one_line_error(bedside(command, tmp_path / "missing", *rest), fragment)


@pytest.mark.parametrize("args", [("collect",), ("query", STEP_LOSS_SQL)], ids=["collect", "query"])
def test_a_folder_that_is_not_a_run_is_refused_and_left_alone(tmp_path, bedside, args: tuple) -> None:
    command, *rest = args
    assert_one_line_error(bedside(command, tmp_path, *rest), "is not a run directory")
    assert list(tmp_path.iterdir()) == []


def test_an_sql_error_keeps_duckdbs_hint_on_its_one_line(collected_run, bedside) -> None:
    assert_one_line_error(bedside("query", collected_run, "SELECT * FROM step_metric"), 'Did you mean "step_metrics"')


def test_json_output_keeps_null_apart_from_nan(tmp_path, bedside) -> None:
    logger = RunLogger(tmp_path / "run", rank=0, world_size=1)
    logger.step(1, loss=float("nan"))
    logger.close()
    done = bedside("query", tmp_path / "run", "SELECT loss, lr FROM step_metrics", "--format", "json")
    assert json.loads(done.stdout) == [{"loss": "NaN", "lr": None}]


def test_a_hand_written_run_json_without_run_id_gets_a_stable_one(tmp_path, bedside) -> None:
    run = tmp_path / "run"
    (run / "telemetry").mkdir(parents=True)
    (run / "run.json").write_text('{"world_size": 1}')
    ids = {bedside("runs", run, "--format", "json").stdout for _ in range(2)}
    assert len(ids) == 1 and json.loads(ids.pop())[0]["run_id"]


OUT_OF_RANGE = [
    (("collect", "--batch-mb", "0"), "argument --batch-mb: expected an integer from 1 to 1024, got 0"),
    (("collect", "--batch-mb", "1025"), "argument --batch-mb: expected an integer from 1 to 1024, got 1025"),
    (("collect", "--batch-mb", "1.5"), "argument --batch-mb: expected an integer from 1 to 1024, got '1.5'"),
    (
        ("collect", "--follow", "--rescan-every", "0"),
        "argument --rescan-every: expected a number of seconds > 0, got '0'",
    ),
    (("collect", "--follow", "--rescan-every", "nan"), "argument --rescan-every: expected a number of seconds > 0"),
    (("query", STEP_LOSS_SQL, "--timeout", "-1"), "argument --timeout: expected a number of seconds > 0, got '-1'"),
    (("query", STEP_LOSS_SQL, "--timeout", "inf"), "argument --timeout: expected a number of seconds > 0"),
]


@pytest.mark.parametrize(("args", "message"), OUT_OF_RANGE, ids=[" ".join(a[-2:]) for a, _ in OUT_OF_RANGE])
def test_options_out_of_range_are_refused(tmp_path, bedside, args: tuple, message: str) -> None:
    command, *rest = args
    done = bedside(command, tmp_path, *rest)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value", "parsed"),
    [
        ("--batch-mb", "1", 1),
        ("--batch-mb", "1024", 1024),
        ("--rescan-every", "0.01", 0.01),
    ],
)
def test_options_at_the_ends_of_their_range_are_accepted(option: str, value: str, parsed: float) -> None:
    args = build_parser().parse_args(["collect", "run", option, value])
    assert getattr(args, option[2:].replace("-", "_")) == parsed


def commands() -> list[str]:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(subparsers.choices)


@pytest.mark.parametrize("command", ["", *commands()], ids=lambda c: c or "bedside")
def test_help_works_for_every_command(bedside, command: str) -> None:
    done = bedside(*filter(None, [command]), "--help")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: bedside")
