"""Data parallelism: DDP or FSDP2 (``fully_shard``, ZeRO-3 style), chosen by ``TrainConfig.parallelism``.

``wrap`` returns the module to train (it runs forward and backward) and the core
``Transformer`` (its parameters, state dict, ``loss`` and evaluation forward). Under
DDP the core is ``ddp.module``; under FSDP2 the root module is both, its parameters
are DTensors sharded on a 1-D ``dp`` mesh and each rank holds only its shards.

Both strategies see each rank's gradients before the reduction, without a sync:

- DDP through the comm hook in ``ddp_hooks.py`` (per bucket, before the all-reduce);
- FSDP2 through a custom reduce-scatter (``FSDPModule.set_custom_reduce_scatter``):
  its input is this rank's full, unreduced gradient of one FSDP group (one block, or
  the root's embeddings and head), flattened and zero-padded. It adds the group's
  squared norm to ``LocalGrads``, injects gradient faults, and marks the moment the
  last group was ready, as the DDP hook does.

Timing under FSDP2: ``LocalGrads.last_bucket_ready`` is the time the last group's
reduce-scatter was issued, moved back by the time earlier reduce-scatters blocked
the host (on CPU/gloo they are synchronous; on CUDA they are issued on their own
stream and block ~0 s). So compute is forward + backward without blocking comm, and
comm is the time blocked in reduce-scatters plus the wait from the last one to the
end of backward.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from .ddp_hooks import LocalGrads, allreduce_with_local_norm
from .model import Transformer


def wrap(
    model: Transformer, parallelism: str, device: torch.device, grads: LocalGrads
) -> tuple[nn.Module, Transformer]:
    """``(module to train, core Transformer)`` for ``"ddp"`` or ``"fsdp"``, instrumented through ``grads``."""
    if parallelism == "ddp":
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        ddp.register_comm_hook(state=grads, hook=allreduce_with_local_norm)
        return ddp, model
    if parallelism == "fsdp":
        return shard(model, device, grads), model
    raise ValueError(f"unknown parallelism {parallelism!r}")


def shard(model: Transformer, device: torch.device, grads: LocalGrads) -> Transformer:
    """``fully_shard`` each block, then the root (embeddings, final norm, head) on a 1-D ``dp`` mesh."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    comm = ReduceScatterWithLocalNorm(grads)
    for module in (*model.blocks, model):
        fully_shard(module, mesh=mesh)
        module.set_custom_reduce_scatter(comm)
    return model


class ReduceScatterWithLocalNorm(ReduceScatter):
    """FSDP2's default reduce-scatter, after recording the input's squared norm in ``LocalGrads`` (no sync)."""

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
        state.observe(input_tensor)
        state.last_bucket_ready = issued - state.blocked_s
        work = dist.reduce_scatter_single(
            output=output_tensor, input=input_tensor, op=op, group=group, async_op=async_op
        )
        state.blocked_s += time.perf_counter() - issued
        return work


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip to ``max_norm``; the total norm over all ranks' shards as a plain tensor (as torchtitan does).

    Under DDP this is ``clip_grad_norm_``. Under FSDP2 the norm of DTensor gradients is a
    partial DTensor: ``full_tensor()`` all-reduces it (one scalar) before the clip.
    """
    parameters = [p for p in parameters if p.grad is not None]
    total = nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None], foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    nn.utils.clip_grads_with_norm_(parameters, max_norm, total, foreach=True)
    return total


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor, else the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


__all__ = ["ReduceScatterWithLocalNorm", "clip_grad_norm", "local", "shard", "wrap"]
