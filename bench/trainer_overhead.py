"""Step time of the trainer with telemetry on versus off, interleaved in one process.

Run:  OMP_NUM_THREADS=1 python bench/trainer_overhead.py [--blocks 20] [--steps-per-block 10]

Two identical trainers (same preset and seed) share a one-rank gloo group; blocks
of steps alternate between the one that emits its telemetry (RunLogger.step and
rank_step every step, the loss all-reduce, checksums every 10 steps) and one whose
emit does nothing, so drift of the machine hits both alike. Reports the median
step time of each and their ratio. Target: ratio <= 1.01.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bedside.collectors.writer import RunLogger
from bedside.trainer.config import preset
from bedside.trainer.trainer import Trainer


class SilentTrainer(Trainer):
    """The same trainer with its per-step telemetry switched off: its monitor writes nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.monitor.emit = lambda scope: None  # type: ignore[method-assign]


def step_times(trainer: Trainer, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - started)
    return times


def measure(blocks: int, steps_per_block: int, workdir: Path) -> tuple[list[float], list[float]]:
    config = preset("tiny_cpu", steps=10**9)
    device = torch.device("cpu")
    loggers = [RunLogger(workdir / name, rank=0, world_size=1) for name in ("on", "off")]
    on, off = Trainer(config, loggers[0], device), SilentTrainer(config, loggers[1], device)
    step_times(on, steps_per_block), step_times(off, steps_per_block)  # warm-up
    timed_on, timed_off = [], []
    for _ in range(blocks):
        timed_on += step_times(on, steps_per_block)
        timed_off += step_times(off, steps_per_block)
    for logger in loggers:
        logger.close()
    return timed_on, timed_off


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--steps-per-block", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=0, world_size=1)
        try:
            timed_on, timed_off = measure(args.blocks, args.steps_per_block, Path(tmp))
        finally:
            dist.destroy_process_group()
    median_on, median_off = statistics.median(timed_on), statistics.median(timed_off)
    print(
        f"tiny_cpu, 1 rank, {len(timed_on)} steps each, torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads"
    )
    print(f"{'telemetry':<12}{'median ms':>12}{'p90 ms':>10}")
    for name, times in (("on", timed_on), ("off", timed_off)):
        p90 = statistics.quantiles(times, n=10)[-1]
        print(f"{name:<12}{1000 * statistics.median(times):>12.3f}{1000 * p90:>10.3f}")
    print(f"ratio on/off: {median_on / median_off:.4f}   (target <= 1.01)")


if __name__ == "__main__":
    main()
