"""Overview: is the run alive, is it learning for the compute spent, and what is open."""

from __future__ import annotations

import time

import streamlit as st

from bedside.app.dashboard import curves, figures, live, summaries
from bedside.app.dashboard.common import STATUS_LABELS, age, as_of, current_run, number

INCIDENTS_PAGE = "screens/incidents.py"
SEVERITIES = ("critical", "warning", "info")

live.preload_plotly()  # its charts need plotly.js: fetched while the queries run
data = current_run()
st.title(data.title())


@st.fragment(run_every=live.every(data.refresh_s))
def overview() -> None:
    run = data.frame("run")
    now = time.time()
    st.caption(as_of(run["last_seen"].iloc[0] if not run.empty else None, now))
    t = summaries.tiles(
        run, data.frame("progress", window=50), data.frame("good_checkpoint"), data.frame("open_incidents"), now
    )
    top, bottom = st.columns(4), st.columns(4)
    top[0].metric("Status", STATUS_LABELS.get(t.status, t.status))
    top[1].metric("Step", "–" if t.step is None else f"{t.step:,}")
    top[1].caption(f"timeline {t.timeline}" if t.timeline is not None else "")
    top[2].metric("Tokens", number(t.tokens))
    top[3].metric("FLOPs spent", number(t.flops, "FLOP"), help="every timeline, abandoned branches included")
    bottom[0].metric("Tokens/s", number(t.tokens_per_s), help="over the last 50 steps")
    bottom[1].metric(
        "MFU",
        "–" if t.mfu is None else f"{t.mfu:.1%}",
        help="model FLOPs per second / (ranks x peak_flops_per_device of the run's config)",
    )
    bottom[2].metric("Since good checkpoint", age(t.since_checkpoint_s))
    # read-only, the incidents are in the process holding the store; before detection ran: unknown here, not 0
    detected = data.can_write and data.owner.detected_at is not None
    bottom[3].metric("Open incidents", sum(t.open_incidents.values()) if detected else "–")
    severities = ", ".join(f"{t.open_incidents[s]} {s}" for s in SEVERITIES if s in t.open_incidents)
    bottom[3].page_link(
        INCIDENTS_PAGE,
        label=f"{severities} · {t.acknowledged} acknowledged" if detected and severities else "Incidents",
        icon=":material/crisis_alert:",
        query_params={"run": data.name},
    )

    evals = data.frame("evals")
    metric = summaries.headline_metric(evals)
    if metric:
        band = summaries.forecast_band(evals, metric)
        marks = summaries.incidents_on_evals(data.frame("incidents"), evals, metric)
        live.chart(curves.eval_vs_compute(evals, metric, band, marks), "eval_vs_compute")
    else:
        st.info("No held-out evals yet: eval versus compute appears with the first eval record.")
    steps = data.frame("steps")
    if steps.empty:
        st.info("No training steps yet.")
        return
    log_toggle, smoothing_slider = st.columns([1, 3])
    log_y = log_toggle.toggle("Log y", key="curves_log_y", help="loss, gradient norm and learning rate")
    smoothing = smoothing_slider.slider(
        "Smoothing",
        0.0,
        0.99,
        0.0,
        0.01,
        key="curves_smoothing",
        help="an exponential moving average with this weight on the past, as TensorBoard's; the raw line stays "
        "faint behind",
    )
    figure = curves.training_curves(
        steps, data.frame("incidents"), data.frame("actions"), log_y=log_y, smoothing=smoothing
    )
    # the step range lasts through refreshes, toggles and reloads; a y zoom until Log y is switched
    live.chart(figure, "training_curves", revision=f"training, log y {log_y}", url=live.STEP_RANGE)
    live.chart(figures.goodput_bar(data.frame("goodput")), "goodput")
    st.caption(
        "Goodput: every second from the run's first record to its last, in one category (docs/schema.md); "
        "abandoned timelines and steps redone after a restart are compute that bought nothing."
    )


overview()
