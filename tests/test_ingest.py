"""Ingestion: torn lines, malformed lines, non-finite numbers, exactly-once, changed files, new ranks."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from bedside.collectors.format import encode_line
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

RANK0 = "telemetry/rank-00000.jsonl"
BAD_UTF8 = b'{"kind":"log","time":1,"rank":0,"step":2,"timeline":0,"seq":1,"message":"\xff\xfe"}'

MALFORMED = [
    pytest.param(b"not json at all", "not valid JSON", id="not JSON"),
    pytest.param(b"[1, 2]", "not a JSON object", id="an array"),
    pytest.param(b'"text"', "not a JSON object", id="a string"),
    pytest.param(b"", "empty line", id="empty line"),
    pytest.param(BAD_UTF8, "not valid UTF-8", id="invalid UTF-8"),
    pytest.param({"kind": ...}, "kind", id="missing kind"),
    pytest.param({"time": ...}, "time", id="missing time"),
    pytest.param({"seq": ...}, "seq", id="missing seq"),
    pytest.param({"step": "x"}, "step", id="step a word"),
    pytest.param({"step": 2.5}, "integer", id="step a fraction"),
    pytest.param({"step": 2**63}, "out of range", id="step beyond int64"),
    pytest.param({"metrics": {"loss": "abc"}}, "metrics.loss", id="loss a word"),
    pytest.param({"metrics": [1.0]}, "metrics must be an object", id="metrics a list"),
    pytest.param({"metrics": ...}, "needs metrics", id="step without metrics"),
    pytest.param({"rank": 5}, "unknown rank 5", id="rank outside world size"),
    pytest.param({"rank": 1}, "rank 1 written in the file of rank 0", id="rank of another file"),
    pytest.param({"kind": "checkpoint", "event": "exploded"}, "checkpoint event exploded", id="bad checkpoint event"),
]


def rows(store: Store, query: str) -> list[tuple]:
    return store.cursor().execute(query).fetchall()


def heartbeat_steps(store: Store) -> list[int]:
    return [step for (step,) in rows(store, "SELECT step FROM events WHERE kind = 'heartbeat' ORDER BY step")]


@pytest.fixture
def two_rank_run(run_dir: Path) -> Path:
    write_run_info(RunLayout(run_dir), RunInfo(name="two", world_size=2))
    return run_dir


@pytest.fixture
def malformed_line(record):
    """A bad line: raw bytes as given, or a step record with fields replaced (``...`` removes one)."""

    def build(bad: bytes | dict) -> bytes | dict:
        if isinstance(bad, bytes):
            return bad
        line = {**record("step", step=2, seq=1, metrics={"loss": 1.0}), **bad}
        return {k: v for k, v in line.items() if v is not ...}

    return build


@pytest.mark.parametrize(("bad", "reason"), MALFORMED)
def test_malformed_line_is_rejected_with_its_place_and_reason(
        two_rank_run, write_lines, ingest, record, malformed_line, bad, reason) -> None:
    path = write_lines([record("heartbeat", step=1), malformed_line(bad), record("heartbeat", step=3, seq=2)])
    store = ingest(two_rank_run)
    offset = path.read_bytes().index(b"\n") + 1
    [(file, line_offset, why)] = rows(store, "SELECT path, line_offset, reason FROM rejected")
    assert (file, line_offset) == (RANK0, offset)
    assert reason in why
    assert rows(store, "SELECT lines, rejected FROM ingest_status") == [(2, 1)]
    assert heartbeat_steps(store) == [1, 3]


def test_every_malformed_line_in_one_batch_leaves_the_good_lines_around_it(
        two_rank_run, write_lines, ingest, record, malformed_line) -> None:
    lines = [record("heartbeat", step=1)]
    for step, case in enumerate(MALFORMED, start=2):
        lines += [malformed_line(case.values[0]), record("heartbeat", step=step)]
    write_lines(lines)
    store = ingest(two_rank_run)
    assert rows(store, "SELECT lines, rejected FROM ingest_status") == [(len(MALFORMED) + 1, len(MALFORMED))]
    assert heartbeat_steps(store) == list(range(1, len(MALFORMED) + 2))
    expected = [reason for _, reason in (case.values for case in MALFORMED)]
    reasons = [why for (why,) in rows(store, "SELECT reason FROM rejected ORDER BY line_offset")]
    assert len(reasons) == len(expected) and all(e in why for e, why in zip(expected, reasons)), reasons


@pytest.mark.parametrize(("token", "read_as"), [
    ("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"),
    ('"NaN"', "nan"), ('"Infinity"', "inf"), ('"-Infinity"', "-inf"),
    ("1e400", "inf"), ("-1e400", "-inf"),
])
def test_non_finite_numbers_are_read_in_canonical_and_user_metrics(run_dir, write_lines, ingest, token, read_as) -> None:
    write_lines(['{"kind":"step","time":1,"rank":0,"step":1,"timeline":0,"seq":0,'
                 f'"metrics":{{"loss":{token},"mine":{token}}}}}'])
    store = ingest(run_dir)
    assert rows(store, "SELECT loss::VARCHAR, extra['mine']::VARCHAR FROM steps") == [(read_as, read_as)]


def test_torn_last_line_waits_for_the_next_pass_then_is_ingested_once(run_dir, write_lines, ingest, record) -> None:
    torn = encode_line(record("heartbeat", step=2, seq=1)).encode()
    path = write_lines([record("heartbeat", step=1), torn[:17]], end=b"")
    ingest(run_dir)
    store = ingest(run_dir)
    assert heartbeat_steps(store) == [1]
    assert rows(store, "SELECT committed_offset FROM ingest_status") == [(path.stat().st_size - 17,)]
    write_lines([torn[17:]], end=b"")
    store = ingest(run_dir)
    assert heartbeat_steps(store) == [1, 2]
    assert rows(store, "SELECT committed_offset, lines, rejected FROM ingest_status") == [(path.stat().st_size, 2, 0)]


def test_second_ingest_of_unchanged_files_adds_nothing_and_new_lines_are_added_once(
        run_dir, write_lines, ingest, record) -> None:
    write_lines([record("heartbeat", step=s, seq=s) for s in range(3)])
    ingest(run_dir)
    assert heartbeat_steps(ingest(run_dir)) == [0, 1, 2]
    write_lines([record("heartbeat", step=s, seq=s) for s in range(3, 5)])
    ingest(run_dir)
    store = ingest(run_dir)
    assert heartbeat_steps(store) == [0, 1, 2, 3, 4]
    assert rows(store, "SELECT lines FROM ingest_status") == [(5,)]


def shrink(path: Path) -> None:
    os.truncate(path, path.read_bytes().index(b"\n") + 1)


def replace(path: Path) -> None:
    """Rename a new file over ``path``: the same lines and one more, but another file."""
    fresh = path.with_name("fresh.tmp")
    fresh.write_bytes(path.read_bytes() + path.read_bytes().splitlines(keepends=True)[-1])
    os.replace(fresh, path)


@pytest.mark.parametrize(("change", "state"), [(shrink, "shrunk"), (replace, "replaced")], ids=["shrunk", "replaced"])
def test_a_file_that_changed_under_the_collector_is_reported_once_and_not_reread(
        run_dir, write_lines, ingest, record, change, state) -> None:
    path = write_lines([record("heartbeat", step=s, seq=s) for s in (1, 2)])
    ingest(run_dir)
    change(path)
    ingest(run_dir)
    write_lines([record("heartbeat", step=3, seq=2)])
    store = ingest(run_dir)
    assert rows(store, "SELECT path, state FROM ingest_status") == [(RANK0, state)]
    assert rows(store, "SELECT state FROM source_incidents") == [(state,)]
    assert heartbeat_steps(store) == [1, 2]


def test_rank_files_appearing_between_passes_are_picked_up(run_dir, write_lines, ingest, record) -> None:
    write_lines([record("heartbeat")], rank=0)
    ingest(run_dir)
    write_lines([record("heartbeat", rank=1)], rank=1)
    write_lines([record("heartbeat", rank=2)], rank=2)
    store = ingest(run_dir)
    assert rows(store, "SELECT rank FROM events ORDER BY rank") == [(0,), (1,), (2,)]
    assert rows(store, "SELECT file_rank, lines FROM ingest_status ORDER BY file_rank") == [(0, 1), (1, 1), (2, 1)]


def test_a_line_longer_than_the_batch_budget_is_still_ingested(run_dir, write_lines, ingest, record) -> None:
    messages = ["before", "x" * 20_000, "after"]
    write_lines([record("log", step=step, message=m) for step, m in enumerate(messages)])
    store = ingest(run_dir, batch_bytes=256)
    assert rows(store, "SELECT message FROM event_log ORDER BY step") == [(m,) for m in messages]
    assert rows(store, "SELECT lines, rejected FROM ingest_status") == [(3, 0)]
