"""Property tests of the collector against hostile input: lines, file names and run.json.

Each property ingests what hypothesis makes with the real collector into a real store and checks that
nothing crashes, every line is accepted once or rejected once with a reason, an accepted line says in the
store what Python's own JSON reader reads from it, and only canonical rank files are read. The CI size is
small; BEDSIDE_FUZZ_EXAMPLES sets the examples per property for a longer run (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bedside.collectors.errors import RunInfoError
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout, name_problem, rank_file_name
from bedside.collectors.runinfo import read_run_info
from bedside.collectors.store import Store

CI_EXAMPLES = 25
EXAMPLES = int(os.environ.get("BEDSIDE_FUZZ_EXAMPLES") or 0) or CI_EXAMPLES  # 0 or unset: CI's size
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ENVELOPE = ("kind", "time", "rank", "step", "timeline", "seq")
ROWS = " UNION ALL ".join(
    f"SELECT line_offset, {kind} AS kind, rank, step, timeline, seq, time FROM {table}"
    for table, kind in (
        ("steps", "'step'"),
        ("rank_steps", "'rank_step'"),
        ("evals", "'eval'"),
        ("checkpoints", "'checkpoint'"),
        ("actions", "'action'"),
        ("faults", "'fault_injected'"),
        ("events", "kind"),
    )
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def valid_records(draw) -> dict[str, Any]:
    """A record of rank 0 that the format accepts."""
    envelope = {
        "time": draw(st.floats(0, 1e10)),
        "rank": 0,
        "step": draw(st.integers(0, 2**53 - 1)),
        "timeline": draw(st.integers(0, 2**31 - 1)),
        "seq": draw(st.integers(0, 2**53 - 1)),
    }
    body = draw(
        st.sampled_from(
            [
                {"kind": "heartbeat"},
                {"kind": "step", "metrics": {"loss": 1.5, "lr": 0.1}},
                {"kind": "rank_step", "metrics": {"step_time": 0.2}, "param_checksum": "ab12"},
                {"kind": "log", "level": "info", "message": draw(st.text(max_size=30))},
                {"kind": draw(st.text("abcxyz_", min_size=1, max_size=12))},
            ]
        )
    )
    return {**body, **envelope}


@st.composite
def hostile_lines(draw) -> bytes:
    """A line made from a valid record by one hostile change, or bytes of any kind."""
    record = draw(valid_records())
    change = draw(st.sampled_from(["set", "drop", "repeat", "bytes", "cut", "none"]))
    if change == "bytes":
        return draw(st.binary(max_size=60)).replace(b"\n", b" ")
    if change == "set":
        record[draw(st.sampled_from([*ENVELOPE, "metrics", "param_checksum", "shards"]))] = draw(json_values)
    if change == "drop":
        record.pop(draw(st.sampled_from(ENVELOPE)))
    text = json.dumps(record)
    if change == "repeat":
        name = draw(st.sampled_from([*ENVELOPE, "metrics"]))
        text = "{" + json.dumps(name) + ":" + json.dumps(draw(json_values)) + "," + text[1:]
    if change == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode()


@contextmanager
def scratch_run() -> Iterator[RunLayout]:
    with tempfile.TemporaryDirectory() as folder:
        layout = RunLayout(Path(folder) / "run")
        layout.telemetry.mkdir(parents=True)
        yield layout


def python_reading(line: bytes) -> dict[str, Any] | None:
    """The line as Python's json module reads it, or None when it is no JSON object."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def as_number(value: Any) -> float | None:
    """A value as the format reads an envelope number (telemetry-format.md "Numbers"): a number, a numeric
    string, a boolean as 1 or 0; None for anything else."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str) and value.strip() == value and "_" not in value:
        try:
            return float(value)
        except ValueError:
            return None
    return None


def agrees(stored: tuple, record: dict[str, Any]) -> bool:
    """True when the stored row says what Python reads from the line: the same kind and envelope numbers."""
    kind, *numbers = stored
    read = [as_number(record.get(name)) for name in ("rank", "step", "timeline", "seq", "time")]
    return record.get("kind") == kind and read == [float(n) for n in numbers]


@FUZZ
@given(good=st.lists(valid_records(), max_size=5), bad=st.lists(hostile_lines(), max_size=25), seed=st.randoms())
def test_every_fuzzed_line_is_accepted_as_python_reads_it_or_rejected_with_a_reason(good, bad, seed) -> None:
    lines = [json.dumps(r).encode() for r in good] + bad
    seed.shuffle(lines)
    with scratch_run() as layout, Store.open(None) as store:
        layout.rank_file(0).write_bytes(b"".join(line + b"\n" for line in lines))
        Collector(layout.root, store).ingest_available()
        cursor = store.cursor()
        accepted = {r[0]: r[1:] for r in cursor.execute(ROWS).fetchall()}
        rejected = dict(cursor.execute("SELECT line_offset, reason FROM rejected").fetchall())
    offset = 0
    for line in lines:
        assert (offset in accepted) != (offset in rejected), line
        if offset in accepted:
            record = python_reading(line)
            assert record is not None and agrees(accepted[offset], record), (line, accepted[offset])
        else:
            assert rejected[offset], line
        if line in {json.dumps(r).encode() for r in good}:
            assert offset in accepted, (line, rejected.get(offset))
        offset += len(line) + 1


file_names = st.one_of(
    st.integers(0, 2**32).map(rank_file_name),
    st.from_regex(r"rank-[0-9]{1,12}\.jsonl", fullmatch=True),
    st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=20).map(
        lambda t: t + ".jsonl"
    ),
    st.binary(min_size=1, max_size=12).map(lambda b: b.replace(b"/", b"_").replace(b"\x00", b"_") + b".jsonl"),
)


@FUZZ
@given(names=st.lists(file_names, min_size=1, max_size=8, unique=True))
def test_only_canonical_rank_files_are_read_and_every_other_name_is_refused(names) -> None:
    with scratch_run() as layout, Store.open(None) as store:
        folder = os.fsencode(layout.telemetry)
        created = []
        for name in names:
            raw = name if isinstance(name, bytes) else os.fsencode(name)
            if raw in (b".jsonl", b"..jsonl") or raw in {os.fsencode(c) for c in created}:
                continue
            rank = 0
            with open(folder + b"/" + raw, "wb") as fh:
                fh.write(
                    json.dumps(
                        {"kind": "heartbeat", "time": 1, "rank": rank, "step": 1, "timeline": 0, "seq": 0}
                    ).encode()
                    + b"\n"
                )
            created.append(os.fsdecode(raw))
        result = Collector(layout.root, store).ingest_available()
        states = dict(store.cursor().execute("SELECT path, state FROM ingest_status").fetchall())
    assert len(states) == len(created)
    for name in created:
        key = layout.relative(layout.telemetry / name)
        assert states[key] == ("ok" if name_problem(name) is None else "refused"), name
    assert result.lines == sum(name == rank_file_name(0) for name in created)


run_json_values = st.dictionaries(
    st.sampled_from(["run_id", "name", "created", "schema_version", "world_size", "topology", "config", "mesh"]),
    json_values
    | st.lists(
        st.dictionaries(st.sampled_from(["rank", "host", "local_rank", "dp", "tp", "pp"]), json_values, max_size=6),
        max_size=3,
    ),
)


@FUZZ
@given(content=run_json_values | json_values)
def test_any_run_json_is_read_or_refused_with_a_reason_and_the_telemetry_ingested(content) -> None:
    with scratch_run() as layout, Store.open(None) as store:
        layout.run_info.write_text(json.dumps(content))
        layout.rank_file(0).write_text(
            json.dumps({"kind": "heartbeat", "time": 1, "rank": 0, "step": 1, "timeline": 0, "seq": 0}) + "\n"
        )
        try:
            info = read_run_info(layout)
            assert info is not None
        except RunInfoError as error:
            assert not isinstance(content, dict), error
        warnings: list[str] = []
        Collector(layout.root, store, warn=warnings.append).ingest_available()
        [(ingested,)] = store.cursor().execute("SELECT count(*) FROM events").fetchall()
    assert ingested == 1, (content, warnings)  # rank 0 is below any world size run.json may hold
