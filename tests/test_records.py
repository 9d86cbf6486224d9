"""The record dataclasses: the schema's fields exactly, and every one through the collector and back."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bedside.collectors.format import ENVELOPE_FIELDS, Kind, schema
from bedside.collectors.importers import import_jsonl
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.records import (
    KIND_RECORDS,
    Action,
    Checkpoint,
    Envelope,
    Eval,
    Event,
    FaultInjected,
    Heartbeat,
    Log,
    RankInfo,
    RankStep,
    Record,
    RunEnd,
    Step,
    build_record,
    required_fields,
    strict_record,
    to_dict,
    to_line,
)
from bedside.collectors.store import Store

ENVELOPE = {"time": 1_700_000_000.5, "rank": 0, "step": 3, "timeline": 1, "seq": 0}
EXAMPLES: list[Record] = [  # every field of every kind set
    RankInfo(**ENVELOPE, host="node-a", local_rank=0, world_size=1, pid=4242, mesh={"dp": 0, "tp": 0, "pp": 0}),
    Step(
        **ENVELOPE,
        metrics={"loss": 2.5, "grad_norm": "NaN", "lr": 0.001, "tokens": 512, "flops": 1e12, "mine": "-Infinity"},
        shards=[3, "s7"],
    ),
    RankStep(
        **ENVELOPE,
        metrics={
            "step_time": 0.25,
            "data_time": 0.01,
            "compute_time": 0.2,
            "comm_time": 0.03,
            "optimizer_time": 0.01,
            "local_grad_norm": "Infinity",
            "mine": 1.5,
        },
        param_checksum="c0ffee",
    ),
    Eval(**ENVELOPE, metrics={"loss": 2.25, "accuracy": 0.5}, split="val", cum_tokens=1536, cum_flops=3e12),
    Checkpoint(**ENVELOPE, metrics={"duration_s": 1.5, "bytes": 1024}, event="saved", path="ckpt/3", message="written"),
    Action(
        **ENVELOPE,
        action="rewind",
        status="applied",
        request_id="req-1",
        operator="alice",
        reason="loss spike",
        message="rewound",
        args={"to_step": 1},
    ),
    Heartbeat(**ENVELOPE, control=True),
    Log(**ENVELOPE, message="spike seen", level="warning"),
    FaultInjected(**ENVELOPE, fault="nan_loss", target_ranks=[0], args={"p": 1.0}),
    Event(**ENVELOPE, kind="custom_probe", metrics={"value": 1.0}, fields={"note": "a kind unknown to v1"}),
    RunEnd(**{**ENVELOPE, "step": 4}, status="finished", message="done"),
]
TABLES = {
    Kind.STEP: "steps",
    Kind.RANK_STEP: "rank_steps",
    Kind.EVAL: "evals",
    Kind.CHECKPOINT: "checkpoints",
    Kind.ACTION: "actions",
    Kind.FAULT_INJECTED: "faults",
}
"""Where the collector puts each kind; every other kind goes to events, the whole line as its payload."""
METRIC_MAPS = ("extra", "scores")
"""Columns holding the metrics that have no column of their own."""


def kind_schema(kind: str) -> dict:
    return schema()["$defs"].get(kind, {})


@pytest.mark.parametrize("kind", list(Kind), ids=str)
def test_a_kinds_record_class_has_the_schemas_fields_and_requires_what_it_requires(kind: Kind) -> None:
    cls = KIND_RECORDS[kind]
    spec = schema()
    assert {"kind", *(f.name for f in dataclasses.fields(cls))} == {
        *spec["properties"],
        *kind_schema(kind).get("properties", {}),
    }
    assert {"kind", *required_fields(cls)} == {*spec["required"], *kind_schema(kind).get("required", [])}


def test_the_envelope_dataclass_is_the_formats_envelope() -> None:
    assert ("kind", *(f.name for f in dataclasses.fields(Envelope) if f.name != "metrics")) == ENVELOPE_FIELDS


def test_every_kind_the_schema_defines_has_a_record_class_and_every_class_a_kind() -> None:
    defined = {rule["if"]["properties"]["kind"]["const"] for rule in schema()["allOf"]}
    assert defined <= set(KIND_RECORDS) == set(Kind) == {type(r).kind for r in EXAMPLES if type(r) is not Event}


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Store:
    """EXAMPLES written as lines, imported (the importer copies bedside records) and ingested."""
    folder = tmp_path_factory.mktemp("records")
    source = folder / "records.jsonl"
    source.write_text("".join(to_line(r) for r in EXAMPLES))
    import_jsonl(source, folder / "run")
    store = Store.open(RunLayout(folder / "run").store)
    result = Collector(folder / "run", store).ingest_available()
    assert (result.rejected, result.incidents) == (0, [])
    yield store
    store.close()


def stored_row(store: Store, record: Record) -> dict:
    """The one row ``record`` became, by column name (JSON columns parsed)."""
    if record.kind in TABLES:
        cursor = store.cursor().execute(f"SELECT * FROM {TABLES[record.kind]}")
    else:
        cursor = store.cursor().execute("SELECT * FROM events WHERE kind = ?", [str(record.kind)])
    names = [column[0] for column in cursor.description]
    (row,) = cursor.fetchall()
    return {
        name: json.loads(value) if name in ("payload", "attrs", "shards", "args", "target_ranks") and value else value
        for name, value in zip(names, row)
    }


def set_fields(record: Record) -> dict:
    """The fields ``record`` sets (an Event's own included), from the dataclass, but ``kind`` and ``seq``
    (which the importer numbers by line)."""
    values = dataclasses.asdict(record)
    values.update(values.pop("fields", {}))
    return {name: value for name, value in values.items() if value is not None and name not in ("kind", "seq")}


def read_back(row: dict, record: Record) -> dict:
    """The fields ``record`` sets, as the collector stored them: from their columns, else from the stored line."""
    line = row.get("payload") or {}
    fields = {name: row[name] if name in row else line.get(name) for name in set_fields(record) if name != "metrics"}
    if record.metrics is not None:
        maps = {k: v for column in METRIC_MAPS if row.get(column) for k, v in row[column].items()}
        fields["metrics"] = {
            name: row[name] if name in row else maps.get(name, line.get("metrics", {}).get(name))
            for name in record.metrics
        }
    return fields


def json_value(value):
    """A value as the line carries it: the non-finite floats the store reads back as the format's strings."""
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return value


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: str(r.kind))
def test_every_record_comes_back_from_the_store_as_written(imported: Store, record: Record) -> None:
    assert json_value(read_back(stored_row(imported, record), record)) == set_fields(record)


def test_fields_that_do_not_fit_a_kind_make_an_event_kept_as_given() -> None:
    assert type(build_record(Kind.LOG, {"message": "hi"}, **ENVELOPE)) is Log
    unknown_field = build_record(Kind.LOG, {"message": "hi", "color": "red"}, **ENVELOPE)
    missing_field = build_record(Kind.RUN_END, {"message": "bye"}, **ENVELOPE)
    assert (type(unknown_field), type(missing_field)) == (Event, Event)
    assert to_dict(unknown_field) == {"kind": "log", **ENVELOPE, "message": "hi", "color": "red"}


def test_our_own_writers_build_a_kinds_record_strictly() -> None:
    from bedside.app.simulation.write import RankLines

    with pytest.raises(ValueError, match=r"unknown \['shardz'\], missing \[\]"):
        strict_record(Kind.STEP, {"shardz": [1]}, {"loss": 1.0}, **ENVELOPE)
    with pytest.raises(ValueError, match=r"unknown \[\], missing \['status'\]"):
        strict_record(Kind.RUN_END, {"message": "bye"}, **ENVELOPE)
    with pytest.raises(ValueError, match="no record kind"):
        strict_record("custom_probe", {}, **ENVELOPE)
    lines = RankLines(0)
    with pytest.raises(ValueError, match="shardz"):
        lines.record(Kind.STEP, 1.0, 1, {"metrics": {"loss": 1.0}, "shardz": [1]})
    lines.record(Kind.STEP, 1.0, 1, {"metrics": {"loss": 1.0}, "shards": [1]})
    assert json.loads(lines.text())["shards"] == [1]


def test_a_line_leaves_out_what_is_none_and_puts_the_envelope_first() -> None:
    line = to_line(Checkpoint(**ENVELOPE, event="saved", metrics={"bytes": 1}))
    assert line == (
        '{"kind":"checkpoint","time":1700000000.5,"rank":0,"step":3,"timeline":1,"seq":0,'
        '"metrics":{"bytes":1},"event":"saved"}\n'
    )
    assert list(json.loads(line))[: len(ENVELOPE_FIELDS)] == list(ENVELOPE_FIELDS)


def test_the_simulators_templated_lines_are_the_lines_of_its_records() -> None:
    from bedside.app.simulation.write import CHECKSUM, HEARTBEAT, RANK_STEP

    where = {"time": 1_700_000_000.25, "rank": 3, "step": 7, "timeline": 0, "seq": 12}
    phases = {"step_time": 0.5, "data_time": 0.01, "compute_time": 0.4, "comm_time": 0.05, "optimizer_time": 0.04}
    placed = (where["time"], where["rank"], where["step"], where["seq"])  # the templates' timeline is 0
    rank_step = RANK_STEP % (*placed, *phases.values(), '"NaN"', CHECKSUM % 0xC0FFEE)
    assert json.loads(rank_step) == to_dict(
        RankStep(**where, metrics={**phases, "local_grad_norm": "NaN"}, param_checksum="0000000000c0ffee")
    )
    heartbeat = HEARTBEAT % placed
    assert json.loads(heartbeat) == to_dict(Heartbeat(**where))
