"""The instrumentation kit for any PyTorch loop: what a training step costs and achieves.

torch is imported only inside the kit's modules that need it (torch is an optional extra).
"""

from .flops import ModelShape, flops_per_token, mfu

__all__ = ["ModelShape", "flops_per_token", "mfu"]
