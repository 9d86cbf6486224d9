"""Live pages keep their state, in a real browser (Chromium driven by Playwright against ``bedside serve --refresh
1`` on a live two-rank run, ``test_dashboard_browser.live_run``).

On the Overview, a drag-zoom of the training curves lasts through refreshes with new data, every panel follows the
zoomed one, the step range goes into the address and a reload opens it again; no chart is dimmed or drawn twice
while the page refreshes under the pointer, and the console stays free of errors. The sidebar's pause stops every
panel and resuming catches up at once. On the Incidents page, the incident open is in the address, and a new
incident joins the list without rerunning the page: a dropdown left open stays open.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

import pytest
from playwright.sync_api import expect
from test_dashboard_browser import (  # noqa: F401  (browser, page, serve and live_run are fixtures)
    ARTIFACTS,
    INCIDENT_S,
    WIDGET_S,
    LiveRun,
    browser,
    expect_visible,
    file_request,
    live_run,
    page,
    records,
    serve,
    wait_for,
)

from bedside.app.dashboard import live
from bedside.collectors import RunLogger

pytestmark = pytest.mark.slow(reason="a live two-rank run watched and zoomed in Chromium")

CURVES = ".st-key-training_curves .js-plotly-plot"
"""The training curves as plotly.js holds them (the element's key is its class)."""
X_RANGES = f"""() => {{
    const plot = document.querySelector('{CURVES}');
    return Object.keys(plot._fullLayout).filter(a => /^xaxis\\d*$/.test(a)).map(a => plot._fullLayout[a].range);
}}"""
SAMPLE = f"""() => ({{
    dimmed: [...document.querySelectorAll('[data-testid=stElementContainer]')]
        .filter(e => e.querySelector('.js-plotly-plot') && getComputedStyle(e).opacity !== '1').length,
    curves: document.querySelectorAll('{CURVES}').length,
}})"""
"""How many element containers holding a chart are dimmed, and how many training charts are drawn."""
REFRESHES = 4
RUN = "written-live"
PROBE = re.compile(r"/[a-z]+/_stcore/(health|host-config)$")


def train(log: RunLogger, first: int, last: int, nan_at: int | None = None) -> None:
    """Steps ``first`` to ``last`` of a run with a steady loss, NaN at ``nan_at`` (each NaN: an incident)."""
    for step in range(first, last + 1):
        log.step(step, loss=math.nan if step == nan_at else 2.0 + 0.01 * (step % 3), grad_norm=1.0)
    log.flush()


def step_value(tab):
    """The Step tile's value."""
    return tab.locator("[data-testid=stMetric]").filter(has_text="Step").locator("[data-testid=stMetricValue]")


def step_tile(tab) -> str:
    return step_value(tab).inner_text()


def held_tile(tab, quiet_s: float = 3.0) -> str:
    """The Step tile once it has stayed the same for ``quiet_s``: pausing reruns the page, which draws every panel
    once more, and on a loaded machine that rerun can end seconds after the click."""
    deadline = time.monotonic() + INCIDENT_S
    shown, since = step_tile(tab), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the Step tile never held still after the pause"
        tab.wait_for_timeout(200)
        if (now := step_tile(tab)) != shown:
            shown, since = now, time.monotonic()
    return shown


def trained(run) -> int:
    """Rank 0's newest step record."""
    return max((r["step"] for r in records(run, 0) if r["kind"] == "step"), default=0)


def drag_zoom(tab, start: float, end: float) -> None:
    """Drag across the top panel of the training curves from ``start`` to ``end`` (fractions of its width)."""
    panel = tab.locator(f"{CURVES} .nsewdrag").first
    panel.scroll_into_view_if_needed()
    box = panel.bounding_box()
    y = box["y"] + box["height"] / 2
    tab.mouse.move(box["x"] + box["width"] * start, y)
    tab.mouse.down()
    tab.mouse.move(box["x"] + box["width"] * end, y, steps=8)
    tab.mouse.up()


def watch_refreshes(tab, count: int) -> list[dict]:
    """Hover to and fro over the training curves while the Step tile changes ``count`` times; the samples of
    ``SAMPLE`` taken meanwhile (every 0.1 s)."""
    box = tab.locator(f"{CURVES} .nsewdrag").first.bounding_box()
    seen, samples, deadline = {step_tile(tab)}, [], time.monotonic() + INCIDENT_S
    while len(seen) <= count:
        assert time.monotonic() < deadline, f"the Step tile changed only {len(seen) - 1} times"
        fraction = 0.1 + 0.8 * ((len(samples) % 9) / 8)
        tab.mouse.move(box["x"] + box["width"] * fraction, box["y"] + box["height"] / 2, steps=3)
        samples.append(tab.evaluate(SAMPLE))
        seen.add(step_tile(tab))
        tab.wait_for_timeout(100)
    return samples


def shown_id(picker) -> str:
    """The id of the incident the picker shows: its label is the id, its ranks after a slash, then the title."""
    return picker.input_value().split(": ")[0].split("/")[0]


def address(tab) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(urlparse(tab.url).query).items()}


def console_errors(tab) -> list[str]:
    """The errors the tab's console shows from now on, but for Streamlit's own probe of a page's address: a page
    loaded at ``/incidents`` asks ``/incidents/_stcore/health`` first whether the app is served under it (a 404)."""
    errors: list[str] = []

    def seen(message) -> None:
        if message.type == "error" and not PROBE.search(message.location.get("url", "")):
            errors.append(f"{message.text} ({message.location.get('url')})")

    tab.on("console", seen)
    tab.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def test_a_live_zoom_lasts_spreads_and_reloads_and_pause_holds(live_run: LiveRun, serve, page) -> None:  # noqa: F811
    run = live_run.run
    errors = console_errors(page)
    page.goto(f"{serve(run, token=None)}/?run={run.name}")
    file_request(run, "resume")  # the fixture's pause can come before the first step: no curve to draw until now
    expect_visible(page.locator(CURVES), timeout_s=INCIDENT_S)
    expect(step_value(page)).not_to_have_text(step_tile(page), timeout=INCIDENT_S * 1000)  # the run moves

    drag_zoom(page, 0.3, 0.6)
    zoomed = [round(x, 1) for x in page.evaluate(X_RANGES)[0]]
    samples = watch_refreshes(page, REFRESHES)
    ranges = page.evaluate(X_RANGES)
    problems = {
        "the zoom was lost": [round(x, 1) for x in ranges[0]] != zoomed,
        "a panel does not follow the zoom": len(ranges) < 3 or any(r != ranges[0] for r in ranges),
        "a chart was dimmed": any(s["dimmed"] for s in samples),
        "the curves were drawn twice": {s["curves"] for s in samples} != {1},
        "the address lacks the step range": live.parse_range(address(page).get(live.STEP_RANGE)) != tuple(ranges[0]),
    }
    assert not [what for what, wrong in problems.items() if wrong], (zoomed, ranges, page.url, samples)

    page.get_by_text("Pause live updates").click()
    held, since = held_tile(page), trained(run)
    wait_for(lambda: trained(run) >= since + 5, "the run to train 5 more steps", INCIDENT_S)
    page.wait_for_timeout(1500)
    assert step_tile(page) == held, "a panel refreshed while paused"
    page.get_by_text("Pause live updates").click()
    expect(step_value(page)).not_to_have_text(held, timeout=WIDGET_S * 1000)  # caught up at once

    kept = address(page)[live.STEP_RANGE]
    page.reload()
    expect_visible(page.locator(CURVES), timeout_s=INCIDENT_S)
    page.wait_for_function(f"() => ({X_RANGES})()[0][0] === {live.parse_range(kept)[0]}", timeout=WIDGET_S * 1000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(CURVES).screenshot(path=str(ARTIFACTS / "live-training-zoomed.png"))
    assert not errors, errors


def test_the_incident_is_in_the_address_and_a_new_one_leaves_a_dropdown_open(tmp_path: Path, serve, page) -> None:  # noqa: F811
    log = RunLogger(tmp_path / RUN, rank=0, world_size=1, local_rank=0)  # left open: a live run, written here
    try:
        train(log, 1, 20)
        errors = console_errors(page)
        page.goto(f"{serve(tmp_path / RUN, token=None)}/incidents?run={RUN}")
        expect_visible(page.get_by_text(re.compile(r"^No incidents \(detectors ran at ")), timeout_s=INCIDENT_S)
        train(log, 21, 30, nan_at=21)
        picker = page.get_by_role("combobox", name="Incident")
        expect_visible(picker, timeout_s=INCIDENT_S)  # the first incident opens the page for it
        expect_visible(page.get_by_role("heading", name="Audit trail"))
        opened = address(page).get(live.INCIDENT)
        assert opened and shown_id(picker) == opened, (page.url, picker.input_value())

        picker.click()  # open the dropdown, and leave it open while an incident comes
        options = page.get_by_role("option")
        expect(options).to_have_count(1)
        train(log, 31, 90, nan_at=80)
        expect(options).to_have_count(2, timeout=INCIDENT_S * 1000)  # the new incident joins the open list
        page.wait_for_timeout(3000)  # refreshes go on: still open
        expect(page.get_by_role("listbox")).to_be_visible()
        other = options.filter(has_not_text=opened)
        chosen = other.inner_text().split(": ")[0].split("/")[0]
        other.click()
        expect(page).to_have_url(
            re.compile(rf"[?&]{live.INCIDENT}={re.escape(quote(chosen))}(&|$)"), timeout=WIDGET_S * 1000
        )

        page.reload()
        expect_visible(picker, timeout_s=INCIDENT_S)
        expect_visible(page.get_by_role("heading", name="Audit trail"))
        assert shown_id(picker) == chosen and address(page)[live.INCIDENT] == chosen
        assert not errors, errors
    finally:
        log.close()
