"""The SQL page's CSV download in a real browser: the server's peak memory against the size of the result.

Run:  OMP_NUM_THREADS=1 python bench/csv_export.py [--ranks 1024] [--steps 3000] [--workdir DIR]

The run is prepared as ``bench/dashboard.py`` prepares it (kept under --workdir and reused) and served by
``bedside serve`` in a process of its own. In Debian's chromium (driven by Playwright), the SQL page runs
``SELECT * FROM rank_step_metrics`` with growing LIMITs (the last one: the whole view, 3.07M rows at 1,024 ranks),
presses Prepare CSV, then downloads the file by the page's Download CSV link. Before each query the server's peak
resident memory is reset (``/proc/PID/clear_refs``); after the download its peak (``VmHWM``) is read: how much the
server grew to answer it, next to the CSV's rows and size and the seconds to prepare and to download it.

Target (issue 14, point 7): the server does not grow with the result (it grew to 1 GB sending 3.07M rows to the
browser).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from page_load import launch, run_arguments, served  # type: ignore[import-not-found]  (bench/page_load.py)

LIMITS = (30_000, 300_000, 1_000_000, None)


def memory_kib(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure in KiB (``VmRSS``: now, ``VmHWM``: the peak since the last reset)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"no {field} for process {pid}")


def export(tab, pid: int, query: str, timeout_s: float) -> dict[str, float]:
    """Run ``query``, prepare its CSV and download it; what the server's memory did meanwhile."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from now
    before = memory_kib(pid, "VmRSS")
    editor = tab.get_by_label("SQL", exact=True)
    editor.fill(query)
    editor.press("Control+Enter")
    tab.get_by_role("button", name="Run", exact=True).click()
    link = tab.get_by_role("link", name="Download CSV")
    link.wait_for(state="detached", timeout=timeout_s * 1000)  # the new query's page is drawn: no download yet
    started = time.perf_counter()
    tab.get_by_role("button", name="Prepare CSV").click()
    link.wait_for(timeout=timeout_s * 1000)
    prepared = time.perf_counter()
    with tab.expect_download(timeout=timeout_s * 1000) as download:
        link.click()
    path = download.value.path()
    downloaded = time.perf_counter()
    with open(path, "rb") as csv:
        rows = sum(block.count(b"\n") for block in iter(lambda: csv.read(1 << 20), b"")) - 1
    return {
        "rows": rows,
        "mib": os.path.getsize(path) / 2**20,
        "prepare_s": prepared - started,
        "download_s": downloaded - prepared,
        "before_mib": before / 1024,
        "peak_mib": memory_kib(pid, "VmHWM") / 1024,
    }


def measure(url: str, pid: int, timeout_s: float) -> list[dict[str, float]]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            tab = context.new_page()
            tab.goto(f"{url}/sql", wait_until="commit")
            tab.get_by_label("SQL", exact=True).wait_for(timeout=timeout_s * 1000)
            results = []
            for limit in LIMITS:
                query = "SELECT * FROM rank_step_metrics" + (f" LIMIT {limit}" if limit else "")
                results.append({"query": query, **export(tab, pid, query, timeout_s)})
                print(results[-1], flush=True)
            return results
        finally:
            browser.close()


def report(results: list[dict]) -> None:
    print("\n| query | CSV rows | CSV MiB | prepare s | download s | server RSS before MiB | server peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| `{r['query']}` | {r['rows']:,} | {r['mib']:,.0f} | {r['prepare_s']:.1f} | {r['download_s']:.1f} "
            f"| {r['before_mib']:,.0f} | {r['peak_mib']:,.0f} |"
        )


def main() -> None:
    args = run_arguments(__doc__.splitlines()[0], timeout_s=300.0).parse_args()
    with served(args, "csv-export-serve.log") as (url, server):
        report(measure(url, server.pid, args.timeout))


if __name__ == "__main__":
    main()
