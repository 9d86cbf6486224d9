"""Ranks: where a slow or sick rank sits, what its step is spent on, and what stragglers cost the job."""

from __future__ import annotations

import json

import streamlit as st

from bedside.app.dashboard import figures, summaries
from bedside.app.dashboard.common import current_run

HEATMAP_COLUMNS = 400
RECENT_STEPS = 200

data = current_run()
st.title(f"{data.name}: ranks")


@st.fragment(run_every=data.refresh_s)
def ranks() -> None:
    timelines = data.frame("timelines")
    if timelines.empty:
        st.info("No steps yet.")
        return
    timeline = int(timelines["timeline"].max())
    last = int(timelines["last_step"].max())
    bucket = max(1, -(-(last + 1) // HEATMAP_COLUMNS))
    order = data.frame("rank_order")["rank"].tolist()
    heat = data.frame("rank_heatmap", bucket=bucket, timeline=timeline)
    st.plotly_chart(figures.rank_heatmap(heat, order), key="rank_heatmap")
    st.caption(
        f"timeline {timeline}; each column is the slowest step of {bucket} step(s); rows by host, then "
        "pipeline, tensor and data coordinates"
    )
    phases = data.frame("rank_phases", timeline=timeline, steps=RECENT_STEPS)
    table = summaries.slowdowns(phases)
    st.subheader(f"Slowdown (median of the last {RECENT_STEPS} steps)")
    st.dataframe(
        table[["rank", "host", "dp", "tp", "pp", "compute_slowdown", "step_slowdown", "compute_time", "step_time"]],
        hide_index=True,
        key="slowdowns",
        column_config={
            "compute_slowdown": st.column_config.NumberColumn(format="%.2fx"),
            "step_slowdown": st.column_config.NumberColumn(format="%.2fx"),
        },
    )
    st.plotly_chart(figures.phase_breakdown(phases), key="phase_breakdown")
    stragglers = data.frame("incidents")
    stragglers = stragglers[stragglers["kinds"].map(lambda kinds: "straggler" in list(kinds))]
    st.subheader("Straggler incidents")
    if stragglers.empty:
        st.caption("None.")
    for incident in stragglers.itertuples():
        action = json.loads(incident.suggested_action)
        st.markdown(
            f"**{incident.status}** steps {incident.start_step}-{incident.end_step}: {incident.summary}  \n"
            f"suggested: `{action['action']}` {action.get('why', '')}"
        )


ranks()
