"""``bedside demo``: a simulated 4-rank run, followed live into its store, then queried."""
from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

from bedside.collectors.errors import BedsideError
from bedside.collectors.follow import Follower
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

from .output import Progress, print_frame
from .simulate import Scenario, start_ranks

def summary_queries(s: Scenario) -> dict[str, str]:
    """What the demo prints from the store, aimed at the scenario's faults."""
    return {
        "run": "SELECT name, world_size, last_step, status FROM run",
        f"loss around the bad shard at step {s.spike_step}":
            "SELECT step, round(loss, 3) AS loss, round(grad_norm, 2) AS grad_norm, shards FROM step_metrics "
            f"WHERE step BETWEEN {s.spike_step - 2} AND {s.spike_step + 2} ORDER BY step",
        f"per-rank median times from step {s.straggler_from} (rank {s.straggler_rank} straggles)":
            "SELECT rank, host, round(median(compute_time) * 1000, 1) AS compute_ms, "
            "round(median(comm_time) * 1000, 1) AS comm_ms FROM rank_step_metrics "
            f"WHERE step >= {s.straggler_from} GROUP BY ALL ORDER BY rank",
        "non-finite values": "SELECT rank, step, local_grad_norm FROM rank_step_metrics "
                             "WHERE NOT isfinite(local_grad_norm)",
        "held-out evals": "SELECT step, name, round(value, 3) AS value, cum_flops FROM eval_scores "
                          "ORDER BY step, name",
    }


def add_parser(commands) -> None:
    p = commands.add_parser("demo", help="simulate a 4-rank run, follow it into a store, and query it",
                            description="Write a simulated 4-rank run (a loss spike, a straggler, a NaN), follow it "
                                        "live into its store, and print what the store shows.")
    p.add_argument("--out", type=Path, default=Path("bedside-demo"), help="folder for the demo run (default bedside-demo)")
    p.add_argument("--steps", type=int, default=300, help="simulated steps (default 300)")
    p.add_argument("--ranks", type=int, default=4, help="simulated ranks (default 4)")
    p.set_defaults(handler=cmd_demo)


def _command_name() -> str:
    """How the user can run bedside again: the full path when it is not on PATH."""
    launched = Path(sys.argv[0])
    return "bedside" if shutil.which("bedside") == str(launched) or not launched.is_absolute() else str(launched)


def cmd_demo(args: argparse.Namespace) -> int:
    run_dir = args.out / time.strftime("run-%Y%m%d-%H%M%S")
    try:
        scenario = Scenario.scaled(args.ranks, args.steps)
    except ValueError as exc:
        raise BedsideError(str(exc)) from exc
    print(f"simulating {scenario.ranks} ranks x {scenario.steps} steps into {run_dir}", file=sys.stderr)
    run_dir.mkdir(parents=True)
    procs = start_ranks(run_dir, scenario)
    progress = Progress()
    with Store.open(RunLayout(run_dir).store) as store:
        follower = Follower(Collector(run_dir, store), rescan_every_s=0.5, on_pass=progress.update)
        follower.run(threading.Event(), until_finished=True)
        progress.report("done:")
        for proc in procs:
            proc.join()
        for title, query in summary_queries(scenario).items():
            print(f"\n== {title}")
            print_frame(store.fetch_df(query), "table")
    print(f'\nexplore: {_command_name()} query {run_dir} "SELECT * FROM metrics LIMIT 20"')
    return 0
