"""SQL: a read-only console over the documented views (docs/schema.md)."""

from __future__ import annotations

import streamlit as st

from bedside.app.dashboard.common import current_run
from bedside.app.dashboard.data import CONSOLE_LIMITS
from bedside.collectors.errors import QueryError

EXAMPLES = {
    "open incidents": "SELECT severity, title, start_step, summary FROM incidents WHERE status <> 'resolved'",
    "loss around a step": "SELECT step, loss, grad_norm, shards FROM step_metrics WHERE step BETWEEN 80 AND 100 ORDER BY step",
    "slowest ranks": "SELECT rank, host, median(compute_time) AS compute_s FROM rank_step_metrics "
    "GROUP BY ALL ORDER BY compute_s DESC LIMIT 10",
    "eval against compute": "SELECT step, cum_flops, name, value FROM eval_scores ORDER BY step",
    "alerts sent": "SELECT notifier, event, incident_id, status, last_error FROM alerts",
    "rejected lines": "SELECT path, line_offset, reason FROM rejected",
}


def use_example() -> None:
    """Put the chosen example in the editor (a keyed text area keeps its text when its default changes)."""
    st.session_state["sql"] = EXAMPLES[st.session_state["example"]]


data = current_run()
st.title(f"{data.name}: SQL")
st.caption(
    "One SELECT over the views of docs/schema.md, run in a sandbox that cannot write the store or reach files "
    f"and the network; at most {CONSOLE_LIMITS.max_rows:,} rows, {CONSOLE_LIMITS.timeout_s:g} s."
)
example = st.selectbox("Examples", list(EXAMPLES), key="example", on_change=use_example)
st.session_state.setdefault("sql", EXAMPLES[example])
query = st.text_area("SQL", height=120, key="sql")
if st.button("Run", key="run_sql", type="primary"):
    try:
        result = data.user_query(query)
    except QueryError as exc:
        st.error(str(exc))
    else:
        if result.truncated:
            st.warning(result.cut_note(CONSOLE_LIMITS))
        st.caption(f"{len(result.frame):,} rows")
        st.dataframe(result.frame, hide_index=True, key="sql_result")
        st.download_button(
            "Download CSV",
            result.frame.to_csv(index=False),
            file_name=f"{data.name}.csv",
            mime="text/csv",
            key="sql_csv",
        )
