"""Named exceptions of the detectors (a base of their own: detectors import nothing of the collectors)."""

from __future__ import annotations


class DetectorError(Exception):
    """Base of every error the detectors report to a user."""


class DetectorConfigError(DetectorError, ValueError):
    """A detector's name or settings are wrong."""


class DetectorInputError(DetectorError, ValueError):
    """Telemetry handed to the detectors lacks a column they need, or holds values they cannot read."""
