"""The Ranks page under AppTest: which rank is slow against its peers, on any timeline, what its step is spent on,
and the straggler incidents."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from dashboard_app import FAULTS, REWIND, assert_rendered, chart, chart_keys, from_store, open_page, serve, table, texts
from PIL import Image
from test_dashboard_browser import ARTIFACTS, browser, expect_visible  # noqa: F401  (the browser tests' fixtures)
from test_dashboard_browser import serve as http_serve  # noqa: F401

from bedside.app.dashboard import registry
from bedside.app.dashboard.rank_view import NO_PHASES, PHASE_RANKS
from bedside.app.simulation import SimulationConfig, simulate_run
from bedside.collectors.importers import import_csv

SLOW_RANK, DATA_RANK = 5, 2
BIG_RANKS, BIG_STEPS, BIG_SLOW, BIG_ONSET = 1024, 150, 637, 110
SHORT_STEPS, SHORT_ONSET = 40, 21
HUGE_RANKS, HUGE_STEPS, HUGE_SLOW, HUGE_ONSET = 4096, 60, 2050, 20


@pytest.fixture(scope="module")
def straggling(tmp_path_factory) -> Path:
    """A simulated 8-rank run in two pipeline stages (4 ranks per host), with its nuisances (the last stage computes
    12% longer), whose rank 5 computes twice as slowly from the first step and rank 2 reads its data slowly."""
    run = tmp_path_factory.mktemp("straggling") / "straggling"
    simulate_run(
        SimulationConfig(
            ranks=8,
            steps=150,
            ranks_per_host=4,
            pp=2,
            inject=(f"straggler:rank={SLOW_RANK},factor=2,from=1", f"straggler:rank={DATA_RANK},phase=data,from=1"),
        ),
        run,
    )
    return run


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """A simulated 1,024-rank run in four pipeline stages, 8 ranks per host, whose rank 637 computes 30% longer
    from step 110 on."""
    run = tmp_path_factory.mktemp("big") / "big"
    config = SimulationConfig(
        ranks=BIG_RANKS, steps=BIG_STEPS, pp=4, inject=(f"straggler:rank={BIG_SLOW},factor=1.3,from={BIG_ONSET}",)
    )
    simulate_run(config, run)
    return run


@pytest.fixture(scope="module")
def short(tmp_path_factory) -> Path:
    """The 1,024-rank run's first 40 steps, rank 637 slower from step 21 (for the browser: no incident needed)."""
    run = tmp_path_factory.mktemp("short") / "short"
    config = SimulationConfig(
        ranks=BIG_RANKS, steps=SHORT_STEPS, pp=4, inject=(f"straggler:rank={BIG_SLOW},factor=1.3,from={SHORT_ONSET}",)
    )
    simulate_run(config, run)
    return run


@pytest.fixture(scope="module")
def huge(tmp_path_factory) -> Path:
    """A simulated 4,096-rank run of 60 steps in four pipeline stages, 8 ranks per host, whose rank 2050 computes
    50% longer from step 20 on (the detectors blame it)."""
    run = tmp_path_factory.mktemp("huge") / "huge"
    config = SimulationConfig(
        ranks=HUGE_RANKS,
        steps=HUGE_STEPS,
        pp=4,
        nuisances=False,
        inject=(f"straggler:rank={HUGE_SLOW},factor=1.5,from={HUGE_ONSET}",),
    )
    simulate_run(config, run)
    return run


def heat(app) -> tuple[np.ndarray, list[int], list[str]]:
    """The heatmap's colour values (rows x steps), its steps and its row labels."""
    drawn = chart(app, "rank_heatmap")["data"][0]
    return np.asarray(drawn["z"], dtype=float), list(drawn["x"]), drawn["y"]


def test_the_ranks_page_orders_ranks_by_place_and_shows_their_slowdown_with_units(served: Path) -> None:
    app = open_page("ranks", run=FAULTS)
    assert_rendered(app)
    assert chart_keys(app) == ["rank_heatmap", "phase_breakdown"]
    places = from_store(served / FAULTS, "SELECT rank FROM ranks ORDER BY host, pp, tp, dp, rank")["rank"]
    assert chart(app, "rank_heatmap")["data"][0]["y"] == [f"rank {r}" for r in places]
    slowdowns = table(app, "rank", "compute_slowdown", "compute_ms", "step_ms", "comm_ms")
    assert "step_slowdown" not in slowdowns  # 1.00x on every rank of a synchronous job
    assert sorted(slowdowns["rank"]) == sorted(places)
    assert list(slowdowns["compute_slowdown"]) == sorted(slowdowns["compute_slowdown"], reverse=True)
    assert slowdowns["step_ms"].between(1, 1000).all()  # milliseconds
    straggler = from_store(served / FAULTS, "SELECT summary FROM incidents WHERE list_contains(kinds, 'straggler')")
    assert "Straggler incidents on timeline 0" in texts(app)
    assert straggler["summary"][0] in texts(app)


def test_a_rank_twice_as_slow_as_its_stage_comes_first_and_a_slower_stage_is_no_straggler(straggling: Path) -> None:
    serve(straggling)
    app = open_page("ranks")
    assert_rendered(app)
    z, _, rows = heat(app)
    assert rows == [f"rank {r}" for r in range(8)]  # host, then stage and replica: rank order here
    assert np.nanmean(z, axis=1).argmax() == SLOW_RANK
    slowdowns = table(app, "rank", "compute_slowdown", "data_slowdown")
    assert slowdowns["rank"][0] == SLOW_RANK
    assert slowdowns["compute_slowdown"][0] == pytest.approx(2.0, rel=0.1)
    assert slowdowns["compute_slowdown"][1:].between(0.95, 1.05).all()  # stage 1 computes 12% longer: its peers too
    assert slowdowns.set_index("rank")["data_slowdown"][DATA_RANK] > 2


def test_the_heatmap_colours_the_phase_chosen(straggling: Path) -> None:
    serve(straggling)
    app = open_page("ranks")
    assert app.radio(key="rank_phase").options == ["compute", "data", "comm", "optimizer", "step"]
    app = app.radio(key="rank_phase").set_value("data").run()
    assert_rendered(app)
    z, _, _ = heat(app)
    assert np.nanmedian(z, axis=1).argmax() == DATA_RANK
    assert chart(app, "rank_heatmap")["layout"]["title"]["text"].startswith("Data time by rank")


def test_the_straggler_of_1024_ranks_stands_out_of_the_heatmap_and_is_in_the_phase_chart(big: Path) -> None:
    serve(big)
    started = time.perf_counter()
    app = open_page("ranks")
    print(f"the Ranks page of {BIG_RANKS} ranks x {BIG_STEPS} steps in {time.perf_counter() - started:.1f} s")
    assert_rendered(app)
    z, steps, rows = heat(app)
    assert z.shape == (BIG_RANKS, BIG_STEPS)
    slow = rows.index(f"rank {BIG_SLOW}")
    onset = np.asarray(steps) >= BIG_ONSET + 2
    assert (z[:, onset].argmax(axis=0) == slow).all()
    assert (z[slow, onset] > 1.2).all()
    others = np.delete(z, slow, axis=0)
    assert np.nanquantile(np.abs(others - 1), 0.999) < 0.1
    assert np.abs(z[slow, np.asarray(steps) < BIG_ONSET] - 1).max() < 0.1
    assert len(chart(app, "rank_heatmap")["layout"]["shapes"]) == BIG_RANKS // 8 - 1 + 3  # hosts, then stages
    [blamed] = from_store(big, "SELECT ranks FROM findings WHERE kind = 'straggler' AND severity <> 'info'")["ranks"]
    assert list(blamed) == [BIG_SLOW]  # and a slower last stage, as info
    bars = chart(app, "phase_breakdown")["data"][0]["x"]
    assert f"rank {BIG_SLOW}*" in bars and len(bars) == PHASE_RANKS + 1  # its median over the window is not slow yet


@pytest.mark.slow(reason="its module fixture simulates a 4,096-rank run and the page detects and draws it")
def test_above_2048_ranks_the_heatmap_draws_bands_that_name_the_flagged_rank_and_one_opens(huge: Path) -> None:
    serve(huge)
    app = open_page("ranks")
    assert_rendered(app)
    assert chart_keys(app) == ["rank_heatmap", "rank_band_heatmap", "phase_breakdown"]
    drawn = chart(app, "rank_heatmap")["data"][0]
    z, slowest, steps = np.asarray(drawn["z"], dtype=float), np.asarray(drawn["customdata"]), np.asarray(drawn["x"])
    assert z.shape == (HUGE_RANKS // 8, HUGE_STEPS)  # 512 bands of 8 ranks (a host each here), not 4,096 rows
    band = HUGE_SLOW // 8  # hosts hold consecutive ranks of one stage: rank order
    assert [i for i, label in enumerate(drawn["y"]) if f"(flagged: rank {HUGE_SLOW})" in label] == [band]
    assert drawn["y"][band].endswith(f"ranks {band * 8}-{band * 8 + 7} (flagged: rank {HUGE_SLOW})")
    late = steps >= HUGE_ONSET + 1
    assert (z[:, late].argmax(axis=0) == band).all() and (slowest[band, late] == HUGE_SLOW).all()
    assert (z[band, late] > 1.3).all() and np.nanquantile(np.abs(np.delete(z, band, axis=0) - 1), 0.99) < 0.2
    layout = chart(app, "rank_heatmap")["layout"]
    assert dict(zip(layout["yaxis"]["tickvals"], layout["yaxis"]["ticktext"]))[drawn["y"][band]] == f"rank {HUGE_SLOW}*"
    picker = app.selectbox(key="rank_band")
    assert picker.value == band  # the band holding the flagged rank is offered first
    inner = chart(app, "rank_band_heatmap")["data"][0]
    assert inner["y"] == [f"rank {r}" for r in range(band * 8, band * 8 + 8)]
    assert (np.asarray(inner["z"], dtype=float)[:, late].argmax(axis=0) == HUGE_SLOW - band * 8).all()
    app = picker.select(0).run()
    assert_rendered(app)
    assert chart(app, "rank_band_heatmap")["data"][0]["y"] == [f"rank {r}" for r in range(8)]


@pytest.mark.slow(reason="bedside serve driven from Chromium, the heatmap read pixel by pixel")
def test_in_the_browser_the_stragglers_row_of_pixels_is_the_reddest_after_its_onset(short: Path, request) -> None:
    chromium = request.getfixturevalue("browser")
    registry.close_all()  # no store of this process's in the way
    url = request.getfixturevalue("http_serve")(short, token=None)
    context = chromium.new_context(viewport={"width": 1400, "height": 1600})
    try:
        tab = context.new_page()
        tab.goto(f"{url}/ranks")
        expect_visible(tab.get_by_text("Compute time by rank, over its peers'"), timeout_s=120)
        tab.locator(".heatmaplayer image").first.wait_for(timeout=60_000)
        plot = tab.locator(".js-plotly-plot .nsewdrag").first
        height = plot.bounding_box()["height"]
        ARTIFACTS.mkdir(exist_ok=True)
        shot = plot.screenshot(path=str(ARTIFACTS / "ranks-1024-heatmap.png"))
        pixels = np.asarray(Image.open(io.BytesIO(shot)).convert("RGB"), dtype=float)
    finally:
        context.close()
    assert height >= BIG_RANKS  # a pixel for every rank
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    red = np.where(r >= b, 255 - g, g - 255)  # RdBu: white 0, the deepest red 255, the deepest blue -255
    onset = round((SHORT_ONSET + 1 - 0.5) / SHORT_STEPS * red.shape[1])  # the x axis spans steps 0.5 to 40.5
    row = (BIG_SLOW + 0.5) * red.shape[0] / BIG_RANKS  # hosts hold consecutive ranks of one stage: rank order
    reddest = red[:, onset:].mean(axis=1).argmax()
    assert abs(reddest - row) <= 1.5  # rows are about 1.04 px: the straggler's is drawn on one of two pixel rows
    assert red[reddest, onset:].mean() > 200
    assert abs(red[reddest, : onset - 10].mean()) < 60


def test_a_rewound_runs_first_timeline_stays_viewable(served: Path) -> None:
    app = open_page("ranks", run=REWIND)
    spans = from_store(served / REWIND, "SELECT timeline, first_step, last_step FROM timelines ORDER BY timeline")
    assert list(spans["timeline"]) == [0, 1]
    picker = app.selectbox(key="rank_timeline")
    assert picker.value == 1
    _, steps, _ = heat(app)
    assert min(steps) == spans["first_step"][1]
    app = picker.select(0).run()
    assert_rendered(app)
    _, steps, _ = heat(app)
    assert (min(steps), max(steps)) == (spans["first_step"][0], spans["last_step"][0])
    assert "Straggler incidents on timeline 0" in texts(app)


def test_a_run_without_phase_times_says_so(tmp_path: Path) -> None:
    csv = tmp_path / "steps.csv"
    rows = [f"{s},,2.5,\n{s},0,,1.0\n{s},1,,1.1\n" for s in range(1, 21)]
    csv.write_text("step,rank,loss,step_time\n" + "".join(rows))
    import_csv(csv, tmp_path / "imported")
    serve(tmp_path / "imported")
    app = open_page("ranks")
    assert_rendered(app)
    assert chart_keys(app) == ["rank_heatmap"]
    assert NO_PHASES in texts(app)
    assert app.radio(key="rank_phase").options == ["step"]
    z, _, _ = heat(app)
    assert z[1] == pytest.approx(1.1 / 1.05, rel=1e-3)  # no topology: against every rank
