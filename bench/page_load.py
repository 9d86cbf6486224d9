"""Each dashboard page in a real browser: navigation start to every chart drawn, on a large simulated run.

Run:  OMP_NUM_THREADS=1 python bench/page_load.py [--ranks 1024] [--steps 3000] [--workdir DIR] [--repeat 3]

The run is prepared as ``bench/dashboard.py`` prepares it (simulated with a few faults, ingested, detected; kept
under --workdir and reused). ``bedside serve RUN`` then serves it in a process of its own, as an on-call engineer
would start it, and Debian's ``chromium`` (driven by Playwright, as the browser tests drive it) opens each page
afresh --repeat times (a new tab each time, after one untimed visit that warms the server's caches, as a page
already open in someone else's tab has): a link from an alert opened cold. Then, in one open tab, each page is
switched to from the sidebar, round all of them --repeat times, timed from the click: how an on-call engineer
goes from page to page. A page counts as shown when its title is there, no element is still a
loading skeleton, the script is not running, and every Plotly chart on it has drawn (Plotly's ``_fullLayout``
set on each plot's element); the figure is ``performance.now()`` at that frame: milliseconds since the
navigation started, in the browser's own clock. The median and the slowest of the visits are reported, with how
many charts and points (``x`` values over every trace) each page drew.

Target (issue 14): every page shown within 2 s of navigation at 1,024 ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dashboard import PAGES, prepare  # type: ignore[import-not-found]  (bench/dashboard.py, run from here)

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "docs" / "img")]
from chromium import PAGE_SHOWN, launch  # noqa: E402  (Debian's chromium as the browser tests launch it)
from screenshot import free_port, start_serving, stop  # noqa: E402  (bedside serve as the pictures start it)

TARGET_MS = 2000.0


def visit(browser, url: str, timeout_s: float) -> dict[str, float]:
    """Open ``url`` in a new tab; when it was shown (``PAGE_SHOWN``), its charts and points."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        tab = context.new_page()
        tab.goto(url, wait_until="commit")
        shown = tab.wait_for_function(PAGE_SHOWN, polling="raf", timeout=timeout_s * 1000)
        return dict(shown.json_value())
    finally:
        context.close()


def switch(tab, name: str, charts: int, timeout_s: float) -> dict[str, float]:
    """In an open tab, click ``name`` in the sidebar; the page shown (``PAGE_SHOWN``) with its ``charts`` (as many
    as it drew opened cold: a chart not mounted yet is not waited for otherwise), timed from the click."""
    before = tab.locator("h1").first.inner_text()
    clicked = float(tab.evaluate("performance.now()"))
    tab.locator('[data-testid="stSidebarNav"] a', has_text=name.capitalize() if name != "sql" else "SQL").click()
    tab.wait_for_function(
        "(before) => { const h = document.querySelector('h1'); return h !== null && h.innerText !== before; }",
        arg=before,
        polling="raf",
        timeout=timeout_s * 1000,
    )
    with_charts = f"(n) => {{ const s = ({PAGE_SHOWN})(); return s !== null && s.charts >= n ? s : null; }}"
    shown = dict(tab.wait_for_function(with_charts, arg=charts, polling="raf", timeout=timeout_s * 1000).json_value())
    return {**shown, "ms": shown["ms"] - clicked}


def measure(url: str, repeat: int, timeout_s: float) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Each page opened cold (a link in a fresh browser), and switched to from the sidebar of an open tab."""
    from playwright.sync_api import sync_playwright

    visits: dict[str, dict[str, list[dict[str, float]]]] = {"opened from a link": {}, "switched to in the app": {}}
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            for name in PAGES:
                page_url = url if name == "overview" else f"{url}/{name}"
                visit(browser, page_url, timeout_s)  # untimed: the server's caches, the browser's code cache
                visits["opened from a link"][name] = [visit(browser, page_url, timeout_s) for _ in range(repeat)]
            tab = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            tab.goto(url, wait_until="commit")
            tab.wait_for_function(PAGE_SHOWN, polling="raf", timeout=timeout_s * 1000)
            switched = visits["switched to in the app"]
            for _ in range(repeat):  # each page from the one before it, as an on-call engineer goes round them
                names = list(PAGES)
                for name in [*names[1:], names[0]]:
                    charts = int(visits["opened from a link"][name][-1]["charts"])
                    switched.setdefault(name, []).append(switch(tab, name, charts, timeout_s))
        finally:
            browser.close()
    return visits


def report(ways: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    for way, visits in ways.items():
        print(f"\n{way}:")
        table(visits)


def table(visits: dict[str, list[dict[str, float]]]) -> None:
    print(f"| page | median ms | slowest ms | charts | points drawn | within {TARGET_MS:.0f} ms |")
    print("|---|---|---|---|---|---|")
    for name, seen in sorted(visits.items(), key=lambda kv: list(PAGES).index(kv[0])):
        times = [v["ms"] for v in seen]
        within = "yes" if max(times) <= TARGET_MS else "**no**"
        print(
            f"| {name} | {statistics.median(times):,.0f} | {max(times):,.0f} | {int(seen[-1]['charts'])} "
            f"| {int(seen[-1]['points']):,} | {within} |"
        )


def run_arguments(description: str, timeout_s: float) -> argparse.ArgumentParser:
    """The options of a bench over a prepared, served run: its size, where it is kept, how long a step may take."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--timeout", type=float, default=timeout_s, help="seconds one visit or download may take")
    parser.add_argument("--ranks", type=int, default=1024, help="world size of the simulated run")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps of the simulated run")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "bedside-bench-dashboard",
        help="where the prepared run is kept (reused when present; shared with bench/dashboard.py)",
    )
    return parser


@contextmanager
def served(args: argparse.Namespace, log_name: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """The run of ``args`` prepared and served by ``bedside serve``: its address and the server's process."""
    run = (args.workdir / f"run-{args.ranks}x{args.steps}").resolve()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    prepare(run, args.ranks, args.steps)
    port = free_port()
    server = start_serving(run, port, args.workdir / log_name)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        stop(server)
        print(f"\nload average {os.getloadavg()[0]:.2f} (other processes on the machine skew the figures)")


def main() -> None:
    parser = run_arguments(__doc__.splitlines()[0], timeout_s=120.0)
    parser.add_argument("--repeat", type=int, default=3, help="timed visits of each page")
    args = parser.parse_args()
    with served(args, "page-load-serve.log") as (url, _):
        report(measure(url, args.repeat, args.timeout))


if __name__ == "__main__":
    main()
