"""How a live page keeps its state across refreshes: one chart element per key that the browser updates in place,
the pause switch, and what the address holds (the training curves' step range, the incident open).

Streamlit's ``st.plotly_chart`` names its element by a hash of the figure, so each refresh with new data makes a
new element: the browser builds a new plot (the zoom is lost whatever ``uirevision`` says), draws the old one
beside it until the run ends, dims it meanwhile, and a hover over the plot being torn down throws. ``chart`` draws
the figure in a component whose identity is its key alone; the browser hands each new figure to ``Plotly.react``
on the same plot, which keeps what the viewer did (zoom, hidden traces) for as long as the figure's
``uirevision`` stays the same, and skips a figure it already shows. A chart given ``url`` keeps its x range in
the address under that name too, so that a link or a reload opens it zoomed the same way.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io
import streamlit as st

CHART_NAME = "bedside_chart"
PAUSE_KEY = "live_paused"
STEP_RANGE = "steps"
"""The query parameter holding the training curves' step range, ``90-150``."""
INCIDENT = "incident"
"""The query parameter naming the incident open on the Incidents page."""
CONFIG = {"displaylogo": False, "responsive": True}
PLOTLY_CHUNK = next(
    iter(sorted((Path(st.__file__).parent / "static" / "static" / "js").glob("PlotlyChart.*.js"))), None
)
"""Streamlit's own plotly.js bundle (loading it sets ``window.Plotly``): the browser has it already, nothing new is
served."""

LOADER_JS = """
let loading;
function plotly(chunk) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!loading) {  // Streamlit's bundle, next to the page's own script
    const entry = document.querySelector('script[type="module"][src*="/static/js/index."]');
    loading = import(new URL(chunk, entry ? entry.src : new URL("static/js/", document.baseURI)).href)
      .then(() => window.Plotly);
  }
  return loading;
}
"""

CHART_JS = (
    LOADER_JS
    + """
function xRange(change) {  // a zoom or pan of any x axis (they match), or a reset: null
  for (const [name, value] of Object.entries(change)) {
    if (/^xaxis\\d*\\.autorange$/.test(name) && value) return null;
    if (/^xaxis\\d*\\.range\\[0\\]$/.test(name)) return [value, change[name.replace("[0]", "[1]")]];
    if (/^xaxis\\d*\\.range$/.test(name)) return value;
  }
  return undefined;
}
export default function (component) {
  const { data, parentElement, setStateValue } = component;
  let box = parentElement.querySelector(":scope > .bedside-chart");
  if (!box) {  // marked as Streamlit marks its own plotly charts, for the tools that wait for charts drawn
    box = document.createElement("div");
    box.className = "bedside-chart stPlotlyChart";
    box.dataset.testid = "stPlotlyChart";
    box.dataset.key = data.key;
    box.appendChild(document.createElement("div"));
    parentElement.appendChild(box);
  }
  const plot = box.firstChild;
  if (plot.dataset.figure === data.figure) return;  // unchanged: nothing is drawn again
  plot.dataset.figure = data.figure;
  plotly(data.chunk).then((Plotly) => {
    const figure = JSON.parse(plot.dataset.figure);
    return Plotly.react(plot, figure.data, figure.layout, data.config);
  }).then(() => {
    if (!data.url || plot.dataset.listening) return;
    plot.dataset.listening = "1";
    plot.on("plotly_relayout", (change) => {
      const range = xRange(change);
      if (range !== undefined) setStateValue("x_range", range);
    });
  });
}
"""
)
_CHART = st.components.v2.component(CHART_NAME, js=CHART_JS, isolate_styles=False)
PRELOAD_JS = (
    LOADER_JS
    + """
export default function (component) { plotly(component.data.chunk); }
"""
)
_PRELOAD = st.components.v2.component("bedside_plotly_preload", js=PRELOAD_JS, isolate_styles=False)

STEADY_CSS = """<style>
/* A live panel's refresh leaves its elements as they are until their new values come: no dimming. Only the
   opacity: an expander relies on its transitions to open and close. */
[data-testid="stElementContainer"][data-stale="true"] { opacity: 1 !important; }
</style>"""


def steady() -> None:
    """Every page: elements a refresh is about to replace are not dimmed (Streamlit fades them to a third after
    half a second, which on a loaded machine is every refresh)."""
    st.html(STEADY_CSS)


def preload_plotly() -> None:
    """A page with charts, first: the browser starts fetching and compiling plotly.js (megabytes of script) as the
    page's script starts, from an empty element in the sidebar, rather than when its first chart arrives after its
    queries. (Not on a page without charts, such as SQL, which would only pay for it.)"""
    if PLOTLY_CHUNK is not None:
        with st.sidebar:
            _PRELOAD(key="plotly_preload", data={"chunk": PLOTLY_CHUNK.name})


def paused() -> bool:
    return bool(st.session_state.get(PAUSE_KEY))


def pause_switch() -> None:
    """The sidebar's switch: while on, no panel refreshes (a zoom or a table can be read in peace); turned off,
    every panel is drawn again at once."""
    st.sidebar.toggle(
        "Pause live updates",
        key=PAUSE_KEY,
        help="stop every panel's refresh; turned off, the page catches up at once",
    )


def every(refresh_s: float) -> float | None:
    """A live fragment's ``run_every``: the refresh period, or None while paused."""
    return None if paused() else refresh_s


def chart(figure: go.Figure, key: str, *, revision: str | None = None, url: str | None = None) -> None:
    """Draw ``figure`` as the element ``key``, updated in place on every refresh.

    ``revision``: what the viewer's zoom and legend clicks last until (the figure's ``uirevision``; default the
    key, or the figure's own); ``url``: the query parameter that holds the x range (zoom and pan, linked across
    subplots that share the x axis), read to draw the figure and written when the viewer zooms.
    """
    if revision is not None or figure.layout.uirevision is None:
        figure.update_layout(uirevision=revision or key)
    if url and (shown := parse_range(st.query_params.get(url))):
        figure.update_xaxes(range=list(shown), autorange=False)
    if PLOTLY_CHUNK is None:  # a Streamlit without the bundle: drawn anew on each refresh, but drawn
        st.plotly_chart(figure, key=key, config=CONFIG)
        return
    data = {"key": key, "figure": plotly.io.to_json(figure, validate=False), "config": CONFIG, "url": url}
    data["chunk"] = PLOTLY_CHUNK.name
    _CHART(
        key=key,
        data=data,
        default={"x_range": None},
        on_x_range_change=(lambda: keep_range(key, url)) if url else (lambda: None),
    )


def keep_range(key: str, url: str | None) -> None:
    """The viewer zoomed chart ``key``: its x range to the address (none: the whole axis)."""
    state: Any = st.session_state.get(key) or {}
    shown = format_range(state.get("x_range"))
    if url and shown:
        st.query_params[url] = shown
    elif url:
        st.query_params.pop(url, None)


def kept_order(before: list[str] | None, now: list[str]) -> list[str]:
    """A live picker's options: those of ``before`` still in ``now`` where they were, then the new ones in the
    order of ``now`` (the chosen option keeps its place, so an open dropdown stays open); ``now`` without
    ``before``."""
    if before is None:
        return list(now)
    current = set(now)
    kept = [item for item in before if item in current]
    seen = set(kept)
    return kept + [item for item in now if item not in seen]


def format_range(value: object) -> str | None:
    """An x range as the address holds it: ``[90, 150.5]`` -> ``90-150.5``; None for no range."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        return None
    return f"{_short(low)}-{_short(high)}"


def parse_range(text: str | None) -> tuple[float, float] | None:
    """The range ``format_range`` wrote (``90-150``, ``-5-12.5``), or None for anything else."""
    if not text:
        return None
    for cut in range(1, len(text)):
        if text[cut] != "-":
            continue
        try:
            low, high = float(text[:cut]), float(text[cut + 1 :])
        except ValueError:
            continue
        if math.isfinite(low) and math.isfinite(high) and low < high:
            return low, high
    return None


def _short(value: float) -> str:
    """Steps to a tenth: whole steps without a point."""
    rounded = round(value, 1)
    return str(int(rounded)) if rounded == int(rounded) else str(rounded)
