"""Checkpoints: what is saved and verified, the work at risk, and how often to save."""

from __future__ import annotations

import streamlit as st

from bedside.app.dashboard import figures, summaries
from bedside.app.dashboard.common import age, current_run, number

data = current_run()
st.title(f"{data.name}: checkpoints")


@st.fragment(run_every=data.refresh_s)
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
    st.plotly_chart(figures.checkpoint_timeline(saved), key="checkpoint_timeline")
    advice = summaries.checkpoint_advice(saved, data.frame("restarts"))
    if advice:
        st.subheader("Checkpoint interval (Young/Daly)")
        cols = st.columns(4)
        cols[0].metric("Save cost (median)", f"{advice.save_s:.2f} s")
        cols[1].metric(
            "Interruptions seen",
            advice.interruptions,
            help="restarts from a checkpoint; with none yet, one is assumed after the span observed",
        )
        cols[2].metric(
            "Recommended interval",
            age(advice.optimal_interval_s),
            help="sqrt(2 x save cost x mean time between interruptions)",
        )
        cols[3].metric(
            "Current interval",
            age(advice.current_interval_s),
            None
            if advice.current_waste is None
            else f"expected waste {advice.current_waste:.1%} (optimum {advice.optimal_waste:.1%})",
            delta_color="off",
        )
    st.dataframe(saved, hide_index=True, key="checkpoint_table")


checkpoints()
