"""The dashboard server's CPU while someone watches: each page open in Chromium at ``--refresh 1``, beside the same
server with no viewer.

Run:  OMP_NUM_THREADS=1 python bench/serve_cpu.py [--seconds 30] [--refresh 1] [--workdir DIR]

``sample_runs/tiny-faults`` is copied and collected, ``bedside serve`` serves it in a process of its own, and for
each page main.py navigates (``bench/dashboard.py``) a new tab opens it and waits 10 s (the first draw and the caches), then the server's CPU seconds
(user + system, from ``/proc``) are read over ``--seconds``. The first row is the server with no tab open over the
same time: what a viewer adds is the difference. On-call dashboards stay open for hours, so this is the cost
that matters more than one page's load (``bench/page_load.py``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dashboard import PAGES  # type: ignore[import-not-found]  (bench/dashboard.py, run from here)

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "docs" / "img")]
from chromium import launch  # noqa: E402  (Debian's chromium as the browser tests launch it)
from screenshot import free_port, start_serving, stop  # noqa: E402  (bedside serve as the pictures start it)

SETTLE_S = 10.0


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process ``pid`` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # clock ticks: 100 a second on Linux


def measure(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return cpu_seconds(pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--refresh", type=float, default=1.0)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or Path(scratch)
        run = work / "tiny-faults"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(REPO / "sample_runs" / "tiny-faults", run)
        subprocess.run([sys.executable, "-m", "bedside.app.cli", "collect", str(run), "--quiet"], check=True)
        port = free_port()
        server = start_serving(run, port, work / "serve.log", refresh_s=args.refresh)
        try:
            url = f"http://127.0.0.1:{port}"
            print(f"bedside serve at --refresh {args.refresh:g}: CPU seconds over {args.seconds:g} s")
            print(f"{'no viewer':>12}: {measure(server.pid, args.seconds):6.1f}")
            with sync_playwright() as playwright:
                browser = launch(playwright)
                for page in PAGES:
                    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                    tab.goto(url if page == "overview" else f"{url}/{page}")
                    tab.wait_for_timeout(SETTLE_S * 1000)
                    used = measure(server.pid, args.seconds)
                    print(f"{page:>12}: {used:6.1f}  ({used / args.seconds:.2f} of a core)")
                    tab.close()
                browser.close()
        finally:
            stop(server)


if __name__ == "__main__":
    main()
