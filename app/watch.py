"""``bedside watch``: the headless owner of a run's store (collector, detectors and notifiers), and the
follow loop of ``bedside collect --follow`` (which stops with an error on a failure, where watch starts again)."""
from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from bedside.collectors.follow import DEFAULT_RESCAN_EVERY_S, Follower
from bedside.collectors.ingest import Collector, PassResult
from bedside.collectors.layout import RunLayout, require_run_dir

from .alert import alert_settings
from .detect import LiveDetection
from .output import Progress, positive_seconds, warn
from .owner import RunOwner

DEFAULT_DRAIN_S = 10.0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside watch``."""
    p = commands.add_parser("watch", help="follow a run headless: ingest, detect and alert (no dashboard)",
                            description="Own RUN's store: follow its telemetry, run the detectors after every batch "
                                        "and send each incident to the notifiers of bedside.toml (docs/alerts.md). "
                                        "Without a configuration, incidents go to the log (stderr).")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="alert configuration (default: bedside.toml in RUN, else in the directory holding RUN)")
    p.add_argument("--until-finished", action="store_true",
                   help="exit once every rank has written run_end and all is ingested and detected")
    p.add_argument("--rescan-every", type=positive_seconds, default=DEFAULT_RESCAN_EVERY_S, metavar="S",
                   help=f"seconds (> 0) between safety-net rescans (default {DEFAULT_RESCAN_EVERY_S:g})")
    p.add_argument("--drain", type=positive_seconds, default=DEFAULT_DRAIN_S, metavar="S",
                   help=f"on exit, keep delivering pending alerts for up to S seconds (default {DEFAULT_DRAIN_S:g}); "
                        "what is left is delivered when watch next runs")
    p.add_argument("--quiet", action="store_true", help="no progress output and no finding lines")
    p.set_defaults(handler=cmd_watch)


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow, detect and alert until SIGINT or SIGTERM (or, with --until-finished, the run's end).

    A failure while following (a full disk, a damaged store) is logged, announced to the notifiers and followed
    by a restart with backoff (``RunOwner``): watch keeps going until it is stopped.
    """
    layout = RunLayout(require_run_dir(args.run))
    settings = alert_settings(args.config, layout.root, default_log=True)
    progress = Progress(quiet=args.quiet)
    owner = RunOwner(layout.root, settings, warn=warn, rescan_every_s=args.rescan_every, quiet=args.quiet,
                     on_pass=progress.update)
    stop = threading.Event()
    stop_on_signals(stop, owner.wake)
    try:
        owner.follow(stop, until_finished=args.until_finished)
    finally:
        left = owner.close(drain_s=args.drain)
    progress.report("done:")
    if left:
        warn(f"{left} alert message{'s are' if left > 1 else ' is'} still pending: delivered when bedside "
             f"watch or serve next runs on {layout.root}")
    return 0


def stop_on_signals(stop: threading.Event, wake: Callable[[], None]) -> None:
    """SIGINT and SIGTERM set ``stop`` and ``wake`` the follower."""
    def request_stop(signum: int, frame: object) -> None:
        stop.set()
        wake()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def follow_until_stopped(collector: Collector, progress: Progress, live: LiveDetection | None, *,
                         rescan_every_s: float, until_finished: bool) -> None:
    """Follow the run, detecting as it goes, until SIGINT or SIGTERM (or, when asked, the run's end)."""
    stop = threading.Event()

    def on_pass(result: PassResult) -> None:
        progress.update(result)
        if live:
            live.update(result)

    follower = Follower(collector, rescan_every_s=rescan_every_s, on_pass=on_pass, warn=warn,
                        **({"on_idle": live.tick} if live else {}))
    stop_on_signals(stop, follower.wake)
    follower.run(stop, until_finished=until_finished)
    if live and follower.run_ended():
        live.finish()
    progress.report("done:")
