"""Read-only access to a run's store, even while another process holds it.

DuckDB lets one process write a database file. When the collector (or
``bedside serve``/``watch``) holds the store, a reader rebuilds the same tables
and views in memory from the raw telemetry files instead, so every query works
the same on a live run and in a post-mortem.

A snapshot (``snapshot_store``) is the other way to read a held store, and the only one that
sees what lives in the owner's store alone (findings, incidents): a copy of the store file
and its write-ahead log that DuckDB opens as the owner had committed it when the copy was
taken. DuckDB never overwrites the blocks of its last checkpoint before it writes a new
header, and it replays the log on open, so a copy of the log and then of the file is
consistent as long as no checkpoint completed meanwhile: the file's headers (its first
``HEADER_BYTES``) are read before and after, and the copy is taken again when they moved.
Every block of the copy is then read once (``Store.verify``) to check its checksum.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import StoreCorruptError, StoreError, StoreLockedError, StoreTamperedError
from .ingest import Collector
from .layout import RunLayout, require_run_dir
from .safefile import UnsafeFileError, open_regular_file
from .store import Schema, Store, wal_path
from .store.console import ConsoleLimits, ConsoleResult, run_console_query

HEADER_BYTES = 3 * 4096
"""DuckDB's file header and its two alternating database headers: a completed checkpoint rewrites one."""
SNAPSHOT_TRIES = 6
MAX_WAL_BYTES = 1 << 30
"""A snapshot copies a write-ahead log of at most the store file's size or this, whichever is larger."""
COPY_CHUNK = 1 << 20


@dataclass
class ReadView:
    """A store open for reading, and where its rows came from."""

    store: Store
    source: str  # "store" or "raw telemetry"
    note: str = ""


def open_for_reading(run_dir: Path, *, verify: bool = False, schemas: Sequence[Schema] = ()) -> ReadView:
    """The run's store read-only, or an in-memory copy built from its telemetry files, with ``schemas`` beside
    the telemetry's (an in-memory copy has their tables, empty).

    ``verify`` reads the whole store first (``Store.verify``), and falls back to the telemetry if it is damaged.
    """
    layout = RunLayout(require_run_dir(run_dir))
    note = "no store yet"
    if layout.store.exists():
        try:
            store = Store.open(layout.store, read_only=True, schemas=schemas)
            if verify:
                store.verify()
            return ReadView(store, "store")
        except StoreLockedError:
            note = "the store is held by another process"
        except StoreTamperedError as exc:
            note = str(exc)
        except StoreCorruptError:
            note = "the store is damaged"
    return rebuild_from_telemetry(layout, note, schemas=schemas)


def rebuild_from_telemetry(layout: RunLayout, note: str, *, schemas: Sequence[Schema] = ()) -> ReadView:
    """The run's tables and views in memory, ingested from its telemetry files (``schemas``' tables empty)."""
    memory = Store.open(None, schemas=schemas)
    result = Collector(layout.root, memory).ingest_available()
    return ReadView(memory, "raw telemetry", f"{note}; read {result.lines} lines from the raw telemetry")


def run_query(
    run_dir: Path, query: str, limits: ConsoleLimits | None = None, *, schemas: Sequence[Schema] = ()
) -> tuple[ConsoleResult, ReadView]:
    """Run a user's read-only SQL against a run's views (in a sandbox: ``store.console``)."""
    view = open_for_reading(run_dir, schemas=schemas)
    try:
        return run_console_query(view.store, query, limits), view
    finally:
        view.store.close()


def snapshot_store(path: Path, into: Path, *, schemas: Sequence[Schema] = (), tries: int = SNAPSHOT_TRIES) -> Store:
    """A consistent copy of the store at ``path`` (its write-ahead log included) in the folder ``into``, open
    read-only and verified. Works while another process writes the store; StoreError when the store is missing,
    when every copy failed to open (StoreCorruptError: its checksums), or when checkpoints kept moving it."""
    if not path.is_file():
        raise StoreError(f"no store at {path}")
    copy = into / path.name
    failure: StoreError | None = None
    for attempt in range(tries):
        if attempt:
            time.sleep(0.05 * 2**attempt)
        if not _copy_between_checkpoints(path, copy):
            failure = StoreError(f"{path} kept being checkpointed while it was copied ({tries} tries)")
            continue
        try:
            store = Store.open(copy, read_only=True, schemas=schemas)
            store.verify()
            return store
        except StoreTamperedError:  # what the owner committed: another copy holds the same
            raise
        except StoreError as exc:  # a copy torn in a way the headers did not show: take it again
            failure = exc
    assert failure is not None
    raise failure


def _copy_between_checkpoints(path: Path, copy: Path) -> bool:
    """Copy the log, then the file, to ``copy``; False when a checkpoint completed meanwhile. Only regular files
    are copied (a link to ``/dev/zero`` or a FIFO in their place is refused unread: StoreError), and the log at
    most as large as the file or ``MAX_WAL_BYTES``, whichever is larger."""
    wal, copied_wal = wal_path(path), wal_path(copy)
    before = _headers(path)
    copied_wal.unlink(missing_ok=True)
    with _regular(path) as store:
        limit = max(os.fstat(store).st_size, MAX_WAL_BYTES)
        with contextlib.suppress(FileNotFoundError), _regular(wal) as log:  # no log: everything is checkpointed
            _copy_descriptor(log, copied_wal, limit, wal)
        _copy_descriptor(store, copy, None, path)
    return _headers(path) == before


@contextlib.contextmanager
def _regular(path: Path) -> Iterator[int]:
    """A read-only descriptor of the regular file ``path`` (FileNotFoundError passes); StoreError naming anything
    else (a link, a FIFO, a device), unread."""
    try:
        descriptor = open_regular_file(path)
    except UnsafeFileError as exc:
        raise StoreError(f"{path}: {exc}") from None
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def _copy_descriptor(source: int, target: Path, limit: int | None, name: Path) -> None:
    """Copy the ``fstat`` size of ``source`` to a new ``target`` (what it gains meanwhile is left: a later copy
    takes it); StoreError when that is over ``limit``."""
    size = os.fstat(source).st_size
    if limit is not None and size > limit:
        raise StoreError(f"{name}: {size:,} bytes, over the limit of {limit:,} (the store's size or MAX_WAL_BYTES)")
    with target.open("wb") as out:
        left = size
        while left > 0:
            chunk = os.read(source, min(left, COPY_CHUNK))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)


def _headers(path: Path) -> bytes:
    with _regular(path) as descriptor:
        return os.read(descriptor, HEADER_BYTES)
