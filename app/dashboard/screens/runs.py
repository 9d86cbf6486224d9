"""Runs: every run in the directory with its status, and their evals against compute side by side."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bedside.app.dashboard import figures
from bedside.app.dashboard.common import STATUS_LABELS, current_run
from bedside.app.dashboard.registry import desk

current_run()
st.title("Runs")
served = desk()
runs = served.runs()
# From each run's store (cached per store version), not from the rank files: reading 1,024 files' tails
# on every refresh cost seconds.
table = pd.concat(
    [served.data(path).frame("run").assign(folder=path.name, path=str(path)) for path in runs], ignore_index=True
)
table["status"] = table["status"].map(lambda s: STATUS_LABELS.get(s, s))
table["last_seen"] = pd.to_datetime(table["last_seen"], unit="s", utc=True).dt.floor("s")
st.dataframe(
    table[["folder", "name", "run_id", "status", "world_size", "last_step", "timeline", "last_seen", "path"]],
    hide_index=True,
    key="runs_table",
)

chosen = st.multiselect("Compare", [r.name for r in runs], default=[r.name for r in runs][:5], key="compare")
metric = st.selectbox("Held-out metric", ["excess_loss", "loss", "accuracy"], key="overlay_metric")
curves = {path.name: served.data(path).frame("eval_overlay", name=metric) for path in runs if path.name in chosen}
curves = {name: curve for name, curve in curves.items() if not curve.empty}
if curves:
    st.plotly_chart(figures.runs_overlay(curves, metric), key="runs_overlay")
else:
    st.info(f"None of the chosen runs has a held-out {metric} yet.")
