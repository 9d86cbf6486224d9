"""The Ranks page under AppTest: where a slow rank sits, what its step is spent on, and the straggler incidents."""

from __future__ import annotations

from pathlib import Path

import pytest
from dashboard_app import FAULTS, assert_rendered, chart, chart_keys, from_store, open_page, serve, table, texts

from bedside.app.simulation import SimulationConfig, simulate_run

SLOW_RANK = 5


@pytest.fixture(scope="module")
def straggling(tmp_path_factory) -> Path:
    """A simulated clean 8-rank run (4 per host) whose rank 5 computes twice as slowly from the first step."""
    run = tmp_path_factory.mktemp("straggling") / "straggling"
    simulate_run(
        SimulationConfig(
            ranks=8,
            steps=150,
            ranks_per_host=4,
            nuisances=False,
            inject=(f"straggler:rank={SLOW_RANK},factor=2,from=1",),
        ),
        run,
    )
    return run


# -- ranks --------------------------------------------------------------------------------------------------------


def test_the_ranks_page_orders_ranks_by_place_and_shows_their_slowdown(served: Path) -> None:
    app = open_page("ranks", run=FAULTS)
    assert_rendered(app)
    assert chart_keys(app) == ["rank_heatmap", "phase_breakdown"]
    places = from_store(served / FAULTS, "SELECT rank FROM ranks ORDER BY host, pp, tp, dp, rank")["rank"]
    assert chart(app, "rank_heatmap")["data"][0]["y"] == [f"rank {r}" for r in places]
    slowdowns = table(app, "rank", "compute_slowdown", "step_slowdown")
    assert sorted(slowdowns["rank"]) == sorted(places)
    assert list(slowdowns["compute_slowdown"]) == sorted(slowdowns["compute_slowdown"], reverse=True)
    assert "Straggler incidents" in [h.value for h in app.subheader]
    straggler = from_store(served / FAULTS, "SELECT summary FROM incidents WHERE list_contains(kinds, 'straggler')")
    assert straggler["summary"][0] in texts(app)


def test_the_ranks_page_puts_a_rank_twice_as_slow_first(straggling: Path, monkeypatch) -> None:
    serve(straggling)
    app = open_page("ranks")
    assert_rendered(app)
    heat = chart(app, "rank_heatmap")["data"][0]
    assert heat["y"] == [f"rank {r}" for r in range(8)]  # host, then stage and replica: rank order here
    slowdowns = table(app, "rank", "compute_slowdown")
    assert slowdowns["rank"][0] == SLOW_RANK
    assert slowdowns["compute_slowdown"][0] == pytest.approx(2.0, rel=0.1)
    assert slowdowns["compute_slowdown"][1:].between(0.9, 1.1).all()
