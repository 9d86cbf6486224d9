"""A DDP communication hook that sees each rank's gradients before the all-reduce (``LocalGrads``).

The rank's loss rides with the last bucket, so the job's mean loss costs no collective
of its own.

No ``from __future__ import annotations`` here: DDP checks the hook's annotations at
registration and needs real types, not strings.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .grads import LocalGrads


def allreduce_with_local_norm(state: LocalGrads, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce, after ``state`` has seen the bucket (no sync)."""
    state.observe(bucket.buffer())
    state.last_bucket_ready = state.clock.mark()
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
