"""The dashboard under AppTest: private copies of the sample runs, the app opened on a page as a link opens it,
and what a page shows (its tiles, its plotly figures with their arrays decoded, the operator's unlock)."""

from __future__ import annotations

import base64
import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import streamlit.config
from streamlit.components.v2 import manifest_scanner
from streamlit.testing.v1 import AppTest

import bedside.app.dashboard as dashboard
from bedside.app.dashboard import live, registry
from bedside.app.dashboard.server import SCRIPT_SETTINGS
from bedside.app.simulation import SimulationConfig, simulate_run

SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "sample_runs"
MAIN = Path(dashboard.__file__).parent / "main.py"
SCREENS = "screens"
"""Where main.py's pages are, relative to it (their file names are their url paths)."""
FAULTS, REWIND = "tiny-faults", "tiny-rewind"
"""The two sample runs the page tests serve together."""
CLEAN = "clean"
"""A run with nothing to find (``clean_run``)."""
PAGES = ("overview", "ranks", "incidents", "checkpoints", "runs", "sql")
RUN_TIMEOUT_S = 60

# Every AppTest scans each installed distribution for Streamlit components (about 0.27 s, hundreds of times a
# run). What is installed does not change while the suite runs: one scan a process serves every session.
manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)
for option, value in SCRIPT_SETTINGS.items():  # the scripts run as the server runs them
    streamlit.config.set_option(option, value)


def copy_run(name: str, into: Path, as_name: str | None = None) -> Path:
    """A private copy of ``sample_runs/NAME`` in ``into``, without any store (the dashboard builds its own)."""
    run = Path(shutil.copytree(SAMPLE_RUNS / name, into / (as_name or name)))
    for stale in run.glob("bedside.duckdb*"):
        stale.unlink()
    return run


def clean_run(into: Path) -> Path:
    """A run with no fault and nothing for the detectors to find: two simulated ranks, 160 steps."""
    simulate_run(SimulationConfig(ranks=2, steps=160, seed=1), into / CLEAN)
    return into / CLEAN


def serve(target: Path, *, token: str = "", live: bool = False, config: Path | None = None) -> registry.Desk:
    """Point the dashboard at ``target`` as ``bedside serve`` would (not live unless asked), with ``token`` for
    operators and alerts from ``config`` (else the run's bedside.toml)."""
    return registry.install(registry.Desk.for_target(target, config=config, live=live, token=token))


def serving(target: Path) -> Iterator[Path]:
    """For a module's fixture: serve ``target`` (``yield from serving(folder)``), then let its stores go."""
    serve(target)
    yield target
    registry.close_all()


def open_page(page: str, **query: str) -> AppTest:
    """A new browser session landing on ``/PAGE?QUERY`` (a link's first run), after its first run."""
    app = AppTest.from_file(str(MAIN), default_timeout=RUN_TIMEOUT_S)
    app.query_params.update(query)
    return app.switch_page(f"{SCREENS}/{page}.py").run()


def go_to(app: AppTest, page: str) -> AppTest:
    """Click ``page`` in the navigation of a running session."""
    return app.switch_page(f"{SCREENS}/{page}.py").run()


def assert_rendered(app: AppTest) -> None:
    """No exception reached the page (Streamlit shows those as a traceback)."""
    assert not app.exception, "\n".join(e.message + "\n" + "\n".join(e.stack_trace) for e in app.exception)


def tiles(app: AppTest) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}


def charts(app: AppTest) -> dict[str, str]:
    """Every chart on the page in order, its key to its figure's JSON: the live charts (``live.chart``) and any
    drawn by ``st.plotly_chart``."""
    found = {}
    for element in [*app.main, *app.sidebar]:
        kind = getattr(element, "type", None)
        if kind == "plotly_chart":
            found[element.key] = element.proto.spec
        elif kind == "bidi_component" and element.proto.component_name == live.CHART_NAME:
            data = json.loads(element.proto.json)
            found[data["key"]] = data["figure"]
    return found


def chart_keys(app: AppTest) -> list[str]:
    return list(charts(app))


def chart(app: AppTest, key: str) -> dict[str, Any]:
    """The plotly figure drawn with ``key``, as plain data (typed arrays decoded to numpy)."""
    return _decoded(json.loads(charts(app)[key]))


def table(app: AppTest, *columns: str):
    """The one dataframe on the page with all of ``columns``."""
    [found] = [d.value for d in app.dataframe if set(columns) <= set(d.value.columns)]
    return found


def texts(app: AppTest) -> str:
    """Everything written on the page and its sidebar (markdown, captions, alerts, headings), one per line."""
    kinds = ("markdown", "caption", "error", "warning", "info", "success", "title", "subheader")
    return "\n".join(str(element.value) for kind in kinds for element in app.get(kind))


def unlock(app: AppTest, name: str, token: str) -> AppTest:
    """Enter a name and a token in the sidebar's operator panel and press Unlock actions."""
    app.sidebar.text_input(key="operator_name").input(name)
    app.sidebar.text_input(key="operator_token").input(token)
    return app.sidebar.button(key="unlock").click().run()


def from_store(run: Path, sql: str, *params: Any) -> pd.DataFrame:
    """What the run's store says, read through the store of the owner this process holds (the dashboard's)."""
    owner = registry.desk().owner(run)
    assert owner is not None, f"the dashboard does not own {run}'s store"
    return owner.store.cursor().execute(sql, list(params)).df()


def _decoded(value: Any) -> Any:
    if isinstance(value, dict):
        if {"dtype", "bdata"} <= value.keys():
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            shape = value.get("shape")
            return array.reshape([int(n) for n in str(shape).split(",")]) if shape else array
        return {name: _decoded(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    return value


def store_facts(cursor: Any) -> dict[str, object]:
    """What a store holds that no viewer may change: its tables, row counts, views and committed offsets, and
    how many alerts wait in its outbox (the tables the detectors rewrite left out of the counts)."""
    tables = [t for (t,) in cursor.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
    rewritten = ("finding_rows", "incident_rows", "outbox", "schema_migrations")
    counts = {t: cursor.execute(f'SELECT count(*) FROM "{t}"').fetchall()[0][0] for t in tables if t not in rewritten}
    views = cursor.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()
    offsets = cursor.execute("SELECT path, committed_offset FROM sources ORDER BY path").fetchall()
    outbox = cursor.execute("SELECT count(*) FROM outbox").fetchall()[0][0]
    return {"tables": tables, "counts": counts, "views": views, "offsets": offsets, "outbox": outbox}
