"""``bedside watch``: the headless owner of a run's store (collector, detectors and notifiers)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bedside.collectors.defaults import DEFAULT_RESCAN_EVERY_S
from bedside.collectors.layout import RunLayout, require_run_dir

from .options import positive_seconds

DEFAULT_DRAIN_S = 10.0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside watch``."""
    p = commands.add_parser(
        "watch",
        help="follow a run headless: ingest, detect and alert (no dashboard)",
        description="Own RUN's store: follow its telemetry, run the detectors after every batch "
        "and send each incident to the notifiers of bedside.toml (docs/alerts.md). "
        "Without a configuration, incidents go to the log (stderr).",
    )
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="alert configuration (default: bedside.toml in RUN, else in the directory holding RUN)",
    )
    p.add_argument(
        "--until-finished",
        action="store_true",
        help="exit once every rank has written run_end and all is ingested and detected",
    )
    p.add_argument(
        "--rescan-every",
        type=positive_seconds,
        default=DEFAULT_RESCAN_EVERY_S,
        metavar="S",
        help=f"seconds (> 0) between safety-net rescans (default {DEFAULT_RESCAN_EVERY_S:g})",
    )
    p.add_argument(
        "--drain",
        type=positive_seconds,
        default=DEFAULT_DRAIN_S,
        metavar="S",
        help=f"on exit, keep delivering pending alerts for up to S seconds (default {DEFAULT_DRAIN_S:g}); "
        "what is left is delivered when watch next runs",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output and no finding lines")
    p.set_defaults(handler=cmd_watch)


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow, detect and alert until SIGINT or SIGTERM (or, with --until-finished, the run's end).

    A failure while following (a full disk, a damaged store) is logged, announced to the notifiers and followed
    by a restart with backoff (``RunOwner``): watch keeps going until it is stopped.
    """
    from .output import Progress, warn
    from .service.alerts.config import settings_for
    from .service.owner import OwnerSettings, RunOwner

    layout = RunLayout(require_run_dir(args.run))
    settings = OwnerSettings(
        alerts=settings_for(args.config, layout.root, default_log=True),
        rescan_every_s=args.rescan_every,
        quiet=args.quiet,
    )
    progress = Progress(quiet=args.quiet)
    owner = RunOwner(layout.root, settings, warn=warn, on_pass=progress.update)
    try:
        owner.follow_until_signalled(until_finished=args.until_finished)
    finally:
        left = owner.close(drain_s=args.drain)
    progress.report("done:")
    if left:
        warn(
            f"{left} alert message{'s are' if left > 1 else ' is'} still pending: delivered when bedside "
            f"watch or serve next runs on {layout.root}"
        )
    return 0
