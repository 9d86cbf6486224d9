"""Who may act from the dashboard, and what acting leaves behind: the operator token, a confirmed request filed for
the trainer in ``RUN/control/requests/``, acknowledgements in the store, the append-only audit trail, and a run
whose store another process holds. Real run copies, the real file system and store; AppTest drives the pages."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_app import (
    PAGES,
    assert_rendered,
    chart_keys,
    copy_run,
    from_store,
    go_to,
    open_page,
    serve,
    table,
    texts,
    unlock,
)
from streamlit.testing.v1 import AppTest

from bedside.app.dashboard import registry
from bedside.app.dashboard.actions import onset, prefilled_args, request_status
from bedside.app.service.playbooks.trail import read_switch
from bedside.collectors import audit
from bedside.collectors.controlkey import ensure_control_key
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout
from bedside.collectors.writer import RunLogger

TOKEN = "correct horse battery"
OPERATOR = "alice"
REASON = "NaN at step 185 after bit flips: back to the last good checkpoint"
WAITING = "filed, waiting for the trainer's next step"
NEVER = "not applied: the run has ended (a resumed run would take it)"
SWITCH_BUTTONS = {"Switch playbooks off", "Switch playbooks on"}
ACTION_BUTTONS = {"Acknowledge", "Review request", "Confirm rewind", "Cancel"} | SWITCH_BUTTONS
EVENTUALLY_S = 60.0


@pytest.fixture(autouse=True)
def closed_desks() -> Iterator[None]:
    """Each test takes its run's store afresh and lets it go after."""
    yield
    registry.close_all()


def without_run_end(run: Path) -> Path:
    """``run`` with its ``run_end`` records cut: a run that has not ended (its ranks went quiet: stalled)."""
    for path in RunLayout(run).telemetry.glob("rank-*.jsonl"):
        kept = [line for line in path.read_text().splitlines(keepends=True) if '"kind":"run_end"' not in line]
        path.write_text("".join(kept))
    return run


@pytest.fixture
def run(tiny_faults: Path) -> Path:
    """The run served: a private copy of tiny-faults (3 incidents, one critical suggesting a rewind) that has not
    ended, so that requests can still be filed for it."""
    return without_run_end(tiny_faults)


@pytest.fixture
def critical(run: Path, monkeypatch) -> pd.Series:
    """The run's critical incident (the dashboard serves the run with the operator token)."""
    serve(run, token=TOKEN)
    found = from_store(run, "SELECT * FROM incidents WHERE list_contains(kinds, 'nonfinite')")
    assert len(found) == 1
    return found.iloc[0]


@pytest.fixture
def operator(critical: pd.Series) -> AppTest:
    """alice, unlocked, on the Incidents page with the critical incident chosen."""
    app = unlock(open_page("incidents"), OPERATOR, TOKEN)
    app.selectbox(key="incident").set_value(critical["incident_id"]).run()
    assert_rendered(app)
    return app


def buttons(app: AppTest) -> set[str]:
    return {b.label for b in app.button}


def labelled(widgets, label: str):
    """The one widget of ``widgets`` with ``label`` (the action's widgets are keyed per incident)."""
    [widget] = [w for w in widgets if w.label == label]
    return widget


def requests_filed(run: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RunLayout(run).control_requests.glob("*.json"))]


def audit_entries(run: Path) -> list[dict]:
    trail = RunLayout(run).control / "audit.jsonl"
    return [json.loads(line) for line in trail.read_text().splitlines()] if trail.exists() else []


def review(app: AppTest, reason: str = REASON) -> AppTest:
    app.text_input(key="reason").input(reason)
    return app.button(key="review").click().run()


# -- the operator token -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_without_an_operator_token_no_page_offers_an_action(run: Path, monkeypatch, page: str) -> None:
    serve(run)
    app = open_page(page)
    assert_rendered(app)
    assert not buttons(app) & (ACTION_BUTTONS | {"Unlock actions"})
    assert not app.sidebar.text_input
    assert "Read-only: no operator token is configured" in app.sidebar.caption[0].value


def test_without_an_operator_token_the_incidents_page_says_it_is_read_only(run: Path, monkeypatch) -> None:
    serve(run)
    app = open_page("incidents")
    assert [i.value for i in app.info] == [
        "Read-only: no operator token is configured, so no action can be taken from this page."
    ]
    assert not app.number_input and not app.text_input


@pytest.mark.parametrize(
    ("name", "token", "error"),
    [
        pytest.param(OPERATOR, "wrong", "Wrong token.", id="wrong token"),
        pytest.param(OPERATOR, "", "Wrong token.", id="no token"),
        pytest.param(OPERATOR, TOKEN[:-1], "Wrong token.", id="a prefix of the token"),
        pytest.param("  ", TOKEN, "Enter your name: it is recorded with every action.", id="no name"),
    ],
)
def test_unlocking_is_refused_without_the_token_and_a_name(
    critical: pd.Series, name: str, token: str, error: str
) -> None:
    app = unlock(open_page("incidents"), name, token)
    assert_rendered(app)
    assert [e.value for e in app.sidebar.error] == [error]
    assert not buttons(app) & ACTION_BUTTONS and "operator" not in app.session_state
    assert "Actions are locked" in app.info[0].value


def test_the_token_and_a_name_unlock_actions_until_locked_again(critical: pd.Series) -> None:
    app = unlock(open_page("incidents"), f" {OPERATOR} ", TOKEN)
    assert_rendered(app)
    assert app.session_state["operator"] == OPERATOR
    assert f"Acting as **{OPERATOR}**." in [c.value for c in app.sidebar.caption]
    assert {"Acknowledge", "Review request"} <= buttons(app)
    assert_rendered(go_to(app, "overview"))
    assert f"Acting as **{OPERATOR}**." in [c.value for c in app.sidebar.caption]  # every page of the session
    app.sidebar.button(key="lock").click().run()
    assert_rendered(go_to(app, "incidents"))
    assert not buttons(app) & ACTION_BUTTONS and app.sidebar.button(key="unlock")


# -- a confirmed request ------------------------------------------------------------------------------------------


def test_the_action_is_prefilled_from_the_incidents_suggestion(operator: AppTest, critical: pd.Series) -> None:
    suggestion = json.loads(critical["suggested_action"])
    assert suggestion["action"] == "rewind"
    assert labelled(operator.selectbox, "Action").value == "rewind"
    assert [(n.label, n.value) for n in operator.number_input] == [("to_step", suggestion["args"]["to_step"])]


def offered_step_page() -> None:
    """An action argument prefilled from what the run offers now (``offer`` in the session)."""
    import streamlit as st

    from bedside.app.dashboard.common import prefilled_number

    prefilled_number("to_step", st.session_state.get("offer", 90), key="arg_to_step")


def test_a_prefill_follows_the_live_run_until_the_operator_edits_it() -> None:
    app = AppTest.from_function(offered_step_page).run()
    assert [n.value for n in app.number_input] == [90]
    app.session_state["offer"] = 180  # a newer checkpoint, seen on a live refresh
    assert [n.value for n in app.run().number_input] == [180]
    app.number_input(key="arg_to_step").set_value(50).run()
    app.session_state["offer"] = 270
    assert [n.value for n in app.run().number_input] == [50]  # the operator's choice stays
    app.number_input(key="arg_to_step").set_value(270).run()  # back to what is offered: it follows again
    app.session_state["offer"] = 360
    assert [n.value for n in app.run().number_input] == [360]


def test_each_incident_prefills_its_own_action(operator: AppTest, run: Path, critical: pd.Series) -> None:
    [[spike]] = from_store(run, "SELECT incident_id FROM incidents WHERE list_contains(kinds, 'loss_spike')").values
    operator.selectbox(key="incident").set_value(spike).run()
    assert_rendered(operator)
    labelled(operator.selectbox, "Action").select("rewind").run()
    # to the newest good checkpoint before step 85 still on disk: none, step 50's was rotated out (3 are kept)
    assert [(n.label, n.value) for n in operator.number_input] == [("to_step", 0)]
    operator.selectbox(key="incident").set_value(critical["incident_id"]).run()
    assert [n.value for n in operator.number_input] == [json.loads(critical["suggested_action"])["args"]["to_step"]]


@pytest.mark.parametrize(("kind", "suggested"), [("straggler", "evict"), ("loss_spike", "investigate")])
def test_a_suggestion_the_form_cannot_do_gets_no_default_action(
    operator: AppTest, run: Path, kind: str, suggested: str
) -> None:
    [[chosen, suggestion]] = from_store(
        run, "SELECT incident_id, suggested_action FROM incidents WHERE list_contains(kinds, ?)", kind
    ).values
    assert json.loads(suggestion)["action"] == suggested
    operator.selectbox(key="incident").set_value(chosen).run()
    assert_rendered(operator)
    assert labelled(operator.selectbox, "Action").value is None and not operator.number_input
    assert f"The detectors suggest **{suggested}**, which this form cannot do: choose an action only if one helps." in [
        c.value for c in operator.caption
    ]
    assert operator.button(key="review").disabled
    assert requests_filed(run) == [] and "Confirm rewind" not in buttons(operator)


def test_a_rewind_at_or_after_the_onset_of_a_related_incident_is_warned(operator: AppTest, run: Path) -> None:
    # the critical incident (steps 150-185, ranks 0 and 1) overlaps the straggler incident from step 102 on the same
    # ranks: a rewind to 150 would retrain through the straggler's steps; 100, the prefill, would not
    assert [n.value for n in operator.number_input] == [100] and not operator.warning
    labelled(operator.number_input, "to_step").set_value(150).run()
    assert [w.value for w in operator.warning] == [
        "to_step 150 is at or after step 105, where the related incident straggler@0:105/r1 began: the run would "
        "train through the same fault again."
    ]


def test_the_confirmation_shows_what_a_rewind_discards_and_replays(operator: AppTest) -> None:
    review(operator)
    assert_rendered(operator)
    assert [m.value for m in operator.markdown if m.value.startswith("- This ")] == [
        "- This discards steps 101-200 of the live timeline: 100 steps, 3 s of training, 136 GFLOP.",
        "- This replays global batches 100-199 (3,200 samples) on a new timeline.",
    ]


def test_the_confirmation_shows_what_a_skip_and_a_quarantine_take_out(operator: AppTest) -> None:
    labelled(operator.selectbox, "Action").select("skip").run()
    review(operator)
    assert "- This skips global batches 150-185: 36 batches (1,152 samples) never trained." in [
        m.value for m in operator.markdown
    ]
    operator.button(key="cancel").click().run()
    labelled(operator.selectbox, "Action").select("quarantine").run()
    labelled(operator.number_input, "shard").set_value(3)
    review(operator)
    assert "- This stops reading data shard 3 (256 samples)." in [m.value for m in operator.markdown]


def test_a_request_needs_a_reason(operator: AppTest, run: Path) -> None:
    review(operator, reason="   ")
    assert_rendered(operator)
    assert [e.value for e in operator.error] == ["A reason is required."]
    assert "Confirm rewind" not in buttons(operator)
    assert requests_filed(run) == [] and audit_entries(run) == []


def test_a_reviewed_and_confirmed_rewind_files_one_request_and_one_audit_entry(
    operator: AppTest, run: Path, critical: pd.Series
) -> None:
    to_step = json.loads(critical["suggested_action"])["args"]["to_step"]
    review(operator)
    assert_rendered(operator)
    assert f'{OPERATOR} asks the trainer to **rewind** {{"to_step": {to_step}}}: {REASON}' in [
        w.value for w in operator.warning
    ]
    assert requests_filed(run) == []  # nothing is filed before the confirmation

    before = time.time()
    operator.button(key="confirm").click().run()
    assert_rendered(operator)
    [request] = requests_filed(run)
    assert {k: request[k] for k in ("action", "args", "operator", "reason")} == {
        "action": "rewind",
        "args": {"to_step": to_step},
        "operator": OPERATOR,
        "reason": REASON,
    }
    [entry] = audit_entries(run)
    assert entry == {
        "seq": 0,
        "time": entry["time"],
        "operator": OPERATOR,
        "what": "rewind",
        "incident_id": critical["incident_id"],
        "request_id": request["request_id"],
        "args": {"to_step": to_step},
        "reason": REASON,
        "prev": audit.GENESIS,
        "hash": audit.entry_hash(entry),
    }
    assert before <= entry["time"] <= time.time()
    assert from_store(run, "SELECT seq, hash FROM audit_head").values.tolist() == [[0, entry["hash"]]]

    assert f"Request {request['request_id']} filed." in [s.value for s in operator.success]
    assert f"`{request['request_id']}` **rewind** by {OPERATOR}: {WAITING}" in texts(operator)
    trail = table(operator, "operator", "what", "request_id", "reason")
    assert list(zip(trail["operator"], trail["what"], trail["request_id"], trail["reason"])) == [
        (OPERATOR, "rewind", request["request_id"], REASON)
    ]

    operator.run()  # the next refresh files nothing more, and still says what was filed
    assert len(requests_filed(run)) == 1 and "Confirm rewind" not in buttons(operator)
    assert f"Request {request['request_id']} filed." in [s.value for s in operator.success]
    review(operator)  # until the next review
    assert not [s.value for s in operator.success if "filed" in s.value]


def test_an_edited_argument_is_what_gets_filed(operator: AppTest, run: Path) -> None:
    labelled(operator.selectbox, "Action").select("skip").run()
    assert [n.label for n in operator.number_input] == ["first_batch", "last_batch"]
    labelled(operator.number_input, "last_batch").set_value(190)
    review(operator)
    operator.button(key="confirm").click().run()
    [request] = requests_filed(run)
    assert (request["action"], request["args"]) == ("skip", {"first_batch": 150, "last_batch": 190})


def test_a_request_the_trainer_could_not_take_is_refused_and_not_audited(operator: AppTest, run: Path) -> None:
    labelled(operator.selectbox, "Action").select("skip").run()
    labelled(operator.number_input, "first_batch").set_value(200)  # after last_batch
    review(operator)
    operator.button(key="confirm").click().run()
    assert_rendered(operator)
    assert [e.value for e in operator.error] == ["skip needs first_batch <= last_batch, got 200 > 185"]
    assert requests_filed(run) == [] and audit_entries(run) == []


def test_cancelling_a_review_files_nothing(operator: AppTest, run: Path) -> None:
    review(operator)
    operator.button(key="cancel").click().run()
    assert_rendered(operator)
    assert "Confirm rewind" not in buttons(operator) and not operator.warning
    assert requests_filed(run) == [] and audit_entries(run) == []


def test_a_review_does_not_carry_over_to_another_incident(operator: AppTest, run: Path, critical: pd.Series) -> None:
    review(operator)
    other = next(
        i for i in from_store(run, "SELECT incident_id FROM incidents")["incident_id"] if i != critical["incident_id"]
    )
    operator.selectbox(key="incident").set_value(other).run()
    assert_rendered(operator)
    assert "Confirm rewind" not in buttons(operator) and not operator.warning
    operator.selectbox(key="incident").set_value(critical["incident_id"]).run()
    assert "Confirm rewind" not in buttons(operator)  # reviewed again, or not at all
    assert requests_filed(run) == []


def test_a_review_does_not_carry_over_to_another_run(tmp_path: Path, monkeypatch) -> None:
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        ensure_control_key(RunLayout(without_run_end(copy_run("tiny-faults", runs, as_name=name))))
    serve(runs, token=TOKEN)
    critical = "nonfinite@0:150"  # the one incident of the run with an action to review
    app = unlock(open_page("incidents", run="a", incident=critical), OPERATOR, TOKEN)
    review(app)
    assert "Confirm rewind" in buttons(app)
    app.sidebar.selectbox(key="run").select("b").run()
    assert_rendered(app)
    assert app.sidebar.selectbox(key="run").value == "b"
    assert "Confirm rewind" not in buttons(app) and not app.warning
    assert requests_filed(runs / "a") == requests_filed(runs / "b") == []


# -- acknowledgements ---------------------------------------------------------------------------------------------


def test_acknowledging_records_the_operator_in_the_store_and_the_audit_trail(
    operator: AppTest, run: Path, critical: pd.Series
) -> None:
    note = "on it: checking rank 1's host"
    operator.text_input(key="ack_note").input(note)
    [acknowledge] = [b for b in operator.button if b.label == "Acknowledge"]
    acknowledge.click().run()
    assert_rendered(operator)
    assert f"Acknowledged by {OPERATOR}." in [s.value for s in operator.success]

    [[who, said, status]] = from_store(
        run, "SELECT acknowledged_by, ack_note, status FROM incidents WHERE incident_id = ?", critical["incident_id"]
    ).values
    assert (who, said, status) == (OPERATOR, note, "acknowledged")
    [entry] = audit_entries(run)
    assert {k: entry[k] for k in ("operator", "what", "incident_id", "request_id", "reason")} == {
        "operator": OPERATOR,
        "what": "acknowledge",
        "incident_id": critical["incident_id"],
        "request_id": None,
        "reason": note,
    }
    assert requests_filed(run) == []

    operator.run()
    assert f"Acknowledged by {OPERATOR}: {note}" in [c.value for c in operator.caption]
    assert list(table(operator, "operator", "what")["what"]) == ["acknowledge"]


def test_resolving_by_hand_needs_a_note_and_is_recorded_in_the_store_and_the_audit_trail(
    operator: AppTest, run: Path, critical: pd.Series
) -> None:
    [resolve] = [b for b in operator.button if b.label == "Resolve"]
    resolve.click().run()
    assert any("say why the incident is resolved" in e.value for e in operator.error)
    operator.text_input(key="ack_note").input("false alarm: the NaN came from a test shard")
    [resolve] = [b for b in operator.button if b.label == "Resolve"]
    resolve.click().run()
    assert f"Resolved by {OPERATOR}." in [s.value for s in operator.success]
    [[who, status]] = from_store(
        run, "SELECT resolved_by, status FROM incidents WHERE incident_id = ?", critical["incident_id"]
    ).values
    assert (who, status) == (OPERATOR, "resolved")
    assert [e["what"] for e in audit_entries(run)] == ["resolve"]


def test_a_resolved_incident_cannot_be_acknowledged(operator: AppTest, run: Path) -> None:
    resolved = from_store(run, "SELECT incident_id FROM incidents WHERE status = 'resolved'")["incident_id"][0]
    operator.selectbox(key="incident").set_value(resolved).run()
    [acknowledge] = [b for b in operator.button if b.label == "Acknowledge"]
    assert acknowledge.disabled


def acknowledge(app: AppTest, note: str = "mine") -> AppTest:
    app.text_input(key="ack_note").input(note)
    [button] = [b for b in app.button if b.label == "Acknowledge"]
    return button.click().run()


def test_acknowledging_twice_is_not_possible(operator: AppTest, run: Path, critical: pd.Series) -> None:
    acknowledge(operator)
    [button] = [b for b in operator.button if b.label == "Acknowledge"]
    assert button.disabled
    with pytest.raises(BedsideError, match="not acknowledged: the incident is already acknowledged"):
        registry.desk().data(run).acknowledge(critical["incident_id"], operator="bob", note="mine too")
    assert [e["what"] for e in audit_entries(run)] == ["acknowledge"]


def test_other_incidents_do_not_read_as_acknowledged_or_resolved_by_someone(
    operator: AppTest, run: Path, critical: pd.Series
) -> None:
    acknowledge(operator, "looking")  # the critical incident, which the page opens on
    others = from_store(run, "SELECT incident_id FROM incidents WHERE incident_id != ?", critical["incident_id"])

    def someones() -> list[str]:
        return [c.value for c in operator.caption if c.value.startswith(("Acknowledged by", "Resolved by hand by"))]

    for other in others["incident_id"]:
        operator.selectbox(key="incident").set_value(other).run()
        assert_rendered(operator)
        assert someones() == []
    operator.selectbox(key="incident").set_value(critical["incident_id"]).run()
    assert f"Acknowledged by {OPERATOR}: looking" in someones()
    operator.text_input(key="ack_note").input("handled")
    [resolve] = [b for b in operator.button if b.label == "Resolve"]
    resolve.click().run()
    for other in others["incident_id"]:
        operator.selectbox(key="incident").set_value(other).run()
        assert someones() == []


def test_no_request_is_reviewed_or_filed_for_a_resolved_incident(operator: AppTest, run: Path) -> None:
    resolved = from_store(run, "SELECT incident_id FROM incidents WHERE status = 'resolved'")["incident_id"][0]
    operator.selectbox(key="incident").set_value(resolved).run()
    labelled(operator.selectbox, "Action").select("pause").run()
    assert "No request can be filed: the incident is resolved: act on an open one." in [i.value for i in operator.info]
    assert operator.button(key="review").disabled
    with pytest.raises(BedsideError, match="not filed: the incident is resolved"):
        registry.desk().data(run).request("pause", {}, operator=OPERATOR, reason=REASON, incident_id=resolved)
    assert requests_filed(run) == [] and audit_entries(run) == []


def test_no_request_is_reviewed_or_filed_for_a_run_that_has_ended(tiny_faults: Path, monkeypatch) -> None:
    serve(tiny_faults, token=TOKEN)
    app = unlock(open_page("incidents"), OPERATOR, TOKEN)
    assert_rendered(app)
    refused = "the run has finished: no trainer is left to apply a request"
    assert f"No request can be filed: {refused}." in [i.value for i in app.info]
    assert app.button(key="review").disabled and "Confirm rewind" not in buttons(app)
    with pytest.raises(BedsideError, match=f"not filed: {refused}"):
        registry.desk().data(tiny_faults).request(
            "rewind", {"to_step": 100}, operator=OPERATOR, reason=REASON, incident_id=None
        )
    assert requests_filed(tiny_faults) == [] and audit_entries(tiny_faults) == []


def test_a_broken_audit_chain_is_shown_on_the_incidents_page(operator: AppTest, run: Path) -> None:
    acknowledge(operator, "first")
    trail = RunLayout(run).control / "audit.jsonl"
    assert "Chain intact: 1 entries" in texts(operator)
    trail.write_text(trail.read_text().replace('"reason":"first"', '"reason":"never happened"'))
    operator.run()
    assert_rendered(operator)
    assert [e.value for e in operator.error] == [
        "The audit trail's chain is broken: line 1 (entry 0) was rewritten: its content no longer matches its hash. "
        "Entries from there on may be forged, rewritten or missing (bedside audit verify)."
    ]


def test_a_trail_cut_short_is_shown_broken_against_the_head_the_store_recorded(
    operator: AppTest, run: Path, critical: pd.Series
) -> None:
    acknowledge(operator, "first")
    trail = RunLayout(run).control / "audit.jsonl"
    trail.write_text("")
    operator.run()
    assert any(
        "the store recorded entry 0 as a head, but the trail is empty: entries were deleted from its end" in e.value
        for e in operator.error
    )


# -- a store held by another process --------------------------------------------------------------------------


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + EVENTUALLY_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_run_whose_store_another_process_holds_is_shown_read_only(
    tiny_faults: Path, tmp_path: Path, monkeypatch, start_bedside
) -> None:
    run = tiny_faults
    log = tmp_path / "collect.log"
    with open(log, "w") as err:
        collector = start_bedside("collect", run, "--follow", stderr=err)
    wait_for(lambda: "ingested" in log.read_text() or collector.poll() is not None)
    assert collector.poll() is None, log.read_text()
    serve(run, token=TOKEN)

    app = open_page("overview")
    for page in PAGES:
        assert_rendered(go_to(app, page))
        [warning] = app.sidebar.warning
        assert warning.value.startswith("Read-only: another process holds this run's store")
    shown = {m.label: m.value for m in go_to(app, "overview").metric}
    assert (shown["Status"], shown["Step"]) == ("finished", "200")  # from the raw telemetry
    assert shown["Open incidents"] == "–"  # not "0": the incidents are in the other process
    assert set(chart_keys(app)) == {"goodput", "eval_vs_compute", "training_curves"}

    unlock(go_to(app, "incidents"), OPERATOR, TOKEN)
    assert_rendered(app)
    assert not app.success and "another process holds this run's store" in app.warning[0].value
    assert not buttons(app) & (ACTION_BUTTONS - SWITCH_BUTTONS)

    with pytest.raises(BedsideError, match="acknowledging needs the store, which another process holds"):
        registry.desk().data(run).acknowledge("nonfinite@0:150", operator=OPERATOR, note="mine")
    assert audit_entries(run) == []
    # the kill switch is kept in the audit trail, not the store: the process that holds the store (and runs the
    # playbooks) reads it before each automatic action, so it is offered here too
    assert_rendered(switch_playbooks(app, "Switch playbooks off", "the watch holds the store: stop its playbooks"))
    assert [entry["what"] for entry in audit_entries(run)] == ["playbook_off"]
    assert collector.poll() is None


# -- the pieces, on small frames ----------------------------------------------------------------------------------

CHECKPOINTS = pd.DataFrame(
    {
        "step": [20, 50, 60, 100],
        "state": ["saved", "verified", "corrupt", "verified"],
        "deleted": [False, True, False, False],
    }
)


@pytest.mark.parametrize(
    ("action", "suggestion", "args"),
    [
        pytest.param("rewind", {"action": "rewind", "args": {"to_step": 40}}, {"to_step": 40}, id="the suggestion"),
        pytest.param(
            "rewind",
            {"action": "investigate", "args": {"step": 85}},
            {"to_step": 20},
            id="rewind to the newest good checkpoint still on disk",
        ),
        pytest.param("rewind", {"action": "rewind", "args": {}}, {"to_step": 20}, id="a suggestion without arguments"),
        pytest.param(
            "skip",
            {"action": "rewind", "args": {"to_step": 40}},
            {"first_batch": 85, "last_batch": 94},
            id="skip the incident's batches",
        ),
        pytest.param("quarantine", {"action": "investigate", "args": {}}, {"shard": 0}, id="quarantine"),
        pytest.param("pause", {"action": "rewind", "args": {"to_step": 40}}, {}, id="pause"),
    ],
)
def test_prefilled_args_take_the_suggestion_else_derive_from_the_incident(
    action: str, suggestion: dict, args: dict
) -> None:
    incident = pd.Series({"start_step": 85, "end_step": 94})
    assert prefilled_args(action, suggestion, incident, CHECKPOINTS) == args


def incidents_frame(*rows: tuple[str, int, int, list[int], str, list[str]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"incident_id": i, "timeline": 0, "start_step": a, "end_step": b, "ranks": r, "cause": c, "kinds": k}
            for i, a, b, r, c, k in rows
        ]
    )


def test_a_prefilled_rewind_goes_before_a_related_bad_shard_episode() -> None:
    # the case: a spike at 2081-2248 inside a bad-shard episode from 2000; the detector suggested 2100
    incidents = incidents_frame(
        ("spike", 2081, 2248, [], "unexplained", ["loss_spike"]),
        ("shard", 2000, 2250, [], "bad shard 3", ["bad_shard", "loss_spike"]),
        ("slow", 2050, 2300, [5], "slow worker(s)", ["straggler"]),
        ("old", 1500, 1600, [], "bad shard 3", ["bad_shard"]),
    )
    first, where = onset("spike", incidents)
    assert (first, where) == (2000, "shard")  # not the straggler on rank 5 alone, nor the old episode
    checkpoints = pd.DataFrame(
        {"step": [1900, 2000, 2100], "state": ["saved", "verified", "verified"], "deleted": [False, False, False]}
    )
    suggestion = {"action": "rewind", "args": {"to_step": 2100}}
    assert prefilled_args("rewind", suggestion, incidents.iloc[0], checkpoints, before=first) == {"to_step": 1900}


def test_incidents_on_the_same_ranks_or_cause_relate_and_others_do_not() -> None:
    incidents = incidents_frame(
        ("nan", 150, 185, [0, 1], "sdc on rank 0", ["nonfinite", "sdc"]),
        ("slow", 102, 194, [1], "slow", ["straggler"]),
        ("other", 120, 130, [7], "network", ["straggler"]),
        ("later", 190, 200, [0], "sdc on rank 0", ["sdc"]),
    )
    assert onset("nan", incidents) == (102, "slow")
    assert onset("other", incidents) == (120, "other")


def test_a_job_wide_slowdown_does_not_send_a_loss_spikes_rewind_further_back() -> None:
    # a busy machine slows every rank from step 60; the loss spikes at 100; the checkpoint at 90 is still good
    incidents = incidents_frame(
        ("spike", 100, 104, [], "", ["loss_spike"]),
        ("busy", 60, 300, [], "", ["throughput_drop"]),
        ("slow", 70, 300, [0, 1], "slow worker(s)", ["straggler"]),
    )
    assert onset("spike", incidents) == (100, "spike")
    assert onset("busy", incidents) == (60, "busy")
    checkpoints = pd.DataFrame({"step": [0, 90], "state": ["verified", "verified"], "deleted": [False, False]})
    before = onset("spike", incidents)[0]
    assert prefilled_args(
        "rewind", {"action": "rewind", "args": {"to_step": 90}}, incidents.iloc[0], checkpoints, before=before
    ) == {"to_step": 90}


def test_a_rewind_with_no_good_checkpoint_before_the_onset_goes_to_step_0() -> None:
    assert prefilled_args(
        "rewind", {"action": "investigate"}, pd.Series({"start_step": 10, "end_step": 12}), CHECKPOINTS
    ) == {"to_step": 0}


def test_request_status_follows_the_request_from_filing_to_the_trainers_answer(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    layout.control_processed.mkdir(parents=True)
    none = pd.DataFrame(columns=["request_id", "status", "step", "timeline", "message"])
    assert request_status("req-1", none, layout) == WAITING
    assert request_status("req-1", none, layout, ended=True) == NEVER
    (layout.control_processed / "req-1.json").write_text("{}")
    assert request_status("req-1", none, layout) == "taken by the trainer"

    def answered(status: str, message: str | None = None) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "request_id": ["req-0", "req-1"],
                "status": ["applied", status],
                "step": [3, 187],
                "timeline": [0, 1],
                "message": [None, message],
            }
        )

    assert request_status("req-1", answered("requested"), layout) == "acknowledged by the trainer, not yet applied"
    assert request_status("req-1", answered("applied"), layout) == "applied at step 187 on timeline 1"
    assert (
        request_status("req-1", answered("rejected", "no checkpoint at step 40"), layout)
        == "rejected by the trainer: no checkpoint at step 40"
    )
    lost = pd.DataFrame(
        {
            "request_id": ["req-2"],
            "summary": ["control request req-2 (rewind by ana, filed ...) was not applied: 20 steps and 31 s later"],
        }
    )
    filed = pd.concat([none, pd.DataFrame({"request_id": ["req-2"], "status": ["not answered"]})])
    assert request_status("req-2", filed, layout) == WAITING
    assert request_status("req-2", filed, layout, unanswered=lost) == "not applied: 20 steps and 31 s later"


def with_control_heartbeat(run: Path) -> Path:
    """``run`` with a heartbeat of rank 0 written now that says a control reader polls (as ControlClient writes)."""
    path = RunLayout(run).rank_file(0)
    last = json.loads(path.read_text().splitlines()[-1])
    beat = {**{k: last[k] for k in ("rank", "step", "timeline")}, "time": time.time(), "seq": last["seq"] + 1}
    with path.open("a") as fh:
        fh.write(json.dumps({"kind": "heartbeat", **beat, "control": True}) + "\n")
    return run


def test_the_form_says_when_no_control_reader_polls_the_run_before_anything_is_filed(operator: AppTest) -> None:
    assert (
        "A request filed now may not be applied: no control reader: no heartbeat of rank 0 says a loop polls this "
        "run's requests (the loop needs the kit's ControlClient); the request waits until one does."
    ) in [i.value for i in operator.info]
    assert not operator.button(key="review").disabled


def test_the_form_says_nothing_of_readers_when_one_polls(run: Path) -> None:
    serve(with_control_heartbeat(run), token=TOKEN)
    app = unlock(open_page("incidents"), OPERATOR, TOKEN)
    assert_rendered(app)
    assert not [i.value for i in app.info if "control reader" in i.value]
    assert from_store(run, "SELECT beats FROM control_reader")["beats"].tolist() == [1]


def test_a_suggestion_without_arguments_reads_without_empty_braces(tmp_path: Path) -> None:
    run = tmp_path / "slowed"
    jitter = np.random.default_rng(0)
    with RunLogger(run, rank=0, world_size=1, local_rank=0) as log:
        for step in range(1, 401):  # three times slower from step 200
            log.rank_step(step, step_time=(0.1 if step < 200 else 0.3) * float(np.exp(0.03 * jitter.standard_normal())))
            log.step(step, loss=3.0 * step**-0.1, tokens=4096)
    serve(run)
    [[chosen, suggestion]] = from_store(
        run, "SELECT incident_id, suggested_action FROM incidents WHERE list_contains(kinds, 'throughput_drop')"
    ).values
    assert json.loads(suggestion)["args"] == {}
    app = open_page("incidents", incident=chosen)
    assert_rendered(app)
    [line] = [text for text in texts(app).splitlines() if "Suggested action:" in text]
    assert line.startswith("**Suggested action:** `investigate` look for ") and "{}" not in line


# -- the kill switch of automatic playbooks -----------------------------------------------------------------------


def playbooks_panel(app: AppTest):
    [panel] = [e for e in app.expander if e.label.startswith("Automatic playbooks")]
    return panel


def switch_playbooks(app: AppTest, label: str, reason: str) -> AppTest:
    app.text_input(key="playbook_reason").set_value(reason)
    return next(b for b in app.button if b.label == label).click().run()


def test_an_operator_switches_automatic_playbooks_off_and_on_again_and_the_trail_keeps_both(
    run: Path, operator: AppTest, bedside: Callable
) -> None:
    """What the page records is what the live service and ``bedside playbook status`` read: the trail's switch."""
    assert playbooks_panel(operator).label.startswith("Automatic playbooks: switched on")
    off = switch_playbooks(operator, "Switch playbooks off", "the rewinds replay the bad shard: by hand from here")
    assert_rendered(off)
    switch = read_switch(RunLayout(run))
    assert not switch.enabled and switch.entry is not None
    assert (switch.entry["operator"], switch.entry["reason"]) == (
        OPERATOR,
        "the rewinds replay the bad shard: by hand from here",
    )
    assert playbooks_panel(off).label.startswith("Automatic playbooks: switched off")
    assert f"Playbooks switched off by {OPERATOR}." in [s.value for s in off.success]
    status = bedside("playbook", "status", run)
    assert status.returncode == 0 and f"switch: off, by {OPERATOR}" in status.stdout, status.stderr
    on = switch_playbooks(off, "Switch playbooks on", "shard 3 quarantined")
    assert_rendered(on)
    assert read_switch(RunLayout(run)).enabled and audit.verify(RunLayout(run)).intact
    assert [e["what"] for e in audit.verify(RunLayout(run)).entries] == ["playbook_off", "playbook_on"]


def test_switching_playbooks_without_a_reason_records_nothing_and_says_why(run: Path, operator: AppTest) -> None:
    app = switch_playbooks(operator, "Switch playbooks off", "   ")
    assert_rendered(app)
    assert "A reason is required." in [e.value for e in app.error]
    assert read_switch(RunLayout(run)).enabled and audit.verify(RunLayout(run)).entries == []


def test_a_viewer_sees_the_playbooks_switch_but_cannot_change_it(critical: pd.Series) -> None:
    app = open_page("incidents")
    assert_rendered(app)
    assert playbooks_panel(app).label.startswith("Automatic playbooks: switched on")
    assert "Switching is locked" in " ".join(c.value for c in app.caption)
    assert not {"Switch playbooks off", "Switch playbooks on"} & buttons(app)


def test_a_broken_audit_chain_reads_as_playbooks_off_and_cannot_be_switched_on(run: Path, operator: AppTest) -> None:
    switch_playbooks(operator, "Switch playbooks off", "first")
    trail = RunLayout(run).control / "audit.jsonl"
    trail.write_text(trail.read_text().replace('"what":"playbook_off"', '"what":"playbook_on"'))
    app = operator.run()
    assert_rendered(app)
    assert playbooks_panel(app).label.startswith("Automatic playbooks: switched off")
    assert any("chain is broken" in w.value for w in app.warning)
    assert next(b for b in app.button if b.label == "Switch playbooks on").disabled
