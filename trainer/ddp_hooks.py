"""A DDP communication hook that sees each rank's gradients before the all-reduce.

It records this rank's local gradient norm (a device tensor, no sync) and the
moment the last gradient bucket was ready, which splits backward into local
compute and the wait for the all-reduce: a slow rank shows long compute, its
peers show long communication waits. The rank's loss rides with the last bucket,
so the job's mean loss costs no collective of its own.

No ``from __future__ import annotations`` here: DDP checks the hook's
annotations at registration and needs real types, not strings.
"""

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .faults import FaultPlan


class LocalGrads:
    """The hook's state: squared local gradient norm and last-bucket time of the current backward.

    ``blocked_s`` is the host time spent inside reduction calls so far (FSDP2's
    reduce-scatters on gloo block; DDP's all-reduce hook never does and leaves it 0).
    """

    def __init__(self, faults: FaultPlan, process_group: dist.ProcessGroup | None = None) -> None:
        self.faults = faults
        self.process_group = process_group
        self.step = 0
        self.squared_norm: torch.Tensor | None = None
        self.last_bucket_ready = 0.0
        self.blocked_s = 0.0
        self.loss: torch.Tensor | None = None
        self.mean_loss: torch.Tensor | None = None

    def reset(self, step: int, loss: torch.Tensor | None = None) -> None:
        """Start a backward pass; ``loss`` rides along with the last bucket's all-reduce (DDP)."""
        self.step = step
        self.squared_norm = None
        self.blocked_s = 0.0
        self.loss, self.mean_loss = loss, None

    def local_grad_norm(self) -> torch.Tensor | None:
        return None if self.squared_norm is None else self.squared_norm.sqrt()

    def observe(self, gradients: torch.Tensor) -> None:
        """See one flat group of this rank's gradients before their reduction: inject gradient
        corruption (where a faulty chip's error would enter), then add their squared norm (no sync)."""
        self.faults.corrupt_gradients(self.step, gradients)
        squared = gradients.detach().float().pow(2).sum()
        self.squared_norm = squared if self.squared_norm is None else self.squared_norm + squared


def allreduce_with_local_norm(state: LocalGrads, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce, after ``state`` has seen the bucket (no sync)."""
    state.observe(bucket.buffer())
    state.last_bucket_ready = time.perf_counter()
    loss = state.loss
    if loss is None or not bucket.is_last():
        # torch reduces over the default group when given None, though its annotation leaves None out
        return default_hooks.allreduce_hook(state.process_group, bucket)  # type: ignore[arg-type]
    return _allreduce_with_loss(state, bucket, loss)


def _allreduce_with_loss(
    state: LocalGrads, bucket: dist.GradBucket, loss: torch.Tensor
) -> torch.futures.Future[torch.Tensor]:
    """The last bucket's all-reduce with this rank's loss appended: the job's mean loss
    arrives with the gradients, with no collective of its own (``state.mean_loss``)."""
    gradients = bucket.buffer()
    group = state.process_group or dist.group.WORLD
    packed = torch.cat([gradients, loss.detach().reshape(1).to(gradients.dtype)])
    packed.div_(dist.get_world_size(group))
    reduction = dist.all_reduce(packed, group=group, async_op=True).get_future()

    def unpack(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        reduced = done.value()[0]
        state.mean_loss = reduced[-1]
        gradients.copy_(reduced[:-1])
        return gradients

    return reduction.then(unpack)
