"""``bedside demo``: a simulated multi-rank run, followed live into its store, then queried."""
from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from bedside.collectors.errors import BedsideError
from bedside.collectors.follow import Follower
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

from .output import Progress, integer_in, print_frame, warn
from .simulate import MIN_RANKS, MIN_STEPS, Scenario, start_ranks


def summary_queries(s: Scenario) -> list[tuple[str, str, dict[str, Any]]]:
    """(title, named query, parameters) of what the demo prints, aimed at the scenario's faults."""
    return [
        ("run", "demo_run", {}),
        (f"loss around the bad shard at step {s.spike_step}", "demo_loss_spike", {"spike_step": s.spike_step}),
        (f"per-rank median times from step {s.straggler_from} (rank {s.straggler_rank} straggles)",
         "demo_rank_times", {"straggler_from": s.straggler_from}),
        ("non-finite values", "demo_nonfinite", {}),
        ("held-out evals", "demo_evals", {}),
    ]


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``bedside demo`` to the CLI's sub-commands."""
    p = commands.add_parser("demo", help="simulate a 4-rank run, follow it into a store, and query it",
                            description="Write a simulated 4-rank run (a loss spike, a straggler, a NaN), follow it "
                                        "live into its store, and print what the store shows.")
    p.add_argument("--out", type=Path, default=Path("bedside-demo"), help="folder for the demo run (default bedside-demo)")
    p.add_argument("--steps", type=integer_in(MIN_STEPS), default=300, metavar="N",
                   help=f"simulated steps, at least {MIN_STEPS} (default 300)")
    p.add_argument("--ranks", type=integer_in(MIN_RANKS), default=4, metavar="N",
                   help=f"simulated ranks, at least {MIN_RANKS} (default 4)")
    p.add_argument("--crash-rank", type=integer_in(0), metavar="R",
                   help="make rank R die halfway through, as an OOM kill would (the demo then fails)")
    p.set_defaults(handler=cmd_demo)


def _command_name() -> str:
    """How the user can run bedside again: ``bedside`` when that is on PATH, else the path they typed."""
    launched = Path(sys.argv[0])
    on_path = shutil.which("bedside")
    if launched.name != "bedside" or (on_path and Path(on_path).resolve() == launched.resolve()):
        return "bedside"
    return str(launched)


def cmd_demo(args: argparse.Namespace) -> int:
    """``bedside demo``: simulate a run, follow it into its store, and print what the store shows."""
    run_dir = args.out / time.strftime("run-%Y%m%d-%H%M%S")
    try:
        scenario = Scenario.scaled(args.ranks, args.steps, crash_rank=args.crash_rank)
    except ValueError as exc:
        raise BedsideError(str(exc)) from exc
    print(f"simulating {scenario.ranks} ranks x {scenario.steps} steps into {run_dir}", file=sys.stderr)
    run_dir.mkdir(parents=True)
    procs = start_ranks(run_dir, scenario)
    with Store.open(RunLayout(run_dir).store) as store:
        follow_ranks(Collector(run_dir, store, warn=warn), procs)
        _check_exit_codes(procs, run_dir)
        for title, name, params in summary_queries(scenario):
            print(f"\n== {title}")
            print_frame(store.fetch_named(name, params), "table")
    print(f'\nexplore: {_command_name()} query {run_dir} "SELECT * FROM metrics LIMIT 20"')
    return 0


def follow_ranks(collector: Collector, procs: list[BaseProcess]) -> None:
    """Follow the run until it ends or every rank process has exited, then ingest what is left."""
    progress = Progress()
    stop = threading.Event()
    follower = Follower(collector, rescan_every_s=0.5, on_pass=progress.update, warn=warn)
    watcher = threading.Thread(target=_stop_when_exited, args=(procs, stop, follower), name="rank-watcher",
                               daemon=True)
    watcher.start()
    follower.run(stop, until_finished=True)
    watcher.join()
    collector.ingest_available(on_pass=progress.update)
    progress.report("done:")


def _stop_when_exited(procs: list[BaseProcess], stop: threading.Event, follower: Follower) -> None:
    """Wait for every rank process (the only thread that joins them), then stop the follower."""
    for proc in procs:
        proc.join()
    stop.set()
    follower.wake()


def _check_exit_codes(procs: list[BaseProcess], run_dir: Path) -> None:
    """Raise BedsideError naming every rank process that exited with a non-zero code."""
    failed = [f"rank {rank} exited with code {proc.exitcode}" for rank, proc in enumerate(procs) if proc.exitcode]
    if failed:
        raise BedsideError(f"{', '.join(failed)}; what the run wrote is in its store, see: "
                           f'{_command_name()} query {run_dir} "SELECT * FROM run"')
