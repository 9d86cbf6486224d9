"""Step time of a plain DDP loop bare versus instrumented with the kit's ``Monitor``, side by side.

Run:  OMP_NUM_THREADS=1 python bench/kit_overhead.py [--ranks 2] [--blocks 300] [--steps-per-block 1]

Each of ``--ranks`` gloo ranks (spawned here) trains two identical DDP copies of a small
MLP on the same batches: one bare (DDP's built-in all-reduce, no telemetry), one wired to
a ``Monitor`` (the comm hook with the local gradient norm and the loss riding along,
phase marks, a ``rank_step`` record per step, the job's ``step`` record on rank 0, a
parameter checksum every 50 steps). Steps (blocks of ``--steps-per-block``) alternate
between the two, so drift of the machine hits both alike. Rank 0 reports the median step time of each and their
ratio. Target: ratio <= 1.01.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bedside.collectors.kit import Monitor
from bedside.collectors.writer import RunLogger

WIDTH, HIDDEN, LAYERS, BATCH = 256, 1024, 4, 128


def mlp() -> nn.Module:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH)) for _ in range(LAYERS)]
    return nn.Sequential(*blocks)


def bare_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Callable) -> None:
    x, y = batch()
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


def monitored_step(monitor: Monitor, step: int, batch: Callable) -> None:
    with monitor.step(step) as s:
        x, y = batch()
        s.compute()
        s.backward(F.mse_loss(monitor.model(x), y))
        assert monitor.optimizer is not None
        monitor.optimizer.step()
        monitor.optimizer.zero_grad()


def timed(step: Callable[[], None], steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return times


def rank_main(rank: int, world: int, workdir: str, blocks: int, steps_per_block: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world)
    batches = torch.Generator().manual_seed(rank)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(BATCH, WIDTH, generator=batches), torch.randn(BATCH, WIDTH, generator=batches)

    bare = DistributedDataParallel(mlp())
    bare_optimizer = torch.optim.SGD(bare.parameters(), lr=1e-3)
    wired = DistributedDataParallel(mlp())
    logger = RunLogger(Path(workdir) / "run", rank=rank, world_size=world)
    monitor = Monitor(logger, wired, torch.optim.SGD(wired.parameters(), lr=1e-3), checksum_every=50)
    counter = iter(range(1, 10**9))

    def run_bare() -> None:
        bare_step(bare, bare_optimizer, batch)

    def run_wired() -> None:
        monitored_step(monitor, next(counter), batch)

    timed(run_bare, steps_per_block), timed(run_wired, steps_per_block)  # warm-up
    times: dict[str, list[float]] = {"bare": [], "monitor": []}
    for _ in range(blocks):
        times["bare"] += timed(run_bare, steps_per_block)
        times["monitor"] += timed(run_wired, steps_per_block)
    logger.close()
    dist.destroy_process_group()
    if rank == 0:
        report(times, world)


def report(times: dict[str, list[float]], world: int) -> None:
    steps = len(times["bare"])
    print(
        f"MLP {LAYERS}x({WIDTH}-{HIDDEN}-{WIDTH}), batch {BATCH}, {world} gloo ranks, {steps} steps each, "
        f"torch {torch.__version__}"
    )
    print(f"{'loop':<10}{'median ms':>12}{'p90 ms':>10}")
    for name, measured in times.items():
        p90 = statistics.quantiles(measured, n=10)[-1]
        print(f"{name:<10}{1000 * statistics.median(measured):>12.3f}{1000 * p90:>10.3f}")
    ratio = statistics.median(times["monitor"]) / statistics.median(times["bare"])
    print(f"ratio monitor/bare: {ratio:.4f}   (target <= 1.01)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=300)
    parser.add_argument("--steps-per-block", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        mp.spawn(rank_main, args=(args.ranks, workdir, args.blocks, args.steps_per_block), nprocs=args.ranks)


if __name__ == "__main__":
    main()
