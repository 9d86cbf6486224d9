"""Bulk ingest throughput and live (follow mode) latency of the collector.

Run:  python bench/ingest.py [--ranks 64] [--steps 20000] [--workdir DIR] [--trials 3]

Bulk: a run of RANKS files of STEPS ``rank_step`` records each (format v1, written
with encode_line; generated once and cached under --workdir) is ingested from an
empty store with ``Collector.ingest_available()``, timed per phase by wrapping the
collector's own steps (read, split into lines, DuckDB stage, insert + commit).
Live: a Follower (default rescan interval) follows a fresh run while a writer
appends one record every 50 ms; each record's delay until its offset is
committed in the store is measured from another thread.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np

import bedside.collectors.ingest as ingest_module
from bedside.collectors.follow import DEFAULT_RESCAN_EVERY_S, Follower
from bedside.collectors.format import RANK_STEP_METRICS, encode_line
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RankPlacement, RunInfo, write_run_info
from bedside.collectors.store import Store

LIVE_RECORDS = 200
LIVE_INTERVAL_S = 0.05
POLL_S = 0.005
TARGET_ROWS_PER_S = 1_000_000
TARGET_P95_S = 1.0


# -- generating a run -------------------------------------------------------
def rank_info_line(rank: int, world_size: int, now: float) -> str:
    return encode_line(
        {
            "kind": "rank_info",
            "time": now,
            "rank": rank,
            "step": 0,
            "timeline": 0,
            "seq": 0,
            "host": f"node{rank // 8:03d}",
            "local_rank": rank % 8,
            "world_size": world_size,
            "pid": 1000 + rank,
            "mesh": {"dp": rank, "tp": 0, "pp": 0},
        }
    )


def rank_step_line(rank: int, step: int, seq: int, now: float, rng: random.Random) -> str:
    compute, comm, data = 0.21 + rng.gauss(0, 0.01), 0.05 + rng.gauss(0, 0.005), 0.01 * rng.random()
    metrics = dict(
        zip(RANK_STEP_METRICS, (compute + comm + data + 0.011, data, compute, comm, 0.011, 1.0 + 0.1 * rng.random()))
    )
    return encode_line(
        {
            "kind": "rank_step",
            "time": now,
            "rank": rank,
            "step": step,
            "timeline": 0,
            "seq": seq,
            "metrics": metrics,
            "param_checksum": f"{(step * 2654435761) & 0xFFFFFFFFFFFF:012x}",
        }
    )


def write_rank_file(layout: RunLayout, rank: int, ranks: int, steps: int, start: float) -> None:
    rng = random.Random(rank)
    lines = [rank_info_line(rank, ranks, start)]
    lines += [rank_step_line(rank, step, step, start + step * 0.3 + 0.001 * rank, rng) for step in range(1, steps + 1)]
    with open(layout.rank_file(rank), "w") as fh:
        fh.write("".join(lines))


def generate_run(run: Path, ranks: int, steps: int) -> None:
    """Write the run once; a marker file naming its size lets reruns skip this."""
    marker = run / f".generated-{ranks}x{steps}"
    if marker.exists():
        return
    shutil.rmtree(run, ignore_errors=True)
    layout = RunLayout(run)
    layout.telemetry.mkdir(parents=True)
    topology = tuple(RankPlacement(rank=r, host=f"node{r // 8:03d}", local_rank=r % 8, dp=r) for r in range(ranks))
    write_run_info(layout, RunInfo(name="bench-ingest", world_size=ranks, topology=topology))
    start = time.time() - steps * 0.3
    for rank in range(ranks):
        write_rank_file(layout, rank, ranks, steps, start)
    marker.touch()


# -- bulk ingest ------------------------------------------------------------
def timed(phases: dict[str, float], name: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] += time.perf_counter() - start

    return wrapper


def instrument(collector: Collector, store: Store, phases: dict[str, float]) -> None:
    """Time the collector's steps by wrapping them on this instance (product code unchanged)."""
    collector._read_sources = timed(phases, "read", collector._read_sources)
    collector._stage = timed(phases, "stage (DuckDB parse)", collector._stage)
    ingest_module.lines_table = timed(phases, "split into lines", ingest_module.lines_table)
    original = store.transaction

    @contextmanager
    def transaction() -> Iterator[duckdb.DuckDBPyConnection]:
        with original() as con:
            start = time.perf_counter()
            yield con
            body_done = time.perf_counter()
        phases["insert + offsets"] += body_done - start
        phases["commit"] += time.perf_counter() - body_done

    store.transaction = transaction


def ingest_trial(run: Path) -> tuple[float, int, int, dict[str, float]]:
    """(seconds, rows, bytes, phase seconds) of one ingest into an empty store."""
    for leftover in run.glob("bedside.duckdb*"):
        leftover.unlink()
    phases: dict[str, float] = defaultdict(float)
    original_lines_table = ingest_module.lines_table
    try:
        with Store.open(RunLayout(run).store) as store:
            collector = Collector(run, store)
            instrument(collector, store, phases)
            start = time.perf_counter()
            result = collector.ingest_available()
            elapsed = time.perf_counter() - start
            rows = store.cursor().execute("SELECT count(*) FROM rank_steps").fetchall()[0][0]
    finally:
        ingest_module.lines_table = original_lines_table
    if result.rejected:
        print(f"warning: {result.rejected} lines rejected")
    return elapsed, rows, result.bytes, dict(phases)


def report_bulk(trials: list[tuple[float, int, int, dict[str, float]]]) -> None:
    print(f"{'trial':>5} {'seconds':>8} {'rank_step rows':>15} {'rows/s':>11} {'MB/s':>7}")
    for i, (elapsed, rows, size, _) in enumerate(trials, 1):
        print(f"{i:>5} {elapsed:>8.2f} {rows:>15,} {rows / elapsed:>11,.0f} {size / elapsed / 1e6:>7.1f}")
    elapsed, _, _, phases = min(trials, key=lambda t: t[0])
    print(f"time split of the fastest trial ({elapsed:.2f} s):")
    for name, seconds in phases.items():
        print(f"  {name:<22} {seconds:>7.2f} s {100 * seconds / elapsed:>5.1f} %")
    other = elapsed - sum(phases.values())
    print(f"  {'other':<22} {other:>7.2f} s {100 * other / elapsed:>5.1f} %")
    print(f"target: >= {TARGET_ROWS_PER_S:,} rows/s")


# -- live latency -----------------------------------------------------------
def append_live_records(path: Path, written: list[tuple[int, float]], done: threading.Event) -> None:
    """Append one record every LIVE_INTERVAL_S; note (end offset, time written) of each."""
    rng = random.Random(1)
    with open(path, "a") as fh:
        for step in range(1, LIVE_RECORDS + 1):
            fh.write(rank_step_line(0, step, step, time.time(), rng))
            fh.flush()
            written.append((fh.tell(), time.perf_counter()))
            time.sleep(LIVE_INTERVAL_S)
    done.set()


def committed_offset(cursor: duckdb.DuckDBPyConnection, relative: str) -> int:
    rows = cursor.execute("SELECT committed_offset FROM sources WHERE path = ?", [relative]).fetchall()
    return rows[0][0] if rows else 0


def poll_visibility(
    store: Store, relative: str, written: list[tuple[int, float]], done: threading.Event
) -> list[float]:
    """Delay of each written record until the store's committed offset covers it."""
    cursor = store.cursor()
    delays: list[float] = []
    deadline = None
    while len(delays) < LIVE_RECORDS:
        offset = committed_offset(cursor, relative)
        now = time.perf_counter()
        while len(delays) < len(written) and written[len(delays)][0] <= offset:
            delays.append(now - written[len(delays)][1])
        if done.is_set():
            deadline = deadline or now + 2 * DEFAULT_RESCAN_EVERY_S + 5
            if now > deadline:
                break
        time.sleep(POLL_S)
    return delays


def live_latency(run: Path) -> list[float]:
    shutil.rmtree(run, ignore_errors=True)
    layout = RunLayout(run)
    layout.telemetry.mkdir(parents=True)
    write_run_info(layout, RunInfo(name="bench-live", world_size=1))
    path = layout.rank_file(0)
    path.write_text(rank_info_line(0, 1, time.time()))
    with Store.open(layout.store) as store:
        follower = Follower(Collector(run, store))
        stop, done, written = threading.Event(), threading.Event(), []
        follow = threading.Thread(target=follower.run, args=(stop,), daemon=True)
        follow.start()
        time.sleep(0.5)
        writer = threading.Thread(target=append_live_records, args=(path, written, done), daemon=True)
        writer.start()
        delays = poll_visibility(store, layout.relative(path), written, done)
        stop.set()
        follower.wake()
        follow.join()
        writer.join()
    return delays


def report_live(delays: list[float]) -> None:
    ms = np.array(delays) * 1000
    print(
        f"live: {len(ms)} of {LIVE_RECORDS} records visible (one every {LIVE_INTERVAL_S * 1000:.0f} ms, "
        f"rescan every {DEFAULT_RESCAN_EVERY_S:g} s)"
    )
    if len(ms):
        p50, p95 = np.percentile(ms, [50, 95])
        print(f"  write -> committed in store: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {ms.max():.1f} ms")
    print(f"target: p95 <= {TARGET_P95_S * 1000:.0f} ms")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64, help="rank files in the bulk run")
    parser.add_argument("--steps", type=int, default=20_000, help="rank_step records per rank")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "bedside-bench-ingest",
        help="where the generated run is cached",
    )
    parser.add_argument("--trials", type=int, default=3, help="bulk ingests from an empty store")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    run = args.workdir / f"run-{args.ranks}x{args.steps}"
    start = time.perf_counter()
    generate_run(run, args.ranks, args.steps)
    size = sum(p.stat().st_size for p in RunLayout(run).source_files())
    print(
        f"run {run}: {args.ranks} ranks x {args.steps} steps, {size / 1e6:.0f} MB "
        f"(ready in {time.perf_counter() - start:.1f} s, not timed); duckdb {duckdb.__version__}, "
        f"{os.cpu_count()} CPUs"
    )
    report_bulk([ingest_trial(run) for _ in range(args.trials)])
    report_live(live_latency(args.workdir / "live-run"))


if __name__ == "__main__":
    main()
