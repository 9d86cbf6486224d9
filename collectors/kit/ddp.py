"""A DDP communication hook that sees each rank's gradients before the all-reduce (``LocalGrads``).

The rank's loss rides with the step's first bucket of at most ``RIDE_ALONG_MAX`` elements
(DDP caps the first bucket ready at about 1 MB), or with the last bucket if none is that small:
the job's mean loss costs no collective of its own, only a copy of one bucket.

No ``from __future__ import annotations`` here: DDP checks the hook's annotations at
registration and needs real types, not strings.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .grads import LocalGrads

RIDE_ALONG_MAX = 1 << 20
"""Elements of a bucket up to which appending the loss is cheap (4 MB of fp32; DDP's first
bucket of a step, capped at 1 MB plus the parameter that crosses the cap, usually fits; the
copy costs about 0.5 ns an element twice on a CPU, where a collective of its own costs a
round trip between the ranks: 0.1 ms on an idle gloo host, milliseconds on a busy one)."""


def allreduce_with_local_norm(state: LocalGrads, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce, after ``state`` has seen the bucket (no sync); the step's loss
    rides with its first small bucket, or else with its last."""
    state.observe(bucket.buffer())
    state.last_bucket_ready, state.waited_at_ready = state.clock.mark(), state.run_queue.read()
    loss = state.loss
    if loss is not None and (bucket.buffer().numel() <= RIDE_ALONG_MAX or bucket.is_last()):
        state.loss = None  # it rides once
        return _allreduce_with_loss(state, bucket, loss)
    # torch reduces over the default group when given None, though its annotation leaves None out
    return default_hooks.allreduce_hook(state.process_group, bucket)  # type: ignore[arg-type]


def _allreduce_with_loss(
    state: LocalGrads, bucket: dist.GradBucket, loss: torch.Tensor
) -> torch.futures.Future[torch.Tensor]:
    """A bucket's all-reduce with this rank's loss appended: the job's mean loss
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
