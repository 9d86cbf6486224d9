"""The instrumentation kit for any PyTorch loop: what a training step costs and achieves.

torch is imported only inside the kit's modules that need it (torch is an optional extra).
"""

from .flops import ModelShape, flops_per_token, mfu

__all__ = ["ModelShape", "flops_per_token", "mfu"]

from typing import TYPE_CHECKING, Any

from ..control_inbox import ControlState, Rejected, Request

if TYPE_CHECKING:
    from .actions import Action as Action
    from .actions import ControlClient as ControlClient
    from .actions import int_arg as int_arg
    from .skipping import SkippingSampler as SkippingSampler

_NEED_TORCH = {"Action": "actions", "ControlClient": "actions", "int_arg": "actions", "SkippingSampler": "skipping"}
__all__ += ["ControlState", "Rejected", "Request", *_NEED_TORCH]


def __getattr__(name: str) -> Any:
    """The kit's names that need torch, imported when first used."""
    if name not in _NEED_TORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_NEED_TORCH[name]}", __name__), name)
