"""The fault harness at full size: kills, fuzzing and attacks, with the figures docs/reliability.md reports.

The same tests CI runs (``tests/test_crash.py``, ``tests/test_kill_harness.py``, ``tests/test_soak.py``,
``tests/test_fuzz_ingest.py``, ``tests/test_import_hostile.py``, ``tests/test_console.py``, the SQL page in a
browser), sized up through their environment variables, each run as its own pytest (one process, no xdist) and
timed:

    python bench/harness.py            # CI's size, as a check that the harness itself runs
    python bench/harness.py --long     # the full figures (about an hour on 2 cores)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from sql_attacks import ATTACKS  # noqa: E402  (the corpus lives with the tests)


@dataclass(frozen=True)
class Stage:
    """One promise checked by one pytest selection, at CI's size and at the long size."""

    promise: str
    tests: tuple[str, ...]
    ci: dict[str, int | str]
    long: dict[str, int | str]
    figure: str  # how the figure reads, formatted with the sizes used


STAGES = (
    Stage(
        "collector killed: every line once",
        ("tests/test_crash.py",),
        {"BEDSIDE_HARNESS_COLLECT_KILLS": 6, "BEDSIDE_HARNESS_FOLLOW_KILLS": 2},
        {"BEDSIDE_HARNESS_COLLECT_KILLS": 200, "BEDSIDE_HARNESS_FOLLOW_KILLS": 50},
        "{BEDSIDE_HARNESS_COLLECT_KILLS} batch (half by a failpoint before a commit) + {BEDSIDE_HARNESS_FOLLOW_KILLS} follow SIGKILLs",
    ),
    Stage(
        "watch and serve killed: rows, incidents and alerts once",
        ("tests/test_kill_harness.py", "-k", "owner"),
        {"BEDSIDE_HARNESS_KILLS": 3},
        {"BEDSIDE_HARNESS_KILLS": 40},
        "{BEDSIDE_HARNESS_KILLS} SIGKILLs each of watch and serve",
    ),
    Stage(
        "trainer rank killed: each step once per timeline",
        ("tests/test_kill_harness.py", "-k", "trainer"),
        {"BEDSIDE_HARNESS_TRAINER_KILLS": 2},
        {"BEDSIDE_HARNESS_TRAINER_KILLS": 10},
        "{BEDSIDE_HARNESS_TRAINER_KILLS} SIGKILLs of rank 1, each resumed",
    ),
    Stage(
        "1,024 live ranks followed in real time with flat memory",
        ("tests/test_soak.py",),
        {"BEDSIDE_SOAK_SECONDS": 30},
        {"BEDSIDE_SOAK_SECONDS": 60},
        "1,024 ranks for {BEDSIDE_SOAK_SECONDS} s",
    ),
    Stage(
        "hostile lines, file names, run.json, control requests and audit trails refused with a reason",
        ("tests/test_fuzz_ingest.py", "tests/test_fuzz_control.py", "tests/test_fuzz_audit.py"),
        {"BEDSIDE_FUZZ_EXAMPLES": 0},
        {"BEDSIDE_FUZZ_EXAMPLES": 5000},
        "hypothesis examples per property: {BEDSIDE_FUZZ_EXAMPLES} (0: the tests' own default)",
    ),
    Stage(
        "hostile imports refused with a reason, nothing written",
        ("tests/test_import_hostile.py", "-k", "mutated"),
        {"BEDSIDE_FUZZ_EXAMPLES": 0},
        {"BEDSIDE_FUZZ_EXAMPLES": 2000},
        "mutations of a real file per importer (7 readers, W&B records reframed too): "
        "{BEDSIDE_FUZZ_EXAMPLES} (0: the tests' own default)",
    ),
    Stage(
        "SQL attacks refused, the store unchanged",
        (
            "tests/test_console.py",
            "tests/test_dashboard_sql.py",
            "tests/test_dashboard_browser.py",
            "-k",
            "attack or refuse",
        ),
        {"BEDSIDE_BROWSER_ATTACKS": "the first of each class"},
        {"BEDSIDE_BROWSER_ATTACKS": "all"},
        f"{len(ATTACKS)} attacks x (console, bedside query on raw telemetry, the page's preview and CSV),"
        " and typed into the page in Chromium: {BEDSIDE_BROWSER_ATTACKS}",
    ),
)


def run_stage(stage: Stage, sizes: dict[str, int | str]) -> tuple[bool, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **{k: str(v) for k, v in sizes.items() if v}}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *stage.tests],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-2000:], file=sys.stderr)
    return done.returncode == 0, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="the full sizes, for docs/reliability.md")
    args = parser.parse_args()
    print("| promise | what was done | result | seconds |\n|---|---|---|---|")
    failed = 0
    for stage in STAGES:
        sizes = stage.long if args.long else stage.ci
        ok, seconds = run_stage(stage, sizes)
        failed += not ok
        print(
            f"| {stage.promise} | {stage.figure.format(**sizes)} | {'held' if ok else 'FAILED'} | {seconds:.0f} |",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
