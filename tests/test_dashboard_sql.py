"""The SQL page under AppTest: a preview of the result in the page, the whole result as CSV written on the server
in bounded memory, examples with the run's own numbers, and the console still read-only."""

from __future__ import annotations

import io
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from dashboard_app import assert_rendered, copy_run, from_store, open_page, serving, store_facts, table, texts
from sql_attacks import ATTACKS

from bedside.app.dashboard import registry
from bedside.app.dashboard.data import PREVIEW_LIMITS
from bedside.app.dashboard.exports import EXPORTS, KEEP_S, PREFIX, ROUTE, csv_note, sweep
from bedside.app.simulation import SimulationConfig, simulate_run
from bedside.collectors.errors import QueryError
from bedside.collectors.layout import RunLayout
from bedside.collectors.store.console import ConsoleLimits, CsvExport, write_console_csv

FAULTS, REWIND, WIDE = "tiny-faults", "tiny-rewind", "sixteen-ranks"
EVERY_RANK_STEP = "SELECT * EXCLUDE (extra) FROM rank_step_metrics"  # AppTest cannot decode a MAP column
LIMITS = ConsoleLimits(max_rows=700, max_bytes=1 << 30)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("runs")
    copy_run(FAULTS, folder)
    copy_run(REWIND, folder)
    simulate_run(SimulationConfig(ranks=16, steps=200, ranks_per_host=8, nuisances=False), folder / WIDE)
    yield from serving(folder)


def run_sql(app, sql: str):
    app.text_area(key="sql").input(sql)
    return app.button(key="run_sql").click().run()


def test_the_page_shows_a_preview_not_the_whole_result(served: Path) -> None:
    [[rows]] = from_store(served / WIDE, "SELECT count(*) FROM rank_step_metrics").values
    assert rows == 16 * 200 > PREVIEW_LIMITS.max_rows
    app = run_sql(open_page("sql", run=WIDE), EVERY_RANK_STEP)
    assert_rendered(app)
    shown = table(app, "rank", "step", "compute_time")
    assert len(shown) == PREVIEW_LIMITS.max_rows == 1_000
    assert "First 1,000 rows shown: the result has more (Prepare CSV writes them all on the server)." in texts(app)
    assert not [m for m in app.markdown if "href" in m.value] and not app.download_button  # nothing written yet


def prepared(app) -> tuple[str, Path]:
    """Press Prepare CSV: the download link's note, and the file on the server it names."""
    app = app.button(key="sql_csv").click().run()
    assert_rendered(app)
    [link] = [m.value for m in app.markdown if "Download CSV" in m.value]
    token = re.search(rf'href="{ROUTE}/([^/"]+)/', link)
    assert token, link
    export = EXPORTS.get(token.group(1))
    assert export is not None and export.path.is_file()
    return link, export.path


def test_prepare_csv_writes_the_whole_result_to_a_file_the_link_serves(served: Path) -> None:
    app = run_sql(open_page("sql", run=WIDE), EVERY_RANK_STEP + " ORDER BY step, rank")
    link, path = prepared(app)
    assert f"(all {16 * 200:,} rows, " in link
    assert len(pd.read_csv(path)) == 16 * 200
    assert "First 1,000 rows shown" in texts(app)  # the preview stays
    _, again = prepared(app)
    assert again != path and not path.exists()  # a session keeps one download: the one before is removed


def test_a_prepared_download_goes_after_its_time_and_a_failed_one_leaves_no_file(served: Path) -> None:
    data = registry.desk().data(served / FAULTS)
    export = EXPORTS.add("steps.csv", lambda out: data.user_csv("SELECT step FROM step_metrics", out))
    assert EXPORTS.get(export.token) == export and export.written.rows == 200
    assert export.path.parent.stat().st_mode & 0o777 == 0o700
    EXPORTS.expire(now=export.made + KEEP_S + 1)
    assert EXPORTS.get(export.token) is None and not export.path.exists()
    before = set(export.path.parent.iterdir())
    with pytest.raises(QueryError):
        EXPORTS.add("bad.csv", lambda out: data.user_csv("DELETE FROM step_metrics", out))
    assert set(export.path.parent.iterdir()) == before


def test_a_download_link_escapes_the_run_s_name() -> None:
    export = EXPORTS.add('a "run" <b>&#.csv', lambda out: CsvExport(0, out.write(b"")))
    assert export.link("Download CSV") == (
        f'<a href="{ROUTE}/{export.token}/a%20%22run%22%20%3Cb%3E%26%23.csv" '
        'download="a &quot;run&quot; &lt;b&gt;&amp;#.csv">Download CSV</a>'
    )
    EXPORTS.drop(export.token)


def test_a_download_past_its_limits_says_which_rows_it_holds(served: Path) -> None:
    export = write_console_csv(registry.desk().owner(served / WIDE).store, EVERY_RANK_STEP, io.BytesIO(), LIMITS)
    assert csv_note(export, LIMITS) == (
        f"the first 700 of 3,200 rows, {export.bytes / 1024:.0f} KiB: a download holds at most 700 rows or 1 GiB; add a LIMIT or aggregate"
    )


def test_the_csv_holds_the_whole_result_written_a_batch_at_a_time(served: Path) -> None:
    data = registry.desk().data(served / WIDE)
    out = io.BytesIO()
    export = data.user_csv("SELECT * FROM rank_step_metrics ORDER BY step, rank", out)
    csv = out.getvalue()
    written = pd.read_csv(io.BytesIO(csv))
    stored = from_store(
        served / WIDE, "SELECT rank, step, compute_time, extra FROM rank_step_metrics ORDER BY step, rank"
    )
    assert (export.rows, export.bytes, export.truncated, export.total) == (len(stored), len(csv), False, len(stored))
    assert list(written[["rank", "step"]].itertuples(index=False)) == list(
        stored[["rank", "step"]].itertuples(index=False)
    )
    assert written["compute_time"].tolist() == pytest.approx(stored["compute_time"].tolist())


def test_a_csv_past_its_limits_stops_at_a_whole_row_and_says_so(served: Path) -> None:
    owner = registry.desk().owner(served / WIDE)
    out = io.BytesIO()
    export = write_console_csv(owner.store, EVERY_RANK_STEP, out, ConsoleLimits(max_rows=700))
    assert (export.rows, export.truncated, export.total) == (700, True, 3_200)
    assert len(pd.read_csv(io.BytesIO(out.getvalue()))) == 700
    out = io.BytesIO()
    export = write_console_csv(owner.store, EVERY_RANK_STEP, out, ConsoleLimits(max_bytes=100_000))
    assert export.truncated and export.bytes == len(out.getvalue()) <= 100_000 and export.total == 3_200
    assert len(pd.read_csv(io.BytesIO(out.getvalue()))) == export.rows > 0  # whole rows only, as many as fit
    assert export.bytes > 100_000 - 2 * export.bytes // export.rows  # the last row that fits, not a batch before


@pytest.mark.parametrize(
    "value, text",
    [
        ("INTERVAL 1 DAY", "1 day"),
        ("'101'::BIT", "101"),
        ("'12:00:00+01'::TIMETZ", "12:00:00+01"),
        ("'\\xff'::BLOB", "\\xFF"),
        ("(SELECT typed_value FROM duckdb_settings() LIMIT 1)", None),  # a VARIANT
    ],
)
def test_a_csv_holds_every_type_a_query_can_return(served: Path, value: str, text: str | None) -> None:
    """Types Arrow's CSV writer refuses (an interval, a bit string, a variant, bytes that are not UTF-8) or writes
    without their offset are written as DuckDB's text of them; before, the first two and the variant crashed
    the download and the time lost its offset."""
    owner = registry.desk().owner(served / FAULTS)
    out = io.BytesIO()
    export = write_console_csv(owner.store, f"SELECT {value} AS v", out)
    assert export.rows == 1
    written = out.getvalue().decode().splitlines()
    assert written[0] == '"v"' and (text is None or written[1] == f'"{text}"')


def test_the_page_s_preview_and_csv_refuse_every_attack_for_one_reason_and_change_nothing(
    served: Path, tmp_path: Path
) -> None:
    """The whole corpus of ``sql_attacks.py`` through what the SQL page runs: its preview (``user_query``) and its
    Prepare CSV, which runs the query again in a sandbox of its own (``user_csv``). Both refuse each attack for
    the same reason, write no byte, and leave the store as it was (``test_console.py`` holds ``bedside query``
    to the same corpus; a browser types the first attack of each class into the page: ``test_dashboard_browser.py``)."""
    run = served / FAULTS
    secret, out = tmp_path / "secret.csv", tmp_path / "out.csv"
    secret.write_text("root:x:0:0:the secret line\n")
    owner, data = registry.desk().owner(run), registry.desk().data(run)
    assert owner is not None
    before = store_facts(owner.store.cursor())
    for name, attack in ATTACKS.items():
        sql = attack.format(secret=secret, store=RunLayout(run).store, out=out)
        with pytest.raises(QueryError) as refused:
            data.user_query(sql)
        assert "the secret line" not in str(refused.value), name
        csv = io.BytesIO()
        with pytest.raises(QueryError, match=re.escape(str(refused.value).splitlines()[0])):
            data.user_csv(sql, csv)
        assert csv.getvalue() == b"", name
    assert not out.exists()
    assert store_facts(owner.store.cursor()) == before


@pytest.mark.parametrize(
    ("run", "timeline", "first", "last", "ranks"),
    [
        pytest.param(WIDE, 0, 180, 200, 10, id="no incident: the last steps"),
        pytest.param(REWIND, 0, None, None, 2, id="around the newest incident, on the abandoned timeline"),
        pytest.param(FAULTS, 0, None, None, 2, id="around the newest incident"),
    ],
)
def test_the_examples_use_the_run_s_own_steps(served: Path, run: str, timeline: int, first, last, ranks: int) -> None:
    if first is None:
        [[onset]] = from_store(served / run, "SELECT max(start_step) FROM incidents").values
        first, last = onset - 10, onset + 10
    app = open_page("sql", run=run)
    app.selectbox(key="example").select("loss around a step").run()
    assert f"timeline = {timeline} AND step BETWEEN {first} AND {last}" in app.text_area(key="sql").value
    app.button(key="run_sql").click().run()
    assert list(table(app, "step", "loss", "shards")["step"]) == list(range(first, last + 1))
    app.selectbox(key="example").select("slowest ranks").run()
    app.button(key="run_sql").click().run()
    assert_rendered(app)
    assert len(table(app, "rank", "compute_s")) == ranks  # the run's ranks, the ten slowest of 16


def test_export_folders_of_killed_servers_are_swept_and_nothing_else(tmp_path: Path) -> None:
    # A server stopped by a signal never ran its exit hook: one folder of CSVs left in /tmp per run.
    gone = subprocess.Popen(["true"])
    gone.wait()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    left = tmp_path / f"{PREFIX}{gone.pid}-abc"
    left.mkdir()
    (left / "token.csv").write_text("step\n1\n")
    ours = tmp_path / f"{PREFIX}{os.getpid()}-def"
    ours.mkdir()
    link = tmp_path / f"{PREFIX}{gone.pid}-link"
    link.symlink_to(victim)
    odd = tmp_path / f"{PREFIX}notapid-x"
    odd.mkdir()
    sweep(tmp_path)
    assert not left.exists() and ours.is_dir() and odd.is_dir()
    assert link.is_symlink() and (victim / "keep.txt").read_text() == "x"
