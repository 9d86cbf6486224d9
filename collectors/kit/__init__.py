"""The instrumentation kit for any PyTorch loop: what a training step costs and achieves, and the actions it takes.

``Monitor`` wires it to a model and optimizer (``monitor.py``); the pieces are usable alone:
local gradient norms before reduction (``grads.py``, ``ddp.py``, ``fsdp.py``), the on-device
parameter digest (``checksum.py``), phase timers (``timers.py``), GradScaler state
(``scaler.py``), FLOPs accounting (``flops.py``), and control requests in any loop
(``actions.py``: ``ControlClient``; ``skipping.py``: ``SkippingSampler``). torch is an optional
extra: the FLOPs accounting and the control state import it not, and the names that need torch
load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..control_inbox import ControlState, Rejected, Request
from .flops import ModelShape, flops_per_token, mfu

if TYPE_CHECKING:
    from .actions import Action, ControlClient, int_arg
    from .checksum import param_checksum
    from .grads import LocalGrads, clip_grad_norm, local, total_grad_norm, watch_gradients
    from .monitor import Monitor, StepScope
    from .scaler import ScalerState
    from .skipping import SkippingSampler
    from .timers import PHASES, clock_for, phase_times

_NEED_TORCH = {
    "Monitor": "monitor",
    "StepScope": "monitor",
    "LocalGrads": "grads",
    "watch_gradients": "grads",
    "clip_grad_norm": "grads",
    "total_grad_norm": "grads",
    "local": "grads",
    "param_checksum": "checksum",
    "ScalerState": "scaler",
    "PHASES": "timers",
    "clock_for": "timers",
    "phase_times": "timers",
    "Action": "actions",
    "ControlClient": "actions",
    "int_arg": "actions",
    "SkippingSampler": "skipping",
}

__all__ = [
    "PHASES",
    "Action",
    "ControlClient",
    "ControlState",
    "LocalGrads",
    "ModelShape",
    "Monitor",
    "Rejected",
    "Request",
    "ScalerState",
    "SkippingSampler",
    "StepScope",
    "clip_grad_norm",
    "clock_for",
    "flops_per_token",
    "int_arg",
    "local",
    "mfu",
    "param_checksum",
    "phase_times",
    "total_grad_norm",
    "watch_gradients",
]


def __getattr__(name: str) -> Any:
    """The kit's names that need torch, imported when first used."""
    module = _NEED_TORCH.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
