"""What a rank file with no newline costs the collector: CPU and peak memory of a few ingest passes.

Run:  python bench/long_line.py [--mib 256] [--passes 3] [--workdir DIR]

A run has two rank files: rank 0 writes one good record per pass, rank 1 holds one good
record and then MIB MiB with no newline (a writer gone wrong, or a hostile file). Each
pass appends rank 0's record and calls ``Collector.ingest_available()``; the script
prints the CPU seconds of each pass, the process's peak RSS, and whether rank 0's new
record was in the store after its pass. Before the line-length bound, each pass read
the whole file again looking for a newline; now the line is rejected once, from its
offset, and the file is not read again.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store


def record(rank: int, step: int) -> bytes:
    line = {"kind": "heartbeat", "time": 1_700_000_000.0 + step, "rank": rank, "step": step, "timeline": 0, "seq": step}
    return (json.dumps(line) + "\n").encode()


def build(run: Path, mib: int) -> RunLayout:
    layout = RunLayout(run)
    layout.telemetry.mkdir(parents=True)
    with open(layout.rank_file(1), "wb") as fh:
        fh.write(record(1, 0) + b'{"kind":"log","message":"')
        block = b"x" * (1 << 20)
        for _ in range(mib):
            fh.write(block)
    return layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB with no newline in rank 1's file")
    parser.add_argument("--passes", type=int, default=3, help="ingest passes, each after one new record of rank 0")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bedside-bench-long-line")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    layout = build(args.workdir / "run", args.mib)
    with Store.open(layout.store) as store:
        collector = Collector(layout.root, store)
        for step in range(args.passes):
            with open(layout.rank_file(0), "ab") as fh:
                fh.write(record(0, step))
            started = time.process_time()
            collector.ingest_available()
            cpu = time.process_time() - started
            seen = store.cursor().execute("SELECT count(*) FROM events WHERE rank = 0 AND step = ?", [step]).fetchone()
            print(f"pass {step + 1}: {cpu:.2f} CPU-s, rank 0's record of this pass ingested: {bool(seen and seen[0])}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB for a {args.mib} MiB line with no newline")
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
