"""FSDP2's reduce-scatter with this rank's gradients seen first (``LocalGrads``).

Installed with ``FSDPModule.set_custom_reduce_scatter``: its input is this rank's full,
unreduced gradient of one FSDP group (one ``fully_shard`` module), flattened and
zero-padded. (With a reduce dtype that risks overflow, fp16, FSDP2 divides the input by
about sqrt(world size) first; the recorded norm is then of the divided gradients.)

Timing: ``last_bucket_ready`` is the mark of the last group's reduce-scatter issue, moved
back by the time earlier reduce-scatters blocked the host (on CPU/gloo they are
synchronous; on CUDA they run on their own stream and block ~0 s). So compute is forward
plus backward without blocking communication, and comm is the time blocked in
reduce-scatters plus the wait from the last one to the end of backward.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from .grads import LocalGrads


class ReduceScatterWithLocalNorm(ReduceScatter):
    """FSDP2's default reduce-scatter, after ``LocalGrads`` has seen the input (no sync)."""

    def __init__(self, grads: LocalGrads) -> None:
        self.grads = grads

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: dist.ReduceOp,
        async_op: bool = False,
    ) -> dist.Work | None:
        state = self.grads
        issued = time.perf_counter()
        state.last_bucket_ready = state.clock.mark_unblocked(state.blocked_s)
        state.waited_at_ready = state.run_queue.read()
        state.observe(input_tensor)
        work = dist.reduce_scatter_single(
            output=output_tensor, input=input_tensor, op=op, group=group, async_op=async_op
        )
        state.blocked_s += time.perf_counter() - issued
        return work
