"""Step time of a plain DDP loop bare versus instrumented with the kit's ``Monitor``, side by side.

Run:  OMP_NUM_THREADS=1 python bench/kit_overhead.py [--ranks 2] [--blocks 300] [--steps-per-block 1]

Each of ``--ranks`` gloo ranks (spawned here) trains three identical DDP copies of a
small MLP on the same batches: one bare (DDP's built-in all-reduce, no telemetry), one
with torch's own Python all-reduce comm hook (``default_hooks.allreduce_hook``: what any
comm hook costs, telemetry aside), and one wired to a ``Monitor`` (the comm hook with the
local gradient norm and the job's mean loss, phase marks, a ``rank_step`` record per
step, the job's ``step`` record on rank 0, a parameter checksum every 50 steps). Steps
(blocks of ``--steps-per-block``) alternate between the loops, so drift of the machine
hits them alike. Rank 0 reports the median step time of each and its ratio to the bare
loop's, in wall time and in the process's CPU time (all its threads: on a busy machine
the CPU time is the steadier measure of the work added). Target: monitor/bare <= 1.01.
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
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


def timed(step: Callable[[], None], steps: int) -> list[tuple[float, float]]:
    """(wall seconds, this process's CPU seconds in all its threads) of each step."""
    times = []
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def rank_main(rank: int, world: int, workdir: str, blocks: int, steps_per_block: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world)
    batches = torch.Generator().manual_seed(rank)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(BATCH, WIDTH, generator=batches), torch.randn(BATCH, WIDTH, generator=batches)

    bare = DistributedDataParallel(mlp())
    bare_optimizer = torch.optim.SGD(bare.parameters(), lr=1e-3)
    hooked = DistributedDataParallel(mlp())
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    hooked_optimizer = torch.optim.SGD(hooked.parameters(), lr=1e-3)
    wired = DistributedDataParallel(mlp())
    logger = RunLogger(Path(workdir) / "run", rank=rank, world_size=world)
    monitor = Monitor(logger, wired, torch.optim.SGD(wired.parameters(), lr=1e-3), checksum_every=50)
    counter = iter(range(1, 10**9))

    loops: dict[str, Callable[[], None]] = {
        "bare": lambda: bare_step(bare, bare_optimizer, batch),
        "torch hook": lambda: bare_step(hooked, hooked_optimizer, batch),
        "monitor": lambda: monitored_step(monitor, next(counter), batch),
    }
    for loop in loops.values():
        timed(loop, steps_per_block)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in loops}
    for _ in range(blocks):
        for name, loop in loops.items():
            times[name] += timed(loop, steps_per_block)
    logger.close()
    dist.destroy_process_group()
    if rank == 0:
        report(times, world)


def report(times: dict[str, list[tuple[float, float]]], world: int) -> None:
    steps = len(times["bare"])
    print(
        f"MLP {LAYERS}x({WIDTH}-{HIDDEN}-{WIDTH}), batch {BATCH}, {world} gloo ranks, {steps} steps each, "
        f"torch {torch.__version__}"
    )
    print(f"{'loop':<12}{'median ms':>12}{'p90 ms':>10}{'median CPU ms':>16}")
    medians = {}
    for name, measured in times.items():
        wall, cpu = [w for w, _ in measured], [c for _, c in measured]
        p90 = statistics.quantiles(wall, n=10)[-1]
        medians[name] = statistics.median(wall), statistics.median(cpu)
        print(f"{name:<12}{1000 * medians[name][0]:>12.3f}{1000 * p90:>10.3f}{1000 * medians[name][1]:>16.3f}")
    (wall_off, cpu_off) = medians["bare"]
    for name in ("torch hook", "monitor"):
        wall, cpu = medians[name]
        print(f"ratio {name}/bare: {wall / wall_off:.4f} wall, {cpu / cpu_off:.4f} CPU")
    print("target: monitor/bare <= 1.01")


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
