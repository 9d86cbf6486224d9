"""The simulated signals of a run, as arrays over steps and (ranks, steps) matrices, and what they add up to."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Traces:
    """Every signal before it is written; nuisances and faults change them in place.

    Index ``i`` is step ``steps[i]`` (steps count from 1). Losses and gradient norms are
    kept as logs; rank matrices are (ranks, steps).
    """

    steps: np.ndarray
    lr: np.ndarray
    tokens: np.ndarray
    log_loss: np.ndarray
    loss_add: np.ndarray  # nats added to the loss (bad shards)
    log_grad: np.ndarray
    local_grad: np.ndarray
    eval_log_loss: np.ndarray  # the held-out loss the model would score at each step (no noise)
    eval_noise: np.ndarray
    shards: np.ndarray  # (steps, k) shard ids; data-parallel replica d reads column d % k
    compute: np.ndarray
    data: np.ndarray
    optimizer: np.ndarray
    comm: np.ndarray  # (steps,) seconds of the collective itself, waits excluded
    slowdown: np.ndarray  # (steps,) job-wide factor on every phase (common mode, diurnal, drops)
    nonfinite: dict[int, float] = field(default_factory=dict)  # step index -> NaN or inf loss and grad norm
    corruptions: dict[int, list[int]] = field(default_factory=dict)  # rank -> steps its parameters diverged

    def losses(self) -> np.ndarray:
        loss = np.exp(self.log_loss) + self.loss_add
        return self._with_nonfinite(loss)

    def grad_norms(self) -> np.ndarray:
        return self._with_nonfinite(np.exp(self.log_grad))

    def eval_scores(self, index: np.ndarray) -> np.ndarray:
        """Held-out loss at step indices ``index``."""
        return np.exp(self.eval_log_loss[index] + self.eval_noise[index])

    def _with_nonfinite(self, values: np.ndarray) -> np.ndarray:
        for i, value in self.nonfinite.items():
            values[i] = value
        return values


@dataclass(frozen=True)
class Timing:
    """Phase times as every rank reports them; ``step_time`` (steps,) is the same wall time on every rank."""

    step_time: np.ndarray
    data: np.ndarray
    compute: np.ndarray
    optimizer: np.ndarray
    comm: np.ndarray


def compose_timing(
    data: np.ndarray, compute: np.ndarray, optimizer: np.ndarray, comm: np.ndarray, slowdown: np.ndarray | None = None
) -> Timing:
    """A synchronous step: it lasts as long as the slowest rank's own work plus the collective.

    ``data``, ``compute`` and ``optimizer`` are (ranks, steps) seconds, ``comm`` (steps,) the
    collective itself and ``slowdown`` (steps,) a job-wide factor on all of them, applied to the
    matrices in place. Each rank waits in the collective for the slowest, so its ``comm_time``
    is the step time less its own data, compute and optimizer time.
    """
    if slowdown is not None:
        for phase in (data, compute, optimizer):
            phase *= slowdown[None, :]
        comm = comm * slowdown
    busy = data + compute
    busy += optimizer
    step_time = busy.max(axis=0) + comm
    np.subtract(step_time[None, :], busy, out=busy)
    return Timing(step_time, data, compute, optimizer, busy)
