"""Incidents: what happened, the evidence, and a safe, recorded action on the live job."""

from __future__ import annotations

import json
import time

import pandas as pd
import streamlit as st

from bedside.app.dashboard import figures, live, rank_view, summaries
from bedside.app.dashboard.actions import ACTION_LABELS, onset, prefilled_args, request_status, what_is_lost
from bedside.app.dashboard.common import SEVERITY_MARKS, age, clock, current_run, is_operator, prefilled_number
from bedside.app.dashboard.registry import desk
from bedside.collectors.errors import BedsideError
from bedside.collectors.format import RUN_END_STATUSES
from bedside.detectors.incidents import concerns_training, id_ranges

INCIDENT_COLUMNS = {
    "onset": st.column_config.DatetimeColumn("onset (UTC)", format="YYYY-MM-DD HH:mm:ss", timezone="UTC"),
    "age": st.column_config.TextColumn("age", help="since the onset: the step the fault began at"),
    "id": st.column_config.TextColumn("id", help="the exact id alerts, links and the audit trail carry"),
}


def note_text(note: object) -> str:
    return "" if note is None or pd.isna(note) else str(note)


live.preload_plotly()  # its charts need plotly.js: fetched while the queries run
data = current_run()
st.title(f"{data.name}: incidents")


@st.fragment(run_every=live.every(data.refresh_s))
def incident_list() -> str | None:
    """The list and the picker, refreshed in place: a new incident joins both without rerunning the page (which
    would close an open dropdown and redraw every chart). Choosing another incident builds the page for it."""
    incidents = data.frame("incidents")
    if incidents.empty:
        if data.can_write and data.owner.detected_at is None:
            st.info("The detectors have not gone over this run yet: incidents appear once they have.")
        elif data.can_write:
            st.success(f"No incidents (detectors ran at {clock(data.owner.detected_at)}).")
        else:  # read from the raw telemetry: the incidents are in the process holding the store
            st.warning(data.note)
        return None
    shown = summaries.incident_rows(incidents)
    shown.insert(shown.columns.get_loc("onset_s"), "age", (time.time() - shown.pop("onset_s")).map(age))
    st.dataframe(shown, hide_index=True, column_config=INCIDENT_COLUMNS, key="incident_table")
    chosen = pick(incidents)
    if not st.session_state.get("incident_building") and chosen != st.session_state.get("incident_shown"):
        st.rerun(scope="app")  # the list's own run picked another incident: the page follows
    return chosen


def pick(incidents: pd.DataFrame) -> str | None:
    """The Incident picker, opened on the incident the address names (``?incident=``, written once the page shows
    it), so that a link or a reload opens it again. It keeps its choice as incidents come (its identity is its key); a link naming an incident the run
    does not have says so and opens none. Its options are in triage order as the page was built, incidents that
    came since at the end: an open dropdown closes when the chosen option moves."""
    since = None if st.session_state.get("incident_building") else st.session_state.get("incident_order")
    ids = st.session_state["incident_order"] = live.kept_order(since, incidents["incident_id"].tolist())
    by_id = incidents.set_index("incident_id")
    linked = st.query_params.get(live.INCIDENT)
    wanted = st.session_state.get("incident", st.session_state.get("incident_chosen", linked))
    if wanted in ids:
        st.session_state["incident"] = wanted
    elif wanted == linked and linked:
        st.warning(f"This run has no incident {linked!r} (resolved and gone, or another run's?): choose one below.")
        st.session_state["incident"] = None
    chosen = st.selectbox(
        "Incident",
        ids,
        key="incident",
        format_func=lambda i: f"{summaries.incident_name(i, by_id.loc[i, 'ranks'])}: {by_id.loc[i, 'title']}",
        placeholder="choose an incident",
    )
    st.session_state["incident_chosen"] = chosen
    return chosen


def playbooks_switch() -> None:
    """The kill switch of automatic playbooks (``bedside playbook off RUN``): its state for anyone, the switch for
    an operator. The state is the audit trail's, read as the service reads it before each automatic action."""
    settings = desk().settings.playbooks
    switch = data.playbook_switch()
    state = "on" if switch.enabled else "off"
    mode = settings.mode if settings.configured else "none configured"
    with st.expander(f"Automatic playbooks: switched {state} (mode: {mode})", icon=":material/smart_toy:"):
        if "playbooks_switched" in st.session_state:
            st.success(st.session_state.pop("playbooks_switched"))
        if switch.broken:
            st.warning(
                f"The audit trail's chain is broken ({switch.broken}): playbooks read as off and cannot be switched "
                f"on until the trail is whole again (bedside audit verify)."
            )
        elif switch.entry is not None:
            st.caption(f"Switched {state} by {switch.entry.get('operator')}: {switch.entry.get('reason')}")
        if mode != "auto":
            st.caption("Nothing is done automatically in this mode: the switch matters once the mode is auto.")
        if not desk().operator_token:
            st.caption("Read-only: no operator token is configured, so the switch cannot be changed here.")
            return
        if not is_operator():
            st.caption("Switching is locked: enter your name and the operator token in the sidebar.")
            return
        turn_on = not switch.enabled
        with st.form("playbook_switch", clear_on_submit=True):
            reason = st.text_input("Why (required, kept in the audit trail)", key="playbook_reason")
            if st.form_submit_button(
                "Switch playbooks on" if turn_on else "Switch playbooks off", disabled=bool(switch.broken)
            ):
                if not reason.strip():
                    st.error("A reason is required.")
                    return
                operator = st.session_state["operator"]
                try:
                    data.switch_playbooks(turn_on, operator=operator, reason=reason)
                except BedsideError as exc:
                    st.error(str(exc))
                else:
                    st.session_state["playbooks_switched"] = (
                        f"Playbooks switched {'on' if turn_on else 'off'} by {operator}."
                    )
                    st.rerun()


playbooks_switch()
st.session_state["incident_building"] = True  # the page's own run: what the list picks, the page shows
chosen = incident_list()
st.session_state["incident_building"] = False
st.session_state["incident_shown"] = chosen
if chosen is None:
    st.stop()
st.query_params[live.INCIDENT] = chosen  # here, not in the list's run: the page's run after it would not send it
incidents = data.frame("incidents")
by_id = incidents.set_index("incident_id")
incident = by_id.loc[chosen]
suggestion = json.loads(incident["suggested_action"])

st.subheader(f"{SEVERITY_MARKS.get(incident['severity'], '')} {incident['title']} ({incident['status']})")
st.markdown(
    f"{incident['summary']}  \n**Cause:** {incident['cause']}  \n"
    f"**Suggested action:** `{suggestion['action']}`"
    f"{' ' + json.dumps(suggestion['args']) if suggestion['args'] else ''} {suggestion['why']}"
)
if pd.notna(incident["acknowledged_by"]):  # a missing value may read NaN, which is true
    st.caption(f"Acknowledged by {incident['acknowledged_by']}: {note_text(incident['ack_note'])}")
if pd.notna(incident["resolved_by"]):
    st.caption(f"Resolved by hand by {incident['resolved_by']}: {note_text(incident['resolve_note'])}")
elif pd.notna(incident["resolution"]):
    st.caption(f"Resolved: {incident['resolution']}.")
if concerns_training(incident["kinds"]) and (
    cost := summaries.abandoned_cost(data.frame("abandoned"), int(incident["timeline"]))
):
    st.caption(cost)

first = int(incident["start_step"]) - rank_view.INCIDENT_MARGIN
last = int(incident["end_step"]) + rank_view.INCIDENT_MARGIN
ranks = (
    data.frame("window_ranks", timeline=int(incident["timeline"]), first=first, last=last)
    if len(incident["ranks"])
    else pd.DataFrame()
)
live.chart(
    figures.incident_window(
        data.frame("window_steps", timeline=int(incident["timeline"]), first=first, last=last),
        ranks,
        int(incident["start_step"]),
        int(incident["end_step"]),
        tuple(int(r) for r in incident["ranks"]),
        about_training=concerns_training(incident["kinds"]),
    ),
    "incident_evidence",
    revision=chosen,  # a zoom lasts while the incident stays open
)
read = data.frame("window_data", timeline=int(incident["timeline"]), first=first, last=last)
if read["shards"].map(len).any() or read["batch"].notna().any():
    st.markdown(
        f"**Data read** in steps {int(incident['start_step'])}-{int(incident['end_step'])}: "
        f"{summaries.batch_span(read, int(incident['start_step']), int(incident['end_step'])) or 'batches not reported'}; "
        f"shards by how much more the incident's steps read them than steps {first}-{last} around it:"
    )
    st.dataframe(
        summaries.data_read(read, int(incident["start_step"]), int(incident["end_step"])),
        hide_index=True,
        column_config={
            "share_incident": st.column_config.ProgressColumn("in the incident's steps", format="percent"),
            "share_other": st.column_config.ProgressColumn("in the steps around", format="percent"),
        },
        key="incident_data_read",
    )
with st.expander("Findings", expanded=False):
    found = data.frame("incident_findings", incident_id=chosen)
    st.dataframe(
        found.assign(ranks=found["ranks"].map(lambda r: id_ranges(r) if len(r) else "")),
        hide_index=True,
        key="incident_findings",
    )

st.subheader("Act")
if not desk().operator_token:
    st.info("Read-only: no operator token is configured, so no action can be taken from this page.")
elif not is_operator():
    st.info("Actions are locked: enter your name and the operator token in the sidebar.")
else:
    operator = st.session_state["operator"]
    with st.form("acknowledge", clear_on_submit=True):
        if "acted" in st.session_state:
            st.success(st.session_state.pop("acted"))
        note = st.text_input("Note (required to resolve)", key="ack_note")
        acknowledge, resolve = st.columns(2)
        closed = not data.can_write or incident["status"] == "resolved"
        if acknowledge.form_submit_button(
            "Acknowledge",
            disabled=closed or incident["status"] == "acknowledged",
            help="already acknowledged" if incident["status"] == "acknowledged" else None,
        ):
            try:
                data.acknowledge(chosen, operator=operator, note=note)
            except BedsideError as exc:
                st.error(str(exc))
            else:  # drawn again: Acknowledge is disabled now
                st.session_state["acted"] = f"Acknowledged by {operator}."
                st.rerun()
        if resolve.form_submit_button(
            "Resolve",
            disabled=closed,
            help="close it by hand (a false alarm, or handled): later findings open a new incident",
        ):
            try:
                data.resolve(chosen, operator=operator, note=note)
            except BedsideError as exc:
                st.error(str(exc))
            else:
                st.session_state["acted"] = f"Resolved by {operator}."
                st.rerun()
    actions = list(ACTION_LABELS)
    if suggestion["action"] not in actions:  # evict, investigate: nothing this form can do, so nothing chosen
        st.caption(
            f"The detectors suggest **{suggestion['action']}**, which this form cannot do: choose an "
            f"action only if one helps."
        )
    action = st.selectbox(
        "Action",
        actions,
        index=actions.index(suggestion["action"]) if suggestion["action"] in actions else None,
        format_func=ACTION_LABELS.get,
        placeholder="choose an action",
        key=f"action_{chosen}",
    )  # per incident: each its own
    first, first_id = onset(chosen, incidents)
    args = prefilled_args(action, suggestion, incident, data.frame("checkpoints"), before=first) if action else {}
    edited = {name: prefilled_number(name, value, key=f"arg_{chosen}_{action}_{name}") for name, value in args.items()}
    if action == "rewind" and edited["to_step"] >= first:
        st.warning(
            f"to_step {edited['to_step']} is at or after step {first}, where "
            f"{'this incident' if first_id == chosen else f'the related incident {first_id}'} began: the "
            f"run would train through the same fault again."
        )
    reason = st.text_input("Reason (required, recorded with the request)", key="reason")
    refusal = data.action_refusal(chosen)
    if refusal:
        st.info(f"No request can be filed: {refusal}.")
    elif unread := data.reader_warning():
        st.info(f"A request filed now may not be applied: {unread}.", icon=":material/hourglass_empty:")
    here = {"run": str(data.run_dir), "incident_id": chosen}
    pending = st.session_state.get("confirming")
    if pending and {name: pending[name] for name in here} != here:  # reviewed on another run or incident
        del st.session_state["confirming"]
        pending = None
    filed = st.session_state.get("filed")
    if filed and filed["where"] == here:  # kept through live refreshes until the next review
        st.success(filed["text"])
        st.caption(
            f"Audit head {filed['head']}: keep a copy off this machine (the incident's channel); "
            f"`bedside audit verify --head` checks the trail against it."
        )
    if st.button("Review request", key="review", disabled=bool(refusal) or action is None):
        if not reason.strip():
            st.error("A reason is required.")
        else:
            st.session_state.pop("filed", None)
            st.session_state["confirming"] = {**here, "action": action, "args": edited, "reason": reason.strip()}
            st.rerun()
    if pending:
        st.warning(
            f"{operator} asks the trainer to **{pending['action']}** {json.dumps(pending['args'])}: {pending['reason']}"
        )
        cost = (
            data.frame("rewind_cost", to_step=pending["args"]["to_step"])
            if pending["action"] == "rewind"
            else pd.DataFrame()
        )
        run_row = data.frame("run")
        for line in what_is_lost(
            pending["action"], pending["args"], cost, run_row.iloc[0].to_dict() if not run_row.empty else {}
        ):
            st.markdown(f"- This {line}.")
        confirm, cancel = st.columns(2)
        if confirm.button(f"Confirm {pending['action']}", type="primary", key="confirm", disabled=bool(refusal)):
            try:
                request_id, head = data.request(
                    pending["action"], pending["args"], operator=operator, reason=pending["reason"], incident_id=chosen
                )
            except BedsideError as exc:
                st.error(str(exc))
            else:
                st.session_state["filed"] = {"where": here, "text": f"Request {request_id} filed.", "head": str(head)}
                del st.session_state["confirming"]
                st.rerun()
        if cancel.button("Cancel", key="cancel"):
            del st.session_state["confirming"]
            st.rerun()


@st.fragment(run_every=live.every(data.refresh_s))
def requests_and_audit_trail() -> None:
    trail, chain = data.audit_trail()
    filed = trail[trail["request_id"].notna() & (trail["incident_id"] == chosen)]
    if not filed.empty:
        st.subheader("Requests for this incident")
        statuses, lost = data.frame("actions"), data.frame("unanswered")
        run = data.frame("run")
        ended = not run.empty and run["status"].iloc[0] in RUN_END_STATUSES
        for entry in filed.itertuples():
            st.markdown(
                f"`{entry.request_id}` **{entry.what}** by {entry.operator}: "
                f"{request_status(entry.request_id, statuses, data.layout, ended=ended, unanswered=lost)}"
            )
    st.subheader("Audit trail")
    if chain.broken:
        st.error(
            f"The audit trail's chain is broken: {chain.broken}. Entries from there on may be forged, "
            f"rewritten or missing (bedside audit verify).",
            icon=":material/gpp_bad:",
        )
    elif chain.head is not None:
        st.caption(f"Chain intact: {len(chain.entries)} entries, head {chain.head.hash[:16]}.")
    st.dataframe(trail.drop(columns=["prev"]), hide_index=True, key="audit_trail")


requests_and_audit_trail()
