"""Text from a run reaches the operator's terminal with its control characters shown, never obeyed: a run name in
run.json, a metric name, a log message and a request's reason held escape sequences (OSC 0 retitles the terminal,
OSC 52 writes its clipboard, CSI moves the cursor and erases lines) that ``bedside runs`` and ``bedside query``
printed raw. A table escapes them; CSV and JSON are data and keep them exactly. ``bedside action`` refuses them in
a reason or an operator's name. Real runs, the real CLI."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from bedside.collectors import audit
from bedside.collectors.layout import RunLayout
from bedside.collectors.writer import RunLogger

ESCAPES = "\x1b]0;OWNED\x07\x1b]52;c;ZWNobyBwd25lZAo=\x07\x1b[1A\x1b[2K\u202egnp.exe\nFAKE LINE: request applied"
"""OSC 0 (the window title), OSC 52 (the clipboard), cursor up and erase line, a right-to-left override, and a
newline that starts a forged line."""


def assert_shown_not_obeyed(text: str) -> None:
    assert not {"\x1b", "\x07", "\u202e"} & set(text), text
    assert "\nFAKE LINE" not in text
    assert "\\x1b]0;OWNED\\x07" in text and "\\u202egnp.exe\\nFAKE LINE" in text


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-rank run whose name, one metric name and one log message hold ``ESCAPES``."""
    run = tmp_path_factory.mktemp("runs") / "r"
    logger = RunLogger(run, rank=0, world_size=1, name=f"r{ESCAPES}")
    logger.step(1, loss=0.5, **{f"tag{ESCAPES}": 1.0})
    logger.log(1, f"note{ESCAPES}")
    logger.close()
    return run


def test_runs_shows_a_run_name_escaped_and_keeps_it_as_data(hostile_run: Path, bedside: Callable) -> None:
    table = bedside("runs", hostile_run.parent)
    assert table.returncode == 0, table.stderr
    assert_shown_not_obeyed(table.stdout)
    data = bedside("runs", hostile_run.parent, "--format", "json")
    assert [run["name"] for run in json.loads(data.stdout)] == [f"r{ESCAPES}"]


@pytest.mark.parametrize(
    ("sql", "value"),
    [
        ("SELECT name FROM metrics WHERE name LIKE 'tag%'", f"tag{ESCAPES}"),
        ("SELECT message AS name FROM event_log WHERE kind = 'log'", f"note{ESCAPES}"),
    ],
    ids=["metric name", "log message"],
)
def test_query_shows_outside_text_escaped_in_a_table_and_exactly_as_data(
    hostile_run: Path, bedside: Callable, sql: str, value: str
) -> None:
    table = bedside("query", hostile_run, sql)
    assert table.returncode == 0, table.stderr
    assert_shown_not_obeyed(table.stdout)
    as_csv = bedside("query", hostile_run, sql, "--format", "csv").stdout
    assert [row["name"] for row in csv.DictReader(io.StringIO(as_csv))] == [value]
    as_json = bedside("query", hostile_run, sql, "--format", "json").stdout
    assert "\x1b" not in as_json and [row["name"] for row in json.loads(as_json)] == [value]


@pytest.mark.parametrize("option", ["--reason", "--operator"])
def test_action_refuses_control_characters_in_a_reason_or_a_name(
    control_run: RunLayout, bedside: Callable, option: str
) -> None:
    given = {"--reason": "loss spike", "--operator": "ana", option: "ana\x1b]0;OWNED\x07\u202e\nFAKE LINE"}
    done = bedside("action", control_run.root, "pause", *[part for pair in given.items() for part in pair])
    assert done.returncode == 2 and "control characters (U+0007, U+000A, U+001B, U+202E)" in done.stderr
    assert done.stderr.startswith(f"bedside: error: {'--operator: ' if option == '--operator' else ''}the ")
    assert list(control_run.control_requests.iterdir()) == [] and not audit.audit_path(control_run).exists()


def test_a_reason_written_into_the_trail_by_hand_is_shown_escaped(tiny_faults: Path, bedside: Callable) -> None:
    """Whoever can write the run folder can append an entry that no check saw; its reason reaches the
    ``control_requests`` view, and ``bedside query`` shows it escaped."""
    audit.record(RunLayout(tiny_faults), operator="ana", what="pause", reason=f"spike{ESCAPES}", request_id="r-1")
    assert bedside("detect", tiny_faults).returncode == 0
    done = bedside("query", tiny_faults, "SELECT reason FROM control_requests WHERE operator = 'ana'")
    assert done.returncode == 0, done.stderr
    assert_shown_not_obeyed(done.stdout)
