"""SQL: a read-only console over the documented views (docs/schema.md)."""

from __future__ import annotations

import streamlit as st

from bedside.app.dashboard.common import current_run
from bedside.app.dashboard.data import CSV_LIMITS, PREVIEW_LIMITS, RunData
from bedside.app.service.schema import SERVICE
from bedside.collectors.errors import QueryError
from bedside.collectors.store.console import console_examples

AROUND = 10
"""Steps either side of the newest incident's onset in the examples."""
RECENT = 200


def examples(data: RunData) -> dict[str, str]:
    """The example queries with this run's numbers: its live timeline, the steps around its newest incident (else
    its last steps), and its last 200 steps."""
    timelines, incidents = data.frame("timelines"), data.frame("incidents")
    live = timelines.iloc[-1] if not timelines.empty else None
    timeline, last = (int(live["timeline"]), int(live["last_step"])) if live is not None else (0, 0)
    if not incidents.empty:
        newest = incidents.sort_values(["timeline", "start_step"]).iloc[-1]
        timeline, onset = int(newest["timeline"]), int(newest["start_step"])
        first, last = max(onset - AROUND, 0), onset + AROUND
    else:
        first = max(last - 2 * AROUND, 0)
    text = SERVICE.query("console_examples") or ""
    return console_examples(text, timeline=timeline, first=first, last=last, recent=max(last - RECENT, 0))


def csv_of(data: RunData, query: str) -> bytes:
    """The whole result as CSV, made on the server when the download is clicked (an error as its one line)."""
    try:
        return data.user_csv(query)[0]
    except QueryError as exc:
        return f"error: {exc}\n".encode()


data = current_run()
st.title(f"{data.name}: SQL")
st.caption(
    "One SELECT over the views of docs/schema.md, run in a sandbox that cannot write the store or reach files "
    f"and the network, within {PREVIEW_LIMITS.timeout_s:g} s. The page shows the first {PREVIEW_LIMITS.max_rows:,} "
    f"rows; Download CSV writes the whole result on the server (up to {CSV_LIMITS.max_rows:,} rows or "
    f"{CSV_LIMITS.max_bytes >> 20:,} MiB)."
)
EXAMPLES = examples(data)
if st.session_state.get("sql_run") != data.name:  # another run: its own numbers in the editor
    st.session_state["sql_run"] = data.name
    st.session_state["sql"] = EXAMPLES[st.session_state.get("example", next(iter(EXAMPLES)))]
example = st.selectbox(
    "Examples",
    list(EXAMPLES),
    key="example",
    on_change=lambda: st.session_state.update(sql=EXAMPLES[st.session_state["example"]]),
)
query = st.text_area("SQL", height=120, key="sql")
if st.button("Run", key="run_sql", type="primary"):
    try:
        result = data.user_query(query)
    except QueryError as exc:
        st.error(str(exc))
    else:
        shown = len(result.frame)
        st.caption(
            f"First {shown:,} rows shown: the result has more (Download CSV holds them all)."
            if result.truncated
            else f"{shown:,} rows"
        )
        st.dataframe(result.frame, hide_index=True, key="sql_result")
        st.download_button(
            "Download CSV",
            lambda: csv_of(data, query),
            file_name=f"{data.name}.csv",
            mime="text/csv",
            on_click="ignore",
            help=f"the whole result, written on the server: at most {CSV_LIMITS.max_rows:,} rows or "
            f"{CSV_LIMITS.max_bytes >> 20:,} MiB, within {CSV_LIMITS.timeout_s:g} s",
            key="sql_csv",
        )
