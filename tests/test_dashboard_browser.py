"""The on-call dashboard in a real browser: Chromium, driven by Playwright, against ``bedside serve``.

A live two-rank gloo run is held at its first steps until the Incidents page shows "No
incidents.", then spikes (a bad data shard) and slows down, so that it is still training
when the operator acts. The incident appears on the open page; the operator opens it,
unlocks actions with the token, reviews and confirms the suggested rewind, and watches
the trainer apply it on a new timeline. Screenshots go to ``test-artifacts/``. Without
chromium or playwright the tests are skipped, unless ``BEDSIDE_REQUIRE_BROWSER=1`` (CI)
makes that a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pytest
from chromium import CHROMIUM, launch
from dashboard_app import store_facts
from receiver import answers, free_port
from sql_attacks import ATTACKS, SAMPLE

from bedside.app.service.schema import SCHEMAS
from bedside.app.simulation import SimulationConfig, simulate_run
from bedside.app.train import train_command
from bedside.collectors.control import request_action
from bedside.collectors.errors import QueryError
from bedside.collectors.layout import RunLayout
from bedside.collectors.query import run_query
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="bedside serve and a live two-rank run driven from Chromium")

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the browser fixture says so: a skip, or a failure where CI requires the browser
    expect = sync_playwright = None

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
SAMPLE_RUN = REPO / "sample_runs" / "tiny-faults"
TOKEN, OPERATOR, REASON = "browser-test-token", "ana", "loss spike from a bad shard"

# The live run: checkpoints at steps 90, 180 and 270 (three are kept: step 90's lasts); shards 0-3
# serve garbage from step 100, once the loss-spike detector has learned the run's noise (it is
# ready at about step 85); from step 106 every step takes 1 s more, so the run goes on for
# about 200 s unless stopped (a sleep, which leaves the cores to the tests beside it): time for
# the operator to act on a machine as busy as the suite makes it.
STEPS, CHECKPOINT_EVERY, GOOD_CHECKPOINT, SPIKE_FROM = 300, 90, 90, 100
FAULTS = (f"bad_shard:shards=0-3,from={SPIKE_FROM}", f"straggler:ranks=0-1,delay_ms=1000,from={SPIKE_FROM + 6}")
REWIND_TEXT = f'rewind {{"to_step": {GOOD_CHECKPOINT}}}'
SERVE_START_S, INCIDENT_S, APPLIED_S, WIDGET_S = 60, 120, 90, 30
BROWSER_ATTACKS = (
    ATTACKS if os.environ.get("BEDSIDE_BROWSER_ATTACKS") == "all" else SAMPLE
)  # all: bench/harness.py --long


def skip_or_fail(reason: str) -> None:
    """No browser here: a skip, or a failure where CI requires the browser tests to run."""
    if os.environ.get("BEDSIDE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (BEDSIDE_REQUIRE_BROWSER=1)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        skip_or_fail(f"chromium is not installed ({CHROMIUM}): apt-get install chromium")
    if sync_playwright is None:
        skip_or_fail("playwright is not installed: pip install -e '.[test]'")
    with sync_playwright() as playwright:
        launched = launch(playwright)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, request):
    """A fresh browser tab; its last state is saved as ``test-artifacts/TEST-last.png`` (and its text as
    ``TEST-last.txt``) whatever the outcome."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(WIDGET_S * 1000)
    yield tab
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}-last.png"))
    (ARTIFACTS / f"{request.node.name}-last.txt").write_text(tab.inner_text("body"))
    context.close()


def screenshot(tab, name: str, showing) -> None:
    """``test-artifacts/NAME.png``, scrolled to ``showing``, once the charts and tables are drawn."""
    tab.locator("[data-testid=stSkeleton]").first.wait_for(state="detached")
    showing.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def expect_visible(locator, text: str | re.Pattern | None = None, timeout_s: float = WIDGET_S) -> None:
    expect(locator).to_be_visible(timeout=timeout_s * 1000)
    if text is not None:
        expect(locator).to_contain_text(text, timeout=timeout_s * 1000)


def wait_for(condition: Callable[[], object], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)


def tail(log: Path) -> str:
    return log.read_text()[-3000:] if log.exists() else ""


# -- bedside serve ------------------------------------------------------------------------
class Served:
    """``serve(TARGET, token)`` starts ``bedside serve TARGET`` on a free port, with the operator token or
    without any, and gives its URL; ``serve.stop()`` stops every one started (each runs in a process group
    of its own)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen] = []

    def __call__(self, target: Path, token: str | None) -> str:
        started = self.started
        port, log = free_port(), self.tmp_path / f"serve-{len(started)}.log"
        env = {k: v for k, v in os.environ.items() if k != "BEDSIDE_OPERATOR_TOKEN"}
        env.update({"OMP_NUM_THREADS": "1", **({"BEDSIDE_OPERATOR_TOKEN": token} if token else {})})
        command = [sys.executable, "-m", "bedside.app.cli", "serve", str(target), "--port", str(port), "--refresh", "1"]
        with log.open("w") as out:
            started.append(
                subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: answers(f"{url}/_stcore/health") or started[-1].poll() is not None,
            "bedside serve to answer",
            SERVE_START_S,
        )
        assert started[-1].poll() is None, f"bedside serve exited:\n{tail(log)}"
        return url

    def stop(self) -> None:
        for process in self.started:
            stop_group(process)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Served]:
    served = Served(tmp_path)
    yield served
    served.stop()


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group (Streamlit stops, the stores are closed), SIGKILL if that is not enough."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# -- the live run -------------------------------------------------------------------------
class LiveRun(NamedTuple):
    run: Path
    trainer: subprocess.Popen
    log: Path


def records(run: Path, rank: int) -> list[dict]:
    """The complete records of a rank's telemetry file so far."""
    path = RunLayout(run).rank_file(rank)
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line) for line in lines]


def applied(run: Path, request_id: str) -> list[dict]:
    """Rank 0's ``action`` records saying the request was applied."""
    return [
        r
        for r in records(run, 0)
        if r["kind"] == "action" and r.get("request_id") == request_id and r["status"] == "applied"
    ]


def file_request(run: Path, action: str) -> str:
    """A control request from the test itself, as ``bedside action`` files one; its id."""
    return request_action(RunLayout(run), action, operator="test", reason="the test holds the run")


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[LiveRun]:
    """The faulty run above under torchrun, paused at its first steps (the test resumes it).

    Stopped at teardown: SIGTERM to torchrun, which stops its ranks (they run in sessions of their own).
    """
    run, log = tmp_path / "run", tmp_path / "train.log"
    options = [
        "--nproc",
        "2",
        "--out",
        str(run),
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        *(option for spec in FAULTS for option in ("--inject", spec)),
    ]
    with log.open("w") as out:
        trainer = subprocess.Popen(
            train_command(options), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    try:
        wait_for(
            lambda: (
                (RunLayout(run).run_info.exists() and (RunLayout(run).control / "key").exists())
                or trainer.poll() is not None
            ),
            "run.json and the control key",
            120,
        )
        pause = file_request(run, "pause")
        wait_for(lambda: applied(run, pause) or trainer.poll() is not None, "the pause", 60)
        assert [r["step"] < SPIKE_FROM for r in applied(run, pause)] == [True], f"not paused early:\n{tail(log)}"
        yield LiveRun(run, trainer, log)
    finally:
        if trainer.poll() is None:
            trainer.terminate()
            try:
                trainer.wait(timeout=60)
            except subprocess.TimeoutExpired:
                trainer.kill()
                trainer.wait()


# -- what the operator does -----------------------------------------------------------------
def unlock(tab, token: str) -> None:
    """The sidebar's Operator panel: name, token, Unlock actions."""
    tab.get_by_label("Your name").fill(OPERATOR)
    tab.get_by_label("Operator token").fill(token)
    tab.get_by_role("button", name="Unlock actions").click()


def open_incident(tab, kind: str) -> None:
    """Pick the incident whose id starts with ``kind@`` in the Incident selectbox."""
    picker = tab.get_by_role("combobox", name="Incident")
    picker.click()
    tab.get_by_role("option", name=re.compile(rf"^{kind}@")).click()
    expect(picker).to_have_value(re.compile(rf"^{kind}@"))


def review_and_confirm(tab) -> str:
    """Give a reason, review the prefilled rewind and confirm it; the id of the request filed."""
    tab.get_by_label(re.compile(r"^Reason \(required")).fill(REASON)
    tab.get_by_role("button", name="Review request").click()
    expect_visible(tab.get_by_text(f"{OPERATOR} asks the trainer to"), REWIND_TEXT)
    tab.get_by_role("button", name="Confirm rewind").click()
    filed = tab.get_by_text(re.compile(r"^Request req-\S+ filed\.$"))
    expect_visible(filed)
    screenshot(tab, "dashboard-rewind-confirmed", filed)
    return filed.inner_text().split()[1]


# -- the tests ----------------------------------------------------------------------------
def test_an_operator_rewinds_a_live_run_from_its_incident_and_sees_the_trainer_apply_it(
    live_run: LiveRun, serve, page
) -> None:
    run, trainer, log = live_run
    page.goto(f"{serve(run, token=TOKEN)}/incidents")
    expect_visible(page.get_by_text(re.compile(r"^No incidents \(detectors ran at ")))
    file_request(run, "resume")
    expect_visible(page.get_by_role("combobox", name="Incident"), timeout_s=INCIDENT_S)  # live, without a reload
    open_incident(page, "loss_spike")
    assert trainer.poll() is None, f"the run ended before the operator could act:\n{tail(log)}"
    suggested = page.get_by_role("paragraph").filter(has_text="Suggested action:")
    expect_visible(suggested, REWIND_TEXT)

    unlock(page, "not-the-token")
    expect_visible(page.get_by_text("Wrong token."))
    assert page.get_by_role("button", name="Review request").count() == 0
    unlock(page, TOKEN)
    expect_visible(page.get_by_text(f"Acting as {OPERATOR}"))
    expect(page.get_by_role("combobox", name="Action")).to_have_value("rewind to a checkpoint")
    expect(page.get_by_role("spinbutton", name="to_step")).to_have_value(str(GOOD_CHECKPOINT))
    screenshot(page, "dashboard-incident-open", suggested)

    request_id = review_and_confirm(page)
    status = page.get_by_text(re.compile(rf"{re.escape(request_id)}.*: applied at step \d+ on timeline 1$"))
    expect_visible(status, timeout_s=APPLIED_S)
    screenshot(page, "dashboard-rewind-applied", status)
    # The retrained steps read the bad shard again, so an incident opens on timeline 1; the page stays on this one.
    expect(page.get_by_role("combobox", name="Incident")).to_have_value(re.compile(r"^loss_spike@0:"))
    check_rewound(run, request_id, shown_step=int(re.search(r"at step (\d+)", status.inner_text()).group(1)))


def check_rewound(run: Path, request_id: str, shown_step: int) -> None:
    """The trainer applied the request as the page says, and both ranks train on timeline 1 from the checkpoint."""
    assert [(r["action"], r["args"], r["operator"], r["reason"], r["step"]) for r in applied(run, request_id)] == [
        ("rewind", {"to_step": GOOD_CHECKPOINT}, OPERATOR, REASON, shown_step)
    ]
    wait_for(
        lambda: all(
            any(r["kind"] == "rank_step" and r["timeline"] == 1 for r in records(run, rank)) for rank in (0, 1)
        ),
        "both ranks to train on timeline 1",
        APPLIED_S,
    )
    assert min(r["step"] for r in records(run, 0) if r["kind"] == "step" and r["timeline"] == 1) == GOOD_CHECKPOINT + 1
    audit = [json.loads(line) for line in (RunLayout(run).control / "audit.jsonl").read_text().splitlines()]
    assert [(a["operator"], a["what"], a["reason"]) for a in audit if a["request_id"] == request_id] == [
        (OPERATOR, "rewind", REASON)
    ]


def test_without_an_operator_token_the_incident_page_offers_no_action(tmp_path: Path, serve, page) -> None:
    run = shutil.copytree(SAMPLE_RUN, tmp_path / "tiny-faults")
    page.goto(f"{serve(run, token=None)}/incidents")
    expect_visible(page.get_by_role("combobox", name="Incident"), timeout_s=INCIDENT_S)
    expect_visible(page.get_by_text("set BEDSIDE_OPERATOR_TOKEN for bedside serve"))
    expect_visible(page.get_by_text("no action can be taken from this page"))
    expect_visible(page.get_by_role("heading", name="Audit trail"))  # the page is drawn to its end
    assert page.get_by_label("Operator token").count() == 0
    assert page.get_by_role("button", name="Review request").count() == 0


def run_sql(tab, sql: str) -> None:
    """Type ``sql`` into the SQL page's editor, apply it, and press Run."""
    editor = tab.get_by_label("SQL", exact=True)
    editor.fill(sql)
    editor.press("Control+Enter")
    tab.get_by_role("button", name="Run", exact=True).click()


def test_the_sql_page_refuses_an_attack_of_each_class_and_the_store_is_unchanged(tmp_path: Path, serve, page) -> None:
    """The first attack of each class of ``sql_attacks.py`` typed into the real page of a served run, no token
    needed (``test_dashboard_sql.py`` puts every attack through the page's code; ``bench/harness.py --long``
    types every one here).

    Each attack follows a good query, so the error it shows is its own; the page says what
    ``bedside query`` says of the same SQL.
    """
    copy = shutil.ignore_patterns("bedside.duckdb*")
    run, reference = (shutil.copytree(SAMPLE_RUN, tmp_path / name, ignore=copy) for name in ("tiny-faults", "ref"))
    assert (
        subprocess.run(
            [sys.executable, "-m", "bedside.app.cli", "collect", str(reference), "--quiet"], timeout=120
        ).returncode
        == 0
    )
    secret, out = tmp_path / "secret.csv", tmp_path / "out.csv"
    secret.write_text("root:x:0:0:the secret line\n")
    page.goto(f"{serve(run, token=None)}/sql?run={run.name}")
    errors, rows = page.locator("[data-testid=stAlertContentError]"), page.get_by_text("1 rows")
    for name, attack in BROWSER_ATTACKS.items():
        run_sql(page, f"SELECT '{name}' AS before_the_attack")
        expect(errors).to_have_count(0)
        expect_visible(rows)
        sql = attack.format(secret=secret, store=RunLayout(run).store, out=out)
        with pytest.raises(QueryError) as refused:
            run_query(reference, sql.replace(str(RunLayout(run).store), str(RunLayout(reference).store)))
        run_sql(page, sql)
        expect(errors).to_have_count(1)
        expect(errors.first).to_contain_text(str(refused.value).splitlines()[0][:40])
        expect(page.get_by_role("button", name="Download CSV")).to_have_count(0)
        assert "the secret line" not in page.content(), name
    screenshot(page, "dashboard-sql-refused", errors.first)
    assert not out.exists()
    serve.stop()
    assert_store_intact(run, reference)


def assert_store_intact(run: Path, reference: Path) -> None:
    """The served store holds what a plain ``bedside collect`` of the same run holds: same tables, views,
    row counts and committed offsets, and no forged alert."""

    def facts(path: Path) -> dict[str, object]:
        with Store.open(RunLayout(path).store, read_only=True, schemas=SCHEMAS) as store:
            return store_facts(store.cursor())

    served, collected = facts(run), facts(reference)
    assert served == {**collected, "outbox": 0}


def test_the_sql_page_previews_a_large_result_and_downloads_all_of_it_as_csv(tmp_path: Path, serve, page) -> None:
    """A 16-rank run's 3,200 rank steps: the page shows the first 1,000; Prepare CSV writes every one to a file on
    the server, and the Download CSV link gets that file from the server's own route, not through the page."""
    run = tmp_path / "sixteen-ranks"
    simulate_run(SimulationConfig(ranks=16, steps=200, ranks_per_host=8, nuisances=False), run)
    url = serve(run, token=None)
    page.goto(f"{url}/sql?run={run.name}")
    run_sql(page, "SELECT rank, step, compute_time, extra FROM rank_step_metrics ORDER BY step, rank")
    expect_visible(page.get_by_text("First 1,000 rows shown: the result has more"))
    page.get_by_role("button", name="Prepare CSV").click()
    expect_visible(page.get_by_text(f"all {16 * 200:,} rows"))
    link = page.get_by_role("link", name="Download CSV")
    with page.expect_download(timeout=WIDGET_S * 1000) as download:
        link.click()
    written = pd.read_csv(download.value.path())
    assert len(written) == 16 * 200 and list(written.columns) == ["rank", "step", "compute_time", "extra"]
    assert list(written["step"][:16]) == [1] * 16 and list(written["rank"][:16]) == list(range(16))
    assert download.value.suggested_filename == f"{run.name}.csv"
    expect_visible(page.get_by_text("First 1,000 rows shown"))  # the download did not rerun the page away
    href = link.get_attribute("href")
    assert href and href.startswith("/bedside/export/")
    with pytest.raises(urllib.error.HTTPError, match="404"):  # a token the server does not hold
        urllib.request.urlopen(url + href.replace(href.split("/")[3], "not-a-token"))


NARROW = {"width": 400, "height": 1600}


def test_at_400_px_tiles_go_two_by_two_and_each_legend_sits_below_its_title(tmp_path: Path, serve, browser) -> None:
    run = shutil.copytree(SAMPLE_RUN.with_name("tiny-rewind"), tmp_path / "tiny-rewind")  # two timelines: legends
    url = serve(run, token=None)
    context = browser.new_context(viewport=NARROW)
    tab = context.new_page()
    tab.set_default_timeout(WIDGET_S * 1000)
    try:
        for path, tiles in (("", 8), ("checkpoints", 8)):
            tab.goto(f"{url}/{path}?run={run.name}")
            metrics = tab.locator("[data-testid=stMetric]")
            expect(metrics).to_have_count(tiles, timeout=INCIDENT_S * 1000)
            tab.locator(".js-plotly-plot .gtitle").first.wait_for()
            rows: dict[int, list[float]] = {}
            for box in (metrics.nth(i).bounding_box() for i in range(tiles)):
                rows.setdefault(round(box["y"]), []).append(box["x"])
            assert sorted(len(xs) for xs in rows.values()) == [2] * (tiles // 2), (path, rows)
            for chart in tab.locator(".js-plotly-plot").all():
                if not chart.locator(".legend").count():  # one trace: plotly draws no legend
                    continue
                title, legend = chart.locator(".gtitle").bounding_box(), chart.locator(".legend").bounding_box()
                plot = chart.locator(".nsewdrag").first.bounding_box()
                assert legend["y"] >= title["y"] + title["height"], (path, title, legend)
                assert plot["y"] >= legend["y"] + legend["height"], (path, legend, plot)
            ARTIFACTS.mkdir(exist_ok=True)
            tab.screenshot(path=str(ARTIFACTS / f"dashboard-400px-{path or 'overview'}.png"), full_page=True)
    finally:
        context.close()
