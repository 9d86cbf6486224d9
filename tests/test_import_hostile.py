"""Hostile input to every importer is refused with a named error, in linear time, and leaves nothing written.

Each case is a breakage found by an attacker, rebuilt here with the real writers (torch's SummaryWriter, the real
``wandb`` offline, pyarrow, pandas): TensorBoard tensors that hold no real number, W&B records that are no protobuf
or hold JSON nested 100,000 deep, Parquet that decompresses to millions of rows, CSV and JSONL with bytes that
are not UTF-8 or numbers past any range, Megatron lines that made a pattern backtrack, FIFOs that made an import
wait forever. Every refusal is a ``BedsideError`` (``ImportFormatError`` or ``BoundedInputError``) naming the
file, the line or record and the field. The mutation fuzz at the end starts from files each writer produced and
checks that no damage ends in anything but a ``BedsideError``; BEDSIDE_FUZZ_EXAMPLES sizes it for a longer run.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_import_megatron import write_log
from test_import_tensorboard import write_ranked
from test_import_wandb import LOG_RUNS

from bedside.collectors.bounded import MAX_CELL_CHARS, BoundedInputError
from bedside.collectors.errors import BedsideError, ImportFormatError
from bedside.collectors.importers import import_csv, import_jsonl, import_megatron, import_tensorboard, import_wandb
from bedside.collectors.importers.wandb_import import MAX_PARQUET_ROWS
from bedside.collectors.importers.wandb_records import BLOCK_BYTES, CHUNK, FIRST, FULL, LAST, MIDDLE, read_wandb_records

CI_EXAMPLES = 30
EXAMPLES = int(os.environ.get("BEDSIDE_FUZZ_EXAMPLES") or 0) or CI_EXAMPLES  # 0 or unset: CI's size
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def left_nothing(folder: Path, out: Path) -> None:
    """Neither the destination nor a staging folder beside it exists."""
    assert not out.exists(), sorted(out.rglob("*"))
    assert not [p for p in folder.iterdir() if ".importing-" in p.name]


# -- TensorBoard --------------------------------------------------------------
def scalar_tensor_logdir(folder: Path, tensor: object) -> Path:
    """A log dir written by torch's SummaryWriter: a loss, and at step 1 the scalars plugin's tensor ``x``."""
    from tensorboard.compat.proto import summary_pb2
    from torch.utils.tensorboard import SummaryWriter

    plugin = summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    value = summary_pb2.Summary.Value(tag="x", metadata=summary_pb2.SummaryMetadata(plugin_data=plugin), tensor=tensor)
    with SummaryWriter(str(folder / "logs")) as writer:
        writer.add_scalar("loss", 1.0, 0)
        writer.file_writer.add_summary(summary_pb2.Summary(value=[value]), 1)
    return folder / "logs"


def tensor(dtype: str, **fields: object) -> object:
    from tensorboard.compat.proto import tensor_pb2, types_pb2

    return tensor_pb2.TensorProto(dtype=types_pb2.DataType.Value(dtype), **fields)


NOT_NUMBERS = {
    "string": (("DT_STRING", {"string_val": [b"abc"]}), "a scalar tensor of DT_STRING"),
    "invalid": (("DT_INVALID", {}), "a scalar tensor of DT_INVALID"),
    "resource": (("DT_RESOURCE", {}), "a scalar tensor of DT_RESOURCE"),
    "variant": (("DT_VARIANT", {}), "a scalar tensor of DT_VARIANT"),
    "complex": (("DT_COMPLEX64", {"scomplex_val": [1.0, 2.0]}), "a scalar tensor of DT_COMPLEX64"),
    "short content": (("DT_FLOAT", {"tensor_content": b"\0\0\0"}), "a DT_FLOAT scalar tensor of 3 packed bytes"),
    "no value": (("DT_DOUBLE", {}), "a DT_DOUBLE scalar tensor of 0 values"),
}


@pytest.mark.parametrize("case", NOT_NUMBERS.values(), ids=NOT_NUMBERS)
def test_a_scalar_tensor_that_holds_no_real_number_is_named_and_can_be_left_out(tmp_path, case):
    (dtype, fields), said = case
    logdir = scalar_tensor_logdir(tmp_path, tensor(dtype, **fields))
    pattern = rf"tfevents\S*, record \d+: x at step 1 is {re.escape(said)}.*not a number; leave it out with --map 'x='"
    with pytest.raises(ImportFormatError, match=pattern):
        import_tensorboard(logdir, tmp_path / "run")
    left_nothing(tmp_path, tmp_path / "run")
    (summary,) = import_tensorboard(logdir, tmp_path / "run", names={"x": ""})
    assert summary.steps == 1 and summary.warnings == ("left out as mapped: x",)


@pytest.mark.parametrize(
    ("dtype", "fields", "value"),
    [
        ("DT_BFLOAT16", {"half_val": [0x3FC0]}, 1.5),  # the high half of float32 1.5
        ("DT_BFLOAT16", {"tensor_content": struct.pack("<H", 0x3FC0)}, 1.5),
        ("DT_HALF", {"half_val": [0x3E00]}, 1.5),
        ("DT_UINT64", {"uint64_val": [2**64 - 1]}, float(2**64 - 1)),
        ("DT_INT8", {"int_val": [-7]}, -7.0),
        ("DT_FLOAT", {"tensor_content": struct.pack("<f", 0.25)}, 0.25),
    ],
)
def test_every_real_scalar_tensor_dtype_is_read(tmp_path, dtype, fields, value):
    logdir = scalar_tensor_logdir(tmp_path, tensor(dtype, **fields))
    import_tensorboard(logdir, tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run/telemetry/rank-00000.jsonl").read_text().splitlines()]
    assert [r["metrics"]["x"] for r in lines if r["kind"] == "step" and r["step"] == 1] == [value]


# -- W&B offline ----------------------------------------------------------------
def framed_wandb(records: list[bytes]) -> bytes:
    """A ``.wandb`` file of ``records``: the LevelDB log framing wandb writes (``wandb_records.py``)."""
    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))
    for record in records:
        rest, first = memoryview(record), True
        while True:
            left = BLOCK_BYTES - len(out) % BLOCK_BYTES
            if left < CHUNK.size:
                out += bytes(left)
                continue
            part, rest = rest[: left - CHUNK.size], rest[left - CHUNK.size :]
            kind = (FULL if not rest else FIRST) if first else (LAST if not rest else MIDDLE)
            out += CHUNK.pack(zlib.crc32(part, zlib.crc32(bytes([kind]))), len(part), kind) + part
            first = False
            if not rest:
                break
    return bytes(out)


@pytest.fixture(scope="module")
def wandb_records(tmp_path_factory) -> list[bytes]:
    """The records of a run logged by the real wandb, offline: 5 steps of two runs' first."""
    root = tmp_path_factory.mktemp("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    env |= {"WANDB_CONFIG_DIR": str(root / "config"), "WANDB_CACHE_DIR": str(root / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", LOG_RUNS, str(root), "5", "2"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    run_file = sorted((root / "wandb").glob("offline-run-*/run-*.wandb"))[0]
    framed = read_wandb_records(run_file.read_bytes(), str(run_file))
    assert not isinstance(framed, str) and framed.records
    return framed.records


def history_record(items: dict[str, str], step: int = 5) -> bytes:
    """A history record as wandb writes one: ``value_json`` per key, ``.`` in a key nesting it."""
    from wandb.proto.wandb_internal_pb2 import HistoryItem, HistoryRecord, Record

    listed = [HistoryItem(nested_key=key.split("."), value_json=value) for key, value in items.items()]
    history = HistoryRecord(item=[HistoryItem(key="_step", value_json=str(step)), *listed])
    return Record(history=history).SerializeToString()


HOSTILE_RECORDS = {  # bytes, or the history items of a record built in the test (wandb's protobuf is 4 s to import)
    "not protobuf": (b"\xff\xff\xff\xff", ImportFormatError, r"record \d+: not a W&B record"),
    "deep value": (
        {"train/loss": "[" * 100_000 + "]" * 100_000},
        BoundedInputError,
        r"record \d+, train/loss: JSON nested deeper than 64 levels",
    ),
    "5,000 digits": (
        {"train/loss": "9" * 5000},
        BoundedInputError,
        r"record \d+, train/loss: a number of 5000 characters",
    ),
    "10^400 time": (
        {"_timestamp": "1" + "0" * 400, "train/loss": "1.0"},
        BoundedInputError,
        r"record \d+, _timestamp: a number of 401 characters",
    ),
    "1e400 time": (
        {"_timestamp": "1e400", "train/loss": "1.0"},
        BoundedInputError,
        r"record \d+, _timestamp: the number 1e400 is out of range",
    ),
    "key under a scalar": (
        {"gpu": "1.0", "gpu.util": "0.5"},
        ImportFormatError,
        r"record \d+: gpu\.util is nested under gpu, a value",
    ),
}


@pytest.mark.parametrize("case", HOSTILE_RECORDS.values(), ids=HOSTILE_RECORDS)
def test_a_hostile_wandb_record_is_named(tmp_path, wandb_records, case):
    record, error, message = case
    record = record if isinstance(record, bytes) else history_record(record)
    (tmp_path / "run-x.wandb").write_bytes(framed_wandb([*wandb_records, record]))
    with pytest.raises(error, match=rf"run-x\.wandb, {message}"):
        import_wandb(tmp_path / "run-x.wandb", tmp_path / "run")
    left_nothing(tmp_path, tmp_path / "run")


def test_a_32_mb_wandb_record_is_reassembled_in_linear_time(tmp_path):
    """Joining a record's chunks one by one copied it again for each chunk: 32 MB took 31.8 s."""
    data = framed_wandb([b"x" * (32 << 20)])
    started = time.perf_counter()
    framed = read_wandb_records(data, "big")
    elapsed = time.perf_counter() - started
    assert not isinstance(framed, str) and len(framed.records[0]) == 32 << 20
    assert elapsed < 3.0, f"{elapsed:.1f} s"


# -- W&B Parquet ----------------------------------------------------------------
def test_a_parquet_history_of_millions_of_rows_is_refused_from_its_metadata(tmp_path):
    """45 KB of Parquet that decompressed to 5,000,000 rows took 118 s and 3.1 GiB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 5_000_000
    table = pa.table({"_step": pa.repeat(7, rows), "train/loss": pa.repeat(1.0, rows)})
    pq.write_table(table, tmp_path / "h.parquet", compression="zstd")
    assert (tmp_path / "h.parquet").stat().st_size < 1 << 20
    started = time.perf_counter()
    with pytest.raises(BoundedInputError, match=rf"h\.parquet: {rows} rows, more than {MAX_PARQUET_ROWS}"):
        import_wandb(tmp_path / "h.parquet", tmp_path / "run")
    assert time.perf_counter() - started < 2.0
    left_nothing(tmp_path, tmp_path / "run")


def test_bytes_that_are_no_parquet_are_named(tmp_path):
    (tmp_path / "h.parquet").write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    with pytest.raises(ImportFormatError, match=r"h\.parquet: not a Parquet file"):
        import_wandb(tmp_path / "h.parquet", tmp_path / "run")


# -- CSV and JSONL, ours and W&B's ----------------------------------------------------
TEXT_IMPORTS: dict[str, tuple[Callable[[Path, Path], object], str, str]] = {
    # importer, file name, a good file it reads
    "csv": (import_csv, "m.csv", "step,loss\n0,2.5\n1,2.4\n"),
    "jsonl": (import_jsonl, "m.jsonl", '{"step": 0, "loss": 2.5}\n{"step": 1, "loss": 2.4}\n'),
    "wandb csv": (import_wandb, "export.csv", "Step,a - loss\n0,2.5\n1,2.4\n"),
    "wandb jsonl": (import_wandb, "h.jsonl", '{"_step": 0, "loss": 2.5}\n{"_step": 1, "loss": 2.4}\n'),
}


def hostile_text(kind: str, cell: str, *, time: bool = False) -> str:
    """The good file of ``kind`` whose second row's loss (or time, for ours) is ``cell``, written raw."""
    if kind == "csv":
        return f"step,time,loss\n0,1.0,2.5\n1,{cell},2.4\n" if time else f"step,loss\n0,2.5\n1,{cell}\n"
    if kind == "wandb csv":
        return f"Step,a - loss\n0,2.5\n1,{cell}\n"
    step = "_step" if kind == "wandb jsonl" else "step"
    field = ("_timestamp" if kind == "wandb jsonl" else "time") if time else "loss"
    rest = ', "loss": 2.4' if time else ""
    return f'{{"{step}": 0, "loss": 2.5}}\n{{"{step}": 1, "{field}": {cell}{rest}}}\n'


HOSTILE_TEXT = {
    "5,000 digits": ("9" * 5000, False, BoundedInputError, "5000 characters"),
    "time 10^400": ("1" + "0" * 400, True, BoundedInputError, "401 characters"),
    "time 1e400": ("1e400", True, BoundedInputError, "out of range"),
}


@pytest.mark.parametrize("kind", TEXT_IMPORTS)
@pytest.mark.parametrize("case", HOSTILE_TEXT.values(), ids=HOSTILE_TEXT)
def test_a_number_past_any_range_is_named_with_its_line(tmp_path, kind, case):
    cell, is_time, error, said = case
    if is_time and kind == "wandb csv":
        pytest.skip("a W&B CSV export has no time column")
    importer, name, _ = TEXT_IMPORTS[kind]
    (tmp_path / name).write_text(hostile_text(kind, cell, time=is_time))
    line = 3 if kind.endswith("csv") else 2  # a CSV file's header is line 1
    with pytest.raises(error, match=rf"{re.escape(name)}, line {line}\b.*{said}"):
        importer(tmp_path / name, tmp_path / "run")
    left_nothing(tmp_path, tmp_path / "run")


@pytest.mark.parametrize("kind", TEXT_IMPORTS)
def test_bytes_that_are_not_utf8_are_named_with_their_line(tmp_path, kind):
    importer, name, good = TEXT_IMPORTS[kind]
    (tmp_path / name).write_bytes(good.encode() + b"2,\xff\xfe\n")
    line = 4 if kind.endswith("csv") else 3
    with pytest.raises(ImportFormatError, match=rf"{re.escape(name)}, line {line}: not UTF-8"):
        importer(tmp_path / name, tmp_path / "run")
    left_nothing(tmp_path, tmp_path / "run")


@pytest.mark.parametrize("kind", ["csv", "wandb csv"])
@pytest.mark.parametrize("size", [MAX_CELL_CHARS + 1, 128 << 10, 1 << 20])
def test_a_huge_csv_cell_is_named(tmp_path, kind, size):
    """The csv module's own field limit (128 KiB) ended in its traceback; a cell past MAX_CELL_CHARS is refused."""
    importer, name, _ = TEXT_IMPORTS[kind]
    (tmp_path / name).write_text(hostile_text(kind, '"' + "x" * size + '"'))
    with pytest.raises(BedsideError, match=rf"{re.escape(name)}, line 3"):
        importer(tmp_path / name, tmp_path / "run")


@pytest.mark.parametrize("kind", ["jsonl", "wandb jsonl"])
def test_deep_json_a_key_given_twice_and_a_huge_name_are_named(tmp_path, kind):
    importer, name, good = TEXT_IMPORTS[kind]
    (tmp_path / name).write_text(good + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(BoundedInputError, match=rf"{re.escape(name)}, line 3: JSON nested deeper than 64"):
        importer(tmp_path / name, tmp_path / "run")
    step = "_step" if kind == "wandb jsonl" else "step"
    (tmp_path / name).write_text(good + f'{{"{step}": 2, "loss": 1.0, "loss": 9.0}}\n')
    with pytest.raises(BoundedInputError, match=rf"{re.escape(name)}, line 3: key 'loss' is given twice"):
        importer(tmp_path / name, tmp_path / "run")
    (tmp_path / name).write_text(good + json.dumps({step: 2, "n" * (128 << 10): 1.0}) + "\n")
    with pytest.raises(BoundedInputError, match=rf"{re.escape(name)}, line 3: a metric name of {128 << 10} char"):
        importer(tmp_path / name, tmp_path / "run")


def test_a_rank_past_any_world_fails_before_anything_is_written(tmp_path):
    """Rank 10^299 failed after run.json and rank-00000.jsonl were written."""
    (tmp_path / "m.csv").write_text(f"step,rank,step_time\n0,0,0.5\n0,1{'0' * 299},0.5\n")
    with pytest.raises(BoundedInputError, match=r"m\.csv, line 3: rank"):
        import_csv(tmp_path / "m.csv", tmp_path / "runs" / "run")
    left_nothing(tmp_path, tmp_path / "runs")


def test_a_failure_in_a_later_run_leaves_no_earlier_run_written(tmp_path):
    """A W&B export of two runs, the second with eval spending and no eval score: neither run is written."""
    (tmp_path / "export.csv").write_text("Step,a - loss,b - eval/cum_tokens\n0,2.5,\n1,2.4,100\n")
    with pytest.raises(ImportFormatError, match="eval/cum_tokens without any eval score"):
        import_wandb(tmp_path / "export.csv", tmp_path / "runs")
    left_nothing(tmp_path, tmp_path / "runs")


def test_an_import_into_an_existing_empty_folder_lands_there(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "m.csv").write_text(TEXT_IMPORTS["csv"][2])
    summary = import_csv(tmp_path / "m.csv", tmp_path / "run")
    assert summary.out == tmp_path / "run" and (tmp_path / "run" / "run.json").is_file()
    assert json.loads((tmp_path / "run" / "run.json").read_text())["name"] == "run"
    assert [p.name for p in tmp_path.iterdir() if ".importing-" in p.name] == []


def finishes_within(seconds: float, action: Callable[[], object], fifo: Path | None = None) -> BaseException | None:
    """What ``action`` raised (None if nothing) when it ends within ``seconds``; fails the test otherwise, after
    opening ``fifo`` for writing so that a reader blocked on it is let go."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            action()
            raised.append(None)
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive() and fifo is not None:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
    assert raised, f"still running after {seconds} s"
    return raised[0]


@pytest.mark.parametrize("kind", TEXT_IMPORTS)
@pytest.mark.parametrize("source", ["fifo", "link to /dev/zero", "directory"])
def test_a_source_that_is_no_regular_file_is_refused_unread(tmp_path, kind, source):
    importer, name, _ = TEXT_IMPORTS[kind]
    path = tmp_path / name
    if source == "fifo":
        os.mkfifo(path)
    elif source == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    raised = finishes_within(10, lambda: importer(path, tmp_path / "run"), path if source == "fifo" else None)
    assert isinstance(raised, BedsideError), raised
    if source != "directory":  # a W&B export given as a directory is read as a run directory, and has no run
        said = "a FIFO" if source == "fifo" else "a symbolic link"
        assert f"{path}: {said}, not a regular file: refused unread" in str(raised)
    left_nothing(tmp_path, tmp_path / "run")


# -- Megatron -------------------------------------------------------------------
def test_a_401_digit_megatron_value_is_named(tmp_path):
    write_log(tmp_path / "train.log", 5, 0.0, 0)
    with (tmp_path / "train.log").open("a") as fh:
        fh.write(f" iteration        6/       5 | lm loss: 1{'0' * 400} |\n")
    with pytest.raises(BoundedInputError, match=r"train\.log, line \d+: lm loss has 401 characters"):
        import_megatron(tmp_path / "train.log", tmp_path / "run")
    left_nothing(tmp_path, tmp_path / "run")


@pytest.mark.parametrize(
    "line",
    [
        "validation loss at iteration " + "1" * (1 << 20),
        "validation loss at iteration 5 on " + "a" * (1 << 20),
        " iteration 5/ " + "9" * (1 << 20),
        " [" + "2" * (1 << 20),
    ],
    ids=["digits", "word", "total", "bracket"],
)
def test_a_megabyte_megatron_line_is_read_in_linear_time(tmp_path, line):
    """A 1 MB digit run after 'validation loss at iteration' took about 20 minutes to refuse."""
    write_log(tmp_path / "train.log", 5, 0.0, 0)
    with (tmp_path / "train.log").open("a") as fh:
        fh.write(line + "\n")
    started = time.perf_counter()
    try:
        import_megatron(tmp_path / "train.log", tmp_path / "run")
    except ImportFormatError as exc:
        assert "does not parse" in str(exc)
    assert time.perf_counter() - started < 3.0


# -- mutation fuzz from real files -----------------------------------------------------
@pytest.fixture(scope="module")
def seeds(tmp_path_factory, wandb_records) -> dict[str, tuple[Callable[[Path, Path], object], str, bytes]]:
    """A small real file of each importer's input, written by its writer: importer, file name, bytes."""
    import pandas as pd

    folder = tmp_path_factory.mktemp("seeds")
    frame = pd.DataFrame({"step": [0, 1, 2], "rank": [0, 0, 1], "loss": [2.5, float("nan"), 2.3], "lr": 3e-4})
    frame.to_csv(folder / "m.csv", index=False)
    frame.to_json(folder / "m.jsonl", orient="records", lines=True)
    history = frame.drop(columns=["rank"]).rename(columns={"step": "_step"}).assign(_timestamp=1.7e9)
    history.to_parquet(folder / "h.parquet")
    write_log(folder / "train.log", 6, 0.01, 0)
    write_ranked(folder / "tb", ranks=1, steps=4)
    (event,) = (folder / "tb" / "rank_0").iterdir()
    return {
        "csv": (import_csv, "m.csv", (folder / "m.csv").read_bytes()),
        "jsonl": (import_jsonl, "m.jsonl", (folder / "m.jsonl").read_bytes()),
        "megatron": (import_megatron, "train.log", (folder / "train.log").read_bytes()),
        "wandb parquet": (import_wandb, "h.parquet", (folder / "h.parquet").read_bytes()),
        "wandb offline": (import_wandb, "run-x.wandb", framed_wandb(wandb_records)),
        "tensorboard": (import_tb_file, event.name, event.read_bytes()),
    }


def import_tb_file(path: Path, out: Path) -> object:
    return import_tensorboard(path.parent, out)


INSERTS = [b"\xff", b"\x00", b"\n", b",", b"|", b'"', b"[" * 80, b"9" * 70, b"1e400", b"NaN", b"-", b"{}"]
mutations = st.lists(
    st.tuples(st.sampled_from(["flip", "cut", "insert"]), st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=4
)


def mutated(data: bytes, edits: list[tuple[str, float, int]]) -> bytes:
    for what, where, byte in edits:
        at = int(where * len(data))
        if what == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ (byte or 1)]) + data[at + 1 :]
        elif what == "cut":
            data = data[:at]
        else:
            data = data[:at] + INSERTS[byte % len(INSERTS)] + data[at:]
    return data


def reframed_tensorboard(data: bytes, edits: list[tuple[str, float, int]]) -> bytes:
    """The event file ``data`` with one record's bytes mutated and its checksums made right again, so the damage
    reaches the event parser rather than the framing."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    records, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        records.append(data[pos + 12 : pos + 12 + length])
        pos += 16 + length
    which = int(edits[0][1] * len(records)) % len(records)
    records[which] = mutated(records[which], edits)
    out = b""
    for record in records:
        header = struct.pack("<Q", len(record))
        out += header + struct.pack("<I", masked_crc32c(header)) + record + struct.pack("<I", masked_crc32c(record))
    return out


def assert_imports_or_names(importer: Callable[[Path, Path], object], name: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / ("tb/rank_0" if name.startswith("events") else "in")
        folder.mkdir(parents=True)
        (folder / name).write_bytes(data)
        try:
            importer(folder / name, Path(scratch) / "run")
        except BedsideError:
            left_nothing(Path(scratch), Path(scratch) / "run")


@pytest.mark.parametrize(
    "kind", ["csv", "jsonl", "megatron", "wandb parquet", "wandb offline", "tensorboard", "tensorboard records"]
)
def test_mutated_real_files_import_or_raise_a_named_error(seeds, kind):
    importer, name, data = seeds[kind.replace(" records", "")]

    @seed(20240601)
    @FUZZ
    @given(mutations)
    def check(edits: list[tuple[str, float, int]]) -> None:
        damaged = reframed_tensorboard(data, edits) if kind == "tensorboard records" else mutated(data, edits)
        assert_imports_or_names(importer, name, damaged)

    check()


def test_mutated_wandb_records_import_or_raise_a_named_error(seeds, wandb_records):
    """The records of a real run, one mutated and framed again with right checksums: the damage reaches the
    protobuf and JSON readers rather than the framing."""
    importer, name, _ = seeds["wandb offline"]

    @seed(20240602)
    @FUZZ
    @given(mutations)
    def check(edits: list[tuple[str, float, int]]) -> None:
        records = list(wandb_records)
        which = int(edits[0][1] * len(records)) % len(records)
        records[which] = mutated(records[which], edits)
        assert_imports_or_names(importer, name, framed_wandb(records))

    check()
