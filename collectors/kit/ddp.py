"""A DDP communication hook that sees each rank's gradients before the all-reduce (``LocalGrads``).

The rank's loss rides with the last bucket when that bucket is small (appending it costs
a copy of the bucket, cheaper than a collective's latency up to ``RIDE_ALONG_MAX``
elements); with a bigger last bucket it is all-reduced on its own, asynchronously, right
after the bucket's all-reduce is issued, and backward waits for both.

No ``from __future__ import annotations`` here: DDP checks the hook's annotations at
registration and needs real types, not strings.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .grads import LocalGrads

RIDE_ALONG_MAX = 1 << 18
"""Elements of a last bucket up to which the loss is appended to it (about 1 MB of fp32):
copying it costs ~0.5 ns an element twice, a separate gloo all-reduce ~0.1 ms."""


def allreduce_with_local_norm(state: LocalGrads, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce, after ``state`` has seen the bucket (no sync)."""
    state.observe(bucket.buffer())
    state.last_bucket_ready = state.clock.mark()
    loss = state.loss
    if loss is not None and bucket.is_last() and bucket.buffer().numel() <= RIDE_ALONG_MAX:
        return _allreduce_with_loss(state, bucket, loss)
    # torch reduces over the default group when given None, though its annotation leaves None out
    reduced = default_hooks.allreduce_hook(state.process_group, bucket)  # type: ignore[arg-type]
    if loss is None or not bucket.is_last():
        return reduced
    return _then_mean_loss(state, reduced, loss)


def _then_mean_loss(
    state: LocalGrads, reduced: torch.futures.Future[torch.Tensor], loss: torch.Tensor
) -> torch.futures.Future[torch.Tensor]:
    """The bucket's reduction, done once this rank's loss is all-reduced too (``state.mean_loss``)."""
    group = state.process_group or dist.group.WORLD
    mean = loss.detach().reshape(1) / dist.get_world_size(group)
    loss_done = dist.all_reduce(mean, group=group, async_op=True).get_future()

    def both(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        loss_done.wait()
        state.mean_loss = mean[0]
        return done.value()

    return reduced.then(both)


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
