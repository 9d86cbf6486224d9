"""The Overview's curves: the training curves against step and held-out eval against compute.

A timeline keeps one colour in every panel and in the legend (``timeline_color``), the live one drawn in front
and the abandoned ones faded. An incident is shaded over its steps and marked where it began, and a NaN or
infinite value is marked where its line breaks, so that one step stays visible on an axis of thousands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bedside.detectors.incidents import concerns_training

from .figures import FADED, SEVERITY_COLORS, apply_layout, band_traces, downsample_minmax

TIMELINE_COLORS = ("#1f77b4", "#2ca02c", "#8c564b", "#17becf", "#e377c2", "#bcbd22", "#7f7f7f", "#393b79")
"""No red, orange or amber (the severities') and no violet (the rewinds' and skips' lines)."""
ACTION_COLOR = "#7c3aed"
RAW_FADED = 0.3
"""How much of its timeline's opacity the raw line behind a smoothed one keeps."""
NONFINITE_COLOR = SEVERITY_COLORS["critical"]
EVAL_TITLES = {
    "excess_loss": "held-out excess loss (nats/token above the floor)",
    "loss": "held-out loss (nats/token)",
}
"""The eval chart's y title for the metrics whose unit bedside knows (excess loss: above the data's entropy)."""
RANGE_PAD = 0.08
"""The margin above and below the data's span on the eval chart's y axis."""


@dataclass(frozen=True)
class Panel:
    """One row of the training curves: a ``dash_steps`` column, its axis title with units, whether the log-y and
    smoothing toggles apply to it, and whether it shows the job's pace (shaded with the incidents about speed)."""

    column: str
    title: str
    log: bool
    smooth: bool
    pace: bool = False


PANELS = (
    Panel("loss", "train loss (nats/token)", log=True, smooth=True),
    Panel("grad_norm", "gradient norm (L2)", log=True, smooth=True),
    Panel("lr", "learning rate", log=True, smooth=False),
    Panel("tokens_per_s", "throughput (tokens/s)", log=False, smooth=True, pace=True),
    Panel("step_s", "step time (s)", log=False, smooth=True, pace=True),
)


def timeline_color(timeline: int) -> str:
    """The one colour a timeline has in every chart."""
    return TIMELINE_COLORS[int(timeline) % len(TIMELINE_COLORS)]


def smoothed(values: pd.Series, weight: float) -> pd.Series:
    """TensorBoard's smoothing: an exponential moving average with ``weight`` on the past, debiased at the start.
    Values that are not finite are skipped and stay gaps."""
    finite = values.where(np.isfinite(values))
    if weight <= 0:
        return finite
    return finite.ewm(alpha=1.0 - weight, adjust=True, ignore_na=True).mean().where(finite.notna())


def training_curves(
    steps: pd.DataFrame,
    incidents: pd.DataFrame,
    actions: pd.DataFrame,
    *,
    log_y: bool = False,
    smoothing: float = 0.0,
) -> go.Figure:
    """Loss, gradient norm, LR, throughput and step time against step (the ``PANELS`` the run reports), each
    timeline a line in its colour; incidents shaded by severity and marked at their first step (those about the
    training's numbers on its panels, those about speed on the pace panels), non-finite values marked, applied
    rewinds and skips drawn as lines.

    ``steps``: the ``dash_steps`` columns (``nonfinite``, the metrics that were NaN or infinite, is optional);
    ``log_y``: log scale on the panels that allow it; ``smoothing``: the EMA weight (0: raw lines only).
    """
    steps = steps.sort_values(["timeline", "step"], kind="stable").reset_index(drop=True)
    panels = [p for p in PANELS if p.column in steps and steps[p.column].notna().any()]
    fig = make_subplots(rows=max(1, len(panels)), cols=1, shared_xaxes=True, vertical_spacing=0.025)
    live = steps["timeline"].max() if not steps.empty else None
    about_speed = ~incidents["kinds"].map(concerns_training).astype(bool)
    legend: set[str] = set()  # the marks' entries, each once
    shades: list[dict] = []
    flagged = steps["nonfinite"].explode() if "nonfinite" in steps else pd.Series(dtype=object)
    for row, panel in enumerate(panels, start=1):
        for timeline, series in steps.groupby("timeline"):
            opacity = 1.0 if timeline == live else FADED
            _timeline_lines(fig, series, panel, int(timeline), opacity, smoothing if panel.smooth else 0.0, row)
        _nonfinite_marks(fig, steps, flagged, panel, row, legend)
        fig.update_yaxes(title=panel.title, type="log" if log_y and panel.log else "linear", row=row, col=1)
        shown = incidents[about_speed == panel.pace]
        shades += _incident_shades(shown, row)
        if panel is next(p for p in panels if p.pace == panel.pace):  # the top panel of its kind
            _mark_incidents(fig, steps, shown, panel.column, row, legend)
    fig.update_layout(shapes=shades)  # at once: each add_vrect validates every shape before it again
    _mark_actions(fig, actions)
    fig.update_xaxes(title="step", row=max(1, len(panels)), col=1)
    return apply_layout(fig, "Training", height=160 + 150 * len(panels))


def _timeline_lines(
    fig: go.Figure, series: pd.DataFrame, panel: Panel, timeline: int, opacity: float, smoothing: float, row: int
) -> None:
    """One timeline's line in one panel (one legend entry per timeline, which shows or hides it in every panel);
    when smoothed, the raw line stays faint behind it."""
    style = {"legendgroup": f"timeline {timeline}", "line": {"color": timeline_color(timeline)}, "mode": "lines"}
    values = series[["step"]].assign(value=smoothed(series[panel.column], 0.0))
    if smoothing > 0:
        raw = downsample_minmax(values, "step", "value")
        faint = {"name": f"timeline {timeline} raw", "opacity": opacity * RAW_FADED, "showlegend": False}
        fig.add_trace(go.Scatter(x=raw["step"], y=raw["value"], hoverinfo="skip", **faint, **style), row=row, col=1)
        values = values.assign(value=smoothed(series[panel.column], smoothing))
    points = downsample_minmax(values, "step", "value")
    front = {"name": f"timeline {timeline}", "opacity": opacity, "showlegend": row == 1}
    fig.add_trace(go.Scatter(x=points["step"], y=points["value"], **front, **style), row=row, col=1)


def _nonfinite_marks(
    fig: go.Figure, steps: pd.DataFrame, flagged: pd.Series, panel: Panel, row: int, legend: set[str]
) -> None:
    """A red cross at each step whose value was NaN or infinite (``flagged``: each row's non-finite metrics, by
    row), at the height of the last finite value before it on its timeline (the line itself has a gap there,
    which at thousands of steps no one sees)."""
    rows = flagged.index[flagged.to_numpy() == panel.column]
    if rows.empty:
        return
    by_timeline = steps["timeline"]
    finite = steps[panel.column].where(np.isfinite(steps[panel.column]))
    height = finite.groupby(by_timeline).ffill().groupby(by_timeline).bfill()
    bad = steps.loc[rows]
    marks = [
        (step, y, f"timeline {timeline}, step {step}: {panel.title} {value}")
        for timeline, step, value, y in zip(bad["timeline"], bad["step"], bad[panel.column], height[rows])
    ]
    x, y, text = zip(*marks)
    fig.add_trace(
        go.Scatter(
            x=x,
            y=y,
            mode="markers",
            name="non-finite value",
            legendgroup="nonfinite",
            showlegend=_first_in(legend, "non-finite value"),
            marker={"symbol": "x", "size": 11, "color": NONFINITE_COLOR, "line": {"width": 1, "color": "white"}},
            text=text,
            hovertemplate="%{text}<extra></extra>",
        ),
        row=row,
        col=1,
    )


def _first_in(legend: set[str], name: str) -> bool:
    """Whether ``name`` takes its legend entry here (its first trace), noting that it has."""
    first = name not in legend
    legend.add(name)
    return first


def _incident_shades(incidents: pd.DataFrame, row: int) -> list[dict]:
    """A band over each incident's steps in panel ``row``, by severity (the shapes ``add_vrect`` makes)."""
    axis = "" if row == 1 else str(row)
    return [
        {"type": "rect", "xref": f"x{axis}", "yref": f"y{axis} domain", "y0": 0, "y1": 1, "opacity": 0.15}
        | {"x0": incident.start_step - 0.5, "x1": incident.end_step + 0.5, "line": {"width": 0}}
        | {"fillcolor": SEVERITY_COLORS.get(incident.severity, "#94a3b8")}
        for incident in incidents.itertuples()
    ]


def _mark_incidents(
    fig: go.Figure, steps: pd.DataFrame, incidents: pd.DataFrame, column: str, row: int, legend: set[str]
) -> None:
    """A triangle at each incident's first step on the curve of its timeline in panel ``row``, by severity."""
    placed = []
    for incident in incidents.itertuples():
        series = steps[steps["timeline"] == incident.timeline]
        finite = series[np.isfinite(series[column])]
        if finite.empty:
            continue
        y = float(np.interp(incident.start_step, finite["step"], finite[column]))
        steps_text = f"step {incident.start_step}" + (
            f"-{incident.end_step}" if incident.end_step != incident.start_step else ""
        )
        placed.append((incident.severity, incident.start_step, y, f"{incident.title} ({steps_text})"))
    for severity, marks in pd.DataFrame(placed, columns=["severity", "step", "y", "label"]).groupby("severity"):
        fig.add_trace(
            go.Scatter(
                x=marks["step"],
                y=marks["y"],
                mode="markers",
                name=f"{severity} incident",
                legendgroup=f"{severity} incident",
                showlegend=_first_in(legend, f"{severity} incident"),
                marker={"symbol": "triangle-down", "size": 13, "color": SEVERITY_COLORS.get(severity)}
                | {"line": {"width": 1, "color": "white"}},
                text=marks["label"],
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row,
            col=1,
        )


def _mark_actions(fig: go.Figure, actions: pd.DataFrame) -> None:
    """A dashed line through every panel at each applied rewind and skip, named once, in the top panel."""
    for action in actions.itertuples():
        if action.status == "applied" and action.action in ("rewind", "skip") and pd.notna(action.step):
            fig.add_vline(x=float(action.step), line_dash="dash", line_color=ACTION_COLOR)
            fig.add_annotation(
                x=float(action.step),
                y=1,
                xref="x",
                yref="y domain",
                text=action.action,
                showarrow=False,
                xanchor="right",
                yanchor="top",
            )


def eval_vs_compute(
    evals: pd.DataFrame, metric: str, band: pd.DataFrame | None = None, incidents: pd.DataFrame | None = None
) -> go.Figure:
    """Held-out ``metric`` against cumulative FLOPs (log x), one line per timeline in its colour, the live one in
    front. The y range is the data's: the forecast band is clipped to it, so a band widened by a rewind's new
    branch cannot squash the curves.

    ``band``: columns ``cum_flops``, ``low``, ``center``, ``high`` (the detectors' forecast);
    ``incidents``: columns ``cum_flops``, ``value``, ``severity``, ``label``, drawn as markers.
    """
    fig = go.Figure()
    shown = evals[evals["name"] == metric].dropna(subset=["cum_flops"])
    marks = incidents if incidents is not None else pd.DataFrame(columns=["cum_flops", "value", "severity"])
    span = _data_range(pd.concat([shown["value"], marks["value"]]))
    if band is not None and not band.empty:
        shown_band = band if span is None else band.assign(**band[["low", "center", "high"]].clip(*span))
        edges = (shown_band["low"], shown_band["center"], shown_band["high"])
        fig.add_traces(band_traces(shown_band["cum_flops"], *edges, name="forecast band", middle_name="forecast"))
    live = shown["timeline"].max() if not shown.empty else None
    for timeline, points in shown.groupby("timeline"):
        fig.add_trace(
            go.Scatter(
                x=points["cum_flops"],
                y=points["value"],
                mode="lines+markers",
                name=f"timeline {timeline}",
                line={"color": timeline_color(int(timeline))},
                opacity=1.0 if timeline == live else FADED,
                customdata=points["step"],
                hovertemplate="step %{customdata}<br>%{x:.3s}FLOP<br>" + metric + " %{y:.4g}<extra></extra>",
            )
        )
    for severity, placed in marks.groupby("severity"):
        fig.add_trace(
            go.Scatter(
                x=placed["cum_flops"],
                y=placed["value"],
                mode="markers",
                name=f"{severity} incident",
                marker={"symbol": "x", "size": 12, "color": SEVERITY_COLORS.get(severity)},
                text=placed["label"],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    fig.update_xaxes(type="log", title="cumulative FLOPs spent", exponentformat="SI extended")
    fig.update_yaxes(title=EVAL_TITLES.get(metric, f"held-out {metric}"), range=list(span) if span else None)
    return apply_layout(fig, "Held-out eval against compute")


def _data_range(values: pd.Series) -> tuple[float, float] | None:
    """The span of the finite ``values`` with a margin of ``RANGE_PAD`` each side (None without any)."""
    finite = values[np.isfinite(values.astype(float))].astype(float)
    if finite.empty:
        return None
    low, high = float(finite.min()), float(finite.max())
    pad = RANGE_PAD * (high - low) or RANGE_PAD * abs(high) or 1.0
    return low - pad, high + pad
