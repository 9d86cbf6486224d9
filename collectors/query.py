"""Read-only access to a run's store, even while another process holds it.

DuckDB lets one process write a database file. When the collector (or
``bedside serve``/``watch``) holds the store, a reader rebuilds the same tables
and views in memory from the raw telemetry files instead, so every query works
the same on a live run and in a post-mortem.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import StoreCorruptError, StoreLockedError
from .ingest import Collector
from .layout import RunLayout, require_run_dir
from .store import Schema, Store
from .store.console import ConsoleLimits, ConsoleResult, run_console_query


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
        except StoreCorruptError:
            note = "the store is damaged"
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
