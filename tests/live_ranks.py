"""Many ranks writing live, and a collector with detectors following them: lag in steps and memory.

The writer is a separate process (``python tests/live_ranks.py RUN RANKS SECONDS``): every second it appends
one ``rank_step`` record to each of RANKS files (opened, appended, closed, as a trainer's writer thread does
on a shared filesystem) and rank 0's ``step`` record, then prints the step it finished. ``follow_live_ranks``
follows the run in this process as ``bedside collect --follow`` does (a Follower, detection after every
pass), and once a second samples how many steps the store is behind the writer and the process's RSS.
Used by ``tests/test_soak.py`` (CI's size) and ``bench/many_files.py`` (the full figures).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from bedside.app.service.detection import LiveDetection
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.follow import Follower
from bedside.collectors.format import RANK_STEP_METRICS, STEP_METRICS, encode_line
from bedside.collectors.ingest import Collector, PassResult
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

INGESTED_STEP = "SELECT count(*), min(newest) FROM (SELECT max(step) AS newest FROM rank_steps GROUP BY rank)"
ROWS = "SELECT count(*), count(DISTINCT (rank, step)) FROM rank_steps"
DRAIN_SAMPLES = 30


def rank_lines(rank: int, step: int, now: float) -> str:
    """What a rank writes in one step: its rank_step record, and rank 0's step record."""
    jitter = (rank * 7919 + step * 104729) % 1000 / 1e5
    times = (0.3 + jitter, 0.01, 0.22 + jitter, 0.05, 0.011, 1.0)
    envelope = {"time": now, "rank": rank, "step": step, "timeline": 0, "seq": step}
    text = encode_line({"kind": "rank_step", **envelope, "metrics": dict(zip(RANK_STEP_METRICS, times))})
    if rank == 0:
        values = (2.0 + 5.0 / (step + 1), 1.0, 3e-4, 4096.0, 1e12)
        text += encode_line({"kind": "step", **envelope, "seq": step + 1, "metrics": dict(zip(STEP_METRICS, values))})
    return text


def write_live_ranks(run: Path, ranks: int, seconds: int) -> None:
    """Append one step to every rank's file each second, for ``seconds`` steps (the writer process)."""
    layout = RunLayout(run)
    layout.telemetry.mkdir(parents=True, exist_ok=True)
    write_run_info(layout, RunInfo(name="live-ranks", world_size=ranks))
    start = time.time()
    for step in range(1, seconds + 1):
        for rank in range(ranks):
            with open(layout.rank_file(rank), "a") as fh:
                fh.write(rank_lines(rank, step, time.time()))
        print(step, flush=True)
        time.sleep(max(0.0, start + step - time.time()))


@dataclass
class LiveFigures:
    """Once a second: steps written, steps the store holds for every rank, RSS in MiB."""

    written: list[int] = field(default_factory=list)
    lag: list[int] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    passes: int = 0
    rows: int = 0
    distinct_rows: int = 0

    def settled_lag(self, skip: int) -> list[int]:
        """Lags after the first ``skip`` samples (the run's start, when files and detectors warm up)."""
        return self.lag[skip:]

    def rss_growth_mib(self, skip: int) -> float:
        """RSS at the end less RSS after ``skip`` samples."""
        return self.rss_mib[-1] - self.rss_mib[min(skip, len(self.rss_mib) - 1)]


def follow_live_ranks(run: Path, ranks: int, seconds: int) -> LiveFigures:
    """Follow ``ranks`` live writers for ``seconds`` steps with detection; the figures sampled once a second
    (and, once the writer is done, until the store holds its last step), and the rank_steps rows held."""
    writer = subprocess.Popen(
        [sys.executable, __file__, str(run), str(ranks), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    written = [0]
    reader = threading.Thread(target=_count_steps, args=(writer, written), daemon=True)
    reader.start()
    figures, stop = LiveFigures(), threading.Event()
    while not RunLayout(run).run_info.exists():
        time.sleep(0.05)
    with Store.open(RunLayout(run).store, schemas=SCHEMAS) as store:
        live = LiveDetection(store, quiet=True)

        def on_pass(result: PassResult) -> None:
            figures.passes += 1
            live.update(result)

        follower = Follower(Collector(run, store), on_pass=on_pass, on_idle=live.tick)
        follow = threading.Thread(target=follower.run, args=(stop,), daemon=True)
        follow.start()
        cursor = store.cursor()
        while writer.poll() is None:
            time.sleep(1.0)
            _sample(figures, cursor, ranks, written[0])
        for _ in range(DRAIN_SAMPLES):  # the writer is done: the store catches up with its last step
            if figures.lag[-1] == 0:
                break
            time.sleep(1.0)
            _sample(figures, cursor, ranks, written[0])
        figures.rows, figures.distinct_rows = cursor.execute(ROWS).fetchone() or (0, 0)
        stop.set()
        follower.wake()
        follow.join()
    reader.join()
    if writer.returncode != 0:
        raise RuntimeError(f"the live writer exited with {writer.returncode}")
    return figures


def _count_steps(writer: subprocess.Popen, written: list[int]) -> None:
    assert writer.stdout is not None
    for line in writer.stdout:
        written[0] = int(line)


def _sample(figures: LiveFigures, cursor: duckdb.DuckDBPyConnection, ranks: int, written: int) -> None:
    count, newest = cursor.execute(INGESTED_STEP).fetchone() or (0, None)
    ingested = newest if count == ranks else 0
    figures.written.append(written)
    figures.lag.append(written - int(ingested or 0))
    figures.rss_mib.append(_rss_mib())


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


if __name__ == "__main__":
    write_live_ranks(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
