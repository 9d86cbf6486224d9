"""Ranks: which rank is slow against its peers, what its step is spent on, and what stragglers cost the job."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from bedside.app.dashboard import live, rank_view
from bedside.app.dashboard.common import current_run

# At most this many step buckets, and fewer when the rows are many: the browser draws cells, not rows.
HEATMAP_COLUMNS, HEATMAP_CELLS = 400, 160_000
RECENT_STEPS = 200
TIME_COLUMNS = ("step_ms", "data_ms", "compute_ms", "comm_ms", "optimizer_ms")
# The heatmap's steps: every one of the timeline's (the post-mortem report draws an incident's window).
WHOLE_TIMELINE = {"first_step": 0, "last_step": None}

live.preload_plotly()  # its charts need plotly.js: fetched while the queries run
data = current_run()
st.title(f"{data.name}: ranks")


def pick_timeline(timelines: pd.DataFrame) -> pd.Series:
    """The timeline to show, the live one unless the viewer picks another (a rewound one keeps its history)."""
    numbers = timelines["timeline"].tolist()
    if len(numbers) == 1:
        return timelines.iloc[0]
    spans = {
        int(t.timeline): f"timeline {t.timeline} (steps {t.first_step}-{t.last_step})" for t in timelines.itertuples()
    }
    chosen = st.selectbox(
        "Timeline", numbers, index=len(numbers) - 1, format_func=lambda t: spans[t], key="rank_timeline"
    )
    return timelines[timelines["timeline"] == chosen].iloc[0]


@st.fragment(run_every=live.every(data.refresh_s))
def ranks() -> None:
    timelines = data.frame("timelines")
    if timelines.empty:
        st.info("No steps yet.")
        return
    shown = pick_timeline(timelines)
    timeline = int(shown["timeline"])
    phases = data.frame("rank_phases", timeline=timeline, steps=RECENT_STEPS)
    reported = rank_view.reported_phases(phases)
    phase = st.radio("Colour by", [*reported, "step"], horizontal=True, key="rank_phase")
    stragglers = rank_view.straggler_incidents(data.frame("incidents"), timeline)
    flagged = rank_view.flagged_ranks(blamed(stragglers))
    heatmap(timeline, int(shown["last_step"]), phase, flagged)
    slowdown_table(phases)
    if reported:
        live.chart(rank_view.phase_breakdown(rank_view.phase_ranks(phases, flagged), flagged), "phase_breakdown")
        if flagged:
            st.caption("* flagged: blamed by an unresolved straggler incident of this timeline")
    else:
        st.info(rank_view.NO_PHASES)
    straggler_list(stragglers, timeline)


def heatmap_columns(drawn_rows: int) -> int:
    """Step buckets for ``drawn_rows`` rows: ``HEATMAP_COLUMNS``, fewer (down to 100) above ``HEATMAP_CELLS`` cells."""
    return min(HEATMAP_COLUMNS, max(100, HEATMAP_CELLS // max(drawn_rows, 1)))


def heatmap(timeline: int, last: int, phase: str, flagged: list[int]) -> None:
    rows = data.frame("rank_rows", timeline=timeline)
    band = rank_view.band_size(len(rows))
    bucket = max(1, -(-(last + 1) // heatmap_columns(-(-len(rows) // band))))
    cells = data.frame(
        "rank_heatmap",
        **WHOLE_TIMELINE,
        bucket=bucket,
        timeline=timeline,
        phase=phase,
        band=band,
        first_row=0,
        last_row=len(rows),
    )
    figure = rank_view.rank_heatmap(cells, rows, phase, band=band, flagged=flagged)
    live.chart(figure, "rank_heatmap", revision=f"{timeline} {phase}")
    each = "rank's" if band == 1 else f"band's (of {band} ranks, in row order) slowest rank's"
    st.caption(
        f"timeline {timeline}; each cell is a {each} mean {phase} time over {bucket} step(s) against the median of "
        "its peers' (the ranks of its pipeline stage and TP index, or every rank without a topology): 1 is typical, "
        "red slower. Rows by host (thin lines), then pipeline stage (heavy lines), tensor and data coordinates."
    )
    if band > 1:
        band_heatmap(rows, band, flagged, bucket=bucket, timeline=timeline, phase=phase)


def band_heatmap(rows: pd.DataFrame, band: int, flagged: list[int], *, bucket: int, timeline: int, phase: str) -> None:
    """One band's ranks, a row each: the bands holding a flagged rank are offered first."""
    bands = rank_view.bands(rows, band, flagged)
    offered = pd.concat([bands[bands["flagged"].map(len) > 0], bands[bands["flagged"].map(len) == 0]])
    labels = dict(zip(offered["band"], offered["label"]))
    chosen = st.selectbox("Open a band", list(labels), format_func=labels.__getitem__, key="rank_band")
    first = int(bands.loc[bands["band"] == chosen, "first_row"].iloc[0])
    last = min(first + band, len(rows))
    cells = data.frame(
        "rank_heatmap",
        **WHOLE_TIMELINE,
        bucket=bucket,
        timeline=timeline,
        phase=phase,
        band=1,
        first_row=first,
        last_row=last,
    )
    figure = rank_view.rank_heatmap(cells, rows.iloc[first:last], phase, flagged=flagged)
    live.chart(figure, "rank_band_heatmap", revision=f"{timeline} {phase} {chosen}")


def blamed(stragglers: pd.DataFrame) -> pd.DataFrame:
    """The findings of the unresolved straggler incidents."""
    found = [data.frame("incident_findings", incident_id=i) for i in rank_view.unresolved(stragglers)]
    return pd.concat(found) if found else pd.DataFrame(columns=["kind", "severity", "ranks"])


def slowdown_table(phases: pd.DataFrame) -> None:
    st.subheader(f"Slowdown against peers (median of the last {RECENT_STEPS} steps)")
    times = {c: st.column_config.NumberColumn(c.replace("_ms", " (ms)"), format="%.1f") for c in TIME_COLUMNS}
    ratios = {
        f"{p}_slowdown": st.column_config.NumberColumn(f"{p} x peers'", format="%.2fx") for p in ("compute", "data")
    }
    st.dataframe(
        phases[["rank", "host", "pp", "tp", "dp", "compute_slowdown", "data_slowdown", *TIME_COLUMNS]],
        hide_index=True,
        key="slowdowns",
        column_config=times | ratios,
    )


def straggler_list(stragglers: pd.DataFrame, timeline: int) -> None:
    st.subheader(f"Straggler incidents on timeline {timeline}")
    if stragglers.empty:
        st.caption("None.")
    for incident in stragglers.itertuples():
        action = json.loads(incident.suggested_action)
        st.markdown(
            f"**{incident.status}** steps {incident.start_step}-{incident.end_step}: {incident.summary}  \n"
            f"suggested: `{action['action']}` {action.get('why', '')}"
        )


ranks()
