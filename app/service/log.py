"""The service's one-line warnings on stderr (the CLI's and the dashboard's too)."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """Print a one-line warning on stderr."""
    print(f"bedside: warning: {message}", file=sys.stderr)
