"""Debian's chromium as Playwright drives it, for the browser tests and the documentation's screenshots."""

from __future__ import annotations

import shutil
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [  # headless, and nothing that reaches out to Google's hosts (CI machines cannot reach them)
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

PAGE_SHOWN = """() => {
    const title = document.querySelector('h1');
    const busy = document.querySelector('[data-testid="stSkeleton"], [data-testid="stStatusWidget"]');  // running: a Stop button
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    const plotted = (element) => {
        const plot = element.querySelector('.js-plotly-plot');
        return plot !== null && plot._fullLayout !== undefined;
    };  // live.chart's components make their plot once mounted: each must hold one drawn
    const components = [...document.querySelectorAll('[data-testid^="stBidiComponent"]')]
        .filter((element) => !element.closest('[data-testid="stSidebar"]'));  // the sidebar's draws no chart
    const drawn = charts.every(plotted) && components.every(plotted);
    if (!title || busy || !drawn) return null;
    const length = (trace) => trace._length || (trace.x && trace.x.length) || 0;
    const points = charts.reduce((sum, chart) => sum + (chart.querySelector('.js-plotly-plot')._fullData || [])
        .reduce((n, trace) => n + length(trace), 0), 0);
    return {ms: performance.now(), charts: charts.length, points: points};
}"""
"""For ``page.wait_for_function``: null until the page is shown (its title there, no loading skeleton, the script
idle: no status widget, every Plotly chart drawn: ``_fullLayout`` set on its plot, ``live.chart``'s components
included, not the sidebar's plotly preloader); then the time since navigation started (ms, the browser's clock), the charts and their points."""


def launch(playwright: Any) -> Any:
    """A headless chromium browser from a started ``sync_playwright()``."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
