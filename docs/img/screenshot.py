"""The dashboard's pictures in docs/img, served by ``bedside serve`` and drawn by headless Chromium (Debian's,
driven by Playwright), each once the page is shown (``tests/chromium.py: PAGE_SHOWN``).

    python docs/img/screenshot.py                        # overview.png: the Overview of sample_runs/tiny-faults
    python docs/img/screenshot.py --run RUN --prefix 1024-ranks --pages all
    python docs/img/screenshot.py --demo --prefix live --pages all

``--run`` takes any run directory (``bench/page_load.py`` prepares and keeps a simulated 1,024-rank one under
/tmp/bedside-bench-dashboard); ``--demo`` starts ``bedside demo --serve`` (four ranks training under torchrun, its
faults injected) and takes the pictures of the live run once its first incidents are open. Each page is written as
``PREFIX-PAGE.png`` (the whole page); the default is the README's ``overview.png`` (the window only).

Needs chromium (``apt-get install chromium``) and playwright (``pip install -e '.[test]'``).
A run is copied to a temporary folder first: serving it writes its store.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from chromium import PAGE_SHOWN, launch  # noqa: E402  (the browser tests' launch settings)

SAMPLE_RUN = REPO / "sample_runs" / "tiny-faults"
VIEWPORT = {"width": 1500, "height": 1000}
TIMEOUT_S = 120
PAGES = ("overview", "ranks", "incidents", "checkpoints", "runs", "sql")
DEMO_WARMUP_S = 150
"""How long the demo trains before its pictures: past its first faults, while it still runs."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_serving(run: Path, port: int, log: Path, *, demo: bool = False, refresh_s: float = 3600) -> subprocess.Popen:
    """``bedside serve RUN`` in a process group of its own, once it answers (by default panels never refresh: a
    still page); with ``demo``, ``bedside demo --serve --out RUN`` instead (a live run)."""
    command = [sys.executable, "-m", "bedside.app.cli", "serve", str(run), "--port", str(port)]
    command += ["--refresh", f"{refresh_s:g}"]
    if demo:
        command = [sys.executable, "-m", "bedside.app.cli", "demo", "--serve", "--nproc", "4"]
        command += ["--out", str(run), "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "BEDSIDE_OPERATOR_TOKEN"}
    with log.open("w") as out:
        server = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**env, "OMP_NUM_THREADS": "1"}
        )
    deadline = time.monotonic() + TIMEOUT_S
    while server.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return server
        except OSError:
            time.sleep(0.2)
    stop(server)
    raise SystemExit(f"bedside serve did not start:\n{log.read_text()[-3000:]}")


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def capture(url: str, shots: dict[str, Path], *, whole: bool) -> None:
    """Open each page, wait until it is shown, check for error boxes and dialogs, write its PNG."""
    with sync_playwright() as playwright:
        browser = launch(playwright)
        for name, out in shots.items():
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(url if name == "overview" else f"{url}/{name}")  # the Overview is served at the root
            page.wait_for_function(PAGE_SHOWN, polling="raf", timeout=TIMEOUT_S * 1000)
            expect(page.locator("h1")).to_be_visible()
            errors = page.locator("[data-testid=stException], [data-testid=stAlertContentError], [role=dialog]")
            if errors.count():
                raise SystemExit(f"the {name} page shows an error: {errors.first.inner_text()}")
            if whole:  # Streamlit scrolls its main block, not the document: make the window as tall as the page
                height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
                page.set_viewport_size({"width": VIEWPORT["width"], "height": max(VIEWPORT["height"], height)})
                page.wait_for_function(PAGE_SHOWN, polling="raf", timeout=TIMEOUT_S * 1000)
            page.screenshot(path=str(out))
            page.close()
            print(f"{out}: {out.stat().st_size // 1024} KiB")
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run", type=Path, default=SAMPLE_RUN, help="the run to serve (default sample_runs/tiny-faults)"
    )
    parser.add_argument("--demo", action="store_true", help="picture a live run of bedside demo instead")
    parser.add_argument("--pages", nargs="+", default=["overview"], help=f"pages, or all ({', '.join(PAGES)})")
    parser.add_argument("--prefix", help="write PREFIX-PAGE.png for each page (default: overview.png)")
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent, help="where (default docs/img)")
    args = parser.parse_args()
    pages = PAGES if args.pages == ["all"] else tuple(args.pages)
    if unknown := sorted(set(pages) - set(PAGES)):
        parser.error(f"unknown pages: {', '.join(unknown)} (the pages are {', '.join(PAGES)})")
    if args.prefix is None and pages != ("overview",):
        parser.error("--prefix is needed for pages other than the overview")
    shots = {name: args.dir / (f"{args.prefix}-{name}.png" if args.prefix else "overview.png") for name in pages}
    with tempfile.TemporaryDirectory() as scratch:
        run = (
            Path(scratch) / "bedside-demo"
            if args.demo
            else Path(shutil.copytree(args.run, Path(scratch) / args.run.name))
        )
        port = free_port()
        server = start_serving(run, port, Path(scratch) / "serve.log", demo=args.demo)
        try:
            if args.demo:
                time.sleep(DEMO_WARMUP_S)
            capture(f"http://127.0.0.1:{port}", shots, whole=args.prefix is not None)
        finally:
            stop(server)


if __name__ == "__main__":
    main()
