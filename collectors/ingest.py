"""Exactly-once ingestion of a run directory into its store.

Each pass reads, for every source file, the complete lines after the offset the
store has committed for it, parses them in DuckDB, and commits the rows, the
rejected lines and the new offsets in one transaction. A process killed at any
moment leaves the store at the previous commit; the next pass resumes there.
``ingest_available`` reads each file no further than its size when called, so it
ends on a live run; a DuckDB failure that is not a line's fault (out of memory,
disk full) commits nothing of its pass and is raised as StoreError.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import duckdb
import pyarrow as pa

from .batch import (
    MAX_CHUNK_BYTES,
    MAX_REJECTED_CHARS,
    Chunk,
    Rejection,
    complete_prefix,
    explain_rejection,
    lines_table,
    rejections_table,
)
from .defaults import DEFAULT_BATCH_BYTES
from .errors import RunInfoError, StoreError
from .format import (
    ACTION_STATUSES,
    CHECKPOINT_EVENTS,
    CHECKPOINT_METRICS,
    MAX_EXACT_INTEGER,
    MAX_KIND_CHARS,
    MAX_LINE_BYTES,
    MAX_RANK,
    MAX_TIME,
    RANK_STEP_METRICS,
    RUN_END_STATUSES,
    STEP_METRICS,
)
from .layout import RunLayout, name_problem, rank_of_file
from .runinfo import RunInfo, read_run_info
from .safefile import UnsafeFileError, open_regular_file
from .store import Store, sql

HEAD_BYTES = 64

MALFORMED_INPUT_ERRORS = (duckdb.InvalidInputException, duckdb.ConversionException)
"""What DuckDB raises for a line it cannot parse. Any other error (out of memory, I/O,
an interrupt) is not the line's fault: it is raised, and the line is read again later."""

FORMAT_PARAMETERS = {
    "checkpoint_events": list(CHECKPOINT_EVENTS),
    "action_statuses": list(ACTION_STATUSES),
    "run_end_statuses": list(RUN_END_STATUSES),
    "step_metrics": list(STEP_METRICS),
    "rank_step_metrics": list(RANK_STEP_METRICS),
    "checkpoint_metrics": list(CHECKPOINT_METRICS),
    "max_rank": MAX_RANK,
    "max_exact_integer": MAX_EXACT_INTEGER,
    "max_kind_chars": MAX_KIND_CHARS,
    "max_time": MAX_TIME,
}
"""The format's enums, canonical metrics and limits, bound as parameters of stage_lines.sql."""

SOURCE_SCHEMA = pa.schema(
    [
        ("source_id", pa.int32()),
        ("path", pa.string()),
        ("file_rank", pa.int32()),
        ("device", pa.uint64()),
        ("inode", pa.uint64()),
        ("head", pa.binary()),
        ("committed_offset", pa.int64()),
        ("lines", pa.int64()),
        ("rejected", pa.int64()),
        ("state", pa.string()),
        ("state_detail", pa.string()),
        ("updated_at", pa.float64()),
    ]
)
TOPOLOGY_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("host", pa.string()),
        ("local_rank", pa.int32()),
        ("dp", pa.int32()),
        ("tp", pa.int32()),
        ("pp", pa.int32()),
    ]
)


@dataclass(frozen=True)
class Source:
    """A telemetry file as the store knows it."""

    source_id: int
    path: str
    file_rank: int | None
    device: int | None = None
    inode: int | None = None
    head: bytes = b""
    committed_offset: int = 0
    state: str = "ok"


@dataclass
class PassResult:
    """What one ingest pass did."""

    lines: int = 0
    rejected: int = 0
    bytes: int = 0
    incidents: list[str] = field(default_factory=list)
    backlog: bool = False  # the pass used its whole byte budget: files may hold more, ranks' rows not level

    def add(self, other: PassResult) -> None:
        self.lines += other.lines
        self.rejected += other.rejected
        self.bytes += other.bytes
        self.incidents.extend(other.incidents)
        self.backlog |= other.backlog


@dataclass(frozen=True)
class _Read:
    """What a pass read from one file: the source's next state and the complete lines."""

    source: Source
    chunk: Chunk | None
    incident: str | None = None
    cut: bool = False  # the byte budget stopped the read before the file's limit
    overlong: Rejection | None = None  # the line after the chunk has no newline within MAX_LINE_BYTES


class Collector:
    """Ingests one run directory into one store (the store's single writer)."""

    def __init__(
        self,
        run_dir: Path,
        store: Store,
        *,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        warn: Callable[[str], None] = lambda message: None,
    ) -> None:
        if not 0 < batch_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"batch_bytes must be from 1 to {MAX_CHUNK_BYTES:,} (under 2 GiB), got {batch_bytes:,}")
        self.layout = RunLayout(Path(run_dir))
        self.store = store
        self.batch_bytes = batch_bytes
        self.warn = warn
        self._con = store.connection()
        self._sources = {s.path: s for s in self._load_sources()}
        self._next_source_id = max((s.source_id for s in self._sources.values()), default=0) + 1
        self._run_info_stamp: tuple[int, int] | None = None
        self.world_size: int | None = None

    def ingest_available(
        self,
        on_pass: Callable[[PassResult], None] = lambda result: None,
        stop: threading.Event | None = None,
        changed: Collection[Path] | None = None,
    ) -> PassResult:
        """Ingest, in passes, every complete line present when called; return early once ``stop`` is set.

        Each file is read no further than its size at the call, and files that appear
        meanwhile wait for the next call, so the call ends while ranks keep writing.
        ``changed`` (the files that file events named) narrows the call to those files
        when each is a known source; otherwise every source file is listed. Either way
        only files whose size or inode moved from what the store committed are opened.
        """
        limits = self._pending(self._candidates(changed))
        total = PassResult()
        while stop is None or not stop.is_set():
            result = self.run_pass(limits)
            total.add(result)
            if result.bytes == 0:
                break
            on_pass(result)
            limits = {path: size for path, size in limits.items() if self._unread(path, size)}
            if not limits:
                break
        return total

    def _candidates(self, changed: Collection[Path] | None) -> Collection[Path]:
        """The files a call looks at: ``changed`` when every one of them is a known source, else every file."""
        if changed is not None and all(self.layout.relative(path) in self._sources for path in changed):
            return changed
        return self.layout.source_files()

    def _pending(self, paths: Iterable[Path]) -> dict[Path, int]:
        """The files among ``paths`` that are new, or whose size or inode differ from the committed ones, with
        their size now (one stat each; unchanged files are not opened)."""
        pending = {}
        for path in paths:
            try:
                stat = path.lstat()  # a link is refused by what it is, not by what it points to
            except FileNotFoundError:
                continue
            source = self._sources.get(self.layout.relative(path))
            if source is None or (
                source.state == "ok" and (stat.st_size, stat.st_ino) != (source.committed_offset, source.inode)
            ):
                pending[path] = stat.st_size
        return pending

    def _unread(self, path: Path, limit: int) -> bool:
        """True while ``path`` holds bytes before ``limit`` that a pass may still ingest."""
        source = self._sources.get(self.layout.relative(path))
        return source is None or (source.state == "ok" and source.committed_offset < limit)

    def run_pass(self, limits: dict[Path, int] | None = None) -> PassResult:
        """Ingest up to ``batch_bytes`` of new complete lines in one transaction.

        ``limits`` bounds what is read (these files, up to these sizes); by default every
        file as it is now. When DuckDB fails for another reason than a malformed line
        (out of memory, disk full, ...), nothing of the pass is committed: StoreError.
        """
        run_info = self._changed_run_info()
        reads, cut_short = self._read_sources(self._pending(self.layout.source_files()) if limits is None else limits)
        chunks = [r.chunk for r in reads if r.chunk is not None]
        table, rejected = lines_table(chunks)
        rejected += [r.overlong for r in reads if r.overlong is not None]
        try:
            rejected += self._stage(table)
            self._commit(run_info, table.num_rows > 0, reads, rejected)
        except duckdb.Error as exc:
            self._run_info_stamp = None  # not committed: read run.json again next pass
            where = self.store.path or "the in-memory store"
            raise StoreError(f"ingest into {where} failed, nothing of this pass committed: {exc}") from exc
        for read in reads:
            self._sources[read.source.path] = read.source
            if read.incident:
                self.warn(read.incident)
        return PassResult(
            lines=sum(c.line_count for c in chunks) - len(rejected) + sum(r.overlong is not None for r in reads),
            rejected=len(rejected),
            bytes=sum(len(c.data) for c in chunks),
            incidents=[r.incident for r in reads if r.incident],
            backlog=cut_short or any(r.cut for r in reads),
        )

    def _commit(self, run_info: RunInfo | None, staged: bool, reads: list[_Read], rejected: list[Rejection]) -> None:
        """Store run.json, the staged rows, the rejected lines and the new offsets in one transaction."""
        now = time.time()
        with self.store.transaction() as con:
            if run_info is not None:
                _replace_run_info(con, run_info)
            if staged:
                con.execute(sql("insert_staged"))
            if rejected:
                con.register("rejected_batch", rejections_table(rejected, now))
                con.execute(sql("insert_rejected"))
                con.unregister("rejected_batch")
            _commit_sources(con, reads, rejected, now)

    # -- reading files ------------------------------------------------------
    def _load_sources(self) -> list[Source]:
        rows = self._con.execute(sql("sources")).fetchall()
        return [
            Source(
                source_id=r[0],
                path=r[1],
                file_rank=r[2],
                device=r[3],
                inode=r[4],
                head=bytes(r[5] or b""),
                committed_offset=r[6],
                state=r[7],
            )
            for r in rows
        ]

    def _read_sources(self, limits: dict[Path, int]) -> tuple[list[_Read], bool]:
        """What each file holds up to its limit, within the pass's byte budget; and whether the budget ran
        out before every file was read."""
        reads: list[_Read] = []
        budget = self.batch_bytes
        for path, limit in limits.items():
            if budget <= 0:
                return reads, True
            read = self._read_source(path, limit, budget)
            if read is not None:
                reads.append(read)
                budget -= len(read.chunk.data) if read.chunk else 0
        return reads, False

    def _source_for(self, path: Path) -> Source:
        key = self.layout.relative(path)
        if key not in self._sources:
            self._sources[key] = Source(source_id=self._next_source_id, path=key, file_rank=rank_of_file(path))
            self._next_source_id += 1
        return self._sources[key]

    def _read_source(self, path: Path, limit: int, budget: int) -> _Read | None:
        """The complete lines of ``path`` after its committed offset and before byte ``limit``.

        The file is opened without following a link or blocking, and checked on the descriptor: a name
        outside the format or anything but a regular file is refused unread, once, with its reason.
        """
        source = self._source_for(path)
        if source.state != "ok":
            return None
        try:
            problem = name_problem(path.name)
            if problem:
                raise UnsafeFileError(problem)
            with os.fdopen(open_regular_file(path), "rb") as fh:
                stat = os.fstat(fh.fileno())
                if min(stat.st_size, limit) == source.committed_offset and source.inode == stat.st_ino:
                    return None
                head = fh.read(HEAD_BYTES)
                change = _identity_problem(source, stat, head)
                if change:
                    state, detail = change
                    return _Read(replace(source, state=state), None, f"{source.path}: {detail}")
                fh.seek(source.committed_offset)
                data, overlong = _read_complete_lines(fh, budget, limit - source.committed_offset)
        except FileNotFoundError:
            return None
        except UnsafeFileError as refusal:
            return _Read(replace(source, state="refused"), None, f"{source.path}: {refusal}")
        updated = replace(
            source,
            device=stat.st_dev,
            inode=stat.st_ino,
            head=head if len(head) > len(source.head) else source.head,
            committed_offset=source.committed_offset + len(data),
        )
        chunk = Chunk(source.source_id, source.file_rank, source.committed_offset, data) if data else None
        if overlong is None:
            return _Read(updated, chunk, cut=budget < limit - source.committed_offset)
        rejection = _overlong_rejection(updated, overlong, limit - updated.committed_offset)
        return _Read(
            replace(updated, state="overlong"), chunk, f"{source.path}: {rejection.reason}", overlong=rejection
        )

    # -- run.json -----------------------------------------------------------
    def _changed_run_info(self) -> RunInfo | None:
        try:
            stat = self.layout.run_info.stat()
        except FileNotFoundError:
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._run_info_stamp:
            return None
        try:
            info = read_run_info(self.layout)
        except RunInfoError as exc:
            self.warn(f"run.json ignored: {exc}")
            info = None
        self._run_info_stamp = stamp
        if info is not None:
            self.world_size = info.world_size
            for problem in info.problems:
                self.warn(f"run.json: {problem}")
        return info

    # -- parsing ------------------------------------------------------------
    def _stage(self, table: pa.Table) -> list[Rejection]:
        """Parse ``table`` into the temp table staged; return the lines it rejects."""
        if table.num_rows == 0:
            return []
        rejected = []
        try:
            self._try_stage(table, check_json=False)
        except MALFORMED_INPUT_ERRORS:
            broken = self._isolate_unparseable(table)
            keep = sorted(set(range(table.num_rows)) - {i for i, _ in broken})
            rejected = [_rejection(table, i, f"unreadable record: {error}") for i, error in broken]
            self._try_stage(table.take(pa.array(keep, pa.int64())), check_json=True)
        for source_id, offset, length, line, reason in self._con.execute(sql("staged_rejections")).fetchall():
            rejected.append(Rejection(source_id, offset, length, line, explain_rejection(line, reason)))
        return rejected

    def _try_stage(self, table: pa.Table, *, check_json: bool) -> None:
        self._con.register("batch_lines", table)
        try:
            self._con.execute(
                sql("stage_lines"), {**FORMAT_PARAMETERS, "world_size": self.world_size, "check_json": check_json}
            )
        finally:
            self._con.unregister("batch_lines")

    def _isolate_unparseable(self, table: pa.Table, base: int = 0) -> list[tuple[int, str]]:
        """Stage ``table`` checking JSON first; when DuckDB still refuses, bisect to the lines it cannot read."""
        try:
            self._try_stage(table, check_json=True)
            return []
        except MALFORMED_INPUT_ERRORS as exc:
            if table.num_rows == 1:
                return [(base, str(exc).splitlines()[0])]
        half = table.num_rows // 2
        return self._isolate_unparseable(table.slice(0, half), base) + self._isolate_unparseable(
            table.slice(half), base + half
        )


def _read_complete_lines(fh: BinaryIO, budget: int, available: int) -> tuple[bytes, bytes | None]:
    """Complete lines from the current position within ``available`` bytes (about ``budget``, up to
    MAX_LINE_BYTES for one long line); and the start of the line after them when it runs past MAX_LINE_BYTES
    with no newline (None when it may still end)."""
    data = fh.read(max(0, min(budget, available)))
    if b"\n" not in data:
        data += fh.read(max(0, min(available, MAX_LINE_BYTES) - len(data)))
    start = 0
    while len(data) - start >= MAX_LINE_BYTES:
        end = data.rfind(b"\n", start, start + MAX_LINE_BYTES)
        if end < 0:
            return data[:start], data[start:]
        start = end + 1
    return complete_prefix(data), None


def _overlong_rejection(source: Source, text: bytes, length: int) -> Rejection:
    """The rejection of everything in ``source`` from its committed offset: a line with no newline in time."""
    reason = (
        f"no newline within {MAX_LINE_BYTES:,} bytes (the longest line the format allows): rejected from "
        f"byte {source.committed_offset} on, the rest of the file is not read"
    )
    return Rejection(source.source_id, source.committed_offset, length, text[: MAX_REJECTED_CHARS * 4], reason)


def _rejection(table: pa.Table, index: int, reason: str) -> Rejection:
    row = table.slice(index, 1).to_pylist()[0]
    line = row["line"]
    return Rejection(row["source_id"], row["line_offset"], len(line.encode()), line, reason)


def _identity_problem(source: Source, stat: os.stat_result, head: bytes) -> tuple[str, str] | None:
    """('shrunk'|'replaced', detail) when the file is no longer the one ingested so far."""
    if source.committed_offset == 0:
        return None
    if (source.inode, source.device) != (stat.st_ino, stat.st_dev) and source.inode is not None:
        return "replaced", "file was replaced (another file now has its name); not re-read"
    if stat.st_size < source.committed_offset:
        return (
            "shrunk",
            f"file shrank to {stat.st_size} bytes below the {source.committed_offset} already ingested; not re-read",
        )
    if not head.startswith(source.head):
        return "replaced", "file was replaced (different first bytes); not re-read"
    return None


def _commit_sources(con: duckdb.DuckDBPyConnection, reads: list[_Read], rejected: list[Rejection], now: float) -> None:
    """Commit every file's new offset and counts in one statement, then any incidents."""
    if not reads:
        return
    bad: dict[int, int] = {}
    for r in rejected:
        bad[r.source_id] = bad.get(r.source_id, 0) + 1
    rows = [_source_row(read, bad.get(read.source.source_id, 0), now) for read in reads]
    con.register("source_updates", pa.Table.from_pylist(rows, schema=SOURCE_SCHEMA))
    con.execute(sql("upsert_sources"))
    con.unregister("source_updates")
    for read in reads:
        if read.incident:
            con.execute(sql("insert_source_incident"), [read.source.source_id, now, read.source.state, read.incident])


def _source_row(read: _Read, rejected: int, now: float) -> dict:
    source = read.source
    lines = (read.chunk.line_count if read.chunk else 0) + (read.overlong is not None)
    return {
        "source_id": source.source_id,
        "path": source.path,
        "file_rank": source.file_rank,
        "device": source.device,
        "inode": source.inode,
        "head": source.head,
        "committed_offset": source.committed_offset,
        "lines": lines - rejected,
        "rejected": rejected,
        "state": source.state,
        "state_detail": read.incident,
        "updated_at": now,
    }


def _replace_run_info(con: duckdb.DuckDBPyConnection, info: RunInfo) -> None:
    topology = pa.Table.from_pylist(
        [
            {"rank": p.rank, "host": p.host, "local_rank": p.local_rank, "dp": p.dp, "tp": p.tp, "pp": p.pp}
            for p in info.topology
        ],
        schema=TOPOLOGY_SCHEMA,
    )
    con.execute(sql("clear_run_info"))
    con.register("run_topology", topology)
    con.execute(sql("insert_topology"))
    con.unregister("run_topology")
    con.execute(
        sql("insert_run_info"),
        {
            "run_id": info.run_id,
            "name": info.name,
            "created": info.created,
            "schema_version": info.schema_version,
            "world_size": info.world_size,
            "config": json.dumps(info.config),
            "raw": json.dumps(info.to_json()),
            "problems": list(info.problems),
        },
    )
