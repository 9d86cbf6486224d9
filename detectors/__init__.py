"""Statistical detectors over run telemetry (numpy, pandas and scipy only).

``detect`` runs them over plain DataFrames; ``build_detectors`` makes them for a runner
of your own. Both are imported on first use, so ``import bedside.detectors`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:
    from .frames import Detection, detect
    from .registry import build_detectors, detector_names

_WHERE = {"detect": "frames", "Detection": "frames", "build_detectors": "registry", "detector_names": "registry"}
__all__ = ["Detection", "build_detectors", "detect", "detector_names"]


__getattr__ = lazy_exports(__name__, _WHERE)
