"""Named exceptions of the detectors."""
from __future__ import annotations

from bedside.collectors.errors import BedsideError


class DetectorConfigError(BedsideError):
    """A detector's name or settings are wrong."""
