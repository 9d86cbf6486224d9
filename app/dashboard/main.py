"""The dashboard's entry script (``bedside serve`` runs it): pages, the banner of runs in trouble, the run picker
and the operator panel."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from bedside.app.dashboard import live, opening
from bedside.app.dashboard.common import narrow_screens, trouble_banner

PAGES = Path(__file__).parent / "screens"  # not "pages": Streamlit would list that folder as pages of its own

st.set_page_config(page_title="bedside", page_icon="🛏️", layout="wide")
page = st.navigation(
    [
        st.Page(PAGES / "overview.py", title="Overview", icon=":material/monitoring:", default=True),
        st.Page(PAGES / "ranks.py", title="Ranks", icon=":material/grid_on:", url_path="ranks"),
        st.Page(PAGES / "incidents.py", title="Incidents", icon=":material/crisis_alert:", url_path="incidents"),
        st.Page(PAGES / "checkpoints.py", title="Checkpoints", icon=":material/save:", url_path="checkpoints"),
        st.Page(PAGES / "runs.py", title="Runs", icon=":material/list:", url_path="runs"),
        st.Page(PAGES / "sql.py", title="SQL", icon=":material/database:", url_path="sql"),
    ]
)
narrow_screens()
live.steady()
if not opening.follow():  # a click that opens another page: taken before any panel starts a refresh timer
    trouble_banner()
    page.run()
