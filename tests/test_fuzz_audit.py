"""Fuzzing the audit trail's readers from a real trail: byte mutations, and rewrites that keep every link (what
someone who can write the file and knows the format makes) with field values of any JSON type. ``verify`` reports
a chain intact or names its first broken link, and the owner's ``AuditKeeper`` records the head and the filings
it can, into a real store; neither ever raises. CI's size is small; BEDSIDE_FUZZ_EXAMPLES sets a longer run
(bench/harness.py --long)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bedside.collectors import audit
from bedside.collectors.audit import GENESIS, AuditKeeper, canonical_line, entry_hash, verify
from bedside.collectors.controlkey import KEY_ENV, ensure_control_key
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

CI_EXAMPLES = 25
EXAMPLES = int(os.environ.get("BEDSIDE_FUZZ_EXAMPLES") or 0) or CI_EXAMPLES  # 0 or unset: CI's size
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(-1e300, 1e300) | st.text(max_size=40)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
FIELDS = ("time", "operator", "what", "incident_id", "request_id", "args", "reason")


def real_trail(root: Path) -> RunLayout:
    """A run whose trail holds three entries filed the way bedside action files them."""
    layout = RunLayout(root)
    write_run_info(layout, RunInfo(name="fuzz", world_size=1))
    ensure_control_key(layout)
    audit.file_request(layout, "pause", {}, operator="ana", reason="look")
    audit.file_request(layout, "rewind", {"to_step": 3}, operator="bo", reason="spike")
    audit.record(layout, operator="cy", what="acknowledge", reason="on it", incident_id="loss_spike@0:5")
    return layout


def check_everything(layout: RunLayout) -> None:
    report = verify(layout)
    assert report.intact == (report.broken is None)
    with Store.open(None) as store:  # the owner's pass over it: head and filings into a real store
        AuditKeeper(layout).keep_head(store)


@FUZZ
@given(changes=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(FIELDS), VALUES), min_size=1, max_size=4))
def test_a_consistent_rewrite_with_values_of_any_type_is_read_without_raising(changes: list[tuple]) -> None:
    os.environ.pop(KEY_ENV, None)
    with tempfile.TemporaryDirectory() as folder:
        layout = real_trail(Path(folder))
        entries = verify(layout).entries
        for index, name, value in changes:
            entries[index][name] = value
        prev, lines = GENESIS, []
        for entry in entries:
            entry = {**entry, "prev": prev}
            entry.pop("hash")
            entry["hash"] = prev = entry_hash(entry)
            lines.append(canonical_line(entry))
        audit.audit_path(layout).write_bytes(b"".join(lines))
        assert verify(layout).intact  # every link holds (values within the limits): only a copy of the head tells
        check_everything(layout)


@FUZZ
@given(at=st.integers(0, 4096), cut=st.booleans(), junk=st.binary(min_size=1, max_size=64))
def test_a_trail_with_bytes_changed_is_read_without_raising(at: int, cut: bool, junk: bytes) -> None:
    os.environ.pop(KEY_ENV, None)
    with tempfile.TemporaryDirectory() as folder:
        layout = real_trail(Path(folder))
        path = audit.audit_path(layout)
        data = path.read_bytes()
        at %= len(data) + 1
        path.write_bytes(data[:at] if cut else data[:at] + junk + data[at:])
        check_everything(layout)
