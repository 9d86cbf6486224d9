"""``bedside demo``: train ``tiny_cpu`` on two ranks (``bedside train``) with one fault of each kind, follow
the run live into its store, and print what the store shows of each incident."""

from __future__ import annotations

import argparse
import importlib
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bedside.collectors.errors import BedsideError

from . import train
from .dashboard.auth import TOKEN_ENV
from .dashboard.server import DEFAULT_PORT
from .fault_plan import MIN_STEPS, DemoFaults
from .options import integer_in

if TYPE_CHECKING:
    import pandas as pd

    from bedside.collectors.store import Store

    from .service.alerts.config import AlertSettings
    from .service.owner import RunOwner

DEFAULT_STEPS = 200
SERVE_STEPS = 3000
ALERT_DRAIN_S = 15.0
"""How long the demo waits, once training ends, for its alert messages to be delivered."""
FOLLOWER_NICENESS = 10
"""How far this process (collector and detectors) steps back for the training ranks: on a two-core
machine it would otherwise slow one rank enough to be seen as a straggler."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``bedside demo`` to the CLI's sub-commands."""
    p = commands.add_parser(
        "demo",
        help="train a small model with injected faults, follow it into a store, query it",
        description="Train tiny_cpu on two ranks (bedside train) with one fault of each kind (a straggler, a "
        "bad data shard, bit flips in a gradient and in a replica, a NaN), follow "
        "the run live into its store, and print what the store shows.",
    )
    p.add_argument(
        "--out", type=Path, default=Path("bedside-demo"), help="folder for the demo run (default bedside-demo)"
    )
    p.add_argument(
        "--steps",
        type=integer_in(MIN_STEPS),
        metavar="N",
        help=f"training steps, at least {MIN_STEPS} (default {DEFAULT_STEPS}; {SERVE_STEPS} with --serve, "
        "a few minutes, time to act on the run)",
    )
    p.add_argument("--nproc", type=integer_in(2, 8), default=2, metavar="N", help="ranks, 2 to 8 (default 2)")
    p.add_argument(
        "--crash-rank",
        type=integer_in(0),
        metavar="R",
        help="also make rank R crash halfway through (the demo then fails and says so)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="instead of printing a summary, serve the dashboard on the live run (bedside serve), with an "
        "operator token for its actions printed at start; stop with Ctrl-C",
    )
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"with --serve: the dashboard's port (default {DEFAULT_PORT})"
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="alert configuration: send the demo's incidents to its notifiers (default: bedside.toml in "
        "--out, if there is one; docs/alerts.md)",
    )
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Train with the fault plan, follow the run into its store, and print each incident's evidence."""
    from .output import print_frame
    from .service.alerts.config import settings_for

    if args.crash_rank is not None and args.crash_rank >= args.nproc:
        raise BedsideError(f"--crash-rank {args.crash_rank} is not one of the {args.nproc} ranks")
    steps = args.steps or (SERVE_STEPS if args.serve else DEFAULT_STEPS)
    faults = DemoFaults(steps, crash_rank=args.crash_rank)
    run_dir = args.out / time.strftime("run-%Y%m%d-%H%M%S")
    settings = settings_for(args.config, run_dir)
    run_dir.mkdir(parents=True)
    print(
        f"training tiny_cpu on {args.nproc} ranks for {steps} steps into {run_dir}; injecting:\n  "
        + "\n  ".join(faults.specs()),
        file=sys.stderr,
    )
    if args.serve:
        return _serve_live(run_dir, args, steps, faults)
    with _start_training(run_dir, args.nproc, steps, faults.specs()) as training:
        os.nice(FOLLOWER_NICENESS)  # the ranks started at normal priority; on a small machine they come first
        owner = follow_until_exit(run_dir, training, settings)
        try:
            if training.returncode:
                raise BedsideError(
                    f"training exited with code {training.returncode}; what the run wrote is in "
                    f'its store, see: {_command_name()} query {run_dir} "SELECT * FROM run"'
                )
            for title, read in summary_tables(faults, alerts=bool(settings.notifiers)):
                print(f"\n== {title}")
                print_frame(read(owner.store), "table")
        finally:
            owner.close()
    print(f'\nexplore: {_command_name()} query {run_dir} "SELECT * FROM metrics LIMIT 20"')
    print(f"explore: {_command_name()} serve {run_dir}   (the dashboard, at http://127.0.0.1:8501)")
    return 0


def _serve_live(run_dir: Path, args: argparse.Namespace, steps: int, faults: DemoFaults) -> int:
    """Train in the background while ``bedside serve`` owns the run; the training stops with the server."""
    from .dashboard.server import serve_dashboard

    importlib.import_module("streamlit.web.bootstrap")  # the server's heavy imports, before the ranks start:
    importlib.import_module("plotly.graph_objects")  # on a small machine they would slow one rank down
    token = os.environ.get(TOKEN_ENV) or secrets.token_hex(8)
    print(
        f"dashboard: http://127.0.0.1:{args.port}  (operator token for actions: {token}); Ctrl-C stops it all",
        file=sys.stderr,
    )
    keep_every_checkpoint = ("--keep-checkpoints", str(steps))  # a rewind may go back to any of them
    with _start_training(run_dir, args.nproc, steps, faults.specs(), keep_every_checkpoint) as training:
        threading.Thread(target=training.communicate, name="training-output", daemon=True).start()
        os.nice(FOLLOWER_NICENESS)
        try:
            serve_dashboard(run_dir, host="127.0.0.1", port=args.port, config=args.config, refresh_s=2.0, token=token)
        finally:
            if training.poll() is None:
                training.terminate()
    return 0


Summary = tuple[str, Callable[["Store"], "pd.DataFrame"]]
"""One table of the demo's summary: its title, and what reads it from the run's store."""


def _named(name: str, **params: Any) -> Callable[[Store], pd.DataFrame]:
    return lambda store: store.fetch_named(name, params)


def summary_tables(faults: DemoFaults, *, alerts: bool = False) -> list[Summary]:
    """What the demo prints, aimed at each injected fault: (title, reader) pairs."""
    from .service.scorecard import SCORE_MARGIN, demo_scorecard

    first, last = faults.straggler_window
    sent: list[Summary] = [("alert messages and their delivery", _named("demo_alerts"))] if alerts else []
    return [
        ("run", _named("demo_run")),
        ("incidents the detectors opened (bedside detect RUN lists every finding)", _named("demo_incidents")),
        *sent,
        ("each injected fault and the findings that caught it", lambda store: demo_scorecard(store, SCORE_MARGIN)),
        ("held-out loss against compute (above_floor: nats above the language's entropy)", _named("demo_evals")),
        (
            f"bad data shard from step {faults.bad_shard_step}: the loss jumps",
            _named("demo_loss_spike", spike_step=faults.bad_shard_step),
        ),
        (
            f"straggler, steps {first}-{last}: rank {faults.straggler_rank}'s own work slows"
            " (own_ms against own_before_ms)",
            _named("demo_rank_times", first=first, last=last),
        ),
        (
            f"bit flip in rank 1's gradient at step {faults.grad_flip_step}",
            _named("demo_grad_norms", step=faults.grad_flip_step),
        ),
        (
            f"bit flip in rank 0's parameters at step {faults.param_flip_step}: replicas disagree",
            _named("demo_checksums", from_step=faults.param_flip_step),
        ),
        ("updates the trainer skipped", _named("demo_skipped")),
        ("ground truth: what was injected", _named("demo_ground_truth")),
    ]


def _start_training(
    run_dir: Path, nproc: int, steps: int, specs: list[str], extra: tuple[str, ...] = ()
) -> subprocess.Popen:
    """``bedside train`` with the fault plan, as a child process."""
    options = ["--out", str(run_dir), "--nproc", str(nproc), "--steps", str(steps), *extra]
    options += [option for spec in specs for option in ("--inject", spec)]
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    return subprocess.Popen(
        train.train_command(options), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def follow_until_exit(run_dir: Path, training: subprocess.Popen, alerts: AlertSettings) -> RunOwner:
    """Own the run, detecting and alerting as it goes, until it ends or the training process exits; then
    ingest the rest and give the alerts time to be delivered. The owner, its store open for the summary."""
    from .output import Progress, warn
    from .service.owner import OwnerSettings, RunOwner

    progress = Progress()
    settings = OwnerSettings(alerts=alerts, rescan_every_s=0.5, quiet=False, restart=False)
    owner = RunOwner(run_dir, settings, warn=warn, on_pass=progress.update)
    try:
        stop = threading.Event()
        watcher = threading.Thread(
            target=_stop_when_exited, args=(training, stop, owner), name="training-watcher", daemon=True
        )
        watcher.start()
        owner.follow(stop, until_finished=True)
        watcher.join()
        owner.finish()
        progress.report("done:")
        left = owner.drain(ALERT_DRAIN_S)
    except BaseException:
        owner.close()
        raise
    if left:
        warn(
            f"{left} alert message{'s' if left > 1 else ''} not delivered; see: {_command_name()} query "
            f'{run_dir} "SELECT * FROM alerts"'
        )
    return owner


def _stop_when_exited(training: subprocess.Popen, stop: threading.Event, owner: RunOwner) -> None:
    """Wait for the training process (draining its stderr), then stop the owner's follower."""
    training.communicate()
    stop.set()
    owner.wake()


def _command_name() -> str:
    """How the user can run bedside again: ``bedside`` when that is on PATH, else the path they typed."""
    launched = Path(sys.argv[0])
    on_path = shutil.which("bedside")
    if launched.name != "bedside" or (on_path and Path(on_path).resolve() == launched.resolve()):
        return "bedside"
    return str(launched)
