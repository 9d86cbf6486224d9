"""bedside: telemetry, detectors and an on-call desk for large training runs.

``bedside.open(RUN)`` reads a run's views as pandas DataFrames (docs/python.md); the parts install
as ``bedside.collectors`` (the format, ``RunLogger``, the store), ``bedside.detectors``,
``bedside.app`` and ``bedside.trainer``. This module imports nothing until asked: a training
loop that imports ``bedside.collectors.writer`` loads neither pandas nor DuckDB through it.

Its source sits in ``app/root/`` (pyproject.toml maps the package ``bedside`` there), so that the repository's top
level stays the product's layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bedside.app.api import Run

__all__ = ["Run", "__version__", "open"]


def open(run_dir: str | Path) -> Run:
    """The run at ``run_dir``, read-only: its views as DataFrames, a snapshot of its store (docs/python.md)."""
    from bedside.app.api import open_run

    return open_run(run_dir)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from bedside.app.version import installed_version

        return installed_version()
    if name == "Run":
        from bedside.app.api import Run

        return Run
    raise AttributeError(f"module 'bedside' has no attribute {name!r}")
