"""``bedside report``: the post-mortem of a run, as one self-contained HTML page and as a Markdown ticket.

Over copies of the two sample runs with their incidents found by ``bedside detect`` (in this process): the
faulted run is given a hostile name and a request filed for its open incident with a hostile reason. Every
report is written once, in this process, and the stores are compared byte for byte before and after: a report
never writes into the run. One page load in Chromium checks that the charts draw with no console error.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import re
import shutil
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_dashboard_browser import browser  # noqa: F401  (the browser tests' fixture)

from bedside.app.cli import main as cli
from bedside.app.service.detection import detect_run
from bedside.collectors import audit
from bedside.collectors.controlkey import ensure_control_key
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "sample_runs"
HOSTILE_NAME = '<img src=x onerror="alert(1)">run'
HOSTILE_REASON = "</td><script>alert('reason')</script> | *bold* [link](http://evil)"
OPERATOR = "ana"
DRAWN_MS = 30_000


@dataclass(frozen=True)
class Written:
    """What ``bedside report`` gave for one run: the page, the ticket and what it said on standard error."""

    run: Path
    page: str
    ticket: str
    warnings: str


def fingerprint(run: Path) -> dict[str, tuple[str, int]]:
    """Every file of the run: its SHA-256 and modification time (ns)."""
    return {
        str(p.relative_to(run)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def report(run: Path, out: Path | None, *extra: str) -> tuple[int, str, str]:
    """``bedside report RUN ...`` in this process: its exit status, standard output and standard error."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        status = cli(["report", str(run), "-o", str(out), *extra] if out else ["report", str(run), *extra])
    return status, stdout.getvalue(), stderr.getvalue()


def write_both(run: Path, into: Path) -> Written:
    status, _, said = report(run, into / f"{run.name}.html")
    assert status == 0, said
    status, ticket, warned = report(run, None, "--format", "md")
    assert status == 0, warned
    return Written(run, (into / f"{run.name}.html").read_text(), ticket, said + warned)


def prepare(tmp: Path, name: str) -> Path:
    run = Path(shutil.copytree(SAMPLE_RUNS / name, tmp / name, ignore=shutil.ignore_patterns("bedside.duckdb*")))
    ensure_control_key(RunLayout(run))
    return run


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Written]:
    """Both sample runs detected, the faulted one named and acted on with hostile text, then reported; the
    run folders' files are checked unchanged by the reports."""
    tmp = tmp_path_factory.mktemp("report")
    faults, rewind = prepare(tmp, "tiny-faults"), prepare(tmp, "tiny-rewind")
    info = json.loads((faults / "run.json").read_text())
    (faults / "run.json").write_text(json.dumps(info | {"name": HOSTILE_NAME}))
    for run in (faults, rewind):
        detect_run(run)
    audit.file_request(
        RunLayout(faults), "rewind", {"to_step": 100}, operator=OPERATOR, reason=HOSTILE_REASON,
        incident_id="nonfinite@0:150",
    )  # fmt: skip
    before = {run.name: fingerprint(run) for run in (faults, rewind)}
    written = {run.name: write_both(run, tmp) for run in (faults, rewind)}
    assert {run.name: fingerprint(run) for run in (faults, rewind)} == before
    return written


def sql(run: Path, query: str) -> list[tuple]:
    with Store.open(RunLayout(run).store, read_only=True) as store:
        return store.cursor().execute(query).fetchall()


def incident_headings(written: Written) -> tuple[list[str], list[str]]:
    """The incidents' lines of the page (its h3 in the Incidents section) and of the ticket, unescaped."""
    section = written.page.split('<section id="incidents">')[1].split("</section>")[0]
    page = [html.unescape(line) for line in re.findall(r"<h3>(.*?)</h3>", section)]
    part = written.ticket.split("## Incidents\n")[1].split("\n## ")[0]
    ticket = [re.sub(r"\\(.)", r"\1", html.unescape(line[4:])) for line in part.splitlines() if line.startswith("### ")]
    return page, ticket


def test_the_page_has_every_section_with_the_store_s_numbers(reports: dict[str, Written]) -> None:
    written = reports["tiny-rewind"]
    for key in ("summary", "incidents", "timeline", "actions", "eval", "training", "ranks", "checkpoints", "goodput"):
        assert f'<section id="{key}">' in written.page
    [(productive,)] = sql(written.run, "SELECT sum(share) FROM goodput WHERE useful")
    assert f"{productive:.1%} of the wall time trained progress the run kept" in written.page
    for (path,) in sql(written.run, "SELECT DISTINCT path FROM checkpoint_events WHERE event = 'saved'"):
        assert f"<td>{path}</td>" in written.page
    for reason, message in sql(written.run, "SELECT reason, message FROM control_requests"):
        assert html.escape(reason) in written.page and html.escape(message) in written.page
    [(spent,)] = sql(written.run, "SELECT max(spent_flops) FROM step_metrics")
    assert f"{spent / 1e9:.3g} GFLOP (every timeline)" in written.page
    assert "2 (0: steps 1-85; 1: steps 61-160)" in written.page  # both timelines
    assert written.page.count('class="plotly-graph-div"') == 4  # eval, training, checkpoints, goodput


def test_the_incidents_are_the_store_s_and_the_ticket_tells_the_same_lines(reports: dict[str, Written]) -> None:
    written = reports["tiny-faults"]
    stored = sql(written.run, "SELECT incident_id, title FROM incidents")
    page, ticket = incident_headings(written)
    assert page == ticket and len(page) == len(stored) == 3
    for incident_id, title in stored:
        assert any(incident_id in line and title in line for line in page)
    assert "Action: rewind" in written.page and f"by {OPERATOR}" in written.page  # filed for the open incident
    heatmaps = written.page.split('<section id="ranks">')[1].split("</section>")[0]
    assert "straggler@0:105/r1" in heatmaps and heatmaps.count('class="plotly-graph-div"') == 1


def test_the_page_is_self_contained_with_plotly_inlined_once(reports: dict[str, Written]) -> None:
    for written in reports.values():
        outside = re.findall(
            r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", written.page
        )
        assert outside == []
        assert len(re.findall(r"<script\b[^>]*>", written.page.split("</head>")[0])) == 1
        assert written.page.count("plotly.js v") == 1  # the bundle's banner


def test_hostile_names_and_reasons_are_escaped(reports: dict[str, Written]) -> None:
    written = reports["tiny-faults"]
    for raw in (HOSTILE_NAME, HOSTILE_REASON, "<script>alert"):
        assert raw not in written.page and raw not in written.ticket
    assert f"<title>{html.escape(HOSTILE_NAME)}: post-mortem</title>" in written.page
    assert html.escape(HOSTILE_REASON) in written.page
    assert (
        "&lt;/td&gt;&lt;script&gt;alert('reason')&lt;/script&gt; \\| \\*bold\\* \\[link\\](http://evil)"
        in written.ticket
    )


def test_a_run_without_a_store_is_told_from_its_telemetry_and_left_without_one(tmp_path: Path) -> None:
    run = prepare(tmp_path, "tiny-rewind")
    status, ticket, said = report(run, None, "--format", "md")
    assert status == 0
    assert "no store yet" in said and "Incidents are not known: no store yet" in ticket
    assert "| productive | yes |" in ticket and not RunLayout(run).store.exists()


@pytest.mark.parametrize(
    ("target", "out", "error"),
    [
        ("missing", "r.html", "no run directory at"),
        ("not-a-run", "r.html", "is not a run directory"),
        ("tiny-rewind", "tiny-rewind/r.html", "is inside the run"),
    ],
)
def test_a_bad_run_or_destination_is_a_one_line_error(tmp_path: Path, target: str, out: str, error: str) -> None:
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "tiny-rewind" / "telemetry").mkdir(parents=True)
    status, _, said = report(tmp_path / target, tmp_path / out)
    assert status == 2 and said.startswith("bedside: error: ") and error in said
    assert said.count("\n") == 1 and not (tmp_path / out).exists()


def test_the_page_draws_its_charts_in_the_browser_without_errors(browser, reports: dict[str, Written]) -> None:  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: errors.append(request.url) if not request.url.startswith("file:") else None)
    page.goto((reports["tiny-faults"].run.parent / "tiny-faults.html").as_uri())
    drawn = "() => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p._fullLayout).length"
    page.wait_for_function(f"() => ({drawn})() === 5", timeout=DRAWN_MS)  # eval, training, ranks, checkpoints, goodput
    assert page.locator(".js-plotly-plot .main-svg").count() >= 5
    assert errors == []
    page.close()
