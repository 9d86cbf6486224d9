"""The instrumentation kit for any PyTorch loop: what a training step costs and achieves.

``Monitor`` wires it to a model and optimizer (``monitor.py``); the pieces are usable alone:
local gradient norms before reduction (``grads.py``, ``ddp.py``, ``fsdp.py``), the on-device
parameter digest (``checksum.py``), phase timers (``timers.py``), GradScaler state
(``scaler.py``) and FLOPs accounting (``flops.py``). torch is an optional extra: the FLOPs
accounting imports it not, and the names that need torch load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .flops import ModelShape, flops_per_token, mfu

if TYPE_CHECKING:
    from .checksum import param_checksum
    from .grads import LocalGrads, clip_grad_norm, local, total_grad_norm, watch_gradients
    from .monitor import Monitor, StepScope
    from .scaler import ScalerState
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
}

__all__ = [
    "PHASES",
    "LocalGrads",
    "ModelShape",
    "Monitor",
    "ScalerState",
    "StepScope",
    "clip_grad_norm",
    "clock_for",
    "flops_per_token",
    "local",
    "mfu",
    "param_checksum",
    "phase_times",
    "total_grad_norm",
    "watch_gradients",
]


def __getattr__(name: str) -> Any:
    module = _NEED_TORCH.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
