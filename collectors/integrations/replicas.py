"""The kit's silent-data-corruption inputs for a framework's DDP model: each rank's gradient norm before the
all-reduce (the kit's DDP comm hook, ``kit/grads.py``, which also marks when the last bucket was ready) and, every ``checksum_every`` steps, the on-device digest of
its parameters (``kit/checksum.py``), which DDP replicas must agree on bit for bit. Both stay tensors until the
writer thread reads them: nothing in the step waits for the device."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..kit.checksum import param_checksum
from ..kit.grads import LocalGrads, watch_gradients

CHECKSUM_EVERY = 50
"""Steps between parameter checksums unless the callback is told otherwise (as the kit's ``Monitor``)."""


class ReplicaSignals:
    """``watch`` the DDP model before its first backward, ``begin`` each optimizer step, and add ``metrics`` to the
    step's ``rank_step``. A model that is not DDP (one process) gets no comm hook: nothing is reduced, so there is
    no local norm to tell apart from the one the framework logs."""

    def __init__(self, checksum_every: int = CHECKSUM_EVERY) -> None:
        if checksum_every < 0:
            raise ValueError(f"checksum_every must be >= 0 (0: never), got {checksum_every}")
        self.checksum_every = checksum_every
        self.grads = LocalGrads()

    def watch(self, model: nn.Module) -> None:
        """Register the kit's comm hook on ``model`` when it is DDP (DDP refuses a second comm hook)."""
        if isinstance(model, DistributedDataParallel) and not self.grads.hooked:
            watch_gradients(model, self.grads)

    def begin(self, step: int) -> None:
        self.grads.reset(step)

    @property
    def local_done(self) -> float | None:
        """The host time this step's last gradient bucket was ready (None when not hooked or not yet)."""
        ready = self.grads.last_bucket_ready
        return ready if isinstance(ready, float) else None

    @property
    def waited_at_ready(self) -> float | None:
        """The thread's run-queue wait read when the last gradient bucket was ready (None as ``local_done``)."""
        return self.grads.waited_at_ready if self.local_done is not None else None

    def metrics(self, step: int, model: nn.Module) -> dict[str, Any]:
        """The step's ``local_grad_norm`` (when hooked) and, on a checksum step, ``param_checksum`` of ``model``."""
        metrics: dict[str, Any] = {}
        if (norm := self.grads.local_grad_norm()) is not None:
            metrics["local_grad_norm"] = norm
        if self.checksum_every and step % self.checksum_every == 0:
            module = model.module if isinstance(model, DistributedDataParallel) else model
            metrics["param_checksum"] = param_checksum(module)
        return metrics
