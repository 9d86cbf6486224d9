"""Checkpoints: what is saved and verified, the work at risk, and how often to save."""

from __future__ import annotations

import streamlit as st

from bedside.app.dashboard import figures, live, summaries
from bedside.app.dashboard.common import age, current_run, number
from bedside.detectors.checkpointing import CheckpointAdvice

live.preload_plotly()  # its charts need plotly.js: fetched while the queries run
data = current_run()
st.title(f"{data.name}: checkpoints")

TABLE_COLUMNS = {
    "started": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm:ss", timezone="UTC"),
    "save_s": st.column_config.NumberColumn("save (s)", format="%.2f"),
    "size_gib": st.column_config.NumberColumn("size (GiB)", format="%.3f"),
    "path": st.column_config.TextColumn("path", width="large", help="the checkpoint's full path (hover a point above)"),
}


def young_daly(advice: CheckpointAdvice) -> None:
    st.subheader("Checkpoint interval (Young/Daly)")
    cols = st.columns(4)
    cols[0].metric("Save cost (median)", f"{advice.save_s:.2f} s")
    cols[1].metric(
        "Interruptions seen",
        advice.interruptions,
        help="restarts from a checkpoint (an operator's rewind is not one); with none yet, one is assumed after "
        "the span observed",
    )
    cols[2].metric(
        "Recommended interval",
        age(advice.optimal_interval_s),
        help="sqrt(2 x save cost x mean time between interruptions)",
    )
    cols[3].metric("Current interval", age(advice.current_interval_s))
    if advice.current_waste is not None:  # a line of its own: a tile's delta is cut off on a narrow screen
        st.markdown(
            f"**Expected waste** at the current interval: **{advice.current_waste:.1%}** of the run's time "
            f"(saving plus work redone after an interruption); at the recommended interval "
            f"{advice.optimal_waste:.1%}.",
            help="C/T + T/(2M): save cost C, interval T, mean time between interruptions M",
        )


@st.fragment(run_every=live.every(data.refresh_s))
def checkpoints() -> None:
    saved = data.frame("checkpoints")
    risk = data.frame("good_checkpoint")
    cols = st.columns(4)
    if risk.empty:
        cols[0].metric("Last good checkpoint", "none")
    else:
        r = risk.iloc[0]
        cols[0].metric("Last good checkpoint", f"step {int(r['checkpoint_step'])}")
        cols[1].metric("Steps at risk", f"{int(r['steps_at_risk'] or 0):,}")
        cols[2].metric("Time at risk", age(max(float(r["seconds_at_risk"] or 0.0), 0.0)))
        cols[3].metric("FLOPs at risk", number(r["flops_at_risk"]))
    if saved.empty:
        st.info("No checkpoint yet.")
        return
    live.chart(figures.checkpoint_timeline(saved), "checkpoint_timeline")
    advice = summaries.checkpoint_advice(saved, data.frame("restarts"))
    if advice:
        young_daly(advice)
    st.dataframe(summaries.checkpoint_rows(saved), hide_index=True, column_config=TABLE_COLUMNS, key="checkpoint_table")


checkpoints()
