"""``bedside ledger``: which hosts and ranks the incidents of the newest runs of a directory name."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bedside.collectors.errors import BedsideError

from .options import FORMATS, integer_in

DEFAULT_LAST = 50


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside ledger``."""
    p = commands.add_parser(
        "ledger",
        help="which hosts and ranks the incidents of the newest runs in a directory name",
        description="Count, per host, the runs and incidents of the newest runs in DIR that name its ranks, and "
        "the incidents suggesting its eviction; say how few hosts account for half of them.",
    )
    p.add_argument("dir", type=Path, help="a runs directory")
    p.add_argument(
        "--last", type=integer_in(1, 100_000), default=DEFAULT_LAST, help=f"newest runs (default {DEFAULT_LAST})"
    )
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.set_defaults(handler=cmd_ledger)


def cmd_ledger(args: argparse.Namespace) -> int:
    """Print the host ledger of the newest ``--last`` runs in ``dir``, and its concentration."""
    import pandas as pd

    from bedside.collectors.query import open_for_reading
    from bedside.collectors.runs import newest_runs

    from .dashboard.ledger import concentration, host_ledger
    from .output import print_frame, warn
    from .service.schema import SCHEMAS

    if not args.dir.is_dir():
        raise BedsideError(f"no such directory: {args.dir}")
    runs = newest_runs(args.dir)[: args.last]
    if not runs:
        raise BedsideError(f"no runs found in {args.dir}")
    ledgers, hosts = {}, set()
    for run in runs:
        view = open_for_reading(run, schemas=SCHEMAS)
        try:
            if view.source != "store":
                warn(f"{run.name}: its incidents are not known ({view.note}); counted without them")
            ledgers[run.name] = view.store.fetch_named("dash_ledger", {})
            hosts |= set(view.store.fetch_named("dash_hosts", {})["host"])
        finally:
            view.store.close()
    table = host_ledger(ledgers)
    print_frame(pd.DataFrame(table), args.format)
    if said := concentration(table, len(hosts)):
        print(f"{said}, over the newest {len(runs)} runs", file=sys.stderr)
    return 0
