"""``bedside collect``: ingest a run's telemetry into its store, once or following the run."""

from __future__ import annotations

import argparse
from pathlib import Path

from bedside.collectors.defaults import DEFAULT_BATCH_BYTES, DEFAULT_RESCAN_EVERY_S
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout, require_run_dir

from .options import integer_in, positive_seconds

MAX_BATCH_MB = 1024


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside collect``."""
    p = commands.add_parser(
        "collect",
        help="ingest a run's telemetry into its store (RUN/bedside.duckdb)",
        description="Ingest every rank file of RUN into RUN/bedside.duckdb, exactly once.",
    )
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--follow", action="store_true", help="keep ingesting as the run writes (file events + rescans)")
    p.add_argument(
        "--until-finished",
        action="store_true",
        help="with --follow: exit once every rank has written run_end and all is ingested",
    )
    p.add_argument(
        "--rescan-every",
        type=positive_seconds,
        default=DEFAULT_RESCAN_EVERY_S,
        metavar="S",
        help=f"with --follow: seconds (> 0) between safety-net rescans (default {DEFAULT_RESCAN_EVERY_S:g})",
    )
    p.add_argument(
        "--batch-mb",
        type=integer_in(1, MAX_BATCH_MB),
        default=DEFAULT_BATCH_BYTES >> 20,
        metavar="MB",
        help=f"most megabytes ingested per transaction, 1 to {MAX_BATCH_MB} (default {DEFAULT_BATCH_BYTES >> 20})",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="move the store aside (to bedside.duckdb.damaged-TIME) and ingest the telemetry again: the "
        "recovery for a damaged store (docs/cli.md says what is rebuilt and what is lost)",
    )
    p.add_argument(
        "--no-detect",
        dest="detect",
        action="store_false",
        help="with --follow: do not run the detectors (by default they run after every batch)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=cmd_collect)


def cmd_collect(args: argparse.Namespace) -> int:
    """Ingest what the run holds now, or follow it until stopped or finished."""
    from bedside.collectors.ingest import Collector
    from bedside.collectors.store import Store, move_aside

    from .output import Progress, warn
    from .service.owner import OwnerSettings, RunOwner
    from .service.schema import SCHEMAS

    if args.until_finished and not args.follow:
        raise BedsideError("--until-finished needs --follow")
    layout = RunLayout(require_run_dir(args.run))
    progress = Progress(quiet=args.quiet)
    if args.rebuild and (aside := move_aside(layout.store)):
        warn(f"moved the store aside to {aside.name}; rebuilding it from the telemetry")
    if args.follow:
        settings = OwnerSettings(
            rescan_every_s=args.rescan_every,
            batch_bytes=args.batch_mb << 20,
            detect=args.detect,
            quiet=args.quiet,
            restart=False,
        )
        owner = RunOwner(layout.root, settings, warn=warn, on_pass=progress.update)
        try:
            owner.follow_until_signalled(until_finished=args.until_finished)
        finally:
            owner.close()
    else:
        with Store.open(layout.store, schemas=SCHEMAS) as store:
            Collector(layout.root, store, batch_bytes=args.batch_mb << 20, warn=warn).ingest_available(
                on_pass=progress.update
            )
    progress.report("done:")
    return 0
