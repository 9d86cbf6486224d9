"""What every page shares: the run being looked at, the operator's unlock, and small formatting helpers."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import streamlit as st

from bedside.collectors.audit import check_operator
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import read_run_info

from . import live
from .auth import Lockout
from .data import RunData
from .formats import STATUS_LABELS as STATUS_LABELS
from .formats import age, clock
from .formats import number as number
from .registry import Desk, desk

SEVERITY_MARKS = {"critical": ":red[●]", "warning": ":orange[●]", "info": ":blue[●]"}


def current_run() -> RunData:
    """The run chosen in the sidebar (or by the ``run`` query parameter of a link), with its data layer."""
    try:
        served = desk()
    except BedsideError as exc:
        st.error(str(exc))
        st.stop()
    runs = served.runs()
    if not runs:
        st.info(f"No run in {served.target} yet: reload once one has started (bedside takes it over as it appears).")
        st.stop()
    names = [r.name for r in runs]
    wanted = linked_run(st.query_params.get("run"), runs)
    if wanted and "run" not in st.session_state:
        st.session_state["run"] = wanted
    name = st.sidebar.selectbox("Run", names, key="run")
    st.query_params["run"] = name  # the address names the run shown, for reloads and shared links
    data = served.data(runs[names.index(name)])
    if data.note:
        st.sidebar.warning(data.note)
    live.pause_switch()
    operator_panel(served)
    return data


NARROW_SCREEN_CSS = """<style>
@media (max-width: 640px) {  /* a phone: a row of tiles wraps two by two, not one per row */
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"] [data-testid="stMetric"]) {
    flex-wrap: wrap !important;
  }
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"] [data-testid="stMetric"]) > [data-testid="stColumn"] {
    flex: 1 1 calc(50% - 1rem) !important;
    min-width: calc(50% - 1rem) !important;
    width: calc(50% - 1rem) !important;
  }
}
</style>"""


def narrow_screens() -> None:
    """Every page's rows of tiles two per row on a narrow screen (Streamlit stacks columns one per row there)."""
    st.html(NARROW_SCREEN_CSS)


def trouble_banner() -> None:
    """Above every page: each run whose owner failed and is starting again, or whose store is damaged. It goes on
    refreshing while the panels are paused: a failing owner is never hidden."""
    try:
        served = desk()
    except BedsideError:
        return  # the page says so

    @st.fragment(run_every=served.refresh_s)
    def banner() -> None:
        for run, trouble in served.troubles():
            st.error(f"**{run}**: {trouble}", icon=":material/error:")

    banner()


def linked_run(wanted: str | None, runs: list[Path]) -> str | None:
    """The folder name of the run a link names: by folder, or by run.json's name (what alert links carry)."""
    if not wanted:
        return None
    for run in runs:
        if run.name == wanted:
            return run.name
    for run in runs:
        try:
            info = read_run_info(RunLayout(run))
        except BedsideError:
            continue
        if info and info.name == wanted:
            return run.name
    return None


def operator_panel(served: Desk) -> None:
    """Unlock actions with the operator token; the operator's name goes with every action."""
    if is_operator():  # in sight whatever the panel's state: every action goes out in this name
        st.sidebar.caption(f"Acting as **{st.session_state['operator']}**.")
    with st.sidebar.expander("Operator", expanded=not is_operator()):
        if not served.operator_token:
            st.caption("Read-only: no operator token is configured (set BEDSIDE_OPERATOR_TOKEN for bedside serve).")
            return
        if is_operator():
            if st.button("Lock", key="lock"):
                del st.session_state["operator"]
                st.rerun()
            return
        name = st.text_input("Your name", key="operator_name")
        token = st.text_input("Operator token", type="password", key="operator_token")
        if st.button("Unlock actions", key="unlock"):
            if problem := unlock(served, name, token):
                st.error(problem)
            else:
                st.rerun()


def unlock(served: Desk, name: str, token: str) -> str | None:
    """Check the name and the token (this session's and the process's lockouts first); what is wrong, or None
    with the operator set for the session."""
    try:
        name = check_operator(name)
    except ValueError as exc:
        return f"{str(exc)[0].upper()}{str(exc)[1:]}."
    mine = st.session_state.setdefault("lockout", Lockout())
    if wait := max(mine.wait_s(), served.lockout.wait_s()):
        return f"Too many wrong tokens: try again in {wait:.0f} s."
    if not served.can_act(token):
        mine.failed()
        served.lockout.failed()
        return "Wrong token."
    mine.succeeded()
    served.lockout.succeeded()
    st.session_state["operator"] = name
    return None


def is_operator() -> bool:
    return bool(st.session_state.get("operator"))


def prefilled_number(name: str, value: int, *, key: str) -> int:
    """A number input prefilled with ``value`` that follows it while it shows what was offered: on a live
    page a newer prefill (a checkpoint saved, a related incident found earlier) replaces the last one, and a
    number the operator typed stays."""
    offered = f"{key}_offered"
    if key not in st.session_state or st.session_state[key] == st.session_state.get(offered):
        st.session_state[key] = int(value)
    st.session_state[offered] = int(value)
    return int(st.number_input(name, min_value=0, step=1, key=key))


def since(timestamp: float | None) -> str:
    return age(None if timestamp is None or pd.isna(timestamp) else time.time() - timestamp)


def as_of(timestamp: float | None, now: float) -> str:
    """How fresh a page's data is: the newest record's wall-clock time and its age."""
    if timestamp is None or pd.isna(timestamp):
        return "No records yet."
    return f"Data as of {clock(timestamp)} ({age(now - timestamp)} ago)"
