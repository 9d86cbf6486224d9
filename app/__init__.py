"""The bedside command line and the Streamlit dashboard; ``bedside.app.__version__`` is the installed version."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``__version__``, read from the distribution's metadata on first use (importing ``bedside.app`` stays cheap)."""
    if name == "__version__":
        from .version import installed_version

        return installed_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
