"""A plain user training loop (not bedside's trainer) instrumented with the kit's ``Monitor``.

Run under torchrun on gloo: ``kit_loop.py ddp|fsdp RUN STEPS``. Beside the run it writes
``RUN-expected-RANK.json``: per step, the norm of this rank's unreduced gradients computed
directly on an unwrapped replica of the model with the same weights and batch; and
``RUN-expected-job.json``: per step, the norm of the reduced gradients after backward, read
from the trained model's whole gradients (gathered under FSDP2). Under DDP,
rank 1 flips one bit of its parameters after step ``FLIP_AFTER`` (a corrupting chip).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from bedside.collectors.kit import ModelShape, Monitor
from bedside.collectors.writer import RunLogger
from bedside.trainer.train import exit_without_teardown

FLIP_AFTER = 10
BATCH, SEQ = 4, 2
SHAPE = ModelShape(n_layers=1, d_model=8, d_mlp=16, seq_len=SEQ, vocab_size=4)


def tiny_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def unreduced_norm(reference: nn.Module, trained: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """This rank's gradient norm before any reduction, on a plain replica holding the trained weights."""
    weights = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in trained.state_dict().items()}
    reference.load_state_dict({k.removeprefix("module."): v for k, v in weights.items()})
    reference.zero_grad()
    F.mse_loss(reference(x), y).backward()
    return float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in reference.parameters()])))


def reduced_norm(trained: nn.Module) -> float:
    """The norm of the gradients the optimizer will apply, whole (an all-gather of each shard under FSDP2)."""
    grads = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in trained.parameters()]
    return float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))


def main(mode: str, run: Path, steps: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_model()
    reference = tiny_model()
    if mode == "fsdp":
        for layer in (model[0], model[2]):
            fully_shard(layer)
        trained: nn.Module = fully_shard(model)
    else:
        trained = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.05)
    logger = RunLogger(run, config={"mode": mode})
    monitor = Monitor(logger, trained, optimizer, shape=SHAPE, tokens_per_step=BATCH * SEQ * world, checksum_every=2)
    batches = torch.Generator().manual_seed(rank + 1)
    expected, job = [], []
    for step in range(1, steps + 1):
        with monitor.step(step) as s:
            x, y = torch.randn(BATCH, 8, generator=batches), torch.randn(BATCH, 4, generator=batches)
            expected.append(unreduced_norm(reference, trained, x, y))
            s.compute()
            s.backward(F.mse_loss(trained(x), y))
            job.append(reduced_norm(trained))
            optimizer.step()
            optimizer.zero_grad()
        if mode == "ddp" and rank == 1 and step == FLIP_AFTER:
            with torch.no_grad():
                model[0].weight.view(-1).view(torch.int32)[3] ^= 1 << 22
    logger.close()
    Path(f"{run}-expected-{rank}.json").write_text(json.dumps(expected))
    if rank == 0:
        Path(f"{run}-expected-job.json").write_text(json.dumps(job))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
    exit_without_teardown()  # torch's teardown has aborted a finished rank (terminate called without ...)
