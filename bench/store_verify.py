"""What the checksum scan costs when a store is opened for writing: opening with and without it, side by side.

Run:  python bench/store_verify.py [--ranks 256] [--steps 32000] [--repeats 3]

A clean run of RANKS ranks x STEPS steps is simulated (``bedside simulate``'s engine) and ingested into its store.
Then, REPEATS times each, in this order: ``Store.open(read_only=True)`` (no scan, no migration: the baseline),
``Store.open(path)`` (the writers' open: the scan of every block of every table, then the migrations, none due),
and ``Store.verify()`` alone on an open store. Times are wall-clock medians, with the file in the page cache (a
cold open adds reading the file from disk once, which the first query would pay anyway). The figure to read is
seconds of scan per GB of store.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bedside.app.simulation import SimulationConfig, simulate_run
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store


def median_s(action: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def build_store(folder: Path, ranks: int, steps: int) -> Path:
    run = folder / "run"
    simulate_run(SimulationConfig(ranks=ranks, steps=steps, nuisances=False), run)
    store_path = RunLayout(run).store
    with Store.open(store_path) as store:
        Collector(run, store).ingest_available()
    return store_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = build_store(Path(folder), args.ranks, args.steps)
        size_gb = path.stat().st_size / 1e9
        with Store.open(path, read_only=True) as store:
            [[rows]] = store.cursor().execute("SELECT count(*) FROM rank_steps").fetchall()
        plain = median_s(lambda: Store.open(path, read_only=True).close(), args.repeats)
        checked = median_s(lambda: Store.open(path).close(), args.repeats)
        with Store.open(path) as store:
            scan = median_s(store.verify, args.repeats)
    print(f"store: {args.ranks} ranks x {args.steps} steps, {rows:,} rank_step rows, {size_gb * 1000:.0f} MB")
    print(f"{'open':<44}{'median':>10}")
    print(f"{'read-only, no scan (baseline)':<44}{plain * 1000:>8.0f} ms")
    print(f"{'for writing: scan + migrations':<44}{checked * 1000:>8.0f} ms")
    print(f"{'the scan alone (Store.verify)':<44}{scan * 1000:>8.0f} ms")
    print(f"scan cost: {scan / size_gb:.2f} s per GB of store")


if __name__ == "__main__":
    main()
