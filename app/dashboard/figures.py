"""Plain plotly figures from DataFrames (no Streamlit here), and min/max downsampling for long series.

A series is never drawn with more than ``MAX_POINTS`` points: each bucket of steps
keeps its lowest and highest value, so a one-step spike stays visible at any zoom.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

MAX_POINTS = 2000
RANK_LINES = 16
"""The most ranks drawn as lines of their own; the rest share a band."""
RANK_TIMES = {"compute_time": "compute time", "step_time": "step time"}
SEVERITY_COLORS = {"info": "#3b82f6", "warning": "#f59e0b", "critical": "#dc2626"}
CHECKPOINT_COLORS = {
    "verified": "#16a34a",
    "saved": "#2563eb",
    "saving": "#94a3b8",
    "abandoned": "#cbd5e1",
    "failed": "#f97316",
    "corrupt": "#dc2626",
}
FADED = 0.35
BAND_FILL = "rgba(100,116,139,0.2)"
TITLE_PX = 44
"""The height a chart's title takes at its top; the legend starts below it."""

pio.templates.default = "plotly_white"
"""Every figure's look, given as each figure is made: setting a template on a made figure copies and validates it
again, which was half the time a live panel took to build its figure on each refresh."""


def downsample_minmax(frame: pd.DataFrame, x: str, y: str, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """At most ``max_points`` rows of ``frame`` (sorted by ``x``): each bucket's rows with the lowest and highest ``y``.

    Rows whose ``y`` is not finite are kept as they are (a NaN step must stay visible as a gap).
    """
    frame = frame.sort_values(x, kind="stable").reset_index(drop=True)
    if len(frame) <= max_points:
        return frame
    values = frame[y].to_numpy(dtype=float)
    finite = np.isfinite(values)
    kept = set(np.flatnonzero(~finite)[: max_points // 10].tolist())
    buckets = max(1, (max_points - len(kept)) // 2)  # the gaps count against max_points too
    bucket = (np.arange(len(frame)) * buckets) // len(frame)
    shown = pd.DataFrame({"bucket": bucket[finite], "value": values[finite], "row": np.flatnonzero(finite)})
    grouped = shown.groupby("bucket")["value"]
    kept.update(shown.loc[grouped.idxmin(), "row"].tolist())
    kept.update(shown.loc[grouped.idxmax(), "row"].tolist())
    return frame.iloc[sorted(kept)].reset_index(drop=True)


def incident_window(
    window: pd.DataFrame,
    ranks: pd.DataFrame,
    start: int,
    end: int,
    focus: tuple[int, ...] = (),
    *,
    about_training: bool = True,
) -> go.Figure:
    """An incident's evidence: the training curves around it, or for an incident about speed alone the job's
    throughput (``pace``), and, when ranks are involved, each rank's compute time (``rank_time``: a synchronous
    job's step time is the same on every rank, the straggler's included).

    The incident's own ranks (``focus``) are drawn as lines; with more than ``RANK_LINES`` ranks
    in all, the others are one band (min to max, with the median), so 1,024 ranks stay readable.
    """
    rows = 2 if not ranks.empty else 1
    timed = rank_time(ranks)
    fig = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=["loss and gradient norm" if about_training else "throughput", f"{RANK_TIMES[timed]} by rank"][
            :rows
        ],
        specs=[[{"secondary_y": True}]] + [[{}]] * (rows - 1),
    )
    if about_training:
        fig.add_trace(go.Scatter(x=window["step"], y=window["loss"], name="loss", mode="lines+markers"), row=1, col=1)
        fig.add_trace(
            go.Scatter(x=window["step"], y=window["grad_norm"], name="grad norm", mode="lines", line={"dash": "dot"}),
            row=1,
            col=1,
            secondary_y=True,
        )
    else:
        rate, unit = pace(window)
        fig.add_trace(go.Scatter(x=window["step"], y=rate, name=unit, mode="lines+markers"), row=1, col=1)
    if not ranks.empty:  # a job-level incident has no ranks
        _rank_lines(fig, ranks, focus, timed)
    fig.add_vrect(x0=start - 0.5, x1=end + 0.5, line_width=0, fillcolor="#f59e0b", opacity=0.15)
    _evidence_axes(fig, rows, timed, "loss" if about_training else unit)
    return apply_layout(fig, "Evidence", height=300 * rows)


def pace(window: pd.DataFrame) -> tuple[pd.Series, str]:
    """Each step's throughput from the step records' times: tokens per second where the run reports tokens,
    else steps per second (NaN for the first step, with nothing before it)."""
    seconds = window["time"].diff() / window["step"].diff()
    seconds = seconds.where(seconds > 0)
    if window["tokens"].notna().any():
        return window["tokens"] / seconds, "tokens/s"
    return 1.0 / seconds, "steps/s"


def rank_time(ranks: pd.DataFrame) -> str:
    """The per-rank time an incident's evidence plots: compute time, else step time for a run without phases."""
    return "compute_time" if "compute_time" in ranks and ranks["compute_time"].notna().any() else "step_time"


def _evidence_axes(fig: go.Figure, rows: int, timed: str, first: str) -> None:
    """Axis titles with units, whole steps on x (no "1.2k") and short numbers on y (no "2.3456")."""
    fig.update_xaxes(tickformat="d", showticklabels=True)
    fig.update_xaxes(title="step", row=rows, col=1)
    fig.update_yaxes(tickformat=".3~g")
    fig.update_yaxes(title=first, row=1, col=1, secondary_y=False)
    if first == "loss":
        fig.update_yaxes(title="gradient norm", row=1, col=1, secondary_y=True, showgrid=False)
    if rows > 1:
        fig.update_yaxes(title=f"{RANK_TIMES[timed]} (s)", row=2, col=1)


def _rank_lines(fig: go.Figure, ranks: pd.DataFrame, focus: tuple[int, ...], timed: str) -> None:
    everyone = ranks["rank"].nunique()
    lined = set(ranks["rank"]) if everyone <= RANK_LINES else set(focus[:RANK_LINES])
    others = ranks[~ranks["rank"].isin(lined)]
    if not others.empty:
        spread = others.groupby("step")[timed].agg(["min", "median", "max"]).reset_index()
        edges = (spread["min"], spread["median"], spread["max"])
        for trace in band_traces(
            spread["step"], *edges, name=f"other {everyone - len(lined)} ranks", middle_name="their median"
        ):
            fig.add_trace(trace, row=2, col=1)
    for rank, series in ranks[ranks["rank"].isin(lined)].groupby("rank"):
        fig.add_trace(
            go.Scatter(
                x=series["step"],
                y=series[timed],
                name=f"rank {rank}",
                mode="lines",
                legendgroup="ranks",
                hovertemplate=f"rank {rank}, step %{{x}}: %{{y:.3g}} s<extra></extra>",
            ),
            row=2,
            col=1,
        )


def band_traces(
    x: pd.Series, low: pd.Series, middle: pd.Series, high: pd.Series, *, name: str, middle_name: str
) -> list[go.Scatter]:
    """A grey band from ``low`` to ``high`` named ``name`` (its upper edge, then the lower one filled up to it) and
    a dotted ``middle`` line named ``middle_name``: the other ranks around an incident, the forecast around the evals."""
    return [
        go.Scatter(x=x, y=high, mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"),
        go.Scatter(x=x, y=low, mode="lines", line={"width": 0}, fill="tonexty", fillcolor=BAND_FILL, name=name),
        go.Scatter(x=x, y=middle, mode="lines", name=middle_name, line={"color": "#64748b", "dash": "dot"}),
    ]


def checkpoint_timeline(checkpoints: pd.DataFrame) -> go.Figure:
    """Each checkpoint at its wall-clock time and step, colored by state, sized by save duration."""
    fig = go.Figure()
    for state, points in checkpoints.groupby("state"):
        size = 8 + 20 * (points["duration_s"].fillna(0) / max(checkpoints["duration_s"].max() or 1.0, 1e-9))
        fig.add_trace(
            go.Scatter(
                x=pd.to_datetime(points["started_at"], unit="s", utc=True),
                y=points["step"],
                mode="markers",
                name=state,
                marker={"size": size, "color": CHECKPOINT_COLORS.get(state, "#94a3b8")},
                customdata=list(
                    zip(points["duration_s"].fillna(0), points["bytes"].fillna(0) / 2**30, points["path"].fillna(""))
                ),
                hovertemplate=f"{state}, step %{{y}}<br>%{{customdata[0]:.2f}} s, %{{customdata[1]:.3f}} GiB"
                "<br>%{customdata[2]}<extra></extra>",
            )
        )
    fig.update_xaxes(title="started (UTC)")
    fig.update_yaxes(title="step")
    return apply_layout(fig, "Checkpoints")


GOODPUT_COLORS = {"productive": "#16a34a", "data_loading": "#86efac"}
"""Useful time in green; every category of lost time in shades of grey and orange (below)."""
LOST_COLORS = ("#f97316", "#fb923c", "#fdba74", "#94a3b8", "#cbd5e1", "#64748b", "#a8a29e", "#d6d3d1", "#e2e8f0")


def goodput_bar(goodput: pd.DataFrame) -> go.Figure:
    """The run's wall time as one bar split by category (the ``goodput`` view), productive first."""
    fig = go.Figure()
    order = goodput.assign(first=~goodput["useful"]).sort_values(["first", "seconds"], ascending=[True, False])
    lost = iter(LOST_COLORS * 2)
    for row in order.itertuples(index=False):
        fig.add_trace(
            go.Bar(
                x=[row.share],
                y=["wall time"],
                orientation="h",
                name=str(row.category).replace("_", " "),
                marker={"color": GOODPUT_COLORS.get(str(row.category)) or next(lost)},
                customdata=[[row.seconds, row.flops]],
                hovertemplate=f"{row.category}: %{{x:.1%}}, %{{customdata[0]:,.1f}} s, %{{customdata[1]:.3g}} FLOP"
                "<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(tickformat=".0%", range=[0, 1])
    fig.update_yaxes(showticklabels=False)
    productive = float(goodput.loc[goodput["useful"], "share"].sum())
    return apply_layout(fig, f"Goodput: {productive:.1%} of the wall time trained progress the run kept", height=280)


def apply_layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    """Title at the top, the legend in rows below it and the plot below both, at any width: the legend is placed
    from the top of the figure (not of the plot, where its rows grew up over the title on a narrow screen) and
    the top margin grows to hold it."""
    fig.update_layout(
        title={"text": title, "x": 0, "xref": "paper", "xanchor": "left", "y": 1, "yref": "container"}
        | {"yanchor": "top", "pad": {"t": 12}},
        height=height,
        margin={"l": 40, "r": 20, "t": TITLE_PX, "b": 40},
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 1 - TITLE_PX / height, "yref": "container"}
        | {"yanchor": "top"},
    )
    return fig
