"""RunLogger: what it accepts, what reaches the disk (even through kill -9), close() and run.json."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import read_run_info
from bedside.collectors.writer import RunLogger

FLUSH_EVERY_S = 0.1
KILLED_RECORDS = 500

CHILD = """
import sys, time
from bedside.collectors.writer import RunLogger

run_dir, count, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
logger = RunLogger(run_dir, rank=0, world_size=1, flush_every_s=every)
for step in range(count):
    logger.step(step, loss=float(step))
# No flush(): wait until the writer thread alone has put every line in the file.
deadline = time.monotonic() + 60
while open(logger.layout.rank_file(0), "rb").read().count(10) < count + 1 and time.monotonic() < deadline:
    time.sleep(every / 10)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def logger(run_dir: Path):
    logger = RunLogger(run_dir, rank=0, world_size=1)
    yield logger
    logger.close()


def last_record(run_dir: Path, logger: RunLogger, read_records) -> dict:
    logger.flush()
    return read_records(RunLayout(run_dir).rank_file(0))[-1]


@pytest.mark.parametrize(
    ("value", "written"),
    [
        pytest.param(torch.tensor(1.5), 1.5, id="0-d float tensor"),
        pytest.param(torch.tensor(7), 7, id="0-d int tensor"),
        pytest.param(torch.tensor(math.inf), "Infinity", id="0-d inf tensor"),
        pytest.param(np.float32(2.5), 2.5, id="numpy float32"),
        pytest.param(np.float64(math.nan), "NaN", id="numpy nan"),
        pytest.param(np.int64(9), 9, id="numpy int64"),
        pytest.param(True, 1, id="bool"),
    ],
)
def test_tensors_and_numpy_scalars_are_written_as_numbers(run_dir, logger, read_records, value, written) -> None:
    logger.step(3, loss=value)
    assert last_record(run_dir, logger, read_records)["metrics"] == {"loss": written}


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1.0", id="str"),
        pytest.param([1.0], id="list"),
        pytest.param({"a": 1.0}, id="dict"),
        pytest.param(object(), id="object"),
        pytest.param(complex(1, 2), id="complex"),
        pytest.param(torch.tensor([1.0, 2.0]), id="2-element tensor"),
        pytest.param(np.array([1, 2]), id="numpy array"),
        pytest.param(np.str_("1"), id="numpy str"),
    ],
)
def test_metric_of_a_wrong_type_raises_type_error(logger, value) -> None:
    with pytest.raises(TypeError):
        logger.step(1, loss=value)


def test_unencodable_field_raises_at_the_call_and_the_writer_keeps_working(run_dir, logger, read_records) -> None:
    with pytest.raises(TypeError):
        logger.event("custom", 1, where={"a", "b"})
    logger.heartbeat(2)
    assert last_record(run_dir, logger, read_records)["kind"] == "heartbeat"


def test_a_record_that_cannot_be_encoded_is_reported_and_later_records_still_written(
    run_dir, logger, read_records
) -> None:
    logger.step(1, loss=torch.tensor(1.0, device="meta"))  # a device tensor that cannot be read
    logger.step(2, loss=1.0)
    logger.flush()
    records = read_records(RunLayout(run_dir).rank_file(0))
    assert [r["kind"] for r in records] == ["rank_info", "log", "step"]
    assert records[1]["level"] == "error" and "dropped a step record of step 1" in records[1]["message"]
    assert [r["seq"] for r in records] == [0, 1, 2]


def test_records_written_by_the_writer_thread_survive_sigkill(run_dir, read_records) -> None:
    args = [sys.executable, "-c", CHILD, str(run_dir), str(KILLED_RECORDS), str(FLUSH_EVERY_S)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout.readline().strip() == "ready"
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    records = read_records(RunLayout(run_dir).rank_file(0))
    assert [r["kind"] for r in records] == ["rank_info"] + ["step"] * KILLED_RECORDS
    assert [r["step"] for r in records[1:]] == list(range(KILLED_RECORDS))


def test_close_flushes_everything_and_ends_with_run_end(run_dir, read_records) -> None:
    logger = RunLogger(run_dir, rank=0, world_size=1, flush_every_s=3600)
    for step in range(1, 101):
        logger.step(step, loss=1.0)
    logger.close("aborted", "operator stop")
    logger.close()  # idempotent
    records = read_records(RunLayout(run_dir).rank_file(0))
    assert len(records) == 102
    assert {k: records[-1][k] for k in ("kind", "step", "status", "message")} == {
        "kind": "run_end",
        "step": 100,
        "status": "aborted",
        "message": "operator stop",
    }


def test_an_exception_in_the_with_block_ends_the_run_as_failed(run_dir, read_records) -> None:
    with pytest.raises(ZeroDivisionError), RunLogger(run_dir, rank=0, world_size=1) as logger:
        logger.step(1, loss=1 / 0)
    end = read_records(RunLayout(run_dir).rank_file(0))[-1]
    assert (end["kind"], end["status"]) == ("run_end", "failed")
    assert "ZeroDivisionError" in end["message"]


def test_rank_zero_writes_run_json_with_world_size_and_config(run_dir) -> None:
    RunLogger(run_dir, rank=1, world_size=4).close()
    assert read_run_info(RunLayout(run_dir)) is None
    RunLogger(run_dir, rank=0, world_size=4, name="tiny", config={"lr": 0.01, "layers": 2}).close()
    info = read_run_info(RunLayout(run_dir))
    assert (info.name, info.world_size, info.config) == ("tiny", 4, {"lr": 0.01, "layers": 2})


def test_rank_and_world_size_default_from_the_environment(run_dir, monkeypatch, read_records) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    RunLogger(run_dir).close()
    info = read_records(RunLayout(run_dir).rank_file(2))[0]
    assert (info["rank"], info["world_size"], info["local_rank"]) == (2, 3, 1)


@pytest.mark.parametrize("step", [None, "3", 1.5, -1], ids=["None", "str", "float", "negative"])
def test_a_bad_step_raises_at_the_call_and_the_writer_keeps_working(run_dir, logger, read_records, step) -> None:
    with pytest.raises((TypeError, ValueError)):
        logger.step(step, loss=1.0)
    logger.step(np.int64(4), loss=1.0)
    assert last_record(run_dir, logger, read_records)["step"] == 4


def test_shards_from_numpy_or_torch_are_written_as_ints(run_dir, logger, read_records) -> None:
    logger.step(1, loss=1.0, shards=np.array([3, 4]))
    logger.step(2, loss=1.0, shards=torch.tensor([5]))
    logger.flush()
    records = read_records(RunLayout(run_dir).rank_file(0))
    assert [r["shards"] for r in records[1:]] == [[3, 4], [5]]


def test_a_field_changed_after_the_call_is_written_as_it_was(run_dir, logger, read_records) -> None:
    args = {"to_step": 100}
    logger.event("action", 7, action="rewind", status="requested", request_id="r1", args=args)
    args["to_step"] = 999
    assert last_record(run_dir, logger, read_records)["args"] == {"to_step": 100}


@pytest.mark.parametrize("field", ["rank", "seq", "time", "timeline"])
def test_event_fields_cannot_overwrite_the_envelope(logger, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        logger.event("custom", 1, **{field: 3})


def test_flush_racing_close_never_hangs(tmp_path) -> None:
    for attempt in range(100):
        logger = RunLogger(tmp_path / f"run-{attempt}", rank=0, world_size=1, flush_every_s=0.01)
        flusher = threading.Thread(target=logger.flush)
        flusher.start()
        logger.close()
        flusher.join(timeout=30)
        assert not flusher.is_alive(), f"flush() hung on attempt {attempt}"


def test_a_relaunch_with_more_ranks_updates_run_json(run_dir) -> None:
    RunLogger(run_dir, rank=0, world_size=2).close()
    RunLogger(run_dir, rank=0, world_size=4, resume=True).close()
    assert read_run_info(RunLayout(run_dir)).world_size == 4


FULL_DISK_CHILD = """
import resource, signal, sys
from bedside.collectors.writer import RunLogger

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
logger = RunLogger(sys.argv[1], rank=0, world_size=1)
logger.flush()
size = logger.layout.rank_file(0).stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 150, resource.RLIM_INFINITY))
for step in range(1, 11):
    logger.step(step, loss=float(step), note_padding=123456.0)
logger.flush()
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
logger.step(11, loss=11.0)
logger.close()
"""


def test_after_a_failed_write_the_file_stays_parseable_and_seq_stays_the_line_number(run_dir) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "could not write" in done.stderr
    lines = RunLayout(run_dir).rank_file(0).read_text().splitlines()
    parsed = [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]
    assert [r["kind"] for r in parsed][-2:] == ["step", "run_end"]
    assert parsed[-2]["step"] == 11
    assert all(r["seq"] == lines.index(json.dumps(r, separators=(",", ":"))) for r in parsed)


def test_a_dtensor_is_refused_because_its_local_value_is_not_the_metric(logger, tmp_path) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh, Replicate, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        loss = distribute_tensor(torch.tensor(3.0), DeviceMesh("cpu", [0]), [Replicate()])
        with pytest.raises(TypeError, match="full_tensor"):
            logger.step(1, loss=loss)
    finally:
        dist.destroy_process_group()


def test_a_path_with_undecodable_bytes_is_written_as_a_valid_line(run_dir, logger, read_records) -> None:
    path = os.fsdecode(b"checkpoints/step-\xff")  # lone surrogate, as os.fsdecode gives
    logger.checkpoint(5, "saved", path=path)
    assert last_record(run_dir, logger, read_records)["path"] == "checkpoints/step-?"
