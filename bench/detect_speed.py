"""How fast the detectors go, side by side with a vectorised numpy/pandas baseline in the same run.

Run:  python bench/detect_speed.py [--steps 143000] [--ranks 1024] [--stream-steps 180]

Two figures (issue targets in docs/performance.md, "Detection speed"):

- **Batch, one job-level series**: ``bedside.detectors.detect(steps=...)`` over a loss-only run of STEPS steps (a
  power-law decay with Student-t noise and a few spikes), in steps per second, next to a vectorised rolling robust z
  (median and MAD over a 100-step window, pandas' C rolling kernels) over the same series. Target: >= 50,000
  steps per second.
- **Streaming, many ranks**: a generated RANKS-rank run (``detectors.datasets``) fed to one ``DetectorRunner`` a step
  at a time, as a live follow does; the median milliseconds per step, next to the numpy baseline of one step's
  cross-rank work (a median and MAD of every rank's compute time), both over the steps after ``WARM_STEPS`` (every
  detector past its warm-up: the straggler's verdict comes at step 100, its steps reach it ``lag`` = 20 later). Target: <= 1 ms per step at 1,024 ranks, growing
  at most linearly in the ranks. Under it, each detector's median ms per step, and ``assembly``: the rest of the
  runner's step (the one step assembly it shares among the cross-rank detectors, and the run state).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd

from bedside.detectors import detect
from bedside.detectors.datasets import SimulationConfig, simulate
from bedside.detectors.detector import Detector
from bedside.detectors.registry import build_detectors
from bedside.detectors.runner import DetectorRunner
from bedside.detectors.telemetry import RunState, TelemetryBatch

WINDOW = 100
BATCH_TARGET_STEPS_PER_S = 50_000
STREAM_TARGET_MS = 1.0
WARM_STEPS = 120
"""Steps streamed before the per-step figures count: the detectors' default warm-ups and the assembly lag."""


def loss_series(steps: int, seed: int = 0) -> pd.DataFrame:
    """A job-level loss curve: a power-law decay, heavy-tailed noise, and a x3 spike every 20,000 steps."""
    rng = np.random.default_rng(seed)
    step = np.arange(steps)
    loss = 2.0 + 8.0 * (step + 10.0) ** -0.3 + 0.02 * rng.standard_t(4, steps)
    loss[10_000::20_000] *= 3.0
    return pd.DataFrame({"timeline": 0, "step": step, "time": 1.8e9 + step, "loss": loss})


def rolling_robust_z(loss: np.ndarray) -> np.ndarray:
    """The baseline: each point's z against the median and MAD of the WINDOW points before it."""
    series = pd.Series(np.log(loss))
    median = series.rolling(WINDOW, min_periods=WINDOW // 2).median().shift(1)
    mad = (series - median).abs().rolling(WINDOW, min_periods=WINDOW // 2).median().shift(1)
    return ((series - median) / (1.4826 * mad)).to_numpy()


def seconds(work: object) -> float:
    started = time.perf_counter()
    work()  # type: ignore[operator]
    return time.perf_counter() - started


def batch_figures(steps: int) -> tuple[float, float, dict[str, int]]:
    """(detect's steps per second, the baseline's, detect's findings by severity)."""
    frame = loss_series(steps)
    found: list = []
    ours = seconds(lambda: found.append(detect(steps=frame)))
    baseline = seconds(lambda: rolling_robust_z(frame["loss"].to_numpy()))
    return steps / ours, steps / baseline, dict(Counter(f.severity.value for f in found[0].findings))


def timed(detector: Detector, spent: list[float]) -> None:
    """Make ``detector`` add the seconds of each of its updates to ``spent`` (whichever path the runner takes)."""
    for name in ("update", "take"):
        method = getattr(detector, name, None)
        if method is not None:

            def clocked(*args: object, method: Callable = method) -> object:
                started = time.perf_counter()
                try:
                    return method(*args)
                finally:
                    spent.append(time.perf_counter() - started)

            setattr(detector, name, clocked)


def stream_figures(ranks: int, steps: int) -> tuple[float, float, dict[str, float]]:
    """(median ms per streamed step through every detector, the numpy baseline's ms per step, each detector's
    median ms per step; ``assembly`` is the rest: the shared step assembly and the run state)."""
    run = simulate(SimulationConfig(ranks=ranks, steps=steps, seed=1, ranks_per_host=8))
    frames = run.frames()
    state = RunState(world_size=frames["world_size"], topology=frames["topology"])
    detectors = build_detectors()
    spent: dict[str, list[float]] = {d.name: [] for d in detectors}
    for detector in detectors:
        timed(detector, spent[detector.name])
    runner = DetectorRunner(detectors, state)
    telemetry = {name: frames[name] for name in ("steps", "rank_steps", "evals", "checkpoints", "events")}
    per_step = []
    for step in range(steps):
        batch = TelemetryBatch(**{name: f[f["step"] == step] for name, f in telemetry.items()})
        per_step.append(seconds(lambda b=batch: runner.update(b)) * 1e3)
    compute = frames["rank_steps"].pivot(index="step", columns="rank", values="compute_time").to_numpy()
    baseline = [
        seconds(lambda row=row: (np.median(row), np.median(np.abs(row - np.median(row))))) * 1e3 for row in compute
    ]
    warm = min(WARM_STEPS, len(per_step) // 2)
    each = {name: 1e3 * statistics.median(times[warm:]) for name, times in spent.items()}
    whole = [total - 1e3 * sum(times[i] for times in spent.values()) for i, total in enumerate(per_step)]
    each["assembly"] = statistics.median(whole[warm:])
    return statistics.median(per_step[warm:]), statistics.median(baseline[warm:]), each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=143_000, help="steps of the batch series (default 143000)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 1024], help="ranks to stream (default 256 1024)")
    parser.add_argument(
        "--stream-steps",
        type=int,
        default=180,
        help=f"steps streamed per rank count, the first {WARM_STEPS} not counted (default 180)",
    )
    args = parser.parse_args()
    ours, baseline, findings = batch_figures(args.steps)
    print(
        f"batch, {args.steps} steps of one loss series with {len(range(10_000, args.steps, 20_000))} spikes: "
        f"detect {ours:,.0f} steps/s (findings by severity: {findings}), "
        f"rolling robust z {baseline:,.0f} steps/s: {baseline / ours:,.0f}x faster; "
        f"target >= {BATCH_TARGET_STEPS_PER_S:,} steps/s: {'met' if ours >= BATCH_TARGET_STEPS_PER_S else 'NOT met'}"
    )
    for ranks in args.ranks:
        ms, base_ms, each = stream_figures(ranks, args.stream_steps)
        print(
            f"streaming, {ranks} ranks: {ms:.2f} ms per step through every detector, numpy baseline "
            f"{base_ms:.3f} ms; target <= {STREAM_TARGET_MS:g} ms at 1,024 ranks"
        )
        print("  " + ", ".join(f"{name} {value:.2f}" for name, value in sorted(each.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
