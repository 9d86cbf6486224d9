"""``bedside serve``: own the stores of a run (or of every run in a directory), follow, detect and alert,
and serve the on-call dashboard from the same process."""
from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from bedside.collectors.errors import BedsideError
from bedside.detectors.alerts.config import find_config

from .alert import alert_settings
from .output import positive_seconds

DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside serve``."""
    p = commands.add_parser("serve", help="the on-call dashboard, with the collector, detectors and alerts",
                            description="Own the store of RUN (or of every run in RUNS_DIR): follow it, run the "
                                        "detectors, send alerts, and serve the Streamlit dashboard "
                                        "(docs/dashboard.md). Actions are unlocked by the token in "
                                        "$BEDSIDE_OPERATOR_TOKEN; without it the dashboard is read-only.")
    p.add_argument("target", type=Path, metavar="RUN|RUNS_DIR", help="a run directory, or a directory of runs")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="alert configuration (default: bedside.toml of the run, else of the directory holding it)")
    p.add_argument("--refresh", type=positive_seconds, default=5.0, metavar="S",
                   help="seconds between live refreshes of the panels (default 5)")
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Take the stores, then hand the main thread to Streamlit's server until SIGINT or SIGTERM."""
    if not args.target.is_dir():
        raise BedsideError(f"no such directory: {args.target}")
    serve_dashboard(args.target, host=args.host, port=args.port, config=args.config, refresh_s=args.refresh)
    return 0


def serve_dashboard(target: Path, *, host: str, port: int, config: Path | None, refresh_s: float) -> None:
    """Own the stores of ``target`` (following them) and serve the dashboard until the server stops."""
    from streamlit.web import bootstrap

    from .dashboard import registry

    config = config or find_config(target)  # settled once: the run may not be a run yet (demo --serve)
    alert_settings(config, target)  # a bad configuration stops us before anything starts
    os.environ.update({
        registry.TARGET_ENV: str(target.resolve()), registry.CONFIG_ENV: str(config or ""),
        registry.LIVE_ENV: "1", registry.REFRESH_ENV: str(refresh_s),
    })
    served = registry.desk()
    for run_dir in served.runs():
        if served.owner(run_dir) is None:
            print(f"bedside: {run_dir.name}: {served.refused[run_dir.resolve()][1]}; shown read-only", file=sys.stderr)
    stop = threading.Event()
    threading.Thread(target=served.adopt_runs, args=(stop,), name="adopt-runs", daemon=True).start()
    access = "actions unlocked by the operator token" if served.operator_token else "read-only (no operator token)"
    print(f"bedside: serving {target} at http://{host}:{port} ({access})", file=sys.stderr)
    flags = {"server_port": port, "server_address": host, "server_headless": True,
             "browser_gatherUsageStats": False, "server_fileWatcherType": "none", "server_runOnSave": False,
             "global_developmentMode": False, "client_toolbarMode": "viewer"}
    bootstrap.load_config_options(flag_options=flags)
    try:
        bootstrap.run(str(Path(__file__).parent / "dashboard" / "main.py"), False, [], flags)
    finally:
        stop.set()
        registry.close_all()
