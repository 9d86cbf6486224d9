"""The Ranks page's figures and summaries (plain functions of query results, no Streamlit): a rank x step heatmap
of each rank's phase time over its peers', the ranks whose phases are worth drawing, and their breakdown.

In a synchronous job every rank's step takes as long as the slowest one's, so step time cannot point at a slow
rank: its own phases can. A rank is compared with its peers, the ranks at its place (same pipeline stage and TP
index), so a stage that is slower by design is not a straggler; a job-wide stall (an eval, a checkpoint) moves
the peers' median with it and leaves every ratio near 1.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bedside.detectors.incidents import id_ranges

from .figures import apply_layout

PHASES = ("compute", "data", "comm", "optimizer")
"""The phases a run may report (``<phase>_time`` in rank_step metrics), in the order the page offers them."""
PHASE_COLORS = {"data": "#a78bfa", "compute": "#2563eb", "comm": "#f97316", "optimizer": "#10b981"}
SPAN_QUANTILE = 0.995
"""The colour scale spans this quantile of the cells' distance from 1: a few stalled cells do not set it."""
MIN_SPAN, MAX_SPAN = 0.2, 1.0
"""The colour scale is 1 +- span, the span clipped to these: noise of a few % stays pale, 10% slower is plain red."""
RANK_TICKS = 64
"""Up to this many ranks the rows are labelled by rank; above, by host (at most ``HOST_TICKS`` labels)."""
HOST_TICKS = 48
ROW_PX, MIN_PLOT_PX, MAX_PLOT_PX, AROUND_PX = 14, 240, 680, 140
"""Rows of 14 px, the plot 240 to 680 px tall, yet never under 1 px per row (so that no row is dropped), and
``AROUND_PX`` for the title and the step axis."""
NO_PHASES = "This run reports no phase times (data, compute, communication, optimizer): only its step times."
PHASE_RANKS = 32
"""The phase chart shows the ranks slowest in compute against their peers, this many, and every flagged rank."""
BAND_ABOVE, HEATMAP_ROWS = 2048, 512
"""Above ``BAND_ABOVE`` ranks the heatmap's rows are bands of consecutive ranks, at most ``HEATMAP_ROWS`` of them."""
INCIDENT_MARGIN = 30
"""Steps drawn before and after an incident around its evidence (the Incidents page, the post-mortem report)."""


def band_size(rank_rows: int) -> int:
    """Ranks per heatmap row for ``rank_rows`` ranks: one each up to ``BAND_ABOVE``, else bands that make at most
    ``HEATMAP_ROWS`` rows."""
    return 1 if rank_rows <= BAND_ABOVE else -(-rank_rows // HEATMAP_ROWS)


def reported_phases(phases: pd.DataFrame) -> list[str]:
    """The phases the run reports (a value on some rank), in ``PHASES`` order."""
    return [p for p in PHASES if f"{p}_ms" in phases and phases[f"{p}_ms"].notna().any()]


def colour_span(ratios: np.ndarray) -> float:
    """How far from 1 the colour scale reaches: the ``SPAN_QUANTILE`` of the cells' distance, within limits."""
    distance = np.abs(ratios[np.isfinite(ratios)] - 1)
    span = float(np.quantile(distance, SPAN_QUANTILE)) if distance.size else MIN_SPAN
    return min(max(span, MIN_SPAN), MAX_SPAN)


def bands(rows: pd.DataFrame, band: int, flagged: Iterable[int] = ()) -> pd.DataFrame:
    """The heatmap's rows (``rank_rows`` rows, in order) grouped ``band`` at a time: each band's label (its host and
    ranks, and the flagged ones it holds), first row, host, stage and flagged ranks."""
    marked = {int(r) for r in flagged}
    ranks = rows["rank"].to_numpy(dtype=np.int64)
    hosts = rows["host"].to_numpy(dtype=object) if "host" in rows else np.full(len(rows), None, dtype=object)
    stages = rows["pp"].to_numpy(dtype=object) if "pp" in rows else np.full(len(rows), None, dtype=object)
    firsts = np.arange(0, len(rows), band)
    labels: list[str] = []
    hits_of: list[list[int]] = []
    for first in firsts.tolist():
        members = ranks[first : first + band].tolist()
        hits = sorted(marked.intersection(members))
        hits_of.append(hits)
        if band == 1:
            labels.append(f"rank {members[0]}")
            continue
        named = list(dict.fromkeys(h for h in hosts[first : first + band] if isinstance(h, str)))
        where = f"{named[0]}: " if len(named) == 1 else f"{named[0]}-{named[-1]}: " if named else ""
        flags = f" (flagged: rank {id_ranges(hits)})" if hits else ""
        labels.append(f"{where}ranks {id_ranges(members, runs=3)}{flags}")
    out = {"band": np.arange(len(firsts)), "label": labels, "first_row": firsts, "host": hosts[firsts]}
    out |= {"pp": stages[firsts], "flagged": hits_of}
    return pd.DataFrame(out)


def heat_grid(cells: pd.DataFrame, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``rank_heatmap`` query's cells as (rows, steps) arrays of ratios and of the rank that has each, and the
    steps."""
    steps = np.unique(cells["step"].to_numpy())
    at = (cells["band"].to_numpy(dtype=np.int64), np.searchsorted(steps, cells["step"].to_numpy()))
    grid = np.full((rows, len(steps)), np.nan, dtype=np.float32)
    grid[at] = cells["ratio"].to_numpy(dtype=np.float32, na_value=np.nan)
    slowest = np.full((rows, len(steps)), -1, dtype=np.int32)
    slowest[at] = cells["slowest_rank"].to_numpy(dtype=np.int32)
    return grid, slowest, steps


def rank_heatmap(
    cells: pd.DataFrame, rows: pd.DataFrame, phase: str, *, band: int = 1, flagged: Iterable[int] = ()
) -> go.Figure:
    """Each rank's ``phase`` time over its peers' (rows: ``rank_rows``, by host, then mesh coordinates; columns:
    step buckets) on a scale centred on 1, with a line between hosts and a heavier one between pipeline stages.
    With ``band`` > 1 each row is a band of that many ranks coloured by its slowest one, which the hover names,
    with the flagged ranks it holds."""
    labelled = bands(rows, band, flagged)
    grid, slowest, steps = heat_grid(cells, len(labelled))
    span = colour_span(grid)
    labels = labelled["label"].tolist()
    if band == 1:
        hover = f"%{{y}}, step %{{x}}: %{{z:.2f}}x its peers' {phase} time<extra></extra>"
        extra: dict = {}
    else:
        extra = {"customdata": slowest}
        hover = f"%{{y}}<br>step %{{x}}: rank %{{customdata}} the slowest, %{{z:.2f}}x its peers' {phase} time<extra></extra>"
    fig = go.Figure(
        go.Heatmap(
            z=grid,
            x=steps,
            y=labels,
            zmin=1 - span,
            zmax=1 + span,
            colorscale="RdBu_r",
            colorbar={"title": f"{phase} time<br>x peers'"},
            hovertemplate=hover,
            **extra,
        )
    )
    fig.update_layout(shapes=separators(labelled))
    fig.update_yaxes(autorange="reversed", **host_ticks(labelled))
    fig.update_xaxes(title="step")
    plot_px = max(min(max(ROW_PX * len(labelled), MIN_PLOT_PX), MAX_PLOT_PX), len(labelled))
    what = "rank" if band == 1 else f"band of {band} ranks (its slowest)"
    return apply_layout(fig, f"{phase.capitalize()} time by {what}, over its peers'", height=plot_px + AROUND_PX)


def separators(rows: pd.DataFrame) -> list[dict]:
    """Lines across the heatmap where the host changes from one row to the next, heavier where the stage does."""
    shapes = []
    for column, width, colour in (("host", 0.5, "#64748b"), ("pp", 2, "#111827")):
        if column not in rows or rows[column].isna().all():
            continue
        values = rows[column].astype(str).to_numpy()
        for i in np.flatnonzero(values[1:] != values[:-1]) + 1:
            shapes.append(_line(float(i) - 0.5, width, colour))
    return shapes


def _line(y: float, width: float, colour: str) -> dict:
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y} | {
        "line": {"width": width, "color": colour}
    }


def host_ticks(rows: pd.DataFrame) -> dict:
    """Above ``RANK_TICKS`` rows, the y axis names the hosts at their first row (every k-th host when crowded), and
    every row holding a flagged rank (``bands`` rows)."""
    if len(rows) <= RANK_TICKS or "host" not in rows or rows["host"].isna().all():
        return {}
    hosts = rows["host"].astype(str).to_numpy()
    firsts = np.flatnonzero(np.r_[True, hosts[1:] != hosts[:-1]])
    firsts = firsts[:: -(-len(firsts) // HOST_TICKS)]
    names = dict(zip(firsts.tolist(), hosts[firsts]))
    for i in np.flatnonzero(rows["flagged"].map(len).to_numpy()):
        names[int(i)] = f"rank {id_ranges(rows['flagged'].iloc[i], runs=2)}*"
    labels = rows["label"].tolist()
    return {"tickmode": "array", "tickvals": [labels[i] for i in names], "ticktext": list(names.values())}


def straggler_incidents(incidents: pd.DataFrame, timeline: int) -> pd.DataFrame:
    """The straggler incidents of ``timeline`` (the ``incidents`` query's rows)."""
    return incidents[(incidents["timeline"] == timeline) & incidents["kinds"].map(lambda kinds: "straggler" in kinds)]


def unresolved(stragglers: pd.DataFrame) -> list[str]:
    """The ids of the incidents of ``stragglers`` not yet resolved."""
    return stragglers.loc[stragglers["status"] != "resolved", "incident_id"].tolist()


def flagged_ranks(findings: pd.DataFrame) -> list[int]:
    """The ranks that straggler ``findings`` blame: a warning or worse (not a slower stage or a contended machine,
    which the detector reports as info about every rank of the position)."""
    blamed = findings[(findings["kind"] == "straggler") & (findings["severity"] != "info")]
    return sorted({int(r) for ranks in blamed["ranks"] for r in ranks})


def phase_ranks(phases: pd.DataFrame, flagged: Iterable[int], top: int = PHASE_RANKS) -> pd.DataFrame:
    """The ``top`` ranks slowest in compute against their peers and every flagged rank, slowest first (the
    ``rank_phases`` query's rows, already in that order)."""
    shown = phases.head(top)
    extra = phases[phases["rank"].isin(list(flagged)) & ~phases["rank"].isin(shown["rank"])]
    return pd.concat([shown, extra]).sort_values("compute_slowdown", ascending=False, na_position="last", kind="stable")


def phase_breakdown(shown: pd.DataFrame, flagged: Iterable[int] = ()) -> go.Figure:
    """Each shown rank's median time per phase, stacked; a flagged rank's label ends in ``*``."""
    marked = set(flagged)
    labels = [f"rank {r}*" if r in marked else f"rank {r}" for r in shown["rank"]]
    fig = go.Figure()
    for phase in reported_phases(shown):
        fig.add_trace(go.Bar(x=labels, y=shown[f"{phase}_ms"], name=phase, marker_color=PHASE_COLORS[phase]))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(type="category")
    fig.update_yaxes(title="median ms per step")
    return apply_layout(fig, "Where each rank's step goes (slowest compute against its peers first)")
