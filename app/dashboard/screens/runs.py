"""Runs: every run in the directory, live ones first (a row opens its Overview), and any metric of the runs you
pick side by side, by step, tokens, FLOPs or wall time."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from bedside.app.dashboard import ledger, live, opening, run_compare
from bedside.app.dashboard.common import current_run
from bedside.app.dashboard.data import RunData
from bedside.app.dashboard.registry import desk

OVERVIEW = "screens/overview.py"
COLUMNS = {
    "folder": st.column_config.TextColumn("run"),
    "last_loss": st.column_config.NumberColumn("last loss", help="the training loss of the latest step"),
    "tokens_per_s": st.column_config.NumberColumn("tokens/s", help="over the last 50 steps"),
    "open_incidents": st.column_config.NumberColumn("open incidents", help="not resolved, acknowledged included"),
    "last_step": st.column_config.NumberColumn("last step"),
    "world_size": st.column_config.NumberColumn("ranks"),
    "last_seen": st.column_config.DatetimeColumn("last record", format="YYYY-MM-DD HH:mm:ss z"),
    "run_id": st.column_config.TextColumn("run id"),
}


current_run()
live.preload_plotly()  # its chart needs plotly.js: fetched while the queries run
st.title("Runs")
served = desk()


def runs_table() -> pd.DataFrame:
    """Every run's row, read from its store (cached per store version), not from the rank files: reading 1,024
    files' tails on every refresh cost seconds."""
    return run_compare.runs_table([row(served.data(path), path) for path in served.runs()])


def row(data: RunData, path: Path) -> dict[str, object]:
    # read-only, the incidents are in the process holding the store; before detection ran: unknown, not 0
    detected = data.owner is not None and data.owner.detected_at is not None
    return run_compare.summary_row(
        path.name,
        str(path),
        data.frame("run"),
        data.frame("progress", window=50),
        data.frame("compare_summary"),
        data.frame("open_incidents") if detected else None,
    )


@st.fragment(run_every=live.every(served.refresh_s))
def table() -> None:
    shown = runs_table()
    picked = st.dataframe(
        run_compare.styled(shown),
        hide_index=True,
        column_config=COLUMNS,
        placeholder="–",  # what a run does not report
        key="runs_table",
        on_select="rerun",
        selection_mode="single-row",
    )
    st.caption("Click a row to open that run.")
    if picked.selection.rows:  # its Overview, as a link to it opens it: the sidebar's pick gives way to the link's run
        opening.request(OVERVIEW, {"run": str(shown["folder"].iloc[picked.selection.rows[0]])}, forget=("run",))
        st.rerun(scope="app")


LEDGER_RUNS = 50  # the newest runs the hosts ledger counts (bedside ledger's default)
LEDGER_COLUMNS = {
    "runs": st.column_config.NumberColumn("runs", help="of the newest runs, those with an incident naming the host"),
    "incidents": st.column_config.NumberColumn("incidents", help="incidents naming one of its ranks"),
    "evictions": st.column_config.NumberColumn("evictions", help="incidents suggesting to evict it"),
    "last_run": st.column_config.TextColumn("newest run"),
}


@st.fragment(run_every=live.every(served.refresh_s))
def hosts() -> None:
    """Which hosts the incidents of the newest runs name, and how few account for half of the evictions."""
    paths = served.runs()[:LEDGER_RUNS]
    table = ledger.host_ledger({path.name: served.data(path).frame("ledger") for path in paths})
    st.subheader("Hosts in incidents")
    if table.empty:
        st.caption(f"No incident of the newest {len(paths)} runs names a rank.")
        return
    seen = {host for path in paths for host in served.data(path).frame("hosts")["host"]}
    st.caption(f"{ledger.concentration(table, len(seen))}, over the newest {len(paths)} runs.")
    st.dataframe(table, hide_index=True, column_config=LEDGER_COLUMNS, key="hosts_ledger")


def compare(folders: list[str]) -> None:
    chosen = st.multiselect("Compare", folders, default=folders[:5], key="compare")
    paths = {path.name: path for path in served.runs()}
    catalogs = {name: served.data(paths[name]).frame("compare_metrics") for name in chosen if name in paths}
    choices = run_compare.metric_choices(catalogs)
    if not choices:
        st.info("None of the chosen runs reports a metric yet.")
        return
    left, right = st.columns([2, 3])
    labels = list(choices)
    label = left.selectbox(
        "Metric", labels, index=labels.index(run_compare.default_metric(choices)), key="compare_metric"
    )
    axes = list(run_compare.X_AXES)
    x = right.radio(
        "x axis",
        axes,
        index=axes.index(run_compare.DEFAULT_X),
        format_func=run_compare.X_AXES.get,
        horizontal=True,
        key="compare_x",
    )
    metric = choices[label]
    left_out = run_compare.dropped(catalogs, metric, x)
    curves = {
        name: served.data(paths[name]).frame("compare_series", **metric.params(), x=x, buckets=run_compare.BUCKETS)
        for name in catalogs
        if name not in left_out
    }
    left_out |= {name: "has no points yet" for name, curve in curves.items() if curve.empty}
    if left_out:
        st.warning("Not drawn: " + "; ".join(f"**{name}** {why}" for name, why in left_out.items()) + ".")
    drawn = {name: curve for name, curve in curves.items() if not curve.empty}
    if drawn:
        live.chart(run_compare.compare_figure(drawn, metric, x), "runs_compare")


@st.fragment(run_every=live.every(served.refresh_s))
def comparison() -> None:
    compare(runs_table()["folder"].tolist())


table()
comparison()

hosts()
