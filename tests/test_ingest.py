"""Ingestion: torn lines, malformed lines, non-finite numbers, exactly-once, changed files, new ranks,
live files, and failures that are not a line's fault."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from bedside.collectors.errors import StoreError
from bedside.collectors.format import encode_line
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

RANK0 = "telemetry/rank-00000.jsonl"
BAD_UTF8 = b'{"kind":"log","time":1,"rank":0,"step":2,"timeline":0,"seq":1,"message":"\xff\xfe"}'

MALFORMED = [
    pytest.param(b"not json at all", "not valid JSON: Expecting value at column 1", id="not JSON"),
    pytest.param(b"[1, 2]", "not a JSON object", id="an array"),
    pytest.param(b'"text"', "not a JSON object", id="a string"),
    pytest.param(b"", "empty line", id="empty line"),
    pytest.param(BAD_UTF8, f"not valid UTF-8 (invalid start byte at byte {BAD_UTF8.index(0xFF)})", id="invalid UTF-8"),
    pytest.param({"kind": ...}, "missing field: kind", id="missing kind"),
    pytest.param({"time": ...}, "field time is missing or not a number", id="missing time"),
    pytest.param({"seq": ...}, "field seq is missing or not an integer", id="missing seq"),
    pytest.param({"step": "x"}, "field step is missing or not an integer", id="step a word"),
    pytest.param({"step": 2.5}, "rank, step, timeline and seq must be integers", id="step a fraction"),
    pytest.param({"step": 2**63}, "step must be below 2^53 (9007199254740992)", id="step beyond int64"),
    pytest.param(
        {"time": 1_700_000_000_000_000_000},
        "time must be unix seconds, got 1700000000000000000",
        id="time in nanoseconds",
    ),
    pytest.param(
        {"time": 1_700_000_000_000}, "time must be unix seconds, got 1700000000000", id="time in milliseconds"
    ),
    pytest.param({"time": -1}, "time must be unix seconds, got -1", id="time negative"),
    pytest.param({"metrics": {"loss": "abc"}}, 'metrics.loss must be a number, got "abc"', id="loss a word"),
    pytest.param({"metrics": [1.0]}, "field metrics must be an object", id="metrics a list"),
    pytest.param({"metrics": ...}, "a step record needs metrics (an object of numbers)", id="step without metrics"),
    pytest.param({"rank": 5}, "unknown rank 5: the run has world size 2", id="rank outside world size"),
    pytest.param({"rank": 1}, "rank 1 written in the file of rank 0", id="rank of another file"),
    pytest.param(
        {"kind": "checkpoint", "event": "exploded"}, "unknown checkpoint event exploded", id="bad checkpoint event"
    ),
    pytest.param(
        {"kind": "action", "action": "rewind", "status": "done", "request_id": "r1"},
        "unknown action status done",
        id="bad action status",
    ),
    pytest.param(
        {"kind": "run_end", "status": "done"},
        "a run_end record needs status, one of finished, failed, aborted",
        id="bad run_end status",
    ),
    pytest.param(
        {"kind": "eval", "cum_tokens": "abc"},
        'field cum_tokens must be a number, got "abc"',
        id="eval cum_tokens a word",
    ),
    pytest.param(
        {"kind": "eval", "cum_flops": [1]}, "field cum_flops must be a number, got [1]", id="eval cum_flops a list"
    ),
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
    two_rank_run, write_lines, ingest, record, malformed_line, bad, reason
) -> None:
    path = write_lines([record("heartbeat", step=1), malformed_line(bad), record("heartbeat", step=3, seq=2)])
    store = ingest(two_rank_run)
    offset = path.read_bytes().index(b"\n") + 1
    [(file, line_offset, why)] = rows(store, "SELECT path, line_offset, reason FROM rejected")
    assert (file, line_offset, why) == (RANK0, offset, reason)
    assert rows(store, "SELECT lines, rejected FROM ingest_status") == [(2, 1)]
    assert heartbeat_steps(store) == [1, 3]


def test_every_malformed_line_in_one_batch_leaves_the_good_lines_around_it(
    two_rank_run, write_lines, ingest, record, malformed_line
) -> None:
    lines = [record("heartbeat", step=1)]
    for step, case in enumerate(MALFORMED, start=2):
        lines += [malformed_line(case.values[0]), record("heartbeat", step=step)]
    write_lines(lines)
    store = ingest(two_rank_run)
    assert rows(store, "SELECT lines, rejected FROM ingest_status") == [(len(MALFORMED) + 1, len(MALFORMED))]
    assert heartbeat_steps(store) == list(range(1, len(MALFORMED) + 2))
    expected = [reason for _, reason in (case.values for case in MALFORMED)]
    reasons = [why for (why,) in rows(store, "SELECT reason FROM rejected ORDER BY line_offset")]
    assert reasons == expected


@pytest.mark.parametrize(
    ("token", "read_as"),
    [
        ("NaN", "nan"),
        ("Infinity", "inf"),
        ("-Infinity", "-inf"),
        ('"NaN"', "nan"),
        ('"Infinity"', "inf"),
        ('"-Infinity"', "-inf"),
        ("1e400", "inf"),
        ("-1e400", "-inf"),
    ],
)
def test_non_finite_numbers_are_read_in_canonical_and_user_metrics(
    run_dir, write_lines, ingest, token, read_as
) -> None:
    write_lines(
        [
            '{"kind":"step","time":1,"rank":0,"step":1,"timeline":0,"seq":0,'
            f'"metrics":{{"loss":{token},"mine":{token}}}}}'
        ]
    )
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
    run_dir, write_lines, ingest, record
) -> None:
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
    run_dir, write_lines, ingest, record, change, state
) -> None:
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


@pytest.mark.parametrize("seconds", [0, 1e11 - 1], ids=["synthetic clock from 0", "last unix second accepted"])
def test_times_out_of_unix_seconds_are_rejected_and_leave_the_time_views_working(
    run_dir, write_lines, ingest, record, seconds
) -> None:
    write_lines(
        [
            record("step", time=seconds, metrics={"loss": 1.0}),
            record("step", time=1_700_000_000_000_000_000, seq=1, metrics={"loss": 2.0}),
        ]
    )
    store = ingest(run_dir)
    assert rows(store, "SELECT reason FROM rejected") == [("time must be unix seconds, got 1700000000000000000",)]
    assert rows(store, "SELECT time, loss FROM step_metrics") == [(seconds, 1.0)]
    assert rows(store, "SELECT steps FROM timelines") == [(1,)]
    assert rows(store, "SELECT last_step FROM run") == [(1,)]


@pytest.mark.parametrize(
    "metrics",
    [
        pytest.param({"loss": True, "grad_norm": False}, id="canonical metrics only"),
        pytest.param({"loss": True, "grad_norm": False, "mine": True}, id="with a user metric"),
    ],
)
def test_booleans_are_read_as_one_and_zero_in_every_metric(run_dir, write_lines, ingest, record, metrics) -> None:
    write_lines([record("step", metrics=metrics)])
    store = ingest(run_dir)
    assert rows(store, "SELECT count(*) FROM rejected") == [(0,)]
    expected_extra = {"mine": 1.0} if "mine" in metrics else None
    assert rows(store, "SELECT loss, grad_norm, extra FROM steps") == [(1.0, 0.0, expected_extra)]


@pytest.mark.parametrize(
    ("kind", "metrics", "field", "value", "table"),
    [
        ("step", {"loss": 1.0}, "param_checksum", "c0ffee", "steps"),
        ("rank_step", {"step_time": 0.1}, "shards", [3], "rank_steps"),
    ],
)
def test_a_field_of_another_kind_is_kept_in_attrs(
    run_dir, write_lines, ingest, record, kind, metrics, field, value, table
) -> None:
    write_lines([record(kind, metrics=metrics, **{field: value})])
    assert rows(ingest(run_dir), f"SELECT attrs ->> '$.{field}' FROM {table}") == [(str(value).replace(" ", ""),)]


def test_staged_lines_have_readable_column_names(run_dir, write_lines, ingest, record) -> None:
    write_lines([record("heartbeat")])
    store = ingest(run_dir)
    columns = [name for name, *_ in store.connection().execute("DESCRIBE staged").fetchall()]
    assert columns[:4] == ["source_id", "line_offset", "rec", "kind_fields"]


@pytest.mark.parametrize("batch_bytes", [2**31, 0], ids=["2 GiB", "zero"])
def test_a_batch_size_line_offsets_cannot_hold_is_refused(run_dir, batch_bytes) -> None:
    with Store.open(None) as store, pytest.raises(ValueError, match="from 1 to 2,147,483,647"):
        Collector(run_dir, store, batch_bytes=batch_bytes)


def append_heartbeats(path: Path, record, stop: threading.Event) -> None:
    """Keep appending heartbeat lines to ``path`` (a line about every millisecond) until ``stop`` is set."""
    with open(path, "ab", buffering=0) as fh:
        seq = 10_000
        while not stop.is_set():
            fh.write(encode_line(record("heartbeat", step=seq, seq=seq)).encode())
            seq += 1
            time.sleep(0.001)


def test_ingest_available_ends_while_a_rank_keeps_writing(run_dir, write_lines, record) -> None:
    path = write_lines([record("heartbeat", step=s, seq=s) for s in range(1000)])
    present = path.stat().st_size
    stop_writing, results = threading.Event(), []
    writer = threading.Thread(target=append_heartbeats, args=(path, record, stop_writing))
    with Store.open(RunLayout(run_dir).store) as store:
        collector = Collector(run_dir, store, batch_bytes=4096)
        ingesting = threading.Thread(target=lambda: results.append(collector.ingest_available()))
        writer.start()
        try:
            ingesting.start()
            ingesting.join(timeout=60)
            ended = not ingesting.is_alive()
        finally:
            stop_writing.set()
            writer.join()
            ingesting.join()
    assert ended, "ingest_available did not return while the rank kept writing"
    assert results[0].bytes >= present and results[0].rejected == 0


def test_stop_ends_ingest_available_between_passes(run_dir, write_lines, record) -> None:
    write_lines([record("heartbeat", step=s, seq=s) for s in range(100)])
    stop = threading.Event()
    with Store.open(RunLayout(run_dir).store) as store:
        collector = Collector(run_dir, store, batch_bytes=1024)
        first = collector.ingest_available(on_pass=lambda result: stop.set(), stop=stop)
        rest = collector.ingest_available()
    assert 0 < first.lines < 100 and first.lines + rest.lines == 100


def test_a_failure_that_is_not_the_lines_fault_commits_nothing_and_the_line_is_read_later(
    run_dir, write_lines, record
) -> None:
    """Out of memory while parsing a valid line: not an 'unreadable record', the pass fails whole."""
    message = "x" * 5_000_000
    write_lines([record("log", message=message)])
    with Store.open(RunLayout(run_dir).store, memory_limit="20MB") as store:  # a store's settings are locked
        with pytest.raises(StoreError, match="nothing of this pass committed: Out of Memory Error"):
            Collector(run_dir, store).ingest_available()
        assert rows(store, "SELECT (SELECT count(*) FROM rejected), (SELECT count(*) FROM ingest_status)") == [(0, 0)]
    with Store.open(RunLayout(run_dir).store) as store:
        Collector(run_dir, store).ingest_available()
        assert rows(store, "SELECT length(message) FROM event_log") == [(len(message),)]


def test_a_store_that_refuses_the_write_is_one_store_error(run_dir, write_lines, record) -> None:
    write_lines([record("heartbeat")])
    Store.open(RunLayout(run_dir).store).close()
    with Store.open(RunLayout(run_dir).store, read_only=True) as store:
        with pytest.raises(StoreError, match=r"nothing of this pass committed: .*read-only"):
            Collector(run_dir, store).ingest_available()


@pytest.mark.parametrize("metrics", ['{"loss":1,"loss":2}', '{"aux":1,"aux":2}'], ids=["canonical", "user metric"])
def test_a_metric_named_twice_is_rejected_not_dropped(two_rank_run, write_lines, ingest, metrics: str) -> None:
    line = '{"kind":"step","time":1700000000.0,"rank":0,"step":1,"timeline":0,"seq":0,"metrics":' + metrics + "}"
    write_lines([line])
    store = ingest(two_rank_run)
    assert rows(store, "SELECT reason FROM rejected") == [("field metrics names a metric more than once",)]
