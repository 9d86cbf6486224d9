"""What each fault does to the simulated signals (the signatures are in docs/simulate.md)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .config import SimulationConfig
from .faults import SPIKE_DECAY_STEPS, Fault
from .traces import Traces

GRAD_PER_SIGMA = 0.1  # a spike of ``sigma`` raises the gradient norm by 1 + 0.1 * sigma at its peak
DIVERGE_GROWTH, DIVERGE_MAX = 0.05, 4.0  # a divergent spike's excess grows by 5% of itself per step, to 4x
BAD_SHARD_GRAD = 0.5  # a replica reading a bad shard has its gradient norm raised by 1 + 0.5 * excess


def apply_fault(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """Change ``traces`` as ``fault`` would."""
    EFFECTS[fault.name](fault, traces, config)


def _covered(fault: Fault, traces: Traces) -> np.ndarray:
    return np.flatnonzero(fault.window.covers(traces.steps))


def spike(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """Loss up by ``sigma`` noise deviations at the peak; the gradient norm with it, or leading it."""
    sigma, shape, lead = fault.settings["sigma"], fault.settings["shape"], fault.settings["lead"]
    after = traces.steps - fault.settings["peak"]
    if shape == "single":
        profile = (after == 0).astype(float)
    elif shape == "grad_leading":
        profile = (after >= 0) * np.exp(-after.clip(0) / SPIKE_DECAY_STEPS)
    else:
        profile = (after >= 0) * np.minimum(1 + DIVERGE_GROWTH * after.clip(0), DIVERGE_MAX)
    traces.log_loss += sigma * config.model.loss_sigma * profile
    if shape == "divergent":
        traces.eval_log_loss += sigma * config.model.loss_sigma * profile
    if shape == "grad_leading":
        ramp = (after >= -lead) & (after < 0)
        profile = np.where(ramp, (after + lead + 1) / (lead + 1), profile)
    grad = np.log1p(GRAD_PER_SIGMA * sigma * profile)
    traces.log_grad += grad
    traces.local_grad *= np.exp(grad)[None, :]


def nonfinite(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """The loss and the all-reduced gradient norm are NaN (or inf); so is the targeted rank's local norm."""
    value = math.nan if fault.name == "nan" else math.inf
    for i in _covered(fault, traces):
        traces.nonfinite[int(i)] = value
        traces.local_grad[list(fault.ranks), i] = value


def straggler(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """The ranks' compute takes ``factor`` times as long; with ``phase=data`` the same delay is spent on data."""
    cells = np.ix_(np.asarray(fault.ranks, dtype=np.intp), _covered(fault, traces))
    delay = (fault.settings["factor"] - 1) * traces.compute[cells]
    phase = traces.compute if fault.settings["phase"] == "compute" else traces.data
    phase[cells] += delay


def sdc_grad(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """The ranks' local gradients are scaled by 2**scale_log2 before the all-reduce, which averages the error in."""
    covered = _covered(fault, traces)
    cells = np.ix_(np.asarray(fault.ranks, dtype=np.intp), covered)
    scale = 2.0 ** fault.settings["scale_log2"]
    error = ((scale - 1) / config.topology.dp_size * traces.local_grad[cells]) ** 2
    traces.local_grad[cells] *= scale
    traces.log_grad[covered] = 0.5 * np.log(np.exp(2 * traces.log_grad[covered]) + error.sum(axis=0))


def diverge(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """The ranks' parameters leave their replicas' at each covered step: only the checksums tell."""
    steps = traces.steps[_covered(fault, traces)].tolist()
    for rank in fault.ranks:
        traces.corruptions.setdefault(rank, []).extend(steps)


def eval_stall(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """The held-out loss stays where it was at the first step; training loss and throughput are untouched."""
    first = fault.window.first - 1
    last = len(traces.steps) if fault.window.last is None else fault.window.last
    traces.eval_log_loss[first:last] = traces.eval_log_loss[first]


def bad_shard(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """Samples of the shards add ``excess`` nats to the loss, weighted by the share of replicas reading them."""
    low, high = fault.settings["shards"]
    excess, dp = fault.settings["excess"], config.topology.dp()
    columns = traces.shards.shape[1]
    bad = (traces.shards >= low) & (traces.shards <= high) & fault.window.covers(traces.steps)[:, None]
    readers = np.bincount(dp % columns, minlength=columns) / config.topology.dp_size
    traces.loss_add += excess * (bad * readers).sum(axis=1)
    traces.local_grad[bad[:, dp % columns].T] *= 1 + BAD_SHARD_GRAD * excess


def throughput_drop(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """Every phase of every rank slows down so that the job's throughput is ``factor`` of what it was."""
    traces.slowdown[_covered(fault, traces)] /= fault.settings["factor"]


def hang(fault: Fault, traces: Traces, config: SimulationConfig) -> None:
    """Nothing changes before the hang; the run's files stop at it (``SimulationConfig.last_step``)."""


EFFECTS: dict[str, Callable[[Fault, Traces, SimulationConfig], None]] = {
    "spike": spike,
    "nan": nonfinite,
    "inf": nonfinite,
    "straggler": straggler,
    "sdc_grad": sdc_grad,
    "sdc_quiet": diverge,
    "param_corrupt": diverge,
    "eval_stall": eval_stall,
    "hang": hang,
    "bad_shard": bad_shard,
    "throughput_drop": throughput_drop,
}
