"""Mixed-precision state of a ``torch.amp.GradScaler``: the loss scale and overflow-skipped steps.

``GradScaler.get_scale()`` reads the scale to the host (a sync), so the reader takes the
scaler's private ``_scale`` tensor instead (torch 2.x keeps the scale there, on the
scaler's device, once the first ``scale()`` call created it) and copies it on the device
(no sync). A step was skipped for overflow exactly when ``update()`` backed the scale
off (``found_inf``: the scale after the step is below the scale it used), which is
compared on the device too. A scaler that is disabled, or whose ``_scale`` is not
there (another torch), reports nothing rather than syncing.
"""

from __future__ import annotations

from typing import Any

import torch


class ScalerState:
    """Reads one step's loss scale and overflow skip from ``scaler`` without a host sync."""

    def __init__(self, scaler: Any) -> None:
        if not hasattr(scaler, "scale") or not hasattr(scaler, "update"):
            raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        self.scaler = scaler
        self._used: torch.Tensor | None = None
        self.skipped_steps: torch.Tensor | None = None

    def _scale(self) -> torch.Tensor | None:
        scale = getattr(self.scaler, "_scale", None)
        enabled = getattr(self.scaler, "_enabled", True)
        return scale if enabled and isinstance(scale, torch.Tensor) else None

    def before_step(self) -> torch.Tensor | None:
        """After backward, before ``scaler.step``: keep the scale this step used (a device copy), and return it."""
        scale = self._scale()
        self._used = None if scale is None else scale.detach().clone()
        return self._used

    def after_step(self) -> dict[str, torch.Tensor]:
        """After ``scaler.update()``: ``loss_scale`` (the scale the step used), ``overflow_skipped``
        (1 when the step was skipped, else 0) and ``overflow_skipped_steps`` (so far), as device tensors."""
        used, after = self._used, self._scale()
        self._used = None
        if used is None or after is None:
            return {}
        skipped = (after < used).to(torch.int64)
        self.skipped_steps = skipped if self.skipped_steps is None else self.skipped_steps + skipped
        return {"loss_scale": used, "overflow_skipped": skipped, "overflow_skipped_steps": self.skipped_steps}
