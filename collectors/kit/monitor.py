"""``Monitor``: the kit wired to one rank's model and optimizer, in two lines.

```python
monitor = Monitor(RunLogger(run_dir), model, optimizer, shape=shape, tokens_per_step=tokens)
for step in range(1, steps + 1):
    with monitor.step(step) as s:      # the data phase starts
        x, y = next(batches)
        s.compute()                    # data ends; forward and backward begin
        s.backward(loss_fn(model(x), y))
        optimizer.step()               # the optimizer phase, until the block ends
        optimizer.zero_grad()
```

At the end of each block this rank's ``rank_step`` record is queued (phase times, local
gradient norm, local loss, the GradScaler's state, every ``checksum_every`` steps the
parameter digest) and, on the logger's job rank, the job's ``step`` record (mean loss,
gradient norm, lr, tokens, FLOPs, MFU). Nothing in the step waits for the device: every
value stays a tensor or a CUDA event until the writer thread reads it. The one collective
of its own is under FSDP2: the loss mean and the shards' squared gradient norms, in one
two-element all-reduce (under DDP the loss rides with a gradient bucket, and the reduced
gradients, alike on every rank, give the norm).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.nn.parallel import DistributedDataParallel

from bedside.collectors.capture import Later
from bedside.collectors.format import RunEndStatus
from bedside.collectors.writer import RunLogger

from .checksum import param_checksum
from .flops import ModelShape, flops_per_token
from .grads import GradientObserver, LocalGrads, local, total_grad_norm, watch_gradients
from .runqueue import waited_between
from .scaler import ScalerState
from .timers import clock_for, phase_times


class Monitor:
    """Telemetry of one rank's training loop: ``with monitor.step(step) as s: ...`` per step.

    ``logger`` is a ``RunLogger`` or a run directory (a logger is then made and closed by
    ``close()``). ``model`` is the module the loop trains: a ``DistributedDataParallel``
    (a comm hook is registered), a model with FSDP2 ``fully_shard`` modules (a custom
    reduce-scatter is set on each), or a plain module. ``shape`` and ``tokens_per_step``
    (the whole job's tokens per optimizer step) give tokens and FLOPs per step;
    ``peak_flops`` (one device's peak) adds MFU. ``scaler`` is the loop's
    ``torch.amp.GradScaler`` (the local gradient norm is then divided by the loss scale, on the
    device). ``checksum_every`` steps (0: never) the parameters are
    digested on device. ``on_gradients(step, flat)`` sees each gradient bucket before
    its reduction. ``grad_norm``: record the job's gradient norm after backward (before any
    clip), at the cost of one pass over the gradients, as a clip takes; False for a loop
    that records its own (``s.record_job(grad_norm=...)``). Not recorded with a GradScaler
    (an overflow step's norm is infinite), nor under FSDP2 with replicas (HSDP).
    """

    def __init__(
        self,
        logger: RunLogger | str | Path,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        shape: ModelShape | None = None,
        tokens_per_step: int | None = None,
        peak_flops: float | None = None,
        scaler: Any = None,
        checksum_every: int = 50,
        on_gradients: GradientObserver | None = None,
        grad_norm: bool = True,
    ) -> None:
        if checksum_every < 0:
            raise ValueError(f"checksum_every must be >= 0 (0: never), got {checksum_every}")
        if shape is not None and tokens_per_step is None:
            raise ValueError("shape needs tokens_per_step (the job's tokens per optimizer step) to count FLOPs")
        if peak_flops is not None and (shape is None or peak_flops <= 0):
            raise ValueError(f"peak_flops needs a shape and must be > 0, got {peak_flops!r}")
        first = next(model.parameters(), None)
        if first is None:
            raise ValueError(f"the model ({type(model).__name__}) has no parameters to monitor")
        self._owns_logger = not isinstance(logger, RunLogger)
        self.logger = RunLogger(logger) if not isinstance(logger, RunLogger) else logger
        self.model, self.optimizer = model, optimizer
        self.digested = model.module if isinstance(model, DistributedDataParallel) else model
        self.device = first.device
        self.grads = LocalGrads(on_gradients=on_gradients, clock=clock_for(self.device))
        watch_gradients(model, self.grads)
        self.scaler = None if scaler is None else ScalerState(scaler)
        self.checksum_every = checksum_every
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = None if shape is None else flops_per_token(shape) * (tokens_per_step or 0)
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.sharded = self.grads.hooked and not isinstance(model, DistributedDataParallel)
        known = _sharded_once(model) if self.sharded else self.grads.hooked or self.world_size == 1
        self.grad_norm = grad_norm and scaler is None and known
        """Whether the job's norm is recorded: known from this rank's gradients (one process's, DDP's alike
        reduced replicas, or FSDP2's shards, each element on one rank only, summed over the ranks), and no
        GradScaler (its overflow steps' norms are infinite by design; a nonfinite alarm would follow)."""
        self.peak_flops = None if peak_flops is None else peak_flops * self.world_size

    def step(self, step: int) -> StepScope:
        """The scope of one optimizer step: ``with monitor.step(step) as s:``."""
        return StepScope(self, step)

    def emit(self, scope: StepScope) -> None:
        """Queue the records of a finished step (called when its ``with`` block ends)."""
        times = phase_times(self.grads.clock, scope.marks())
        metrics: dict[str, Any] = {**times, "local_grad_norm": scope.local_grad_norm, "local_loss": scope.loss}
        cpu_wait = scope.cpu_wait()
        if cpu_wait is not None:
            metrics["cpu_wait_time"] = cpu_wait
        if self.scaler is not None:
            metrics.update(self.scaler.after_step())
        metrics.update(scope.rank_metrics)
        due = self.checksum_every and scope.number % self.checksum_every == 0
        checksum = param_checksum(self.digested) if due else None
        self.logger.rank_step(scope.number, param_checksum=checksum, **metrics)
        mean_loss, grad_norm = self._job_loss_and_norm(scope)  # a collective under FSDP2: every rank gets here
        if self.logger.rank == self.logger.job_rank:
            metrics = {**self._job_metrics(mean_loss, grad_norm, times["step_time"]), **scope.job_metrics}
            self.logger.step(scope.number, shards=scope.shards, **metrics)

    def close(self, status: str = RunEndStatus.FINISHED, message: str | None = None) -> None:
        """Close the logger if the monitor made it (a logger handed in is the caller's to close)."""
        if self._owns_logger:
            self.logger.close(status, message)

    def _job_loss_and_norm(self, scope: StepScope) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The mean of the ranks' losses and the job's gradient norm, as tensors (None when unknown)."""
        loss, squared = scope.loss, scope.grad_squared
        if self.sharded and self.world_size > 1 and (loss is not None or squared is not None):  # one for both
            zero = torch.zeros((), device=self.device)
            both = torch.stack([zero if t is None else t.float() for t in (loss, squared)])
            dist.all_reduce(both)  # read later by the writer thread
            loss = None if loss is None else both[0] / self.world_size
            return loss, None if squared is None else both[1].sqrt()
        norm = None if squared is None else squared.sqrt()
        if loss is None or self.grads.mean_loss is not None or self.world_size == 1:
            return self.grads.mean_loss if self.grads.mean_loss is not None else loss, norm  # DDP: rode a bucket
        mean = loss.clone()
        dist.all_reduce(mean)
        return mean / self.world_size, norm

    def _job_metrics(
        self, mean_loss: torch.Tensor | None, grad_norm: torch.Tensor | None, step_time: Any
    ) -> dict[str, Any]:
        metrics: dict[str, Any] = {"loss": mean_loss}
        if grad_norm is not None:
            metrics["grad_norm"] = grad_norm
        if self.optimizer is not None:
            metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        if self.tokens_per_step is not None:
            metrics["tokens"] = self.tokens_per_step
        if self.flops_per_step is not None:
            metrics["flops"] = self.flops_per_step
            if self.peak_flops is not None:
                metrics["mfu"] = _utilisation(self.flops_per_step / self.peak_flops, step_time)
        return metrics


class StepScope:
    """One step's phases and extra metrics; phases end at ``compute()``, ``backward()``/``optimizer()``
    and the end of the ``with`` block. A block left by an exception records nothing."""

    def __init__(self, monitor: Monitor, step: int) -> None:
        self.monitor, self.number = monitor, step
        self.loss: torch.Tensor | None = None
        self.local_grad_norm: torch.Tensor | None = None
        self.grad_squared: torch.Tensor | None = None
        """The squared norm of this rank's gradients after backward (a shard's under FSDP2); None where the
        monitor records no job norm, and on DDP's ranks other than the job rank."""
        self.rank_metrics: dict[str, Any] = {}
        self.job_metrics: dict[str, Any] = {}
        self.shards: list[int | str] | None = None
        self._start: Any = None
        self._data_end: Any = None
        self._backward_end: Any = None
        self._end: Any = None
        self._waited: float | None = None
        self._waited_at_backward_end: float | None = None

    def __enter__(self) -> StepScope:
        self.monitor.grads.reset(self.number)
        self._waited = self.monitor.grads.run_queue.read()
        self._start = self.monitor.grads.clock.mark()
        return self

    def compute(self) -> None:
        """The batch is ready: the data phase ends, forward and backward begin."""
        self._data_end = self.monitor.grads.clock.mark()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` (scaled by the GradScaler when there is one), then the optimizer phase
        begins. Under DDP the loss rides with a gradient bucket's all-reduce."""
        monitor = self.monitor
        monitor.grads.loss = loss
        (loss if monitor.scaler is None else monitor.scaler.scaler.scale(loss)).backward()
        self.optimizer(loss)

    def optimizer(self, loss: torch.Tensor | None = None) -> None:
        """Backward is done (for a loop that calls backward itself): the optimizer phase begins.
        ``loss`` is this rank's loss of the step, if the loop wants it recorded."""
        monitor = self.monitor
        self._backward_end = monitor.grads.clock.mark()
        self._waited_at_backward_end = monitor.grads.run_queue.read()
        if loss is not None:
            self.loss = loss.detach()
        norm = monitor.grads.local_grad_norm()
        if norm is None and not monitor.grads.hooked:  # nothing reduced: the gradients are local
            norm = total_grad_norm(monitor.model.parameters())
        scale = None if monitor.scaler is None else monitor.scaler.before_step()
        self.local_grad_norm = norm if norm is None or scale is None else norm / scale  # of the unscaled gradients
        if monitor.grad_norm and (monitor.sharded or monitor.logger.rank == monitor.logger.job_rank):
            held = (
                norm
                if not monitor.grads.hooked
                else _norm([local(p.grad) for p in monitor.model.parameters() if p.grad is not None])
            )
            if held is not None:
                self.grad_squared = held.float().square()

    def record(self, **metrics: Any) -> None:
        """More of this rank's metrics of the step (``rank_step``)."""
        self.rank_metrics.update(metrics)

    def record_job(self, *, shards: list[int | str] | None = None, **metrics: Any) -> None:
        """More of the job's metrics of the step (``step``: grad_norm, ...), and the data shards it
        read; kept by the job rank only, so every rank may call it."""
        self.job_metrics.update(metrics)
        self.shards = shards if shards is not None else self.shards

    def marks(self) -> tuple[Any, ...]:
        """Start, then the end of each phase; a phase the loop did not mark takes no time."""
        data_end = self._start if self._data_end is None else self._data_end
        backward_end = self._end if self._backward_end is None else self._backward_end
        ready = self.monitor.grads.last_bucket_ready
        compute_end = backward_end if ready is None or self._backward_end is None else ready
        return (self._start, data_end, compute_end, backward_end, self._end)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self._end = self.monitor.grads.clock.mark()
            if self._backward_end is None:
                self._waited_at_backward_end = self.monitor.grads.run_queue.read()
            self.monitor.emit(self)

    def cpu_wait(self) -> float | None:
        """Seconds this rank's thread waited for a CPU over the data and compute phases (to the last gradient
        bucket ready where a comm hook saw it, else to the end of backward); None where unknown."""
        grads = self.monitor.grads
        hooked = grads.last_bucket_ready is not None and self._backward_end is not None
        end = grads.waited_at_ready if hooked else self._waited_at_backward_end
        return waited_between(self._waited, end)


def _sharded_once(model: nn.Module) -> bool:
    """Whether every parameter is a DTensor sharded over a one-dimensional mesh of the whole world (plain
    FSDP2): the squares of the ranks' shards then sum to the whole. Replicas (HSDP, tensor-parallel
    replicated parameters) or parameters outside any ``fully_shard`` would be counted more than once."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    return all(
        isinstance(p, DTensor)
        and p.device_mesh.ndim == 1
        and p.device_mesh.size() == world
        and all(isinstance(place, Shard) for place in p.placements)
        for p in model.parameters()
    )


def _norm(gradients: list[torch.Tensor]) -> torch.Tensor | None:
    return nn.utils.get_total_norm(gradients, foreach=True) if gradients else None


def _utilisation(flops_over_peak: float, step_time: Any) -> Any:
    """Achieved over peak FLOP/s for a step time that is a number or read later."""
    if isinstance(step_time, Later):
        return Later(lambda: _ratio(flops_over_peak, step_time.item()))
    return _ratio(flops_over_peak, step_time)


def _ratio(flops_over_peak: float, step_time: float) -> float:
    return flops_over_peak / step_time if step_time > 0 else 0.0
