"""The audit trail proves itself: every entry hash-chained to the one before, heads recorded in the store, and
``bedside audit verify`` naming the first broken link of a trail that was rewritten, added to, cut or cut short.
Real files, a real store, the real CLI in a new process, writers in concurrent processes."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path

import pytest

from bedside.collectors import audit
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

ENTRIES = 5


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    """A run with an audit trail of ``ENTRIES`` entries (an action, acknowledgements, a resolution)."""
    layout = RunLayout(tmp_path / "run")
    (layout.root / "telemetry").mkdir(parents=True)
    for n in range(ENTRIES):
        what = "rewind" if n == 0 else "resolve" if n == ENTRIES - 1 else "acknowledge"
        audit.record(
            layout,
            operator="alice",
            what=what,
            reason=f"reason {n}",
            incident_id=f"inc-{n}",
            request_id="req-1" if n == 0 else None,
            args={"to_step": 40} if n == 0 else None,
        )
    return layout


def lines(layout: RunLayout) -> list[dict]:
    return [json.loads(line) for line in audit.audit_path(layout).read_text().splitlines()]


def rewrite(layout: RunLayout, entries: list[dict]) -> None:
    audit.audit_path(layout).write_bytes(b"".join(audit.canonical_line(e) for e in entries))


def forged(entry: dict, **changes) -> dict:
    """``entry`` changed, with a hash that matches its new content (what a careful forger writes)."""
    changed = {**entry, **changes}
    return {**changed, "hash": audit.entry_hash(changed)}


def keep_head(layout: RunLayout) -> list[audit.AuditHead]:
    """What the owner does on each pass: record the trail's head in the store; the heads recorded."""
    with Store.open(layout.store) as store:
        audit.AuditKeeper(layout).keep_head(store)
        return audit.read_heads(store)


def test_each_entry_carries_its_place_and_the_hash_of_the_one_before(layout: RunLayout) -> None:
    entries = lines(layout)
    assert [e["seq"] for e in entries] == list(range(ENTRIES))
    assert entries[0]["prev"] == audit.GENESIS
    assert [e["prev"] for e in entries[1:]] == [e["hash"] for e in entries[:-1]]
    assert all(e["hash"] == audit.entry_hash(e) for e in entries)
    report = audit.verify(layout)
    assert report.intact and report.head == audit.AuditHead(ENTRIES - 1, entries[-1]["hash"])


def test_canonical_json_is_sorted_compact_ascii_and_leaves_out_the_hash() -> None:
    assert audit.canonical({"b": 1, "a": "é", "hash": "x"}) == b'{"a":"\\u00e9","b":1}'
    with pytest.raises(ValueError):
        audit.canonical({"a": float("nan")})


def test_a_rewritten_entry_is_named(layout: RunLayout) -> None:
    entries = lines(layout)
    entries[2]["reason"] = "nothing to see here"
    rewrite(layout, entries)
    assert audit.verify(layout).broken == "line 3 (entry 2) was rewritten: its content no longer matches its hash"


def test_a_rewritten_entry_with_its_hash_made_again_breaks_the_next_link(layout: RunLayout) -> None:
    entries = lines(layout)
    entries[2] = forged(entries[2], operator="mallory")
    rewrite(layout, entries)
    assert audit.verify(layout).broken == "line 4 (entry 3) does not chain to line 3: inserted, or forged"


def test_a_forged_older_entry_inserted_is_named(layout: RunLayout) -> None:
    entries = lines(layout)
    fake = forged(
        entries[2],
        time=entries[1]["time"] + 0.5,
        operator="alice",
        what="rewind",
        reason="approved earlier",
        seq=2,
        prev=entries[1]["hash"],
    )
    rewrite(layout, [*entries[:2], fake, *entries[2:]])
    assert audit.verify(layout).broken == "line 4 (entry 2) chains to line 2: line 3 was inserted before it"


def test_an_entry_of_a_stranger_is_named(layout: RunLayout) -> None:
    entries = lines(layout)
    stranger = {"time": entries[1]["time"], "operator": "alice", "what": "stop", "reason": "forged"}
    rewrite(layout, [*entries[:2], stranger, *entries[2:]])
    assert audit.verify(layout).broken.startswith("line 3 carries no chain (seq, prev, hash)")


def test_a_deleted_entry_is_named(layout: RunLayout) -> None:
    entries = lines(layout)
    rewrite(layout, entries[:1] + entries[2:])
    assert audit.verify(layout).broken == "line 2 is entry 2: entry 1 before it deleted"


def test_a_torn_tail_is_named(layout: RunLayout) -> None:
    path = audit.audit_path(layout)
    path.write_bytes(path.read_bytes()[:-20])
    assert re.fullmatch(
        rf"line {ENTRIES} is not a JSON entry \(not valid JSON: .*: character \d+\): a torn write, or altered by hand",
        audit.verify(layout).broken,
    )


def test_a_tail_cut_at_an_entry_boundary_is_caught_by_the_head_the_store_recorded(layout: RunLayout) -> None:
    assert keep_head(layout) == [audit.AuditHead(ENTRIES - 1, lines(layout)[-1]["hash"])]
    rewrite(layout, lines(layout)[:-2])
    assert audit.verify(layout).intact  # the chain alone cannot tell
    with Store.open(layout.store) as store:
        keeper = audit.AuditKeeper(layout)
        keeper.keep_head(store)
        assert keeper.broken == (
            f"the store recorded entry {ENTRIES - 1} as a head, but the trail ends at entry "
            f"{ENTRIES - 3}: entries were deleted from its end"
        )
        assert len(audit.read_heads(store)) == 1  # a broken trail's head is never recorded


def test_a_chain_rewritten_consistently_is_caught_by_the_head_the_store_recorded(layout: RunLayout) -> None:
    keep_head(layout)
    entries, prev = [], audit.GENESIS
    for entry in lines(layout):
        entries.append(forged(entry, reason="all is well", prev=prev))
        prev = entries[-1]["hash"]
    rewrite(layout, entries)
    assert audit.verify(layout).intact
    with Store.open(layout.store) as store:
        assert (
            audit.verify(layout, audit.read_heads(store)).broken
            == f"line {ENTRIES} (entry {ENTRIES - 1}) differs from what the store recorded: the trail was rewritten "
            f"from there"
        )


def test_the_head_is_recorded_again_only_when_the_trail_grew(layout: RunLayout) -> None:
    with Store.open(layout.store) as store:
        keeper = audit.AuditKeeper(layout)
        assert keeper.keep_head(store) and not keeper.keep_head(store)
        audit.record(layout, operator="bob", what="acknowledge", reason="mine")
        assert keeper.keep_head(store)
        assert [h.seq for h in audit.read_heads(store)] == [ENTRIES - 1, ENTRIES]


def test_an_entry_after_a_torn_line_chains_on_and_the_torn_line_is_reported(layout: RunLayout) -> None:
    path = audit.audit_path(layout)
    with open(path, "ab") as trail:
        trail.write(b'{"seq":5,"ti')  # a writer killed mid-line
    audit.record(layout, operator="bob", what="acknowledge", reason="after the tear")
    assert lines_text(path)[-1].startswith('{"args":{}')
    assert audit.verify(layout).broken == (
        "line 6 is not a JSON entry (not valid JSON: Unterminated string starting at: character 9): a torn write, "
        "or altered by hand"
    )


def lines_text(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _append_many(root: str, writer: int, count: int) -> None:
    layout = RunLayout(Path(root))
    for n in range(count):
        audit.record(layout, operator=f"writer-{writer}", what="acknowledge", reason=f"{n}")


def test_writers_in_concurrent_processes_chain_in_turn(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_append_many, args=(str(layout.root), w, 25)) for w in range(4)]
    for process in writers:
        process.start()
    for process in writers:
        process.join()
        assert process.exitcode == 0
    report = audit.verify(layout)
    assert report.intact and len(report.entries) == 100


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        pytest.param("   ", "enter your name", id="blank"),
        pytest.param("a" * 65, "the name is 65 characters long: at most 64", id="too long"),
        pytest.param("alice\nbob", "control characters (U+000A)", id="a newline"),
        pytest.param("alice\u202eecila", "control characters (U+202E)", id="a right-to-left override"),
        pytest.param("al\x1b[31mice", "control characters (U+001B)", id="an escape sequence"),
    ],
)
def test_an_operator_name_is_checked(name: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        audit.check_operator(name)


def test_an_operator_name_is_stripped() -> None:
    assert audit.check_operator("  Ana María  ") == "Ana María"


# -- the CLI --------------------------------------------------------------------------------------------------------


def test_audit_verify_reports_an_intact_chain_against_the_store(layout: RunLayout, bedside) -> None:
    keep_head(layout)
    done = bedside("audit", "verify", layout.root)
    assert done.returncode == 0, done.stderr
    head = lines(layout)[-1]["hash"][:16]
    assert done.stdout.strip() == (
        f"audit trail of {layout.root}: {ENTRIES} entries, chain intact, head entry "
        f"{ENTRIES - 1} {head} (checked against 1 head(s) the store recorded)"
    )


@pytest.mark.parametrize("damage", ["rewrite", "insert", "delete", "cut"])
def test_audit_verify_names_the_first_broken_link_and_exits_1(layout: RunLayout, bedside, damage: str) -> None:
    keep_head(layout)
    entries = lines(layout)
    if damage == "rewrite":
        entries[1]["reason"] = "changed"
    elif damage == "insert":
        entries.insert(2, forged(entries[1], reason="forged", seq=2))
    elif damage == "delete":
        del entries[3]
    else:
        entries = entries[:-1]
    rewrite(layout, entries)
    done = bedside("audit", "verify", layout.root)
    assert done.returncode == 1, done.stderr
    expected = {
        "rewrite": "line 2 (entry 1) was rewritten",
        "insert": "line 3 (entry 2) does not chain to line 2",
        "delete": "line 4 is entry 4: entry 3 before it deleted",
        "cut": f"the store recorded entry {ENTRIES - 1} as a head, but the trail ends at entry {ENTRIES - 2}",
    }
    assert done.stdout.startswith(f"audit trail of {layout.root} is broken: {expected[damage]}"), done.stdout


def test_audit_verify_without_a_store_checks_the_chain_alone_only_when_told(layout: RunLayout, bedside) -> None:
    done = bedside("audit", "verify", layout.root)
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith(
        f"audit trail of {layout.root}: {ENTRIES} entries, chain intact, but not checked: no head to check against "
        f"(no store)"
    )
    done = bedside("audit", "verify", layout.root, "--no-head")
    assert done.returncode == 0, done.stderr
    assert "(checked against no head: no store; the chain alone was checked (--no-head)" in done.stdout


def test_bedside_action_is_audited(tiny_faults: Path, bedside) -> None:
    done = bedside("action", tiny_faults, "rewind", "--to-step", "100", "--reason", "spike", "--operator", "carol")
    assert done.returncode == 0, done.stderr
    [entry] = lines(RunLayout(tiny_faults))
    assert {k: entry[k] for k in ("seq", "operator", "what", "request_id", "args", "reason", "prev")} == {
        "seq": 0,
        "operator": "carol",
        "what": "rewind",
        "request_id": done.stdout.splitlines()[0],
        "args": {"to_step": 100},
        "reason": "spike",
        "prev": audit.GENESIS,
    }


def test_bedside_action_refuses_an_operator_name_with_control_characters(tiny_faults: Path, bedside) -> None:
    done = bedside("action", tiny_faults, "stop", "--reason", "x", "--operator", "root\nalice")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "bedside: error: --operator: the name holds control characters (U+000A): use "
        "letters, digits, spaces and punctuation"
    )
    assert not list(RunLayout(tiny_faults).control_requests.glob("*.json"))
    assert not audit.audit_path(RunLayout(tiny_faults)).exists()
