"""How long the CLI takes to answer ``--help`` and ``--version``, side by side with ``import duckdb``.

Run:  python bench/cli_startup.py [--runs 30]

Each command runs RUNS times as a new process, in turns (one of each, then again), after two untimed rounds that
warm the page cache; the figure is the median wall time from spawn to exit. ``bedside`` is the installed console
script next to this Python (else ``python -m bedside.app.cli``). ``python -c pass`` is the interpreter's own start,
for reference. Target (docs/performance.md): ``--help`` and ``--version`` within 1.5x of ``import duckdb``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_RATIO = 1.5
BASELINE = "python -c 'import duckdb'"


def bedside_command() -> list[str]:
    """The ``bedside`` a user runs: the console script beside this interpreter, else the module."""
    script = Path(sys.executable).with_name("bedside")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "bedside.app.cli"]


def commands() -> dict[str, list[str]]:
    bedside = bedside_command()
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        BASELINE: [sys.executable, "-c", "import duckdb"],
        "bedside --help": [*bedside, "--help"],
        "bedside --version": [*bedside, "--version"],
    }


def wall_s(argv: list[str]) -> float:
    """Seconds from spawning ``argv`` to its exit (output discarded); an error if it fails."""
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def measure(runs: int, warm_up: int = 2) -> dict[str, list[float]]:
    """Wall times of every command, taken in turns so that a slow moment of the machine falls on all of them."""
    todo = commands()
    times: dict[str, list[float]] = {name: [] for name in todo}
    for round_ in range(warm_up + runs):
        for name, argv in todo.items():
            took = wall_s(argv)
            if round_ >= warm_up:
                times[name].append(took)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each command (default 30)")
    args = parser.parse_args()
    times = measure(args.runs)
    baseline = statistics.median(times[BASELINE])
    print(f"{args.runs} runs each, bedside as: {' '.join(bedside_command())}\n")
    print("| command | median ms | min ms | max ms | vs import duckdb |\n|---|---|---|---|---|")
    for name, taken in times.items():
        median = statistics.median(taken)
        print(
            f"| `{name}` | {median * 1e3:.0f} | {min(taken) * 1e3:.0f} | {max(taken) * 1e3:.0f} "
            f"| {median / baseline:.2f}x |"
        )
    worst = max(statistics.median(times[name]) for name in ("bedside --help", "bedside --version")) / baseline
    print(
        f"\ntarget: --help and --version within {TARGET_RATIO}x of import duckdb: "
        f"{'met' if worst <= TARGET_RATIO else 'NOT met'} ({worst:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
