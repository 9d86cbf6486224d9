"""``bedside runs``: list the runs in a directory with their status, from their files."""

from __future__ import annotations

import argparse
from pathlib import Path

from bedside.collectors.errors import BedsideError

from .options import FORMATS


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside runs``."""
    p = commands.add_parser(
        "runs",
        help="list the runs in a directory with their status",
        description="List the runs in DIR (or DIR itself) from their files.",
    )
    p.add_argument("dir", type=Path, help="a runs directory, or one run")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.set_defaults(handler=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    """List the runs in a directory with their status, from their files."""
    import pandas as pd

    from bedside.collectors.runs import find_runs, summarize_run

    from .output import print_frame

    if not args.dir.is_dir():
        raise BedsideError(f"no such directory: {args.dir}")
    runs = [summarize_run(path) for path in find_runs(args.dir)]
    if not runs:
        raise BedsideError(f"no runs found in {args.dir}")
    frame = pd.DataFrame([vars(r) for r in runs])
    frame["last_seen"] = pd.to_datetime(frame["last_seen"], unit="s", utc=True).dt.floor("s")
    frame["path"] = frame["path"].astype(str)
    print_frame(frame, args.format)
    return 0
