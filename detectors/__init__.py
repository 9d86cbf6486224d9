"""Statistical detectors over run telemetry (numpy, pandas and scipy only).

``detect`` runs them over plain DataFrames; ``build_detectors`` makes them for a runner
of your own. Both are imported on first use, so ``import bedside.detectors`` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .frames import Detection, detect
    from .registry import build_detectors, detector_names

_WHERE = {"detect": "frames", "Detection": "frames", "build_detectors": "registry", "detector_names": "registry"}
__all__ = ["Detection", "build_detectors", "detect", "detector_names"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
