"""The instrumentation kit's ``Monitor`` on a plain user loop (``kit_loop.py``), not bedside's trainer:
three DDP ranks and two FSDP2 ranks on gloo under torchrun, and a GradScaler loop in this process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kit_loop import BATCH, FLIP_AFTER, SEQ, SHAPE, tiny_model
from torch import nn
from torchrun_runs import rows, train_and_collect

from bedside.collectors.kit import Monitor, flops_per_token, param_checksum
from bedside.collectors.store import Store
from bedside.collectors.writer import RunLogger

pytestmark = pytest.mark.slow(reason="the kit's loop on two torchrun ranks")

DDP_RANKS, DDP_STEPS = 3, 34
FSDP_RANKS, FSDP_STEPS = 2, 6


@pytest.fixture(scope="module")
def ddp(tmp_path_factory, bedside) -> tuple[Path, list[dict]]:
    """The DDP run (rank 1 flips a parameter bit after step FLIP_AFTER) and what ``bedside detect`` found."""
    run = tmp_path_factory.mktemp("kit") / "ddp"
    train_and_collect("kit_loop.py", run, DDP_STEPS, args=("ddp",), nproc=DDP_RANKS).close()
    found = bedside("detect", run, "--json")
    assert found.returncode == 0, found.stderr
    return run, [json.loads(line) for line in found.stdout.splitlines()]


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("kit") / "fsdp"
    train_and_collect("kit_loop.py", run, FSDP_STEPS, args=("fsdp",), nproc=FSDP_RANKS).close()
    return run


@pytest.fixture(params=["ddp", "fsdp"])
def run(request, ddp, fsdp) -> Path:
    return ddp[0] if request.param == "ddp" else fsdp


def query(run: Path, sql: str) -> list[tuple]:
    store = Store.open(run / "bedside.duckdb", read_only=True)
    try:
        return rows(store, sql)
    finally:
        store.close()


def test_each_ranks_local_grad_norm_is_the_norm_of_its_unreduced_gradients(run: Path) -> None:
    recorded = query(run, "SELECT rank, step, local_grad_norm FROM rank_step_metrics ORDER BY rank, step")
    ranks = {rank for rank, *_ in recorded}
    direct = {r: json.loads(Path(f"{run}-expected-{r}.json").read_text()) for r in ranks}
    assert len(ranks) > 1 and len(recorded) == sum(len(d) for d in direct.values())
    for rank, step, norm in recorded:
        assert norm == pytest.approx(direct[rank][step - 1], rel=1e-5), (rank, step)
    assert len({round(norm, 6) for _, step, norm in recorded if step == 2}) == len(ranks)  # not the reduced one


def test_the_job_rank_records_the_norm_of_the_reduced_gradients(run: Path) -> None:
    recorded = query(run, "SELECT step, grad_norm FROM step_metrics ORDER BY step")
    direct = json.loads(Path(f"{run}-expected-job.json").read_text())
    assert [step for step, _ in recorded] == list(range(1, len(direct) + 1))
    assert [norm for _, norm in recorded] == pytest.approx(direct, rel=1e-5)


def test_phase_times_are_recorded_and_add_up_to_the_step_time(run: Path) -> None:
    phases = query(run, "SELECT step_time, data_time, compute_time, comm_time, optimizer_time FROM rank_step_metrics")
    assert phases and all(part >= 0 for row in phases for part in row)
    assert all(math.isclose(total, sum(parts), rel_tol=1e-9, abs_tol=1e-9) for total, *parts in phases)
    assert all(compute > 0 and comm > 0 for _, _, compute, comm, _ in phases)
    waits = query(run, "SELECT cpu_wait_time, data_time + compute_time FROM rank_step_metrics")
    # Linux counts a wait when it ends: one that began just before the step's first read counts whole (a slice)
    assert all(0 <= wait <= work + 0.01 for wait, work in waits)


def test_the_job_rank_records_tokens_flops_lr_and_the_mean_of_the_ranks_losses(run: Path) -> None:
    world = query(run, "SELECT world_size FROM run")[0][0]
    tokens = BATCH * SEQ * world
    steps = query(run, "SELECT step, tokens, flops, lr, loss FROM step_metrics ORDER BY step")
    assert [s[1:4] for s in steps] == [(tokens, flops_per_token(SHAPE) * tokens, 0.05)] * len(steps)
    losses = query(run, "SELECT step, avg(value) FROM metrics WHERE name = 'local_loss' GROUP BY step ORDER BY step")
    assert [loss for *_, loss in steps] == pytest.approx([mean for _, mean in losses], rel=1e-5)


def test_ddp_replicas_agree_on_their_checksum_until_one_ranks_parameter_bit_flips(ddp) -> None:
    run, _ = ddp
    distinct = query(
        run,
        "SELECT step, count(DISTINCT param_checksum), count(*) FROM rank_step_metrics "
        "WHERE param_checksum IS NOT NULL GROUP BY step ORDER BY step",
    )
    assert distinct == [(s, 1 if s <= FLIP_AFTER else 2, DDP_RANKS) for s in range(2, DDP_STEPS + 1, 2)]
    odd = query(
        run,
        "SELECT DISTINCT rank FROM rank_step_metrics WHERE step = 12 AND param_checksum NOT IN "
        "(SELECT param_checksum FROM rank_step_metrics WHERE step = 12 AND rank = 0)",
    )
    assert odd == [(1,)]


def test_bedside_detect_reports_silent_data_corruption_on_the_flipped_rank(ddp) -> None:
    _, findings = ddp
    sdc = [f for f in findings if f["kind"] == "sdc"]
    assert [(f["ranks"], f["start_step"]) for f in sdc] == [([1], FLIP_AFTER + 2)]


def test_fsdp_ranks_digest_their_own_shards_every_checksum_step(fsdp: Path) -> None:
    distinct = query(
        fsdp,
        "SELECT step, count(DISTINCT param_checksum) FROM rank_step_metrics "
        "WHERE param_checksum IS NOT NULL GROUP BY step ORDER BY step",
    )
    assert distinct == [(s, FSDP_RANKS) for s in range(2, FSDP_STEPS + 1, 2)]


def test_a_checksum_tensor_is_written_as_the_16_hex_digits_of_its_64_bits(tmp_path: Path, read_records) -> None:
    model = tiny_model()
    with RunLogger(tmp_path, rank=0, world_size=1) as logger:
        logger.rank_step(1, param_checksum=torch.tensor(-1, dtype=torch.int64), step_time=0.1)
        logger.rank_step(2, param_checksum=param_checksum(model), step_time=0.1)
        with pytest.raises(TypeError, match="one-element integer tensor"):
            logger.rank_step(3, param_checksum=torch.tensor(1.5))
        with pytest.raises(TypeError, match="string or an integer tensor"):
            logger.rank_step(3, param_checksum=12)
    checksums = [r["param_checksum"] for r in read_records(tmp_path / "telemetry" / "rank-00000.jsonl")[1:3]]
    assert checksums[0] == "f" * 16
    assert checksums[1] == f"{int(param_checksum(model)) & (2**64 - 1):016x}"
    model[0].weight.data.view(-1).view(torch.int32)[0] ^= 1
    assert f"{int(param_checksum(model)) & (2**64 - 1):016x}" != checksums[1]


def test_a_gradscaler_loop_records_its_loss_scale_and_the_steps_skipped_for_overflow(
    tmp_path: Path, read_records
) -> None:
    overflow_at = {3, 6}
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    direct = []
    with RunLogger(tmp_path, rank=0, world_size=1) as logger:
        monitor = Monitor(logger, model, optimizer, scaler=scaler, checksum_every=0)
        for step in range(1, 9):
            with monitor.step(step) as s:
                x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
                s.compute()
                loss = F.mse_loss(model(x), x.sum(1, keepdim=True)) * (math.inf if step in overflow_at else 1.0)
                s.backward(loss)
                direct.append(float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm() / scaler._scale))
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        with pytest.raises(RuntimeError, match="raised in the step"), monitor.step(9):
            raise RuntimeError("raised in the step")  # a step left by an exception records nothing
    records = [r for r in read_records(tmp_path / "telemetry" / "rank-00000.jsonl") if r["kind"] == "rank_step"]
    assert [r["step"] for r in records] == list(range(1, 9))
    metrics = [r["metrics"] for r in records]
    assert [m["loss_scale"] for m in metrics] == [1024.0] * 3 + [512.0] * 3 + [256.0] * 2
    assert [m["overflow_skipped"] for m in metrics] == [int(step in overflow_at) for step in range(1, 9)]
    assert [m["overflow_skipped_steps"] for m in metrics] == [0, 0, 1, 1, 1, 2, 2, 2]
    finite = [(m["local_grad_norm"], d) for m, d in zip(metrics, direct) if isinstance(m["local_grad_norm"], float)]
    assert len(finite) == 6 and all(norm == pytest.approx(d, rel=1e-5) for norm, d in finite)
    assert all(m["comm_time"] == 0 for m in metrics)  # a plain module: nothing is reduced
    steps = [r for r in read_records(tmp_path / "telemetry" / "rank-00000.jsonl") if r["kind"] == "step"]
    assert len(steps) == 8 and not [r for r in steps if "grad_norm" in r["metrics"]]  # inf at each overflow: none


def test_a_loop_that_records_its_own_grad_norm_keeps_it(tmp_path: Path, read_records) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with RunLogger(tmp_path, rank=0, world_size=1) as logger:
        quiet = Monitor(logger, model, optimizer, checksum_every=0, grad_norm=False)
        default = Monitor(logger, model, optimizer, checksum_every=0)
        for step, monitor, own in ((1, quiet, None), (2, quiet, 7.0), (3, default, 7.0), (4, default, None)):
            with monitor.step(step) as s:
                s.compute()
                s.backward(model(torch.ones(2, 4)).sum())
                if own is not None:
                    s.record_job(grad_norm=own)
                optimizer.step()
                optimizer.zero_grad()
    steps = [r["metrics"] for r in read_records(tmp_path / "telemetry" / "rank-00000.jsonl") if r["kind"] == "step"]
    assert [m.get("grad_norm") for m in steps[:3]] == [None, 7.0, 7.0]  # off: none taken; the loop's own wins
    assert steps[3]["grad_norm"] == pytest.approx(math.sqrt(4 * 2**2 + 2**2))  # 2 per weight (two samples), 2 bias


def test_the_loop_in_docs_kit_md_runs_as_written(tmp_path: Path, read_records) -> None:
    text = (Path(__file__).parents[1] / "docs" / "kit.md").read_text()
    script = tmp_path / "loop.py"
    script.write_text(text.split("## A loop in full", 1)[1].split("```python\n", 1)[1].split("```", 1)[0])
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(tmp_path / "run" / "telemetry" / "rank-00000.jsonl")
    rank_steps = [r for r in records if r["kind"] == "rank_step"]
    assert [r["step"] for r in rank_steps] == list(range(1, 51))
    assert [r["step"] for r in rank_steps if "param_checksum" in r] == [10, 20, 30, 40, 50]
    assert all(r["metrics"]["local_grad_norm"] > 0 for r in rank_steps)
    assert {r["metrics"]["tokens"] for r in records if r["kind"] == "step"} == {32}
    assert records[-1]["kind"] == "run_end"
