"""RunLogger: what it accepts, what reaches the disk (even through kill -9), close() and run.json."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
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
time.sleep(3 * every)
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


@pytest.mark.parametrize(("value", "written"), [
    pytest.param(torch.tensor(1.5), 1.5, id="0-d float tensor"),
    pytest.param(torch.tensor(7), 7, id="0-d int tensor"),
    pytest.param(torch.tensor(math.inf), "Infinity", id="0-d inf tensor"),
    pytest.param(np.float32(2.5), 2.5, id="numpy float32"),
    pytest.param(np.float64(math.nan), "NaN", id="numpy nan"),
    pytest.param(np.int64(9), 9, id="numpy int64"),
    pytest.param(True, 1, id="bool"),
])
def test_tensors_and_numpy_scalars_are_written_as_numbers(run_dir, logger, read_records, value, written) -> None:
    logger.step(3, loss=value)
    assert last_record(run_dir, logger, read_records)["metrics"] == {"loss": written}


@pytest.mark.parametrize("value", [
    pytest.param("1.0", id="str"),
    pytest.param([1.0], id="list"),
    pytest.param({"a": 1.0}, id="dict"),
    pytest.param(object(), id="object"),
    pytest.param(complex(1, 2), id="complex"),
    pytest.param(torch.tensor([1.0, 2.0]), id="2-element tensor"),
    pytest.param(np.array([1, 2]), id="numpy array"),
    pytest.param(np.str_("1"), id="numpy str"),
])
def test_metric_of_a_wrong_type_raises_type_error(logger, value) -> None:
    with pytest.raises(TypeError):
        logger.step(1, loss=value)


def test_unencodable_field_raises_at_the_call_and_the_writer_keeps_working(run_dir, logger, read_records) -> None:
    with pytest.raises(TypeError):
        logger.event("custom", 1, where=("a", "b"))
    logger.heartbeat(2)
    assert last_record(run_dir, logger, read_records)["kind"] == "heartbeat"


def test_a_record_that_cannot_be_encoded_is_reported_and_later_records_still_written(
    run_dir, logger, read_records
) -> None:
    logger.event("custom", 1, nested=[object()])
    logger.step(2, loss=1.0)
    logger.flush()
    records = read_records(RunLayout(run_dir).rank_file(0))
    assert [r["kind"] for r in records] == ["rank_info", "log", "step"]
    assert records[1]["level"] == "error" and "dropped a custom record of step 1" in records[1]["message"]
    assert [r["seq"] for r in records] == [0, 1, 2]


def test_records_reach_the_disk_within_the_flush_delay_even_through_sigkill(run_dir, read_records) -> None:
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
        "kind": "run_end", "step": 100, "status": "aborted", "message": "operator stop"}


def test_an_exception_in_the_with_block_ends_the_run_as_failed(run_dir, read_records) -> None:
    with pytest.raises(ZeroDivisionError):
        with RunLogger(run_dir, rank=0, world_size=1) as logger:
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
