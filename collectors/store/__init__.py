"""The DuckDB store of one run: the only module that opens a database connection.

A store holds the parts of its owners, each a ``Schema`` (as datasette keeps its internal
tables apart): a namespace with numbered ``.sql`` migrations in its package's ``migrations/``
folder and named queries in its ``queries/`` folder. The telemetry's own (this package) is
always there; the service adds the findings, incidents and outbox (``bedside.app.service.schema``).
One process writes a store; others open it read-only, or, while it is held, rebuild it in
memory from the raw telemetry through the same schemas (see ``collectors.query``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from .. import failpoints
from ..errors import StoreCorruptError, StoreError, StoreLockedError, StoreTamperedError
from ..safefile import special_file

if TYPE_CHECKING:  # the writers (collect, watch) never load pandas: a DataFrame is only made on a read
    import pandas as pd

STORE_CONFIG: dict[str, str | bool | int | float | list[str]] = {  # every connection, a store's included: no
    # file but its own database, no network, extensions or Python objects; its configuration locked
    "enable_external_access": False,
    "python_enable_replacements": False,
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "allow_community_extensions": False,
    "lock_configuration": True,
}
SANDBOX_CONFIG: dict[str, str | bool | int | float | list[str]] = {  # a database for users' SQL, in memory
    **STORE_CONFIG,
    "temp_directory": "",
    "memory_limit": "2GB",
    "threads": 2,
}


DatabaseError = duckdb.Error
"""What DuckDB raises (for callers that report errors without importing duckdb)."""
DAMAGED_SUFFIX = ".damaged-"
"""A damaged store moved aside by ``move_aside`` is named ``bedside.duckdb.damaged-<UTC time>``."""


@dataclass(frozen=True)
class Schema:
    """One owner's part of a store: its migrations (versions count per namespace) and its named queries."""

    namespace: str
    package: str
    """The package whose ``migrations/`` and ``queries/`` folders hold the ``.sql`` files."""

    def migrations(self) -> list[tuple[int, str, str]]:
        """(version, name, sql) of every migration file, in order."""
        folder = resources.files(self.package).joinpath("migrations")
        found = []
        for entry in folder.iterdir() if folder.is_dir() else ():
            if entry.name.endswith(".sql"):
                found.append((int(entry.name.split("_", 1)[0]), entry.name, entry.read_text()))
        return sorted(found)

    def query(self, name: str) -> str | None:
        """The text of ``queries/<name>.sql``, None when this schema has no such query."""
        return _query_text(self.package, name)


@cache
def _query_text(package: str, name: str) -> str | None:
    entry = resources.files(package).joinpath("queries", f"{name}.sql")
    return entry.read_text() if entry.is_file() else None


TELEMETRY = Schema("telemetry", __package__)
"""The telemetry's tables and views, every store has them (versions 3 to 5 moved to the service's namespace)."""


def sql(name: str) -> str:
    """The text of the telemetry's named query ``queries/<name>.sql``."""
    text = TELEMETRY.query(name)
    if text is None:
        raise StoreError(f"no query named {name!r}")
    return text


def open_sandbox() -> duckdb.DuckDBPyConnection:
    """A new, empty in-memory database for one user query, locked down (see ``console``)."""
    return duckdb.connect(":memory:", config=SANDBOX_CONFIG)


class Store:
    """One DuckDB database (a run's ``bedside.duckdb``, or in memory)."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, path: Path | None, read_only: bool, schemas: Sequence[Schema] = ()
    ) -> None:
        self._con = con
        self.path = path
        self.read_only = read_only
        self.schemas = (TELEMETRY, *(s for s in schemas if s != TELEMETRY))
        self._lock = threading.Lock()
        self._versions: tuple[tuple[str, str, int], ...] | None = None

    @classmethod
    def open(
        cls,
        path: Path | None = None,
        *,
        read_only: bool = False,
        schemas: Sequence[Schema] = (),
        memory_limit: str | None = None,
    ) -> Store:
        """Open (and, when writable, migrate) the store at ``path``, with the telemetry's schema and ``schemas``;
        None means in memory. ``memory_limit`` (DuckDB's, e.g. ``"2GB"``) is set before the configuration is
        locked: nothing can change it later. A store or log that is no regular file is a StoreTamperedError."""
        if path is not None:
            refuse_special_files(path)
        if read_only and (path is None or not path.exists()):
            raise StoreError(f"no store at {path}")
        existed = path is not None and path.exists()
        seen = fingerprint(path) if existed and path is not None else None
        try:
            config = STORE_CONFIG | ({"memory_limit": memory_limit} if memory_limit else {})
            con = duckdb.connect(str(path) if path else ":memory:", read_only=read_only, config=config)
        except duckdb.Error as exc:
            if isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower():
                raise StoreLockedError(f"{path} is held by another process ({exc})") from exc
            raise _damaged(path, exc) if _is_damage(exc) else StoreError(f"cannot open {path}: {exc}") from exc
        store = cls(con, path, read_only, schemas)
        if existed:
            if not read_only:
                store.verify()  # never append to a damaged store: the damage would spread to new rows
            store.trust_code(seen)
        if not read_only:
            store.migrate()
        return store

    def trust_code(self, seen: Fingerprint | None = None) -> None:
        """Make sure the store's views and macros are our migrations' (``catalog``): the owner puts ours back, and
        anything else not ours closes the store with a StoreTamperedError naming it. ``seen``: the files'
        fingerprint before they were opened; a reader of files unchanged since this process checked them trusts
        that check."""
        from . import catalog

        assert self.path is not None
        try:
            self._versions = self._read_versions()
            if self.read_only and seen is not None and catalog.checked_before(self.path, seen, self._versions):
                return
            found = None
            if not self.read_only:
                with self.transaction() as con:
                    found = catalog.read_catalog(con)
                    if catalog.restore(con, self._versions, found):
                        found = None  # ours put back: what the check reads is the catalog now
            catalog.check_catalog(self._con, self._versions, self.path, seen, found)
        except duckdb.Error as exc:
            self._con.close()
            raise (
                _damaged(self.path, exc) if _is_damage(exc) else StoreError(f"cannot read {self.path}: {exc}")
            ) from exc
        except BaseException:
            self._con.close()
            raise

    def versions(self) -> tuple[tuple[str, str, int], ...]:
        """(package, namespace, newest migration applied) of each of this store's schemas, as read at open."""
        if self._versions is None:
            self._versions = self._read_versions()
        return self._versions

    def _read_versions(self) -> tuple[tuple[str, str, int], ...]:
        recorded: dict[str, int] = {}
        if self._has_table("schema_migrations"):
            namespaced = self._has_column("schema_migrations", "namespace")
            query = sql("schema_versions" if namespaced else "schema_versions_legacy")
            recorded = dict(self._con.execute(query).fetchall())
        return tuple((schema.package, schema.namespace, recorded.get(schema.namespace, 0)) for schema in self.schemas)

    def view_names(self) -> list[str]:
        """The views of this store's schemas (ours, each documented in docs/schema.md), sorted."""
        from . import catalog

        return sorted(catalog.expected_catalog(self.versions()).views)

    def verify(self) -> None:
        """Read every block of every table, so DuckDB checks each block's checksum; StoreCorruptError if one
        fails or the file is cut short (the store is closed then)."""
        try:
            for (name,) in self._con.execute(sql("store_tables")).fetchall():
                self._con.execute(sql("verify_table"), {"name": name}).fetchall()
        except duckdb.Error as exc:
            self._con.close()
            raise _damaged(self.path, exc) from exc

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for the calling thread (DuckDB connections are not shared across threads)."""
        return self._con.cursor()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write transaction on this store's connection: committed whole or not at all."""
        with self._lock:
            con = self._con
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            failpoints.reach("store.commit")
            con.execute("COMMIT")

    def connection(self) -> duckdb.DuckDBPyConnection:
        """The writer's own connection (temp tables live here); one thread uses it."""
        return self._con

    def schema_version(self, schema: Schema = TELEMETRY) -> int:
        """The newest migration of ``schema`` applied, 0 for none."""
        if not self._has_table("schema_migrations"):
            return 0
        rows = self._con.execute(sql("schema_version"), {"namespace": schema.namespace}).fetchall()
        return int(rows[0][0])

    def migrate(self) -> None:
        """Apply every migration of each schema newer than the store, each in its own transaction."""
        with self.transaction() as con:
            if self._has_table("schema_migrations") and not self._has_column("schema_migrations", "namespace"):
                con.execute(sql("adopt_namespaces"))  # a store from before namespaces
            con.execute(sql("create_schema_migrations"))
        for schema in self.schemas:
            current = self.schema_version(schema)
            for version, name, text in schema.migrations():
                if version > current:
                    with self.transaction() as con:
                        con.execute(text)
                        con.execute(
                            sql("record_migration"), {"namespace": schema.namespace, "version": version, "name": name}
                        )
        self._versions = self._read_versions()

    def _has_column(self, table: str, column: str) -> bool:
        rows = self._con.execute(sql("has_column"), {"table": table, "column": column}).fetchall()
        return bool(rows[0][0])

    def query_text(self, name: str) -> str:
        """The named query of this store's schemas (StoreError naming it when none has it)."""
        for schema in self.schemas:
            text = schema.query(name)
            if text is not None:
                return text
        raise StoreError(f"no query named {name!r} in the schemas {', '.join(s.namespace for s in self.schemas)}")

    def _has_table(self, name: str) -> bool:
        rows = self._con.execute(sql("has_table"), {"name": name}).fetchall()
        return bool(rows[0][0])

    def fetch_named(
        self, name: str, params: dict[str, Any] | None = None, tables: dict[str, pa.Table] | None = None
    ) -> pd.DataFrame:
        """Run the named query ``queries/<name>.sql`` with its ``$name`` parameters bound; a DataFrame.

        ``tables`` are Arrow tables the query reads by name, registered for this call only.
        """
        cur = self.cursor()
        for table_name, table in (tables or {}).items():
            cur.register(table_name, table)
        return cur.execute(self.query_text(name), params or {}).df()

    def write_named(self, writes: list[tuple[str, dict[str, pa.Table]]]) -> None:
        """Run named write queries, each reading its Arrow tables by name, in one transaction."""
        with self.transaction() as con:
            for name, tables in writes:
                for table_name, table in tables.items():
                    con.register(table_name, table)
                try:
                    con.execute(self.query_text(name))
                finally:
                    for table_name in tables:
                        con.unregister(table_name)

    def execute_named(self, name: str, params: dict[str, Any]) -> None:
        """Run the named write query with its parameters on a cursor of the calling thread (its own transaction).

        For threads other than the writer's (the alert sender), which touch rows the writer does not.
        """
        self.cursor().execute(self.query_text(name), params)


def wal_path(path: Path) -> Path:
    """The write-ahead log DuckDB keeps beside the store at ``path``."""
    return path.with_name(f"{path.name}.wal")


def refuse_special_files(path: Path) -> None:
    """StoreTamperedError when the store at ``path`` or its log is there but is no regular file (a link, a FIFO, a
    device, a directory, a socket): DuckDB opens them by name, so it would block on a FIFO until a writer comes,
    and read and write through a link. Checked with ``lstat``, which neither blocks nor follows."""
    for file, role in ((path, "the store"), (wal_path(path), "the store's write-ahead log")):
        if kind := special_file(file):
            raise StoreTamperedError(
                f"{file} ({role}) is {kind}, not a regular file: bedside does not open it. Remove it, or move the "
                f"store aside and rebuild it from the telemetry with bedside collect {path.parent} --rebuild"
            )


Fingerprint = tuple[tuple[int, ...] | None, ...]


def fingerprint(path: Path) -> Fingerprint:
    """What changes whenever the store file or its write-ahead log is written: device, inode, size, and the
    modification and change times (a change time cannot be set back, as a modification time can)."""
    marks: list[tuple[int, ...] | None] = []
    for file in (path, wal_path(path)):
        try:
            info = os.stat(file)
        except FileNotFoundError:
            marks.append(None)
            continue
        marks.append((info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
    return tuple(marks)


def move_aside(path: Path) -> Path | None:
    """Rename a (damaged) store and its write-ahead log out of the way; the new name, None if there was none.

    StoreLockedError if another process holds the store: it would keep writing to the renamed file.
    """
    if not os.path.lexists(path):
        return None
    try:
        Store.open(path, read_only=True).close()
    except StoreLockedError as exc:
        raise StoreLockedError(f"cannot move the store aside: {exc}") from exc
    except StoreError:
        pass  # damaged beyond opening: nobody holds it
    aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    path.rename(aside)
    if os.path.lexists(wal := wal_path(path)):
        wal.rename(wal_path(aside))
    return aside


def _is_damage(exc: duckdb.Error) -> bool:
    text = str(exc)
    return any(sign in text for sign in ("Corrupt database", "Could not read enough bytes", "not a valid DuckDB"))


def _damaged(path: Path | None, exc: duckdb.Error) -> StoreCorruptError:
    detail = " ".join(str(exc).split())
    run = path.parent if path else "RUN"
    return StoreCorruptError(
        f"{path} is damaged ({detail}); bedside will not write to it. The telemetry is the "
        f"source of truth: rebuild the store with bedside collect {run} --rebuild"
    )
