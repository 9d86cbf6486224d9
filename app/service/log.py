"""The service's one-line warnings on stderr (the CLI's and the dashboard's too)."""

from __future__ import annotations

import sys

from bedside.collectors.display_text import visible


def warn(message: str) -> None:
    """Print a one-line warning on stderr (control characters of the outside text in it escaped)."""
    print(f"bedside: warning: {visible(message)}", file=sys.stderr)
