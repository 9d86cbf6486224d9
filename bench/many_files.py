"""The collector over many rank files: one step, a pass that finds nothing, and live ranks followed with detection.

Run:  python bench/many_files.py            # 4,096 files; 1,024 live ranks for 30 s
      python bench/many_files.py --long     # 16,384 files; 1,024 and 4,096 live ranks for 60 s each

One step: FILES rank files of one ``rank_step`` line each are ingested into an empty store with
``Collector.ingest_available()``; then the same call again, which finds nothing (an empty pass).
Live: ``tests/live_ranks.py`` writes one record per rank per second from another process while a
Follower with detection after every pass (as ``bedside collect --follow``) follows; once a second it
samples how many steps the store is behind the writer and the process's RSS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from live_ranks import follow_live_ranks, rank_lines  # the harness lives with the soak test

WARM_UP_S = 10


def write_one_step(run: Path, files: int) -> None:
    shutil.rmtree(run, ignore_errors=True)
    layout = RunLayout(run)
    layout.telemetry.mkdir(parents=True)
    write_run_info(layout, RunInfo(name="many-files", world_size=files))
    now = time.time()
    for rank in range(files):
        layout.rank_file(rank).write_text(rank_lines(rank, 1, now).splitlines(keepends=True)[0])


def one_step(workdir: Path, files: int) -> None:
    """Seconds to ingest one step of ``files`` one-line files, then for a pass that finds nothing."""
    run = workdir / f"one-step-{files}"
    write_one_step(run, files)
    with Store.open(RunLayout(run).store) as store:
        collector = Collector(run, store)
        start = time.perf_counter()
        result = collector.ingest_available()
        ingest_s = time.perf_counter() - start
        empties = []
        for _ in range(5):
            start = time.perf_counter()
            collector.ingest_available()
            empties.append(time.perf_counter() - start)
    print(f"| one step of {files:,} one-line files | {result.lines:,} lines | {ingest_s:.2f} s |")
    print(f"| a pass that finds nothing, {files:,} files (median of 5) | - | {np.median(empties):.3f} s |")


def live(workdir: Path, ranks: int, seconds: int) -> None:
    """Lag in steps and RSS while following ``ranks`` live ranks for ``seconds``."""
    run = workdir / f"live-{ranks}"
    shutil.rmtree(run, ignore_errors=True)
    figures = follow_live_ranks(run, ranks, seconds)
    lag = figures.settled_lag(WARM_UP_S)
    rss = figures.rss_mib
    print(
        f"| follow {ranks:,} ranks x {seconds} s with detection | lag after {WARM_UP_S} s: median "
        f"{np.median(lag):.0f}, max {max(lag)} steps (written {figures.written[-1]}) | RSS {rss[WARM_UP_S]:.0f} "
        f"-> {rss[-1]:.0f} MiB (max {max(rss):.0f}), {figures.passes} passes |"
    )
    shutil.rmtree(run, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="16,384 files; 1,024 and 4,096 live ranks for 60 s")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bedside-bench-many-files")
    args = parser.parse_args()
    print(f"duckdb {duckdb.__version__}, {os.cpu_count()} CPUs")
    print("| what | size | figure |\n|---|---|---|")
    one_step(args.workdir, 16_384 if args.long else 4_096)
    for ranks in (1_024, 4_096) if args.long else (1_024,):
        live(args.workdir, ranks, 60 if args.long else 30)


if __name__ == "__main__":
    main()
