"""Per-call cost of RunLogger.step in the calling thread, against other loggers.

Run:  python bench/overhead.py [--iterations 20000] [--skip-wandb] [--skip-tensorboard]

Every backend logs the same 10 scalars per step and is timed call by call with
``time.perf_counter_ns`` in one process: RunLogger (Python floats, and 0-d CPU
torch tensors when torch is importable), a plain ``json.dumps`` + ``file.write``
baseline, ``wandb.log`` in offline mode and TensorBoard's ``add_scalar`` x10.
Then, for RunLogger only: every record is in the file after ``close()``, and
how long a record takes from ``.step()`` to the file (sampled, polling the size).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bedside.collectors.writer import DEFAULT_FLUSH_EVERY_S, RunLogger

METRIC_NAMES = ("loss", "grad_norm", "lr", "tokens", "flops", "mfu", "tokens_per_s", "loss_scale", "moe_aux", "z_loss")
POOL_SIZE = 64
SLOW_FRACTION = 10  # wandb gets iterations // SLOW_FRACTION calls

Call = Callable[[int, dict[str, Any]], None]


@dataclass
class Result:
    name: str
    samples_ns: np.ndarray | None = None
    note: str = ""


def metric_pool(tensors: bool = False) -> list[dict[str, Any]]:
    """POOL_SIZE prepared dicts of 10 scalars, so building values is not timed."""
    rng = random.Random(0)
    pool = [{name: rng.random() * 10 for name in METRIC_NAMES} for _ in range(POOL_SIZE)]
    if tensors:
        import torch

        pool = [{k: torch.tensor(v) for k, v in m.items()} for m in pool]
    return pool


def warmup_calls(iterations: int) -> int:
    return min(1000, iterations // 10)


def time_calls(call: Call, pool: list[dict[str, Any]], iterations: int) -> np.ndarray:
    """Nanoseconds of each of ``iterations`` calls, after a short untimed warm-up (steps keep rising)."""
    warmup = warmup_calls(iterations)
    for step in range(warmup):
        call(step, pool[step % POOL_SIZE])
    clock = time.perf_counter_ns
    samples = np.empty(iterations, dtype=np.int64)
    for i in range(iterations):
        step = warmup + i
        metrics = pool[step % POOL_SIZE]
        start = clock()
        call(step, metrics)
        samples[i] = clock() - start
    return samples


def bench_runlogger(tmp: Path, pool: list[dict[str, Any]], iterations: int, name: str) -> tuple[Result, Path]:
    run = tmp / name.replace(" ", "-")
    logger = RunLogger(run, rank=0, world_size=1)
    samples = time_calls(lambda i, m: logger.step(i, **m), pool, iterations)
    logger.close()
    return Result(name, samples), logger.layout.rank_file(0)


def bench_json(tmp: Path, pool: list[dict[str, Any]], iterations: int) -> Result:
    with open(tmp / "baseline.jsonl", "w") as fh:

        def call(i: int, m: dict[str, Any]) -> None:
            fh.write(json.dumps({"kind": "step", "time": time.time(), "step": i, "metrics": m}) + "\n")

        return Result("json.dumps + file.write", time_calls(call, pool, iterations))


def bench_wandb(tmp: Path, pool: list[dict[str, Any]], iterations: int) -> Result:
    name = "wandb.log (offline)"
    try:
        import wandb
    except ImportError as exc:
        return Result(name, note=f"not installed ({exc})")
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        run = wandb.init(mode="offline", dir=str(tmp), project="bedside-bench")
    except Exception as exc:  # wandb raises its own error types when its service cannot start
        return Result(name, note=f"could not start ({type(exc).__name__}: {exc})")
    try:
        return Result(name, time_calls(lambda i, m: run.log(m, step=i), pool, iterations))
    finally:
        run.finish()


def bench_tensorboard(tmp: Path, pool: list[dict[str, Any]], iterations: int) -> Result:
    try:
        from torch.utils.tensorboard import SummaryWriter

        name = "torch SummaryWriter.add_scalar x10"
    except ImportError:
        try:
            from tensorboardX import SummaryWriter

            name = "tensorboardX add_scalar x10"
        except ImportError as exc:
            return Result("TensorBoard add_scalar x10", note=f"not installed ({exc})")
    writer = SummaryWriter(str(tmp / "tensorboard"))

    def call(i: int, m: dict[str, Any]) -> None:
        for key, value in m.items():
            writer.add_scalar(key, value, i)

    try:
        return Result(name, time_calls(call, pool, iterations))
    finally:
        writer.close()


def count_step_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.startswith(b'{"kind":"step"'))


def visibility_delays(tmp: Path, samples: int) -> np.ndarray:
    """Seconds from ``.step()`` returning to the file growing, at a random phase of the flush timer."""
    logger = RunLogger(tmp / "visibility", rank=0, world_size=1)
    path = logger.layout.rank_file(0)
    metrics = metric_pool()[0]
    delays = []
    for i in range(samples):
        time.sleep(random.uniform(0, DEFAULT_FLUSH_EVERY_S))
        size = path.stat().st_size
        logger.step(i, **metrics)
        start = time.perf_counter()
        while path.stat().st_size == size:
            time.sleep(0.0005)
        delays.append(time.perf_counter() - start)
    logger.close()
    return np.array(delays)


def format_row(result: Result, reference_ns: float) -> str:
    if result.samples_ns is None:
        return f"{result.name:<36} {result.note}"
    p50, p90, p99 = np.percentile(result.samples_ns, [50, 90, 99]) / 1000
    ratio = p50 * 1000 / reference_ns
    return f"{result.name:<36} {len(result.samples_ns):>7} {p50:>9.2f} {p90:>9.2f} {p99:>9.2f} {ratio:>9.1f}x"


def print_table(results: list[Result]) -> None:
    reference = float(np.median(results[0].samples_ns))
    print(
        f"{'backend (10 scalars per step)':<36} {'calls':>7} {'p50 us':>9} {'p90 us':>9} {'p99 us':>9} {'vs RL p50':>10}"
    )
    for result in results:
        print(format_row(result, reference))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20_000, help="timed calls per fast backend")
    parser.add_argument("--skip-wandb", action="store_true", help="do not run wandb.log")
    parser.add_argument("--skip-tensorboard", action="store_true", help="do not run TensorBoard")
    parser.add_argument("--visibility-samples", type=int, default=100, help="sampled step-to-file delays")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    n = args.iterations
    with tempfile.TemporaryDirectory(prefix="bedside-overhead-") as name:
        tmp = Path(name)
        floats = metric_pool()
        result, rank_file = bench_runlogger(tmp, floats, n, "RunLogger.step (floats)")
        results = [result]
        found = count_step_lines(rank_file)
        try:
            tensor_result, _ = bench_runlogger(tmp, metric_pool(tensors=True), n, "RunLogger.step (0-d CPU tensors)")
            results.append(tensor_result)
        except ImportError as exc:
            results.append(Result("RunLogger.step (0-d CPU tensors)", note=f"not installed ({exc})"))
        results.append(bench_json(tmp, floats, n))
        wandb_note = Result("wandb.log (offline)", note="skipped (--skip-wandb)")
        results.append(wandb_note if args.skip_wandb else bench_wandb(tmp, floats, max(1, n // SLOW_FRACTION)))
        tb_note = Result("TensorBoard add_scalar x10", note="skipped (--skip-tensorboard)")
        results.append(tb_note if args.skip_tensorboard else bench_tensorboard(tmp, floats, n))
        print_table(results)
        print(f"\nRunLogger completeness: {found} of {n + warmup_calls(n)} step records in the file after close()")
        delays = visibility_delays(tmp, args.visibility_samples) * 1000
        p50, p95 = np.percentile(delays, [50, 95])
        print(
            f"RunLogger step->file delay ({len(delays)} samples, flush_every_s={DEFAULT_FLUSH_EVERY_S}): "
            f"p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {delays.max():.1f} ms"
        )
        print("targets: RunLogger.step p50 <= 10 us with 10 scalars; >= 20x cheaper than wandb.log offline")


if __name__ == "__main__":
    main()
