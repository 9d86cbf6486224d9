"""Hostile telemetry: files that are not what they claim, run.json values out of range, envelopes that
say two things at once. Each is refused with a reason, and what is already recorded, or valid beside
it, is kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bedside.collectors.batch import MAX_REJECTED_CHARS
from bedside.collectors.format import MAX_LINE_BYTES
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store


def rows(store: Store, query: str) -> list[tuple]:
    return store.cursor().execute(query).fetchall()


def refused(store: Store) -> dict[str, str]:
    """Each refused file's path and reason, as ingest_status shows them."""
    return dict(rows(store, "SELECT path, state_detail FROM ingest_status WHERE state = 'refused'"))


@pytest.fixture
def telemetry(run_dir: Path) -> Path:
    folder = RunLayout(run_dir).telemetry
    folder.mkdir(parents=True)
    return folder


def line(record, **fields) -> bytes:
    return (json.dumps(record("heartbeat", **fields)) + "\n").encode()


# -- files that are not a rank's regular file ---------------------------------------------------------
def test_a_symlinked_rank_file_is_refused_unread(run_dir, telemetry, tmp_path, ingest, record) -> None:
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (telemetry / "rank-00000.jsonl").symlink_to(secret)
    store = ingest(run_dir)
    assert "symbolic link" in refused(store)["telemetry/rank-00000.jsonl"]
    assert rows(store, "SELECT count(*) FROM rejected") == [(0,)]
    assert rows(store, "SELECT state FROM source_incidents") == [("refused",)]


def test_a_fifo_rank_file_is_refused_without_blocking(run_dir, telemetry, ingest, record) -> None:
    os.mkfifo(telemetry / "rank-00001.jsonl")
    (telemetry / "rank-00000.jsonl").write_bytes(line(record))
    store = ingest(run_dir)
    assert "FIFO" in refused(store)["telemetry/rank-00001.jsonl"]
    assert rows(store, "SELECT rank FROM events") == [(0,)]


def test_a_directory_named_like_a_rank_file_is_refused(run_dir, telemetry, ingest, record) -> None:
    (telemetry / "rank-00002.jsonl").mkdir()
    store = ingest(run_dir)
    assert "directory" in refused(store)["telemetry/rank-00002.jsonl"]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("x.jsonl", "not a rank file name"),
        ("rank-1.jsonl", "not a rank file name"),
        ("rank-000005.jsonl", "rank 5's file is rank-00005.jsonl"),
        ("rank-0000a.jsonl", "not a rank file name"),
        ("rank-2147483648.jsonl", "rank 2147483648 is above the largest rank 2147483647"),
    ],
)
def test_a_file_name_outside_the_format_is_refused_and_its_forged_records_ignored(
    run_dir, telemetry, ingest, record, name, why
) -> None:
    (telemetry / "rank-00005.jsonl").write_bytes(line(record, rank=5))
    forged = json.dumps(record("run_end", rank=5, status="failed")) + "\n"
    (telemetry / name).write_text(forged)
    store = ingest(run_dir)
    assert why in refused(store)[f"telemetry/{name}"]
    assert rows(store, "SELECT count(*) FROM events WHERE kind = 'run_end'") == [(0,)]
    assert rows(store, "SELECT rank, kind FROM events") == [(5, "heartbeat")]
    assert rows(store, "SELECT status FROM run") != [("failed",)]


def test_a_file_name_that_is_not_utf8_is_refused_and_every_command_goes_on(run_dir, telemetry, record, bedside) -> None:
    (telemetry / "rank-00000.jsonl").write_bytes(line(record))
    with open(os.fsencode(telemetry) + b"/rank-\xff\xfe.jsonl", "wb") as fh:
        fh.write(line(record))
    query = bedside(
        "query", run_dir, "SELECT path, state, state_detail FROM ingest_status ORDER BY path", "--format", "json"
    )
    assert query.returncode == 0, query.stderr
    assert "Traceback" not in query.stderr
    statuses = {r["path"]: (r["state"], r["state_detail"]) for r in json.loads(query.stdout)}
    assert statuses["telemetry/rank-00000.jsonl"][0] == "ok"
    assert statuses["telemetry/rank-\\xff\\xfe.jsonl"][0] == "refused"
    assert "not valid UTF-8" in statuses["telemetry/rank-\\xff\\xfe.jsonl"][1]
    collect = bedside("collect", run_dir)
    assert collect.returncode == 0, collect.stderr
    assert "Traceback" not in collect.stderr and "not valid UTF-8" in collect.stderr


def test_a_rank_beyond_the_schema_does_not_stop_the_other_runs_of_a_folder(tmp_path, record, bedside) -> None:
    for name, files in (("a", ["rank-00000.jsonl", "rank-2147483648.jsonl"]), ("b", ["rank-00000.jsonl"])):
        folder = RunLayout(tmp_path / "runs" / name).telemetry
        folder.mkdir(parents=True)
        for file in files:
            (folder / file).write_bytes(line(record))
    for name in ("a", "b"):
        result = bedside("collect", tmp_path / "runs" / name)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
    with Store.open(tmp_path / "runs" / "a" / "bedside.duckdb", read_only=True) as store:
        assert rows(store, "SELECT count(*) FROM events") == [(1,)]


# -- lines too long, files replaced, rejected text bounded ---------------------------------------------
def test_a_line_with_no_newline_past_the_maximum_is_rejected_from_its_offset_and_not_reread(
    run_dir, telemetry, ingest, record
) -> None:
    path = telemetry / "rank-00000.jsonl"
    path.write_bytes(line(record) + b'{"kind":"log","message":"' + b"x" * (MAX_LINE_BYTES + 10))
    store = ingest(run_dir)
    offset = len(line(record))
    [(line_offset, reason, text)] = rows(store, "SELECT line_offset, reason, line FROM rejected")
    assert line_offset == offset
    assert f"no newline within {MAX_LINE_BYTES:,} bytes" in reason
    assert len(text) <= MAX_REJECTED_CHARS
    assert rows(store, "SELECT state, committed_offset FROM ingest_status") == [("overlong", offset)]
    with open(path, "ab") as fh:
        fh.write(b'"}\n' + line(record, step=2))
    store = ingest(run_dir)
    assert rows(store, "SELECT count(*) FROM events") == [(1,)]
    assert rows(store, "SELECT count(*) FROM rejected") == [(1,)]


def test_a_file_replaced_by_a_shorter_one_is_reported_as_replaced(run_dir, telemetry, ingest, record) -> None:
    path = telemetry / "rank-00000.jsonl"
    path.write_bytes(line(record, step=1) + line(record, step=2))
    ingest(run_dir)
    fresh = telemetry / "fresh.tmp"
    fresh.write_bytes(line(record, step=9))
    os.replace(fresh, path)
    store = ingest(run_dir)
    assert rows(store, "SELECT state FROM ingest_status") == [("replaced",)]


def test_a_rejected_line_keeps_a_bounded_prefix_and_its_full_length(run_dir, telemetry, ingest, record) -> None:
    bad = b'{"kind":' + b"7" * 100_000 + b"\n"
    (telemetry / "rank-00000.jsonl").write_bytes(bad)
    store = ingest(run_dir)
    [(length, text)] = rows(store, "SELECT length, line FROM rejected")
    assert length == len(bad)
    assert len(text) <= MAX_REJECTED_CHARS


# -- run.json values ----------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", ["3e9", "1e400", "true", "1.5", '"4"', "0"])
def test_a_bad_world_size_is_reported_by_name_and_the_telemetry_ingested(
    run_dir, telemetry, ingest, record, world_size
) -> None:
    RunLayout(run_dir).run_info.write_text(f'{{"name": "hostile", "world_size": {world_size}}}')
    (telemetry / "rank-00000.jsonl").write_bytes(line(record))
    warnings: list[str] = []
    store = ingest(run_dir, warn=warnings.append)
    assert rows(store, "SELECT count(*) FROM events") == [(1,)]
    [(name, size, problems)] = rows(store, "SELECT name, world_size, problems FROM run_info")
    assert (name, size) == ("hostile", None)
    assert len(problems) == 1 and problems[0].startswith("world_size must be an integer from 1 to")
    assert any("run.json: world_size must be an integer" in w for w in warnings)
    assert rows(ingest(run_dir), "SELECT count(*) FROM events") == [(1,)]  # every later pass goes on too


RUN_JSON_ATTACKS = {
    "fifo": (lambda path: os.mkfifo(path), "a FIFO, not a regular file: refused unread"),
    "link to /dev/zero": (lambda path: path.symlink_to("/dev/zero"), "a symbolic link, not a regular file"),
    "nested 100,000 deep": (lambda path: path.write_text("[" * 100_000), "JSON nested deeper than 64 levels"),
    "5,000 digits": (
        lambda path: path.write_text('{"name": "x", "world_size": ' + "9" * 5000 + "}"),
        "a number of 5000 characters, more than 64",
    ),
    "key twice": (lambda path: path.write_text('{"name": "a", "name": "b"}'), "key 'name' is given twice"),
}


@pytest.mark.parametrize("attack", RUN_JSON_ATTACKS.values(), ids=RUN_JSON_ATTACKS.keys())
def test_a_run_json_that_is_no_small_regular_json_file_is_ignored_with_its_reason_and_telemetry_ingested(
    run_dir, telemetry, ingest, record, attack
) -> None:
    """Before, a FIFO blocked collect, a link to /dev/zero read until memory ran out, and deep nesting or a long
    digit run ended in a traceback."""
    plant, reason = attack
    plant(RunLayout(run_dir).run_info)
    (telemetry / "rank-00000.jsonl").write_bytes(line(record))
    warnings: list[str] = []
    store = ingest(run_dir, warn=warnings.append)
    assert rows(store, "SELECT count(*) FROM events") == [(1,)]
    assert any(w.startswith("run.json ignored: ") and reason in w for w in warnings), warnings


def test_a_run_json_with_nan_and_infinity_in_its_config_is_read_as_python_wrote_it(
    run_dir, telemetry, ingest, record
) -> None:
    info = RunInfo(name="nan", world_size=1, config={"lr_floor": float("nan"), "clip": float("inf")})
    write_run_info(RunLayout(run_dir), info)
    (telemetry / "rank-00000.jsonl").write_bytes(line(record))
    warnings: list[str] = []
    store = ingest(run_dir, warn=warnings.append)
    assert rows(store, "SELECT name, world_size FROM run_info") == [("nan", 1)] and warnings == []


def test_a_bad_topology_entry_is_reported_and_the_rest_of_run_json_kept(run_dir, telemetry, ingest, record) -> None:
    write_run_info(RunLayout(run_dir), RunInfo(name="topo", world_size=2))
    info = json.loads(RunLayout(run_dir).run_info.read_text())
    info["topology"] = [{"rank": 0, "host": "a", "dp": 0}, {"rank": 1, "host": "b", "dp": 3e9}]
    RunLayout(run_dir).run_info.write_text(json.dumps(info))
    (telemetry / "rank-00000.jsonl").write_bytes(line(record))
    store = ingest(run_dir)
    [(size, problems)] = rows(store, "SELECT world_size, problems FROM run_info")
    assert size == 2
    assert problems == [
        "topology[1].dp must be an integer from 0 to 2147483647, got 3000000000.0: "
        "the placement of this entry is ignored"
    ]
    assert rows(store, "SELECT rank, host FROM rank_topology") == [(0, "a")]
    assert rows(store, "SELECT count(*) FROM events") == [(1,)]


# -- envelopes that say two things at once, or the wrong type --------------------------------------
ENVELOPE = '"time":1700000000,"step":1,"timeline":0,"seq":0'
STRICT = [
    pytest.param(
        '{"kind":"heartbeat","rank":0,"rank":1,' + ENVELOPE + "}", "field rank appears more than once", id="two ranks"
    ),
    pytest.param(
        '{"kind":"heartbeat","kind":"run_end","status":"failed","rank":0,' + ENVELOPE + "}",
        "field kind appears more than once",
        id="two kinds",
    ),
    pytest.param(
        '{"kind":"step","rank":0,' + ENVELOPE + ',"metrics":{"loss":1},"metrics":{"loss":9}}',
        "field metrics appears more than once",
        id="two metrics",
    ),
    pytest.param('{"kind":5,"rank":0,' + ENVELOPE + "}", "field kind must be a string, got 5", id="kind a number"),
    pytest.param(
        '{"kind":["step"],"rank":0,' + ENVELOPE + "}", 'field kind must be a string, got ["step"]', id="kind a list"
    ),
    pytest.param(
        '{"kind":"' + "k" * 100_000 + '","rank":0,' + ENVELOPE + "}",
        "field kind is 100000 characters long, over the limit of 64",
        id="kind 100 KB",
    ),
    pytest.param(
        '{"kind":"rank_step","rank":0,' + ENVELOPE + ',"metrics":{"step_time":1},"param_checksum":{"a":1}}',
        'field param_checksum must be a string, got {"a":1}',
        id="param_checksum an object",
    ),
    pytest.param(
        '{"kind":"rank_step","rank":0,' + ENVELOPE + ',"metrics":{"step_time":1},"param_checksum":123}',
        "field param_checksum must be a string, got 123",
        id="param_checksum a number",
    ),
    pytest.param(
        '{"kind":"rank_step","rank":0,' + ENVELOPE + ',"metrics":{"step_time":1},"param_checksum":true}',
        "field param_checksum must be a string, got true",
        id="param_checksum a boolean",
    ),
    pytest.param(
        '{"kind":"step","rank":0,' + ENVELOPE + ',"metrics":{"loss":1},"shards":"s1"}',
        'field shards must be an array, got "s1"',
        id="shards a string",
    ),
    pytest.param(
        '{"kind":"heartbeat","rank":0,"time":1700000000,"step":9007199254740993,"timeline":0,"seq":0}',
        "step must be below 2^53 (9007199254740992)",
        id="step beyond 2^53",
    ),
    pytest.param(
        '{"kind":"heartbeat","rank":0,"time":1700000000,"step":1,"timeline":0,"seq":9007199254740992}',
        "seq must be below 2^53 (9007199254740992)",
        id="seq at 2^53",
    ),
    pytest.param(
        '{"kind":"rank_info","rank":0,' + ENVELOPE + ',"host":"a","mesh":{"dp":3e9}}',
        "field mesh.dp must be an integer from 0 to 2147483647, got 3000000000.0",
        id="rank_info dp 3e9",
    ),
    pytest.param(
        '{"kind":"rank_info","rank":0,' + ENVELOPE + ',"host":"a","local_rank":"x"}',
        'field local_rank must be an integer from 0 to 2147483647, got "x"',
        id="rank_info local_rank a word",
    ),
]


@pytest.mark.parametrize(("bad", "reason"), STRICT)
def test_an_envelope_that_is_ambiguous_or_mistyped_is_rejected_with_its_reason(
    run_dir, telemetry, ingest, record, bad, reason
) -> None:
    (telemetry / "rank-00000.jsonl").write_bytes(line(record, step=1) + bad.encode() + b"\n" + line(record, step=3))
    store = ingest(run_dir)
    assert rows(store, "SELECT reason FROM rejected") == [(reason,)]
    assert rows(store, "SELECT step FROM events ORDER BY step") == [(1,), (3,)]
    assert rows(store, "SELECT count(*) FROM steps") + rows(store, "SELECT count(*) FROM rank_steps") == [(0,), (0,)]


def test_a_param_checksum_of_digits_or_braces_is_kept_as_the_string_it_is(run_dir, telemetry, ingest, record) -> None:
    lines = [
        json.dumps(record("rank_step", step=i, metrics={"step_time": 1.0}, param_checksum=digest)) + "\n"
        for i, digest in enumerate(["12345678", "{abc", "-1e5"])
    ]
    (telemetry / "rank-00000.jsonl").write_text("".join(lines))
    store = ingest(run_dir)
    assert rows(store, "SELECT param_checksum FROM rank_steps ORDER BY step") == [("12345678",), ("{abc",), ("-1e5",)]
    assert rows(store, "SELECT count(*) FROM rejected") == [(0,)]


def test_runs_reads_only_canonical_regular_rank_files(run_dir, telemetry, record, bedside) -> None:
    (telemetry / "rank-00000.jsonl").write_bytes(line(record))
    os.mkfifo(telemetry / "rank-00001.jsonl")
    (telemetry / "x.jsonl").write_text(json.dumps(record("run_end", status="failed")) + "\n")
    result = bedside("runs", run_dir, "--format", "json", timeout=60)
    assert result.returncode == 0, result.stderr
    [summary] = json.loads(result.stdout)
    assert summary["status"] != "failed" and summary["rank_files"] == 1
