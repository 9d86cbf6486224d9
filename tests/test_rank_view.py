"""The Ranks page's figures and summaries as plain functions of query-shaped frames (no Streamlit, no store)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bedside.app.dashboard.rank_view import (
    MAX_SPAN,
    MIN_SPAN,
    bands,
    flagged_ranks,
    phase_breakdown,
    phase_ranks,
    rank_heatmap,
    reported_phases,
    straggler_incidents,
    unresolved,
)


def places(ranks: int, per_host: int, stages: int = 1) -> pd.DataFrame:
    """``rank_order`` rows: consecutive ranks per host, the stage the slowest index."""
    rank = np.arange(ranks)
    per_stage = ranks // stages
    return pd.DataFrame(
        {"rank": rank, "host": [f"node-{r // per_host:04d}" for r in rank], "dp": rank % per_stage, "tp": 0}
        | {"pp": rank // per_stage}
    )


def cells(ranks: int | pd.DataFrame, steps: int, ratio=lambda rank, step: 1.0, band: int = 1) -> pd.DataFrame:
    """``rank_heatmap`` rows of ``rank_rows`` rows (or of ranks 0..n-1 in order), bands of ``band`` rows: each
    band's highest ratio at every step, and its rank."""
    order = list(ranks["rank"]) if isinstance(ranks, pd.DataFrame) else list(range(ranks))
    out = []
    for first in range(0, len(order), band):
        for s in range(steps):
            slowest = max(order[first : first + band], key=lambda r: ratio(r, s))
            out.append((first // band, s, ratio(slowest, s), slowest))
    return pd.DataFrame(out, columns=["band", "step", "ratio", "slowest_rank"])


def test_the_rank_heatmap_puts_the_ranks_in_the_order_given() -> None:
    order = places(5, per_host=5).iloc[[3, 1, 4, 0, 2]]
    fig = rank_heatmap(cells(order, 3, lambda r, s: 1.0 + r / 10), order, "compute")
    [heat] = fig.data
    assert list(heat.y) == ["rank 3", "rank 1", "rank 4", "rank 0", "rank 2"]
    assert list(heat.x) == [0, 1, 2]
    np.testing.assert_allclose(np.asarray(heat.z)[:, 0], [1.3, 1.1, 1.4, 1.0, 1.2], rtol=1e-6)
    assert fig.layout.yaxis.autorange == "reversed"  # the first in order on top


def test_the_colour_scale_is_centred_on_1_and_not_set_by_a_stall() -> None:
    stalled = cells(64, 100, lambda r, s: 40.0 if (r, s) == (3, 50) else 1.0 + 0.01 * ((r + s) % 3 - 1))
    [heat] = rank_heatmap(stalled, places(64, 8), "compute").data
    assert (heat.zmin, heat.zmax) == (pytest.approx(1 - MIN_SPAN), pytest.approx(1 + MIN_SPAN))
    slow = cells(64, 100, lambda r, s: 5.0 if r < 8 else 1.0)  # a whole host five times slower
    [heat] = rank_heatmap(slow, places(64, 8), "compute").data
    assert (heat.zmin, heat.zmax) == (pytest.approx(1 - MAX_SPAN), pytest.approx(1 + MAX_SPAN))


def test_the_heatmap_draws_a_line_between_hosts_and_a_heavier_one_between_stages() -> None:
    fig = rank_heatmap(cells(16, 4), places(16, per_host=4, stages=2), "compute")
    lines = {(shape.y0, shape.line.width) for shape in fig.layout.shapes}
    assert lines == {(3.5, 0.5), (7.5, 0.5), (11.5, 0.5), (7.5, 2)}
    assert fig.layout.yaxis.tickvals is None  # few ranks: every row says its rank


def test_above_64_ranks_the_rows_are_named_by_host() -> None:
    fig = rank_heatmap(cells(128, 2), places(128, per_host=8), "data")
    assert list(fig.layout.yaxis.tickvals) == [f"rank {r}" for r in range(0, 128, 8)]
    assert list(fig.layout.yaxis.ticktext) == [f"node-{h:04d}" for h in range(16)]
    assert "data time" in fig.data[0].hovertemplate


def test_the_heatmap_keeps_a_pixel_for_every_rank() -> None:
    fig = rank_heatmap(cells(1024, 2), places(1024, per_host=8), "compute")
    assert fig.layout.height - fig.layout.margin.t - fig.layout.margin.b >= 1024


def test_bands_of_ranks_are_coloured_by_their_slowest_and_name_it_and_the_flagged_ranks() -> None:
    slow = lambda r, s: 1.5 if r == 77 else 1.0 + r / 10_000  # noqa: E731
    fig = rank_heatmap(cells(1024, 3, slow, band=8), places(1024, per_host=8), "compute", band=8, flagged=[77])
    [heat] = fig.data
    z, slowest = np.asarray(heat.z), np.asarray(heat.customdata)
    assert z.shape == slowest.shape == (128, 3)
    assert z[:, 0].argmax() == 77 // 8 and (slowest[9] == 77).all() and (slowest[0] == 7).all()
    assert heat.y[9] == "node-0009: ranks 72-79 (flagged: rank 77)" and heat.y[0] == "node-0000: ranks 0-7"
    assert "rank %{customdata} the slowest" in heat.hovertemplate and "%{y}" in heat.hovertemplate
    ticks = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext))
    assert ticks[heat.y[9]] == "rank 77*" and ticks[heat.y[0]] == "node-0000"  # the flagged band is named on the axis
    assert fig.layout.title.text.startswith("Compute time by band of 8 ranks")


def test_a_band_spanning_hosts_names_them_and_the_last_band_may_be_short() -> None:
    rows = places(20, per_host=4)
    labelled = bands(rows, 8, flagged=[19])
    assert list(labelled["label"]) == [
        "node-0000-node-0001: ranks 0-7",
        "node-0002-node-0003: ranks 8-15",
        "node-0004: ranks 16-19 (flagged: rank 19)",
    ]
    assert list(labelled["first_row"]) == [0, 8, 16] and list(labelled["flagged"]) == [[], [], [19]]


def phases(compute: list[float], **columns) -> pd.DataFrame:
    """``rank_phases`` rows, slowest compute against peers first."""
    frame = pd.DataFrame({"rank": range(len(compute)), "compute_ms": compute} | columns)
    frame["compute_slowdown"] = frame["compute_ms"] / frame["compute_ms"].median()
    return frame.sort_values("compute_slowdown", ascending=False).reset_index(drop=True)


def test_the_phase_chart_shows_the_slowest_ranks_and_every_flagged_one() -> None:
    table = phases([750.0 + r for r in range(100)], data_ms=20.0, step_ms=900.0)
    shown = phase_ranks(table, flagged=[3], top=4)
    assert list(shown["rank"]) == [99, 98, 97, 96, 3]
    fig = phase_breakdown(shown, flagged=[3])
    assert [trace.name for trace in fig.data] == ["compute", "data"]  # the phases reported, not step time
    assert list(fig.data[0].x) == ["rank 99", "rank 98", "rank 97", "rank 96", "rank 3*"]
    assert fig.layout.yaxis.title.text == "median ms per step"


def test_a_run_without_phase_times_reports_none() -> None:
    table = pd.DataFrame({"rank": [0, 1], "step_ms": [900.0, 901.0]} | {f"{p}_ms": np.nan for p in ("compute", "data")})
    assert reported_phases(table) == []
    assert reported_phases(phases([1.0, 2.0], comm_ms=np.nan, optimizer_ms=3.0)) == ["compute", "optimizer"]


def test_the_flagged_ranks_are_those_the_unresolved_straggler_incidents_of_the_timeline_blame() -> None:
    incidents = pd.DataFrame(
        [
            ("a", 0, "open", ["straggler"]),
            ("b", 0, "acknowledged", ["straggler", "throughput_drop"]),
            ("c", 0, "resolved", ["straggler"]),
            ("d", 0, "open", ["loss_spike"]),
            ("e", 1, "open", ["straggler"]),
        ],
        columns=["incident_id", "timeline", "status", "kinds"],
    )
    stragglers = straggler_incidents(incidents, 0)
    assert list(stragglers["incident_id"]) == ["a", "b", "c"]
    assert unresolved(stragglers) == ["a", "b"]
    findings = pd.DataFrame(
        [
            ("straggler", "warning", [637]),
            ("straggler", "info", list(range(768, 1024))),  # a slower pipeline stage: every rank of it
            ("straggler", "critical", [5, 6]),
            ("throughput_drop", "warning", [1]),
        ],
        columns=["kind", "severity", "ranks"],
    )
    assert flagged_ranks(findings) == [5, 6, 637]
