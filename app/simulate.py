"""A simulated multi-rank run written through RunLogger, for the demo and benchmarks.

It stands in for the trainer until the trainer lands: a falling loss with a
bad-shard spike, one straggling rank, one non-finite gradient norm, evals,
checkpoints, and the ground truth of each fault in ``ground_truth/``.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from bedside.collectors.writer import RunLogger

TOKENS_PER_STEP = 8192
FLOPS_PER_TOKEN = 6 * 12e6
MIN_RANKS = 3
"""The straggler is rank 2 and the NaN is on rank 1: fewer ranks would hide a fault."""
MIN_STEPS = 20
"""Room for a spike, a straggler, a NaN and evals at distinct steps."""
CRASH_EXIT_CODE = 3


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """What the simulated run does, and when."""

    ranks: int = 4
    steps: int = 300
    step_s: float = 0.02
    spike_step: int = 200
    bad_shard: int = 99
    straggler_rank: int = 2
    straggler_from: int = 150
    straggler_factor: float = 1.4
    nonfinite_rank: int = 1
    nonfinite_step: int = 250
    eval_every: int = 50
    checkpoint_every: int = 100
    seed: int = 0
    crash_rank: int | None = None
    """A rank that dies hard (exit code 3, its unflushed records lost) at ``crash_step``, as an OOM kill would."""
    crash_step: int | None = None

    def __post_init__(self) -> None:
        if self.ranks < MIN_RANKS or self.steps < MIN_STEPS:
            raise ValueError(f"the demo needs at least {MIN_RANKS} ranks and {MIN_STEPS} steps")
        if (self.crash_rank is None) != (self.crash_step is None):
            raise ValueError("crash_rank and crash_step go together")
        if self.crash_rank is not None and not (0 <= self.crash_rank < self.ranks
                                                and 1 <= self.crash_step <= self.steps):
            raise ValueError(f"crash at rank {self.crash_rank}, step {self.crash_step}: "
                             f"outside ranks 0..{self.ranks - 1} or steps 1..{self.steps}")

    @classmethod
    def scaled(cls, ranks: int, steps: int, crash_rank: int | None = None) -> "Scenario":
        """The default scenario's faults placed at the same fractions of a run of ``steps``
        (a crash of ``crash_rank``, if given, halfway)."""
        return cls(ranks=ranks, steps=steps, spike_step=steps * 2 // 3, straggler_rank=2,
                   straggler_from=steps // 2, nonfinite_step=steps * 5 // 6,
                   eval_every=max(steps // 6, 1), checkpoint_every=max(steps // 3, 1),
                   crash_rank=crash_rank, crash_step=None if crash_rank is None else steps // 2)


def heldout_loss(step: int) -> float:
    """Held-out loss of the simulated model: a power law toward 1.8 nats."""
    return 1.85 + 4.0 * (1 + step) ** -0.35


def train_loss(step: int, s: Scenario) -> float:
    """Training loss: the held-out curve, tripled on the batch from the bad shard."""
    return (heldout_loss(step) - 0.05) * (3.0 if step == s.spike_step else 1.0)


def run_rank(run_dir: Path, rank: int, s: Scenario) -> None:
    """Write rank ``rank``'s telemetry for the whole scenario."""
    rng = random.Random(s.seed * 1000 + rank)
    with RunLogger(run_dir, rank=rank, world_size=s.ranks, name="demo", config={"scenario": vars(s)}) as log:
        for step in range(1, s.steps + 1):
            time.sleep(s.step_s)
            if (rank, step) == (s.crash_rank, s.crash_step):
                os._exit(CRASH_EXIT_CODE)
            _write_step(log, rank, step, s, rng)
            if step % s.eval_every == 0 and rank == 0:
                log.eval(step, {"loss": heldout_loss(step), "accuracy": 1 - math.exp(-step / 150)},
                         cum_tokens=step * TOKENS_PER_STEP, cum_flops=step * TOKENS_PER_STEP * FLOPS_PER_TOKEN)
            if step % s.checkpoint_every == 0:
                log.checkpoint(step, "saved", path=f"checkpoints/step-{step:08d}", duration_s=0.8, bytes=48e6)


def _write_step(log: RunLogger, rank: int, step: int, s: Scenario, rng: random.Random) -> None:
    slow = s.straggler_factor if rank == s.straggler_rank and step >= s.straggler_from else 1.0
    compute = 0.050 * slow * rng.uniform(0.97, 1.03)
    straggler_wait = 0.050 * (s.straggler_factor - 1) if step >= s.straggler_from and slow == 1.0 else 0.0
    comm = 0.010 * rng.uniform(0.9, 1.1) + straggler_wait
    grad = float("nan") if (rank, step) == (s.nonfinite_rank, s.nonfinite_step) else rng.gauss(1.0, 0.05)
    log.rank_step(step, step_time=0.005 + compute + comm + 0.004, data_time=0.005, compute_time=compute,
                  comm_time=comm, optimizer_time=0.004, local_grad_norm=grad, param_checksum=f"{step:08x}")
    if rank == 0:
        shard = s.bad_shard if step == s.spike_step else step % 16
        log.step(step, loss=train_loss(step, s), grad_norm=abs(rng.gauss(1.0, 0.05)) * (4 if step == s.spike_step else 1),
                 lr=3e-4 * min(1.0, step / 50), tokens=TOKENS_PER_STEP, flops=TOKENS_PER_STEP * FLOPS_PER_TOKEN,
                 shards=[shard])
    _write_ground_truth(log, rank, step, s)


def _write_ground_truth(log: RunLogger, rank: int, step: int, s: Scenario) -> None:
    if rank == 0 and step == s.spike_step:
        log.event("fault_injected", step, fault="bad_shard", target_ranks=[], args={"shard": s.bad_shard})
    if rank == s.straggler_rank and step == s.straggler_from:
        log.event("fault_injected", step, fault="straggler", target_ranks=[rank], args={"factor": s.straggler_factor})
    if rank == s.nonfinite_rank and step == s.nonfinite_step:
        log.event("fault_injected", step, fault="nonfinite_grad", target_ranks=[rank], args={})


def start_ranks(run_dir: Path, s: Scenario) -> list[multiprocessing.Process]:
    """Start one writer process per simulated rank."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=run_rank, args=(run_dir, rank, s), name=f"rank-{rank}") for rank in range(s.ranks)]
    for proc in procs:
        proc.start()
    return procs
