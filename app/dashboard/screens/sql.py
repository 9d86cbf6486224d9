"""SQL: a read-only console over the documented views (docs/schema.md)."""

from __future__ import annotations

import streamlit as st

from bedside.app.dashboard.common import current_run
from bedside.app.dashboard.data import CSV_LIMITS, PREVIEW_LIMITS, RunData
from bedside.app.dashboard.exports import EXPORTS, csv_note
from bedside.app.service.schema import SERVICE
from bedside.collectors.errors import QueryError
from bedside.collectors.store.console import ConsoleResult, console_examples

AROUND = 10  # steps either side of the newest incident's onset in the examples
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


def prepare_csv(data: RunData, query: str) -> None:
    """Write the whole result to a file on the server (replacing this session's previous one); an error is kept
    to be shown in its place."""
    if old := st.session_state.pop("sql_export", None):
        EXPORTS.drop(old)
    try:
        export = EXPORTS.add(f"{data.name}.csv", lambda out: data.user_csv(query, out))
    except QueryError as exc:
        st.session_state["sql_export_error"] = str(exc)
    else:
        st.session_state["sql_export"] = export.token


def show_result(data: RunData, query: str, result: ConsoleResult) -> None:
    """The preview, and the download of the whole result once it is written."""
    shown = len(result.frame)
    st.caption(
        f"First {shown:,} rows shown: the result has more (Prepare CSV writes them all on the server)."
        if result.truncated
        else f"{shown:,} rows"
    )
    st.dataframe(result.frame, hide_index=True, key="sql_result")
    st.button(
        "Prepare CSV",
        key="sql_csv",
        on_click=prepare_csv,
        args=(data, query),
        help=f"the whole result, written to a file on the server a batch at a time: at most "
        f"{CSV_LIMITS.max_rows:,} rows or {CSV_LIMITS.max_bytes >> 30:,} GiB, within {CSV_LIMITS.timeout_s:g} s",
    )
    if error := st.session_state.pop("sql_export_error", None):
        st.error(error)
    export = EXPORTS.get(st.session_state.get("sql_export", ""))
    if export is not None:
        st.markdown(
            f"{export.link('Download CSV')} ({csv_note(export.written, CSV_LIMITS)})",
            unsafe_allow_html=True,
        )


data = current_run()
st.title(f"{data.name}: SQL")
st.caption(
    "One SELECT over the views of docs/schema.md, run in a sandbox that cannot write the store or reach files "
    f"and the network, within {PREVIEW_LIMITS.timeout_s:g} s. The page shows the first {PREVIEW_LIMITS.max_rows:,} "
    f"rows; Prepare CSV writes the whole result to a file on the server, which Download CSV then sends (up to "
    f"{CSV_LIMITS.max_rows:,} rows or {CSV_LIMITS.max_bytes >> 30:,} GiB)."
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
    if old := st.session_state.pop("sql_export", None):  # a new query: the old download goes
        EXPORTS.drop(old)
    st.session_state.pop("sql_shown", None)
    try:
        st.session_state["sql_shown"] = (data.name, query, data.user_query(query))
    except QueryError as exc:
        st.error(str(exc))
if (ran := st.session_state.get("sql_shown")) and ran[0] == data.name:
    show_result(data, ran[1], ran[2])
