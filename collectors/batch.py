"""Raw telemetry bytes to an Arrow table of lines, without a Python loop per line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

_NEWLINE = 10

MAX_CHUNK_BYTES = 2**31 - 1
"""The most bytes one chunk may hold: its line bounds are 32-bit (Arrow string offsets)."""

MAX_REJECTED_CHARS = 4096
"""A rejected line keeps at most this many characters of its text (its ``length`` stays the full one)."""

BATCH_BYTES = 1 << 20
"""Chunks smaller than this share a record batch up to this size: one scan for the lines of thousands of
files, and still several batches (DuckDB's unit of parallel work) in a large pass, without copying big chunks."""


@dataclass(frozen=True)
class Chunk:
    """Complete lines read from one source file, starting at byte ``start``."""

    source_id: int
    file_rank: int | None
    start: int
    data: bytes

    @property
    def line_count(self) -> int:
        return self.data.count(b"\n")


@dataclass(frozen=True)
class Rejection:
    """A line refused by the collector: where it starts, its length in bytes, its text and why."""

    source_id: int
    line_offset: int
    length: int
    line: bytes | str
    reason: str


LINES_SCHEMA = pa.schema(
    [("source_id", pa.int32()), ("file_rank", pa.int32()), ("line_offset", pa.int64()), ("line", pa.string())]
)


def complete_prefix(data: bytes) -> bytes:
    """The part of ``data`` up to and including its last newline (a torn tail waits)."""
    end = data.rfind(b"\n")
    return data[: end + 1]


def lines_table(chunks: list[Chunk]) -> tuple[pa.Table, list[Rejection]]:
    """One Arrow table of every line in ``chunks``; lines that are not UTF-8 are rejected.

    Small chunks share record batches of about BATCH_BYTES: a pass over thousands of files with a line
    or two each is then a few scans for DuckDB, not thousands of tiny ones.
    """
    batches, rejected = [], []
    for group in _groups(chunks):
        table, bad = _group_table(group)
        batches.extend(table.to_batches())
        rejected.extend(bad)
    return pa.Table.from_batches(batches, schema=LINES_SCHEMA), rejected


def _groups(chunks: list[Chunk]) -> Iterator[list[Chunk]]:
    """Consecutive chunks holding at most BATCH_BYTES together (a bigger chunk: a group of its own)."""
    group: list[Chunk] = []
    size = 0
    for chunk in chunks:
        if len(chunk.data) > MAX_CHUNK_BYTES:
            raise ValueError(f"a chunk of {len(chunk.data):,} bytes is over the limit of {MAX_CHUNK_BYTES:,} (2 GiB)")
        if group and size + len(chunk.data) > BATCH_BYTES:
            yield group
            group, size = [], 0
        group.append(chunk)
        size += len(chunk.data)
    if group:
        yield group


def _group_table(group: list[Chunk]) -> tuple[pa.Table, list[Rejection]]:
    """The lines of ``group`` as one table, wrapping the joined bytes without a copy per line."""
    data = group[0].data if len(group) == 1 else b"".join(chunk.data for chunk in group)
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == _NEWLINE)
    bounds = np.empty(len(ends) + 1, dtype=np.int32)
    bounds[0] = 0
    bounds[1:] = ends + 1
    lines = pa.StringArray.from_buffers(len(ends), pa.py_buffer(bounds), pa.py_buffer(data))
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        return _split_invalid_utf8(group)
    sizes = np.array([len(chunk.data) for chunk in group], dtype=np.int64)
    base = np.cumsum(sizes) - sizes
    owner = np.repeat(np.arange(len(group)), np.diff(np.searchsorted(ends, base + sizes), prepend=0))
    starts = np.array([chunk.start for chunk in group], dtype=np.int64) - base
    return _table(group, owner, starts[owner] + bounds[:-1], lines), []


def _split_invalid_utf8(group: list[Chunk]) -> tuple[pa.Table, list[Rejection]]:
    """The slow path for chunks with invalid UTF-8: decode line by line."""
    good, owner, offsets, rejected = [], [], [], []
    for index, chunk in enumerate(group):
        begin = 0
        for end in (np.flatnonzero(np.frombuffer(chunk.data, dtype=np.uint8) == _NEWLINE) + 1).tolist():
            raw = chunk.data[begin:end]
            try:
                good.append(raw.decode("utf-8"))
                owner.append(index)
                offsets.append(chunk.start + begin)
            except UnicodeDecodeError as exc:
                rejected.append(
                    Rejection(
                        chunk.source_id,
                        chunk.start + begin,
                        len(raw),
                        raw,
                        f"not valid UTF-8 ({exc.reason} at byte {exc.start})",
                    )
                )
            begin = end
    table = _table(
        group, np.array(owner, dtype=np.int64), np.array(offsets, dtype=np.int64), pa.array(good, type=pa.string())
    )
    return table, rejected


def _table(group: list[Chunk], owner: np.ndarray, offsets: np.ndarray, lines: pa.Array) -> pa.Table:
    """Lines with the source and file rank of the chunk each came from (``owner``: its index in ``group``)."""
    take = pa.array(owner, type=pa.int64())
    columns = {
        "source_id": pa.array([chunk.source_id for chunk in group], pa.int32()).take(take),
        "file_rank": pa.array([chunk.file_rank for chunk in group], pa.int32()).take(take),
        "line_offset": pa.array(offsets, type=pa.int64()),
        "line": lines,
    }
    return pa.table(columns, schema=LINES_SCHEMA)


def explain_rejection(line: str, reason: str) -> str:
    """A precise reason for the cases the store's SQL can only name broadly."""
    if reason == "not valid JSON":
        return _explain_invalid_json(line)
    if reason == "missing field: kind":
        try:
            if not isinstance(json.loads(line), dict):
                return "not a JSON object"
        except (ValueError, RecursionError):
            return _explain_invalid_json(line)
    return reason


def _explain_invalid_json(line: str) -> str:
    if not line.strip():
        return "empty line"
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not valid JSON: {exc.msg} at column {exc.colno}"
    except ValueError as exc:  # an integer of thousands of digits, refused before the syntax is checked
        return f"not valid JSON: {str(exc).split(';')[0]}"
    except RecursionError:
        return "not valid JSON: nested too deeply"
    return "not valid JSON"


def rejections_table(rejected: list[Rejection], now: float) -> pa.Table:
    """Rejected lines as the Arrow table the store's insert_rejected query reads, each text cut to
    MAX_REJECTED_CHARS."""
    texts = [
        (r.line if isinstance(r.line, str) else r.line.decode("utf-8", "replace"))[:MAX_REJECTED_CHARS]
        for r in rejected
    ]
    return pa.table(
        {
            "source_id": pa.array([r.source_id for r in rejected], pa.int32()),
            "line_offset": pa.array([r.line_offset for r in rejected], pa.int64()),
            "length": pa.array([r.length for r in rejected], pa.int64()),
            "reason": pa.array([r.reason for r in rejected], pa.string()),
            "line": pa.array([t.rstrip("\n") for t in texts], pa.string()),
            "ingested_at": pa.array([now] * len(rejected), pa.float64()),
        }
    )
