"""The Runs page in a real browser (Chromium, driven by Playwright, against ``bedside serve``): the live run leads
the table, what it does not report reads "–", and clicking another run's row opens that run's Overview. The page's
picture goes to ``test-artifacts/runs.png``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dashboard_app import FAULTS, REWIND, copy_run
from test_dashboard_browser import (  # noqa: F401 (browser, page and serve are fixtures)
    INCIDENT_S,
    browser,
    expect,
    expect_visible,
    page,
    screenshot,
    serve,
)

from bedside.collectors import RunLogger

pytestmark = pytest.mark.slow(reason="bedside serve and a live run driven from Chromium")

BARE = "bare-live"
HEADER_PX = ROW_PX = 35
"""Streamlit's dataframe: the header's and each row's height (the grid is a canvas: rows are clicked by place)."""


def click_row(tab, row: int) -> None:
    """Click the selection box of ``row`` (0: the first below the header) of the page's one dataframe."""
    box = tab.locator(".st-key-runs_table [data-testid=stDataFrame]").bounding_box()
    tab.mouse.click(box["x"] + 15, box["y"] + HEADER_PX + ROW_PX * row + ROW_PX / 2)


def test_the_live_run_leads_and_a_click_opens_its_overview(tmp_path: Path, serve, page) -> None:  # noqa: F811
    runs = tmp_path / "runs"
    for name in (FAULTS, REWIND):
        copy_run(name, runs)
    log = RunLogger(runs / BARE, rank=0, world_size=1, local_rank=0)  # left open: live, with no loss or tokens
    for step in range(1, 11):
        log.step(step, grad_norm=1.0)
    log.flush()
    errors: list[str] = []  # a page that throws can go blank for good ("Bad delta path index" once a row was clicked)
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(f"{serve(runs, token=None)}/runs")
        grid = page.locator(".st-key-runs_table [data-testid=stDataFrame]")
        rows = grid.locator("[role=row]")  # the grid's accessible twin of its canvas: hidden, but it holds the text
        expect(rows.nth(1)).to_contain_text(BARE, timeout=INCIDENT_S * 1000)
        cells = [c.text_content() for c in rows.nth(1).locator("[role=gridcell]").all()]
        assert cells[:5] == [BARE, BARE, "live", "", ""], cells  # no loss, no tokens/s: drawn "–", never 0
        expect(rows.nth(2)).to_contain_text(REWIND)  # then the finished runs, newest first
        screenshot(page, "runs", grid)

        for step in range(11, 21):  # the live run goes on: the table follows without a reload
            log.step(step, grad_norm=1.0)
        log.flush()
        expect(rows.nth(1).locator("[role=gridcell]").nth(6)).to_have_text("20", timeout=INCIDENT_S * 1000)

        click_row(page, 1)
        try:  # a page that threw is blank: its errors say why (opening.py)
            expect(page.get_by_role("heading", name=REWIND, exact=True)).to_be_visible(timeout=INCIDENT_S * 1000)
            expect(page).to_have_url(re.compile(rf"/\?run={REWIND}$"))
            expect_visible(page.locator(".js-plotly-plot").first)  # the Overview's charts
            expect(page.locator(".st-key-run input")).to_have_value(REWIND)  # the sidebar's run box
        except AssertionError as blank:
            raise AssertionError(f"the Overview is not drawn whole; the page's errors: {errors}") from blank
        assert not errors, errors
    finally:
        log.close()
