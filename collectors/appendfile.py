"""An append-only JSONL file that one process owns: tail repair and line numbering."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .safefile import UnsafeFileError, open_regular_file

_COUNT_CHUNK = 1 << 20


class AppendFile:
    """Appends complete lines to ``path`` with O_APPEND writes.

    Opening an existing file ends a torn last line (left by a killed writer) with a
    newline, so the fragment becomes one malformed line for the collector to reject
    rather than a prefix glued onto the next record. ``next_seq`` continues the
    file's line count, so ``seq`` is the 0-based line number of each record.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._failed = False
        self.next_seq = _count_lines_and_repair(path, self._fd)

    def write(self, data: bytes) -> None:
        """Write ``data`` (whole lines) to the OS; a short write is completed.

        On an OSError (disk full, lost mount) part of a line may be in the file:
        the error is raised and ``recover()`` repairs the file before the next write.
        """
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            self._failed = True
            raise

    def recover(self) -> None:
        """After a failed write: end the partial line and recount, so ``seq`` stays the line number.

        Call before encoding the next records. While the cause persists (disk
        still full) it stays pending and is tried again next time.
        """
        if self._failed:
            try:
                self.next_seq = _count_lines_and_repair(self.path, self._fd)
                self._failed = False
            except OSError:
                pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _count_lines_and_repair(path: Path, fd: int) -> int:
    """Count complete lines; terminate a torn last line first (it then counts too)."""
    lines = 0
    last = b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(_COUNT_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    if last != b"\n":
        os.write(fd, b"\n")
        lines += 1
    return lines


def tail_records(path: Path, tail_bytes: int = 1 << 16) -> list[dict[str, Any]]:
    """The complete, parseable records in the last ``tail_bytes`` of a JSONL file ([] when absent, or when
    it is no regular file: a FIFO would block, a link may lead anywhere)."""
    try:
        with os.fdopen(open_regular_file(path), "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - tail_bytes))
            data = fh.read()
    except (FileNotFoundError, UnsafeFileError):
        return []
    lines = data.split(b"\n")[:-1]
    if size > tail_bytes:
        lines = lines[1:]  # the first line of the window may be cut
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
