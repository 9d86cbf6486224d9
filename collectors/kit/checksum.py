"""A digest of a replica's parameters computed on its device: no host read in the step.

Each tensor of the module's state dict (this rank's shard of a DTensor) is read as integers
of its element width and summed on its device (wrapping int64); the sums are weighted by
position, so a change of one bit of one element changes the digest. The result is a
one-element int64 tensor: hand it to ``RunLogger.rank_step(param_checksum=...)``, whose
writer thread writes it as 16 hex digits (the 64 bits, unsigned) once the device is done.
DDP replicas must agree bit for bit; under FSDP each rank digests its own shards.
"""

from __future__ import annotations

import torch
from torch import nn

from .grads import local

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def param_checksum(module: nn.Module) -> torch.Tensor:
    """The digest of ``module``'s state dict (parameters and buffers), as an int64 tensor on its device."""
    tensors = list(module.state_dict().values())
    if not tensors:
        raise ValueError("param_checksum: the module has no parameters or buffers to digest")
    sums = [bit_sum(local(t)) * (i + 1) for i, t in enumerate(tensors)]
    return torch.stack(sums).sum()


def bit_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of a tensor's elements read as integers of their width (int64, on its device)."""
    bits = tensor.detach().contiguous().view(_INT_OF_SIZE[tensor.element_size()])
    return bits.sum(dtype=torch.int64)
