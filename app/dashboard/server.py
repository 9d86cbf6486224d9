"""The dashboard's server: take the stores of a run (or of every run in a directory), then hand the main thread
to Streamlit's server in this process (``bedside serve``, ``bedside demo --serve``), with one route of our own
beside Streamlit's: the SQL page's CSV downloads (``exports.py``)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from ..service.alerts.config import find_config

DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"
SCRIPT_SETTINGS = {
    # Streamlit runs a full gc.collect(2) after every script run, each live fragment's refresh included: with
    # pandas, pyarrow, DuckDB and plotly loaded that was two thirds of the server's CPU (0.45 of a core for one
    # viewer of the Overview at --refresh 1, bench/serve_cpu.py). Python's own collector still runs as objects
    # are allocated.
    "runner.postScriptGC": False,
}
"""How the pages' scripts run, wherever they run: this server, and the tests' AppTest sessions."""


def serve_dashboard(target: Path, *, host: str, port: int, config: Path | None, refresh_s: float, token: str) -> None:
    """Own the stores of ``target`` (following them) and serve the dashboard until the server stops; ``token``
    (or its hash) unlocks the actions, none leaves the dashboard read-only."""
    import streamlit as st

    from . import exports, registry

    config = config or find_config(target)  # settled once: the run may not be a run yet (demo --serve)
    served = registry.install(
        registry.Desk.for_target(target.resolve(), config=config, live=True, token=token, refresh_s=refresh_s)
    )
    for run_dir in served.runs():
        if served.owner(run_dir) is None:
            print(f"bedside: {run_dir.name}: {served.refused[run_dir.resolve()][1]}; shown read-only", file=sys.stderr)
    stop = threading.Event()
    threading.Thread(target=served.adopt_runs, args=(stop,), name="adopt-runs", daemon=True).start()
    access = "actions unlocked by the operator token" if served.operator_token else "read-only (no operator token)"
    print(f"bedside: serving {target} at http://{host}:{port} ({access})", file=sys.stderr)
    settings = {
        "server.port": port,
        "server.address": host,
        "server.headless": True,
        "browser.gatherUsageStats": False,
        "server.fileWatcherType": "none",
        "server.runOnSave": False,
        "global.developmentMode": False,
        "client.toolbarMode": "viewer",
        **SCRIPT_SETTINGS,
    }
    app = st.App(Path(__file__).parent / "main.py", routes=exports.routes())  # Streamlit's routes and the downloads'
    try:
        app.run(config=settings)
    except KeyboardInterrupt:  # SIGINT is how an operator stops the server: a clean stop, not a failure
        print("bedside: stopped", file=sys.stderr)
    finally:
        stop.set()
        registry.close_all()
