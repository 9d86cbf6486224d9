"""Data parallelism: DDP or FSDP2 (``fully_shard``, ZeRO-3 style), chosen by ``TrainConfig.parallelism``.

``wrap`` returns the module to train (it runs forward and backward) and the core
``Transformer`` (its parameters, state dict, ``loss`` and evaluation forward). Under
DDP the core is ``ddp.module``; under FSDP2 the root module is both, its parameters
are DTensors sharded on a 1-D ``dp`` mesh and each rank holds only its shards. The
instrumentation kit's ``Monitor`` then hooks the gradients of either before their
reduction (a DDP comm hook, or a custom reduce-scatter on each FSDP2 module).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from .model import Transformer


def wrap(model: Transformer, parallelism: str, device: torch.device) -> tuple[nn.Module, Transformer]:
    """``(module to train, core Transformer)`` for ``"ddp"`` or ``"fsdp"``."""
    if parallelism == "ddp":
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, model
    if parallelism == "fsdp":
        return shard(model, device), model
    raise ValueError(f"unknown parallelism {parallelism!r}")


def shard(model: Transformer, device: torch.device) -> Transformer:
    """``fully_shard`` each block, then the root (embeddings, final norm, head) on a 1-D ``dp`` mesh."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    for module in (*model.blocks, model):
        fully_shard(module, mesh=mesh)
    return model


__all__ = ["shard", "wrap"]
