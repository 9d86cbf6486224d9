"""A DDP communication hook that sees each rank's gradients before the all-reduce.

It records this rank's local gradient norm (a device tensor, no sync) and the
moment the last gradient bucket was ready, which splits backward into local
compute and the wait for the all-reduce: a slow rank shows long compute, its
peers show long communication waits.

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

    def reset(self, step: int) -> None:
        self.step = step
        self.squared_norm = None
        self.blocked_s = 0.0

    def local_grad_norm(self) -> torch.Tensor | None:
        return None if self.squared_norm is None else self.squared_norm.sqrt()


def allreduce_with_local_norm(state: LocalGrads, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce, after adding the bucket's squared norm to ``state`` (no sync).

    Injected gradient corruption (silent data corruption) happens here, before the
    norm and the all-reduce, where a faulty chip's error would enter.
    """
    state.faults.corrupt_gradients(state.step, bucket.buffer())
    squared = bucket.buffer().detach().float().pow(2).sum()
    state.squared_norm = squared if state.squared_norm is None else state.squared_norm + squared
    state.last_bucket_ready = time.perf_counter()
    return default_hooks.allreduce_hook(state.process_group, bucket)
