"""``bedside serve``: own the stores of a run (or of every run in a directory), follow, detect and alert,
and serve the on-call dashboard from the same process."""

from __future__ import annotations

import argparse
from pathlib import Path

from bedside.collectors.errors import BedsideError

from .dashboard.auth import TOKEN_ENV
from .dashboard.server import DEFAULT_HOST, DEFAULT_PORT
from .options import positive_seconds


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside serve``."""
    p = commands.add_parser(
        "serve",
        help="the on-call dashboard, with the collector, detectors and alerts",
        description="Own the store of RUN (or of every run in RUNS_DIR): follow it, run the "
        "detectors, send alerts, and serve the Streamlit dashboard "
        "(docs/dashboard.md). Actions are unlocked by the token in "
        "$BEDSIDE_OPERATOR_TOKEN; without it the dashboard is read-only.",
    )
    p.add_argument("target", type=Path, metavar="RUN|RUNS_DIR", help="a run directory, or a directory of runs")
    p.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}: this machine only)"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="alert configuration (default: bedside.toml of the run, else of the directory holding it)",
    )
    p.add_argument(
        "--refresh",
        type=positive_seconds,
        default=5.0,
        metavar="S",
        help="seconds between live refreshes of the panels (default 5)",
    )
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Take the stores, then hand the main thread to Streamlit's server until SIGINT or SIGTERM."""
    from bedside.collectors.controlkey import KEY_ENV, hold_control_key

    from .dashboard.server import serve_dashboard
    from .serve_secrets import take_secrets

    if not args.target.is_dir():
        raise BedsideError(f"no such directory: {args.target}")
    secrets = take_secrets(start_again=args.command_line)
    if KEY_ENV in secrets:
        hold_control_key(secrets[KEY_ENV])
    serve_dashboard(
        args.target,
        host=args.host,
        port=args.port,
        config=args.config,
        refresh_s=args.refresh,
        token=secrets.get(TOKEN_ENV, ""),
    )
    return 0
