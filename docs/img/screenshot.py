"""Regenerate docs/img/overview.png: the Overview page of sample_runs/tiny-faults, served by
``bedside serve`` and drawn by headless Chromium (Debian's, driven by Playwright).

    python docs/img/screenshot.py [--out PATH]

Needs chromium (``apt-get install chromium``) and playwright (``pip install -e '.[test]'``).
The run is copied to a temporary folder first: serving it writes its store.
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
from chromium import launch  # noqa: E402  (the browser tests' launch settings)

SAMPLE_RUN = REPO / "sample_runs" / "tiny-faults"
VIEWPORT = {"width": 1500, "height": 1000}
TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_serving(run: Path, port: int, log: Path) -> subprocess.Popen:
    """``bedside serve RUN`` in a process group of its own, once it answers (panels never refresh: a still page)."""
    command = [sys.executable, "-m", "bedside.app.cli", "serve", str(run), "--port", str(port), "--refresh", "3600"]
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


def capture(url: str, out: Path) -> None:
    """Open the Overview, wait until both charts are drawn, check for error boxes and dialogs, write the PNG."""
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url)  # the Overview is the default page, served at the root ("/overview" is "Page not found")
        expect(page.get_by_text("Held-out eval against compute")).to_be_visible(timeout=TIMEOUT_S * 1000)
        expect(page.locator("[data-testid=stPlotlyChart]")).to_have_count(2)
        page.locator("[data-testid=stSkeleton]").first.wait_for(state="detached")
        errors = page.locator("[data-testid=stException], [data-testid=stAlertContentError], [role=dialog]")
        if errors.count():
            raise SystemExit(f"the Overview shows an error: {errors.first.inner_text()}")
        page.screenshot(path=str(out))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("overview.png"))
    out = parser.parse_args().out
    with tempfile.TemporaryDirectory() as scratch:
        run = shutil.copytree(SAMPLE_RUN, Path(scratch) / SAMPLE_RUN.name)
        port = free_port()
        server = start_serving(run, port, Path(scratch) / "serve.log")
        try:
            capture(f"http://127.0.0.1:{port}", out)
        finally:
            stop(server)
    print(f"{out}: {out.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
