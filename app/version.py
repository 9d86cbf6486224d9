"""bedside's version: the installed distribution's, read from its metadata when asked (``bedside --version``)."""

from __future__ import annotations

DISTRIBUTION = "bedside"
UNKNOWN = "0+unknown"
"""The version of a source tree that was never installed (PEP 440: version 0, local label ``unknown``)."""


def installed_version() -> str:
    """The version of the installed ``bedside`` distribution, else ``UNKNOWN``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN
