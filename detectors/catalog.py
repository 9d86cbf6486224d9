"""Every detector bedside ships, imported so that each registers itself by name."""
from __future__ import annotations

from . import bad_shard, checkpoint_corrupt, eval_stall, hang, nonfinite, sdc, spike, straggler, throughput  # noqa: F401  (registration)
from .detector import REGISTRY

DETECTOR_NAMES = tuple(sorted(REGISTRY))
