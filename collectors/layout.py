"""The run directory: where each file of a run lives.

```
RUN/
  run.json                      run metadata (id, name, world size, topology, config)
  telemetry/rank-00000.jsonl    one append-only telemetry file per rank
  ground_truth/rank-00000.jsonl fault_injected records (labels for scoring, not for detectors)
  control/requests/<id>.json    action requests for the trainer (processed/: handled ones)
  checkpoints/                  checkpoints and their manifests
  bedside.duckdb                the store (written by the collector only)
```
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import RunDirError
from .format import MAX_RANK

STORE_NAME = "bedside.duckdb"
RUN_INFO_NAME = "run.json"
SOURCE_DIRS = ("telemetry", "ground_truth")
_RANK_FILE = re.compile(r"^rank-(\d{5,})\.jsonl$")


def rank_file_name(rank: int) -> str:
    """``rank-00003.jsonl`` for rank 3 (five digits, more when needed)."""
    return f"rank-{rank:05d}.jsonl"


def rank_of_file(path: Path) -> int | None:
    """The rank a telemetry file name declares, or None for a name outside the format (``name_problem`` says why)."""
    match = _RANK_FILE.match(path.name)
    return int(match.group(1)) if match and name_problem(path.name) is None else None


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a rank file's name, or None: one canonical name per rank, within the store's ranks."""
    if not is_utf8(name):
        return "the file name is not valid UTF-8: refused unread"
    match = _RANK_FILE.match(name)
    if not match:
        return "not a rank file name (rank-NNNNN.jsonl, the rank in five digits, more from rank 100000): refused unread"
    rank = int(match.group(1))
    if rank > MAX_RANK:
        return f"rank {rank} is above the largest rank {MAX_RANK}: refused unread"
    if name != rank_file_name(rank):
        return f"not the canonical name of its rank: rank {rank}'s file is {rank_file_name(rank)}; refused unread"
    return None


def is_utf8(text: str) -> bool:
    """False for a name that came from undecodable bytes (os.fsdecode keeps them as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_path(text: str) -> str:
    """``text`` as valid UTF-8: undecodable bytes of a file name shown as ``\\xff`` escapes."""
    return text if is_utf8(text) else os.fsencode(text).decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class RunLayout:
    """Paths inside one run directory."""

    root: Path

    @property
    def run_info(self) -> Path:
        return self.root / RUN_INFO_NAME

    @property
    def telemetry(self) -> Path:
        return self.root / "telemetry"

    @property
    def ground_truth(self) -> Path:
        return self.root / "ground_truth"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def control_requests(self) -> Path:
        """Pending action requests, one JSON file each (written by ``collectors/control.py``)."""
        return self.control / "requests"

    @property
    def control_processed(self) -> Path:
        """Requests the trainer has handled (applied or rejected), moved here by rank 0."""
        return self.control / "processed"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def store(self) -> Path:
        return self.root / STORE_NAME

    def rank_file(self, rank: int) -> Path:
        return self.telemetry / rank_file_name(rank)

    def ground_truth_file(self, rank: int) -> Path:
        return self.ground_truth / rank_file_name(rank)

    def source_files(self) -> list[Path]:
        """Every entry named ``*.jsonl`` in the telemetry and ground-truth folders now, in a stable order.

        Whatever its type or name: the collector refuses, and reports, what is not a rank's regular file.
        """
        found = []
        for name in SOURCE_DIRS:
            folder = self.root / name
            if folder.is_dir():
                found.extend(sorted((p for p in folder.iterdir() if p.suffix == ".jsonl"), key=lambda p: p.name))
        return found

    def relative(self, path: Path) -> str:
        """``path`` relative to the run root, with forward slashes, as valid UTF-8 (the store's source key)."""
        return printable_path(path.relative_to(self.root).as_posix())


def is_run_dir(path: Path) -> bool:
    """True when ``path`` looks like a run: it has run.json or a telemetry folder."""
    layout = RunLayout(path)
    return layout.run_info.is_file() or layout.telemetry.is_dir()


def require_run_dir(path: Path) -> Path:
    """``path`` when it is a run directory; otherwise RunDirError naming what is missing."""
    if not path.is_dir():
        raise RunDirError(f"no run directory at {path}")
    if not is_run_dir(path):
        raise RunDirError(f"{path} is not a run directory (it has neither run.json nor telemetry/)")
    return path
