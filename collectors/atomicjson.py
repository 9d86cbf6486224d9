"""Writing a small JSON file so that readers see the old file or the new one, never half."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, value: Any, *, indent: int | None = None) -> None:
    """Write ``value`` to a hidden temporary file, fsync it, rename it over ``path``, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=indent, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
