"""The Overview's curves in a real browser (Chromium driven by Playwright against ``bedside serve``): the training
chart draws its five panels with their markers, Log y redraws it on log scales, the open-incidents tile opens the
Incidents page of the run, and the browser's console stays free of errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dashboard_app import FAULTS, SAMPLE_RUNS
from playwright.sync_api import expect
from test_dashboard_browser import ARTIFACTS, browser, page, serve  # noqa: F401  (the browser tests' fixtures)

from bedside.app.dashboard.curves import PANELS

pytestmark = pytest.mark.slow(reason="bedside serve driven from Chromium")

DRAWN_S = 60
TRAINING_CHART = "document.querySelectorAll('.js-plotly-plot')[1]"
"""The Overview's second chart (the first is eval against compute), as plotly.js holds it."""


def test_the_overview_s_curves_draw_toggle_and_link_in_the_browser(page, serve, tmp_path: Path) -> None:  # noqa: F811
    run = Path(shutil.copytree(SAMPLE_RUNS / FAULTS, tmp_path / FAULTS))
    for stale in run.glob("bedside.duckdb*"):
        stale.unlink()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(serve(run, None))
    expect(page.locator(".js-plotly-plot")).to_have_count(3, timeout=DRAWN_S * 1000)  # eval, training, goodput
    expect(page.get_by_text("Data as of")).to_be_visible()
    axes = page.evaluate(f"() => {TRAINING_CHART}._fullLayout._subplots.yaxis")
    titles = [page.evaluate(f"() => {TRAINING_CHART}._fullLayout.{a.replace('y', 'yaxis')}.title.text") for a in axes]
    assert titles == [p.title for p in PANELS]
    legend = (
        page.locator(".js-plotly-plot").nth(1).locator(".legendtext").evaluate_all("all => all.map(t => t.textContent)")
    )
    assert {"timeline 0", "non-finite value", "critical incident"} <= set(legend)

    page.get_by_text("Log y").click()
    page.wait_for_function(f"() => {TRAINING_CHART}._fullLayout.yaxis.type === 'log'", timeout=DRAWN_S * 1000)
    assert page.evaluate(f"() => {TRAINING_CHART}._fullLayout.yaxis4.type") == "linear"  # throughput stays linear
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".js-plotly-plot").nth(1).screenshot(path=str(ARTIFACTS / "overview-training-log-y.png"))

    page.locator("[data-testid=stPageLink] a").filter(has_text="acknowledged").click()
    expect(page.get_by_role("heading", name=f"{FAULTS}: incidents")).to_be_visible(timeout=DRAWN_S * 1000)
    assert page.url.split("/")[-1].startswith(f"incidents?run={FAULTS}")
    assert not errors, errors
