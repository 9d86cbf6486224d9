"""Each rank's own gradients before their reduction: the local gradient norm, and an observer.

``LocalGrads`` is what the reduction hooks fill during one backward: the squared norm of
this rank's unreduced gradients (a device tensor, no sync), the mark of the moment the
last gradient group was ready (which splits backward into local compute and the wait
for communication: a slow rank shows long compute, its peers long waits), and, under
DDP, the job's mean loss reduced with one of the buckets. ``watch_gradients`` installs the
hooks on a DDP module (``ddp.py``: a comm hook) or on every FSDP2 module of a model
(``fsdp.py``: a custom reduce-scatter, whose input is this rank's full unreduced
gradient of one group). ``on_gradients(step, flat)`` sees each flat group first and may
change it in place (a fault injector does): what it leaves is what is reduced and measured.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from .runqueue import RunQueueClock
from .timers import Clock, HostClock

GradientObserver = Callable[[int, torch.Tensor], None]
"""Called with (step, flat gradients of one bucket or group) before its reduction."""


class LocalGrads:
    """The hooks' state over one backward pass (``reset`` starts one).

    ``blocked_s`` is the host time spent inside reduction calls so far (FSDP2's
    reduce-scatters on gloo block; DDP's all-reduce hook never does and leaves it 0).
    """

    def __init__(
        self,
        *,
        on_gradients: GradientObserver | None = None,
        clock: Clock | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.on_gradients = on_gradients
        self.clock: Clock = clock or HostClock()
        self.process_group = process_group
        self.hooked = False
        self.step = 0
        self.squared_norm: torch.Tensor | None = None
        self.last_bucket_ready: Any = None
        self.run_queue = RunQueueClock()
        self.waited_at_ready: float | None = None  # the run-queue clock read with ``last_bucket_ready``
        self.blocked_s = 0.0
        self.loss: torch.Tensor | None = None
        self.mean_loss: torch.Tensor | None = None

    def reset(self, step: int, loss: torch.Tensor | None = None) -> None:
        """Start a backward pass; ``loss`` rides along with a bucket's all-reduce (DDP)."""
        self.step = step
        self.squared_norm = None
        self.last_bucket_ready = self.waited_at_ready = None
        self.blocked_s = 0.0
        self.loss, self.mean_loss = loss, None

    def local_grad_norm(self) -> torch.Tensor | None:
        return None if self.squared_norm is None else self.squared_norm.sqrt()

    def observe(self, gradients: torch.Tensor) -> None:
        """See one flat group of this rank's gradients before its reduction: hand it to the
        observer, then add its squared norm (no sync)."""
        if self.on_gradients is not None:
            self.on_gradients(self.step, gradients)
        squared = torch.linalg.vector_norm(gradients.detach(), dtype=torch.float32).square()  # no temporary
        self.squared_norm = squared if self.squared_norm is None else self.squared_norm + squared


def watch_gradients(model: nn.Module, grads: LocalGrads) -> bool:
    """Install ``grads``' hooks on a DDP module or on every FSDP2 module in ``model``.

    False when ``model`` is neither (a single-process loop): nothing is reduced, and the
    local norm is the norm of the gradients after backward (``Monitor`` computes it).
    A DDP module already given a comm hook is refused by DDP itself (RuntimeError).
    """
    from .ddp import allreduce_with_local_norm
    from .fsdp import ReduceScatterWithLocalNorm

    if isinstance(model, DistributedDataParallel):
        model.register_comm_hook(state=grads, hook=allreduce_with_local_norm)
        _keep_group_past_its_reducer(model.process_group)
        grads.hooked = True
        return True
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    comm = ReduceScatterWithLocalNorm(grads)
    for module in sharded:
        module.set_custom_reduce_scatter(comm)
    grads.hooked = bool(sharded)
    return grads.hooked


_GLOO_GROUPS_OF_HOOKED_DDP: set[dist.ProcessGroup] = set()
"""Gloo groups of the DDP modules the kit hooked, dropped from Python at exit (``_keep_group_past_its_reducer``)."""


def _keep_group_past_its_reducer(group: dist.ProcessGroup) -> None:
    """Hold a gloo group until the interpreter exits, so a DDP reducer never drops its last reference.

    pybind frees a ``Reducer`` holding the GIL. If it holds the group's last reference (the
    loop called ``destroy_process_group``, then dropped its DDP module), the group's
    destructor joins gloo's worker threads; a worker still releasing a collective issued
    during backward (whose thread-local state holds a Python object) waits for that GIL,
    and the process hangs at its end (pytorch/pytorch#56297). The kit drops the groups it
    kept from an ``atexit`` hook, before the interpreter's teardown: a group dropped from
    Python releases the GIL before its destructor runs. A loop in a function has freed its
    DDP module by then; a DDP module held in a module's globals is freed during teardown,
    after the hook, and is not covered.
    """
    if "gloo" in dist.get_backend(group):
        if not _GLOO_GROUPS_OF_HOOKED_DDP:
            atexit.register(_GLOO_GROUPS_OF_HOOKED_DDP.clear)
        _GLOO_GROUPS_OF_HOOKED_DDP.add(group)


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip to ``max_norm``; the total norm over all ranks' shards as a plain tensor (as torchtitan does).

    Under DDP this is ``clip_grad_norm_``. Under FSDP2 the norm of DTensor gradients is a
    partial DTensor: ``full_tensor()`` all-reduces it (one scalar) before the clip.
    """
    parameters = [p for p in parameters if p.grad is not None]
    total = total_grad_norm(parameters)
    nn.utils.clip_grads_with_norm_(parameters, max_norm, total, foreach=True)
    return total


def total_grad_norm(parameters: Iterable[nn.Parameter]) -> torch.Tensor:
    """The norm of the parameters' gradients (over all shards under FSDP2), on their device."""
    total = nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None], foreach=True)
    return total.full_tensor() if isinstance(total, DTensor) else total


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor, else the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
