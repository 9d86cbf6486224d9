"""Format v1 end to end: what RunLogger writes is valid, survives ingestion and reads back in the views."""

from __future__ import annotations

import json
import math
import socket
import time
from pathlib import Path

import jsonschema
import pytest

from bedside.collectors import format as fmt
from bedside.collectors.format import Kind
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.runs import summarize_run
from bedside.collectors.store import Store
from bedside.collectors.writer import RunLogger

VALIDATOR = jsonschema.Draft202012Validator(fmt.schema())
NAN, INF = math.nan, math.inf
HOST = socket.gethostname()


def write_every_kind(run: Path) -> None:
    """A two-rank run in which rank 0 writes every kind, non-finite values included."""
    lead = RunLogger(run, rank=0, world_size=2, local_rank=0, name="round-trip", config={"lr": 0.001})
    other = RunLogger(run, rank=1, world_size=2, local_rank=1)
    lead.step(1, loss=NAN, grad_norm=INF, lr=-INF, tokens=100, flops=1e6, shards=[3, "s7"], my_metric=0.5)
    lead.step(2, loss=2.5, grad_norm=1.0, lr=0.001, tokens=100, flops=1e6)
    lead.rank_step(1, step_time=0.25, comm_time=INF, param_checksum="c0ffee", my_rank_metric=-INF)
    other.rank_step(1, step_time=0.5, param_checksum="c0ffee")
    lead.eval(2, {"heldout_loss": 2.25, "accuracy": NAN}, cum_tokens=200, cum_flops=2e6)
    lead.checkpoint(2, "saved", path="ckpt/2", duration_s=1.5, bytes=1024)
    lead.event(
        Kind.ACTION,
        2,
        action="rewind",
        status="applied",
        request_id="req-1",
        operator="alice",
        reason="loss spike",
        args={"to_step": 1},
    )
    lead.event(Kind.FAULT_INJECTED, 1, fault="nan_loss", target_ranks=[0], args={"p": 1.0})
    lead.log(2, "spike seen", level="warning")
    lead.heartbeat(2)
    other.close()
    lead.close("finished")


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("round-trip") / "run"
    write_every_kind(run)
    return run


@pytest.fixture(scope="module")
def round_trip_store(round_trip: Path):
    with Store.open(RunLayout(round_trip).store) as store:
        result = Collector(round_trip, store).ingest_available()
        assert (result.rejected, result.incidents) == (0, [])
        yield store


def comparable(value):
    """``value`` with NaN replaced by a marker, so that rows holding NaN compare equal."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, (list, tuple)):
        return [comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    return value


def rows(store: Store, query: str) -> list:
    return comparable(store.cursor().execute(query).fetchall())


VIEW_ROWS = {
    "step_metrics": (
        "SELECT step, loss, grad_norm, lr, tokens, flops, spent_tokens, shards, extra FROM step_metrics ORDER BY step",
        [
            (1, NAN, INF, -INF, 100.0, 1e6, 100.0, '[3,"s7"]', {"my_metric": 0.5}),
            (2, 2.5, 1.0, 0.001, 100.0, 1e6, 200.0, None, None),
        ],
    ),
    "rank_step_metrics": (
        "SELECT rank, step, host, local_rank, step_time, comm_time, param_checksum, extra "
        "FROM rank_step_metrics ORDER BY rank",
        [(0, 1, HOST, 0, 0.25, INF, "c0ffee", {"my_rank_metric": -INF}), (1, 1, HOST, 1, 0.5, None, "c0ffee", None)],
    ),
    "eval_scores": (
        "SELECT step, split, name, value, cum_tokens, cum_flops FROM eval_scores ORDER BY name",
        [(2, "heldout", "accuracy", NAN, 200.0, 2e6), (2, "heldout", "heldout_loss", 2.25, 200.0, 2e6)],
    ),
    "checkpoint_events": (
        "SELECT step, rank, event, path, duration_s, bytes FROM checkpoint_events",
        [(2, 0, "saved", "ckpt/2", 1.5, 1024.0)],
    ),
    "action_events": (
        "SELECT step, request_id, action, status, operator, reason, args FROM action_events",
        [(2, "req-1", "rewind", "applied", "alice", "loss spike", '{"to_step":1}')],
    ),
    "event_log": (
        "SELECT rank, kind, level, message FROM event_log ORDER BY ALL",
        [
            (0, "heartbeat", None, None),
            (0, "log", "warning", "spike seen"),
            (0, "rank_info", None, None),
            (0, "run_end", None, "finished"),
            (1, "rank_info", None, None),
            (1, "run_end", None, "finished"),
        ],
    ),
    "fault_labels": (
        "SELECT step, rank, fault, target_ranks, args FROM fault_labels",
        [(1, 0, "nan_loss", "[0]", '{"p":1.0}')],
    ),
    "metrics": (
        "SELECT kind, rank, step, name, value FROM metrics "
        "WHERE name IN ('loss', 'lr', 'my_metric', 'comm_time', 'my_rank_metric', 'eval/accuracy') ORDER BY ALL",
        [
            ("eval", None, 2, "eval/accuracy", NAN),
            ("rank_step", 0, 1, "comm_time", INF),
            ("rank_step", 0, 1, "my_rank_metric", -INF),
            ("step", 0, 1, "loss", NAN),
            ("step", 0, 1, "lr", -INF),
            ("step", 0, 1, "my_metric", 0.5),
            ("step", 0, 2, "loss", 2.5),
            ("step", 0, 2, "lr", 0.001),
        ],
    ),
    "ranks": (
        "SELECT rank, host, local_rank, dp, declared_by FROM ranks ORDER BY rank",
        [(0, HOST, 0, 0, "rank_info"), (1, HOST, 1, 1, "rank_info")],
    ),
    "run": (
        "SELECT name, world_size, last_step, timeline, status, config ->> 'lr' FROM run",
        [("round-trip", 2, 2, 0, "finished", "0.001")],
    ),
}


@pytest.mark.parametrize("view", sorted(VIEW_ROWS))
def test_values_written_by_runlogger_come_back_in_the_views(round_trip_store: Store, view: str) -> None:
    query, expected = VIEW_ROWS[view]
    assert rows(round_trip_store, query) == comparable(expected)


@pytest.mark.parametrize("kind", list(Kind), ids=str)
def test_every_line_runlogger_writes_validates_against_the_schema(round_trip: Path, read_records, kind: Kind) -> None:
    written = [r for path in RunLayout(round_trip).source_files() for r in read_records(path) if r["kind"] == kind]
    assert written, f"the round trip wrote no {kind} record"
    for record in written:
        VALIDATOR.validate(record)


VALID = {"kind": "step", "time": 1.0, "rank": 0, "step": 1, "timeline": 0, "seq": 0, "metrics": {"loss": 1.0}}


def changed(**fields) -> dict:
    """The valid step record with ``fields`` replaced (a value of ... removes the field)."""
    record = {**VALID, **fields}
    return {k: v for k, v in record.items() if v is not ...}


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(changed(kind=...), id="no kind"),
        pytest.param(changed(time=...), id="no time"),
        pytest.param(changed(seq=...), id="no seq"),
        pytest.param(changed(kind=""), id="empty kind"),
        pytest.param(changed(time="yesterday"), id="time a string"),
        pytest.param(changed(rank=-1), id="negative rank"),
        pytest.param(changed(step="x"), id="step a string"),
        pytest.param(changed(step=1.5), id="step a fraction"),
        pytest.param(changed(metrics=[1.0]), id="metrics a list"),
        pytest.param(changed(metrics={"loss": "abc"}), id="loss a word"),
        pytest.param(changed(metrics={"loss": True}), id="loss a boolean"),
        pytest.param(changed(metrics=...), id="step without metrics"),
        pytest.param(changed(kind="eval", metrics={}), id="eval without scores"),
        pytest.param(changed(kind="checkpoint", metrics=..., event="exploded"), id="unknown checkpoint event"),
        pytest.param(
            changed(kind="action", metrics=..., action="rewind", status="applied"), id="action without request_id"
        ),
        pytest.param(changed(kind="run_end", metrics=..., status="done"), id="unknown run_end status"),
        pytest.param(changed(kind="log", metrics=...), id="log without message"),
        pytest.param(changed(kind="rank_info", metrics=...), id="rank_info without host"),
        pytest.param(changed(kind="fault_injected", metrics=..., target_ranks=[0]), id="fault without fault"),
        pytest.param([VALID], id="not an object"),
    ],
)
def test_schema_rejects_invalid_records(record) -> None:
    assert not VALIDATOR.is_valid(record)


def test_schema_accepts_the_valid_base_record_and_non_finite_strings() -> None:
    VALIDATOR.validate(VALID)
    VALIDATOR.validate(changed(metrics={"loss": "NaN", "grad_norm": "Infinity", "lr": "-Infinity", "tokens": None}))


UNKNOWN_THINGS = {
    "unknown field of a step": ("SELECT attrs ->> 'note', loss FROM steps", [("hello", 1.0)]),
    "unknown field of a rank_step": ("SELECT attrs ->> 'zone', step_time FROM rank_steps", [("us-east", 0.1)]),
    "unknown kind": (
        "SELECT kind, payload ->> '$.buckets', payload ->> '$.metrics.x' FROM events WHERE kind = 'grad_histogram'",
        [("grad_histogram", "[1,2,3]", "7")],
    ),
    "user metric of a step": ("SELECT kind, value FROM metrics WHERE name = 'tokens_per_s'", [("step", 123.0)]),
    "user metric of a rank_step": ("SELECT kind, value FROM metrics WHERE name = 'gpu_temp_c'", [("rank_step", 71.5)]),
}


@pytest.mark.parametrize("what", sorted(UNKNOWN_THINGS))
def test_unknown_kinds_fields_and_user_metrics_survive_into_the_store(
    run_dir, write_lines, ingest, record, what
) -> None:
    lines = [
        record("step", metrics={"loss": 1.0, "tokens_per_s": 123.0}, note="hello"),
        record("rank_step", metrics={"step_time": 0.1, "gpu_temp_c": 71.5}, zone="us-east"),
        record("grad_histogram", metrics={"x": 7}, buckets=[1, 2, 3]),
    ]
    for line in lines:
        VALIDATOR.validate(line)
    write_lines(lines)
    query, expected = UNKNOWN_THINGS[what]
    assert rows(ingest(run_dir), query) == comparable(expected)


def log_session(run: Path, step: int) -> None:
    """One RunLogger lifetime on rank 0 (a restart, when the file has records): rank_info, a heartbeat, run_end."""
    with RunLogger(run, rank=0, world_size=1, resume=True) as logger:
        logger.heartbeat(step)


def test_seq_is_the_line_number_and_continues_when_a_logger_reopens_the_file(run_dir, read_records) -> None:
    log_session(run_dir, 1)
    log_session(run_dir, 2)
    records = read_records(RunLayout(run_dir).rank_file(0))
    assert [r["seq"] for r in records] == list(range(6))
    assert [r["kind"] for r in records] == ["rank_info", "heartbeat", "run_end"] * 2


def test_torn_last_line_is_terminated_on_reopen_and_only_that_fragment_is_rejected(run_dir, ingest) -> None:
    log_session(run_dir, 1)
    path = RunLayout(run_dir).rank_file(0)
    torn_at, fragment = path.stat().st_size, '{"kind":"heartbeat","ti'
    with open(path, "a") as fh:
        fh.write(fragment)
    log_session(run_dir, 2)
    store = ingest(run_dir)
    assert rows(store, "SELECT path, line_offset, line FROM rejected") == [
        ["telemetry/rank-00000.jsonl", torn_at, fragment]
    ]
    assert rows(store, "SELECT seq FROM events ORDER BY seq") == [[0], [1], [2], [4], [5], [6]]


RUN_HISTORIES = {
    # rank -> its records in file order: (kind, seconds before now, run_end status); the run's status
    "a rank restarted after failing and steps again": (
        {
            0: [("step", 9, None), ("run_end", 8, "failed"), ("rank_info", 5, None), ("step", 4, None)],
            1: [("step", 4, None)],
        },
        "live",
    ),
    "a rank's latest record is its failure": (
        {0: [("step", 9, None), ("run_end", 5, "failed")], 1: [("step", 4, None)]},
        "failed",
    ),
    "same time: the higher seq is later": (
        {0: [("run_end", 5, "aborted"), ("heartbeat", 5, None)], 1: [("step", 4, None)]},
        "live",
    ),
    "finished, then restarted": (
        {0: [("run_end", 9, "finished"), ("step", 4, None)], 1: [("run_end", 5, "finished")]},
        "live",
    ),
    "every rank's latest record is run_end": (
        {0: [("step", 9, None), ("run_end", 5, "finished")], 1: [("run_end", 5, "finished")]},
        "finished",
    ),
    "one rank of two has ended": ({0: [("run_end", 5, "finished")], 1: [("step", 4, None)]}, "live"),
    "a rank aborted": ({0: [("run_end", 5, "aborted")], 1: [("step", 4, None)]}, "aborted"),
    "failed wins over aborted": ({0: [("run_end", 5, "aborted")], 1: [("run_end", 6, "failed")]}, "failed"),
    "nothing within 120 s": ({0: [("step", 130, None)], 1: [("heartbeat", 125, None)]}, "stalled"),
    "a record within 120 s": ({0: [("step", 300, None)], 1: [("heartbeat", 100, None)]}, "live"),
    "no records": ({}, "empty"),
    "a run_end without a status is rejected, not an end": (
        {0: [("step", 9, None), ("run_end", 5, None)], 1: [("run_end", 5, "finished")]},
        "live",
    ),
    "a run_end of an unknown status is rejected, not an end": (
        {0: [("run_end", 5, "crashed")], 1: [("run_end", 5, "finished")]},
        "live",
    ),
}


def write_history(run: Path, history: dict[int, list[tuple]], record) -> None:
    now = time.time()
    for rank, entries in history.items():
        lines = []
        for seq, (kind, ago, status) in enumerate(entries):
            fields = {"step": {"metrics": {"loss": 1.0}}, "rank_info": {"host": HOST}, "run_end": {"status": status}}
            lines.append(record(kind, time=now - ago, rank=rank, seq=seq, **fields.get(kind, {})))
        path = RunLayout(run).rank_file(rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(fmt.encode_line(line) for line in lines))


def run_status(store: Store) -> str:
    return store.cursor().execute("SELECT status FROM run").fetchall()[0][0]


@pytest.mark.parametrize("history", sorted(RUN_HISTORIES))
def test_the_run_view_and_bedside_runs_give_one_status_for_the_same_records(run_dir, ingest, record, history) -> None:
    """One rule (the run_status macro): a rank has ended only while its run_end is its latest record."""
    ranks, expected = RUN_HISTORIES[history]
    write_history(run_dir, ranks, record)
    write_run_info(RunLayout(run_dir), RunInfo(name="restarts", world_size=2))
    assert (run_status(ingest(run_dir)), summarize_run(run_dir).status) == (expected, expected)


def test_without_run_json_the_world_is_the_rank_files(run_dir, ingest, record) -> None:
    write_history(run_dir, {0: [("step", 9, None), ("run_end", 5, "finished")]}, record)
    notes = RunLayout(run_dir).telemetry / "notes.jsonl"
    notes.write_text(json.dumps(record("heartbeat", time=time.time() - 20)) + "\n")
    store = ingest(run_dir)
    assert store.cursor().execute("SELECT world_size, status FROM run").fetchall() == [(1, "finished")]
    summary = summarize_run(run_dir)
    assert (summary.world_size, summary.status) == (1, "finished")
