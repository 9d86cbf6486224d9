"""The learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math

from .config import OptimConfig


def lr_at(step: int, optim: OptimConfig, total_steps: int) -> float:
    """Learning rate of ``step`` (1-based) in a run of ``total_steps``."""
    if optim.warmup_steps and step <= optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    decay_steps = max(total_steps - optim.warmup_steps, 1)
    progress = min(max(step - optim.warmup_steps, 0) / decay_steps, 1.0)
    floor = optim.lr * optim.min_lr_ratio
    return floor + (optim.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
