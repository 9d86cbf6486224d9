"""The live pages' state under AppTest (the browser's side is tests/test_dashboard_live_browser.py): the step range
and the incident in the address, the pause switch, each chart's revision, and the pure rules behind them."""

from __future__ import annotations

from pathlib import Path

import pytest
from dashboard_app import FAULTS, assert_rendered, chart, chart_keys, from_store, open_page
from streamlit.testing.v1 import AppTest

from bedside.app.dashboard import live


@pytest.mark.parametrize(
    ("shown", "text"),
    [((90, 150), "90-150"), ((90.04, 150.46), "90-150.5"), ((-5, 12.2), "-5-12.2"), ((-20.5, -3), "-20.5--3")],
)
def test_a_step_range_reads_back_from_the_address_as_written(shown: tuple[float, float], text: str) -> None:
    assert live.format_range(list(shown)) == text
    low, high = live.parse_range(text)
    assert (low, high) == pytest.approx(shown, abs=0.051)


@pytest.mark.parametrize("text", [None, "", "90", "150-90", "a-b", "90-90", "nan-3", "1-inf", "90-150-"])
def test_an_address_without_a_range_draws_the_whole_axis(text: str | None) -> None:
    assert live.parse_range(text) is None


@pytest.mark.parametrize("value", [None, [], [1], [3, 1], ["a", 2], [float("nan"), 2], (1, 2, 3)])
def test_no_range_is_written_for_a_reset_or_nonsense(value: object) -> None:
    assert live.format_range(value) is None


def test_a_picker_keeps_its_options_in_place_and_adds_new_ones_at_the_end() -> None:
    assert live.kept_order(None, ["c", "a", "b"]) == ["c", "a", "b"]  # a page's own run: the triage order
    assert live.kept_order(["a", "b"], ["c", "b", "a"]) == ["a", "b", "c"]
    assert live.kept_order(["a", "b", "c"], ["c", "a"]) == ["a", "c"]  # gone: dropped, the rest keep their order


def paused_period() -> None:
    """A page reduced to the switch and one live fragment's period."""
    import streamlit as st

    from bedside.app.dashboard import live

    live.pause_switch()
    st.markdown(f"every {live.every(2.0)}")


def test_the_pause_switch_stops_every_live_fragment_and_turning_it_off_restarts_them() -> None:
    app = AppTest.from_function(paused_period).run()
    assert [m.value for m in app.markdown] == ["every 2.0"]
    app.sidebar.toggle(key=live.PAUSE_KEY).set_value(True).run()
    assert [m.value for m in app.markdown] == ["every None"]  # run_every=None: the fragment waits
    app.sidebar.toggle(key=live.PAUSE_KEY).set_value(False).run()
    assert [m.value for m in app.markdown] == ["every 2.0"]


def test_the_overview_draws_the_training_curves_at_the_step_range_of_its_address(served: Path) -> None:
    app = open_page("overview", run=FAULTS, steps="40-120.5")
    assert_rendered(app)
    layout = chart(app, "training_curves")["layout"]
    axes = [name for name in layout if name.startswith("xaxis")]
    assert len(axes) >= 3 and all(layout[a]["range"] == [40, 120.5] for a in axes)  # every panel, one range
    assert layout["uirevision"] == "training, log y False"
    app.toggle(key="curves_log_y").set_value(True).run()
    layout = chart(app, "training_curves")["layout"]
    assert layout["xaxis"]["range"] == [40, 120.5] and layout["uirevision"] == "training, log y True"


def test_without_a_range_in_the_address_the_curves_span_the_run_and_each_chart_has_a_revision(served: Path) -> None:
    app = open_page("overview", run=FAULTS)
    assert_rendered(app)
    assert chart_keys(app) == ["eval_vs_compute", "training_curves", "goodput"]
    assert "range" not in chart(app, "training_curves")["layout"]["xaxis"]
    assert chart(app, "eval_vs_compute")["layout"]["uirevision"] == "eval_vs_compute"
    assert live.STEP_RANGE not in app.query_params


def test_the_incident_open_goes_into_the_address_and_a_link_to_it_opens_it(served: Path) -> None:
    ids = from_store(served / FAULTS, "SELECT incident_id FROM incidents ORDER BY incident_id")["incident_id"].tolist()
    assert len(ids) >= 2
    app = open_page("incidents", run=FAULTS)
    assert_rendered(app)
    first = app.selectbox(key="incident").value
    assert app.query_params[live.INCIDENT] == first
    other = next(i for i in ids if i != first)
    app.selectbox(key="incident").set_value(other).run()
    assert app.query_params[live.INCIDENT] == other
    assert chart(app, "incident_evidence")["layout"]["uirevision"] == other  # a zoom lasts while it stays open

    linked = open_page("incidents", run=FAULTS, incident=other)  # a reload, or the link shared
    assert linked.selectbox(key="incident").value == other
