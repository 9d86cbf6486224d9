"""Opening another page from a click, without a live panel's refresh losing the page on the way.

A live panel refreshes by a timer in the browser, which asks for a rerun of that panel on the page the browser
shows. ``st.switch_page`` changes the page on the server first; a timer that fires before the browser has heard
of the change asks for a panel of the old page, and Streamlit (1.67) runs it as the old page's: the browser
clears the new page and is sent a panel for a place that no longer exists ("Bad delta path index"), a blank tab.

So a click is taken in two steps, ahead of any panel of any page. The first full run after it draws no panel and
starts no timer (the browser drops every timer as a full run starts), and runs to its end, so that Streamlit
forgets every panel of the old page: a timer's request that comes after it finds none to run (a run stopped early
would leave them, and the next request would draw a panel of the old page into the short one). It draws a small
component whose script, once the browser has drawn it, asks for the next run. Every timer request the browser
sent before is ahead of that one on the same connection; the run it asks for switches, with no timer left to
race it.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

PENDING = "opening_page"
"""The session key of the page and query parameters a click asked to open."""
READY = "opening_ready"
"""Set by the component's request: the browser has drawn the first step, no timer of the old page is left."""

_ASK_JS = """
export default function (component) { component.setTriggerValue("drawn", component.data.page); }
"""
_ASK = st.components.v2.component("bedside_opening", js=_ASK_JS, isolate_styles=False)


def request(page: str | Path, query_params: dict[str, str], forget: tuple[str, ...] = ()) -> None:
    """Open ``page`` with ``query_params``, the session keys ``forget`` dropped as it opens (a picker's choice
    that the page's link overrides), from the next full runs: call it, then ``st.rerun(scope="app")``."""
    st.session_state[PENDING] = (str(page), query_params, forget)


def follow() -> bool:
    """Before any panel of any page: whether this run takes a click, and must draw nothing more. The first step
    draws the component; the run that the component asks for switches to the page asked."""
    if PENDING not in st.session_state:
        return False
    page, query_params, forget = st.session_state[PENDING]
    if st.session_state.pop(READY, False):
        for key in (PENDING, *forget):
            st.session_state.pop(key, None)
        st.switch_page(page, query_params=query_params)
    st.caption(f"Opening {', '.join(query_params.values()) or page}…")
    _ASK(key="opening", data={"page": page}, on_drawn_change=_drawn)
    return True


def _drawn() -> None:
    st.session_state[READY] = True
