"""The Runs page's pieces, plain functions of query results (no Streamlit): the runs table, live runs first, and
one metric of several runs against a chosen x axis, each timeline a line of its own.

A metric is a training metric of the step records (canonical or user) or an eval score (by split and name); the
``compare_metrics`` query says which a run reports, and by which x axes its values can be placed, so the page
can name the runs a choice leaves out instead of drawing them at 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
from pandas.io.formats.style import Styler
from plotly.colors import qualitative

from .figures import FADED, MAX_POINTS, apply_layout
from .formats import STATUS_LABELS, number

X_AXES = {"step": "step", "tokens": "tokens spent", "flops": "FLOPs spent", "time": "wall time"}
"""The x axes a comparison can use (the ``compare_series`` query's ``$x``), with their titles."""
DEFAULT_X = "flops"
"""Model-better for the compute spent leads."""
X_HOVER = {"step": "d", "tokens": ".4s", "flops": ".4s", "time": ".4g"}
X_COLUMNS = {"tokens": "by_tokens", "flops": "by_flops"}
"""The ``compare_metrics`` column that says whether a run's values can be placed on that x axis."""
BUCKETS = MAX_POINTS // 2
"""Step buckets per timeline: each keeps its lowest and highest value."""
STATUS_ORDER = {"live": 0, "stalled": 1}
"""Live runs first, then stalled ones, then the rest (ended or empty), each newest record first."""
DURATIONS = (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0))
COLORS = qualitative.Plotly
TABLE_COLUMNS = [
    "folder",
    "name",
    "status",
    "last_loss",
    "tokens_per_s",
    "open_incidents",
    "last_step",
    "timeline",
    "world_size",
    "last_seen",
    "run_id",
    "path",
]


@dataclass(frozen=True)
class Metric:
    """A metric runs can be compared on: ``source`` ``train`` (a step record's metric) or ``eval`` (a score)."""

    source: str
    split: str
    name: str

    @property
    def label(self) -> str:
        """``train/loss``, ``eval/heldout/excess_loss``: what the picker lists."""
        return f"train/{self.name}" if self.source == "train" else f"eval/{self.split}/{self.name}"

    def params(self) -> dict[str, str]:
        """The ``compare_series`` query's parameters for this metric."""
        return {"source": self.source, "split": self.split, "name": self.name}


def summary_row(
    folder: str,
    path: str,
    run: pd.DataFrame,
    progress: pd.DataFrame,
    summary: pd.DataFrame,
    open_incidents: pd.DataFrame | None,
) -> dict[str, object]:
    """One run's row from its ``run``, ``progress``, ``compare_summary`` and ``open_incidents`` queries
    (``open_incidents`` None: not known here, read-only or before detection ran). What the run does not report
    is None, never 0."""
    row: dict[str, object] = {"folder": folder, "path": path}
    if not run.empty:
        row |= run.iloc[0].to_dict()
    row["status"] = STATUS_LABELS.get(str(row.get("status", "empty")), row.get("status"))
    row["last_loss"] = _first(summary, "last_loss")
    row["tokens_per_s"] = _first(progress, "tokens_per_s")
    row["open_incidents"] = None if open_incidents is None else int(open_incidents["incidents"].sum())
    return row


def runs_table(rows: list[dict[str, object]]) -> pd.DataFrame:
    """The runs, live first, then stalled, then the rest, each group newest record first."""
    table = pd.DataFrame(rows).reindex(columns=TABLE_COLUMNS)
    table["last_seen"] = pd.to_datetime(table["last_seen"], unit="s", utc=True).dt.floor("s")
    for column in ("last_loss", "tokens_per_s", "open_incidents"):
        table[column] = pd.to_numeric(table[column]).astype("Float64")
    table["open_incidents"] = table["open_incidents"].astype("Int64")
    order = table["status"].map(lambda s: STATUS_ORDER.get(s, len(STATUS_ORDER)))
    ranked = table.assign(_order=order).sort_values(["_order", "last_seen"], ascending=[True, False], kind="stable")
    return ranked.drop(columns="_order").reset_index(drop=True)


def styled(table: pd.DataFrame) -> Styler:
    """The table as shown: "–" for what a run does not report, SI prefixes on tokens/s."""
    return table.style.format(
        {
            "last_loss": lambda v: "–" if pd.isna(v) else f"{v:.4g}",
            "tokens_per_s": number,
            "open_incidents": lambda v: "–" if pd.isna(v) else f"{v:d}",
        }
    )


def metric_choices(catalogs: dict[str, pd.DataFrame]) -> dict[str, Metric]:
    """Every metric any of the runs (their ``compare_metrics``) reports, by label: train loss first, the other
    training metrics, then the evals."""
    found = {
        Metric(str(r.source), str(r.split), str(r.name)) for catalog in catalogs.values() for r in catalog.itertuples()
    }
    ordered = sorted(found, key=lambda m: (m.source != "train", m.label != "train/loss", m.label))
    return {m.label: m for m in ordered}


def default_metric(choices: dict[str, Metric]) -> str:
    """Lead with held-out eval (excess loss, else loss), else the training loss, else the first metric."""
    for label in ("eval/heldout/excess_loss", "eval/heldout/loss", "train/loss"):
        if label in choices:
            return label
    return next(iter(choices))


def dropped(catalogs: dict[str, pd.DataFrame], metric: Metric, x: str) -> dict[str, str]:
    """The runs that cannot be drawn for ``metric`` against ``x``, each with why."""
    reasons = {}
    for run, catalog in catalogs.items():
        rows = catalog[
            (catalog["source"] == metric.source) & (catalog["split"] == metric.split) & (catalog["name"] == metric.name)
        ]
        if rows.empty:
            reasons[run] = f"reports no {metric.label}"
        elif x in X_COLUMNS and not rows[X_COLUMNS[x]].any():
            reasons[run] = f"reports no {X_AXES[x].split()[0]} for it"
    return reasons


def compare_figure(curves: dict[str, pd.DataFrame], metric: Metric, x: str) -> go.Figure:
    """``metric`` of each run (``compare_series``: ``timeline``, ``step``, ``x``, ``value``) against ``x``: one
    line per run and timeline in the run's colour, the run's abandoned timelines faded behind its live one."""
    scale, unit = _time_unit(curves) if x == "time" else (1.0, "")
    fig = go.Figure()
    for index, (run, curve) in enumerate(curves.items()):
        live = curve["timeline"].max()
        for timeline, line in curve.groupby("timeline"):
            trace = _line(run, int(timeline), line, scale, COLORS[index % len(COLORS)], timeline == live)
            fig.add_trace(trace.update(legendrank=2 * index + (timeline != live)))  # a run's live line first
    title = f"{X_AXES[x]} ({unit})" if unit else X_AXES[x]
    fig.update_xaxes(title=title, exponentformat="SI", hoverformat=X_HOVER[x], type="log" if x == "flops" else "linear")
    fig.update_yaxes(title=metric.label, exponentformat="SI")
    fig.update_layout(uirevision=f"{metric.label} by {x}")  # a zoom outlives the refreshes, not a new choice
    return apply_layout(fig, f"Runs: {metric.label} by {X_AXES[x]}")


def _line(run: str, timeline: int, line: pd.DataFrame, scale: float, color: str, live: bool) -> go.Scatter:
    return go.Scatter(
        x=line["x"] / scale,
        y=line["value"],
        customdata=line["step"],
        mode="lines+markers" if len(line) <= 20 else "lines",
        name=run if live else f"{run} (timeline {timeline}, abandoned)",
        legendgroup=run,
        line={"color": color, "dash": "solid" if live else "dot"},
        opacity=1.0 if live else FADED,
        hovertemplate=f"{run}, timeline {timeline}, step %{{customdata}}<br>%{{x}}: %{{y:.4g}}<extra></extra>",
    )


def _time_unit(curves: dict[str, pd.DataFrame]) -> tuple[float, str]:
    """The unit wall time reads best in: the largest that the longest run spans at least twice."""
    longest = max((float(c["x"].max()) for c in curves.values() if not c.empty), default=0.0)
    return next(((size, unit) for unit, size in DURATIONS if longest >= 2 * size), (1.0, "s"))


def _first(frame: pd.DataFrame, column: str) -> float | None:
    value = frame[column].iloc[0] if not frame.empty and column in frame else None
    return None if value is None or pd.isna(value) else float(value)
