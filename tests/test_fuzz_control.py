"""Mutation fuzzing of the control inbox, starting from a real signed request: whatever bytes land in
``control/requests/`` under whatever name, one poll takes each entry, answers it (taken, or refused with a
reason), never raises and never blocks, and applies nothing whose signature the mutation broke.

The CI size is small; BEDSIDE_FUZZ_EXAMPLES sets the examples per property for a longer run (bench/harness.py
--long, docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bedside.collectors.control import request_action
from bedside.collectors.control_inbox import RequestInbox
from bedside.collectors.controlkey import KEY_ENV, ensure_control_key, request_signature_problem, run_identity
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info

CI_EXAMPLES = 60
EXAMPLES = int(os.environ.get("BEDSIDE_FUZZ_EXAMPLES") or 0) or CI_EXAMPLES  # 0 or unset: CI's size
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def mutations() -> st.SearchStrategy:
    """Edits of a byte string: flip a byte, cut it short, insert bytes, or repeat a slice many times."""
    position = st.integers(min_value=0, max_value=4096)
    return st.lists(
        st.one_of(
            st.tuples(st.just("flip"), position, st.integers(0, 255)),
            st.tuples(st.just("cut"), position, st.just(0)),
            st.tuples(st.just("insert"), position, st.binary(min_size=1, max_size=64)),
            st.tuples(st.just("repeat"), position, st.integers(2, 20_000)),
        ),
        min_size=1,
        max_size=4,
    )


def mutate(data: bytes, edits: list[tuple]) -> bytes:
    for kind, where, what in edits:
        at = where % (len(data) + 1)
        if kind == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([what]) + data[at + 1 :]
        elif kind == "cut":
            data = data[:at]
        elif kind == "insert":
            data = data[:at] + what + data[at:]
        elif kind == "repeat":
            data = data[:at] + data[at : at + 2] * what + data[at + 2 :]
    return data


NAMES = st.one_of(
    st.just(None),  # the request's own id
    st.text(min_size=1, max_size=300).filter(lambda name: "/" not in name and "\x00" not in name),
)


@FUZZ
@given(edits=mutations(), name=NAMES)
def test_a_mutated_request_under_any_name_is_answered_and_never_raises(edits: list[tuple], name: str | None) -> None:
    os.environ.pop(KEY_ENV, None)
    with tempfile.TemporaryDirectory() as folder:
        layout = RunLayout(Path(folder))
        write_run_info(layout, RunInfo(name="fuzz", world_size=1))
        key = ensure_control_key(layout)
        request_id = request_action(layout, "rewind", {"to_step": 3}, operator="ana", reason="spike")
        original = layout.control_requests / f"{request_id}.json"
        data = mutate(original.read_bytes(), edits)
        original.unlink()
        file_name = f"{name if name is not None else request_id}.json"
        try:
            (layout.control_requests / file_name).write_bytes(data)
        except OSError:  # a name this file system refuses: nothing to read
            return
        inbox = RequestInbox(layout.control_requests, layout.control_processed, key, run_identity(layout))
        if file_name.startswith("."):  # hidden: never read (the unanswered_request detector reports it)
            assert inbox.poll(set()) == []
            return
        [request] = inbox.poll(set())
        assert list(layout.control_requests.iterdir()) == []
        if request.problem is None:  # taken: what it says is signed with the run's key
            body = json.loads(data)
            assert request_signature_problem(body, key, run_identity(layout)) is None
            assert (request.request_id, request.action) == (body["request_id"], body["action"])
        inbox.retake(set())
        inbox.poll(set())  # a restart reads processed/ again, and nothing raises there either
