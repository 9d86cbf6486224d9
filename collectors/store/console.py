"""The SQL console: a user's query over the documented views, run where it cannot write.

User SQL never runs on a connection that can reach the store. Each query gets a fresh
in-memory DuckDB instance, the sandbox (``open_sandbox``): file and network access off,
extensions and Python replacement scans off, its configuration locked. The views the
query names are streamed into it from the store as Arrow record batches, each read by
our own ``SELECT * FROM <view>`` on a cursor of the store, whose connection is locked down
too and whose views are the ones our migrations define (``catalog``: a store holding other
code is refused when it is opened). Nothing in the sandbox refers to the store, so no
statement typed there (a CTE that deletes, ``EXPLAIN ANALYZE`` of an insert, ``ATTACH``,
``COPY``, ``PRAGMA``, ``SET``) can change it, and tables that are not documented views (the
outbox, sources, the migrations) are not there to read.

The statement check is a second wall: exactly one SELECT, whose parse tree holds no
data-changing node, names only our views and calls no table function that reads
files or runs SQL text. Results are capped in rows and bytes (the frame says when it was
cut), and a time limit interrupts the sandbox. A result can also be written out as CSV a
batch at a time (``write_console_csv``), so an export of millions of rows holds one batch
in memory, not the result.
"""

from __future__ import annotations

import difflib
import io
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv

from ..defaults import DEFAULT_MAX_ROWS, DEFAULT_QUERY_TIMEOUT_S
from ..errors import QueryError
from . import Store, open_sandbox, sql

BATCH_ROWS = 65_536
AS_TEXT_TYPES = {"map", "list", "array", "struct", "union", "variant", "interval", "bit", "time with time zone", "blob"}
"""Column types a CSV holds as DuckDB's text of them: nested values, and those Arrow's CSV writer refuses
(an interval, a bit string, bytes that are not UTF-8) or writes without their time zone."""
READING_NODES = {"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"}
SQL_RUNNING_FUNCTIONS = {"query", "query_table"}
FILE_FUNCTION_PREFIXES = ("read_", "parquet_", "iceberg_", "delta_")
FILE_FUNCTIONS = {"glob", "sniff_csv", "parquet_scan", "csv_scan"}


@dataclass(frozen=True, kw_only=True)
class ConsoleLimits:
    """How long a console query may run and how much of its result is kept."""

    timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
    max_rows: int = DEFAULT_MAX_ROWS
    max_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        if self.max_rows < 1 or self.max_bytes < 1:
            raise ValueError(f"max_rows and max_bytes must be >= 1, got {self.max_rows!r}, {self.max_bytes!r}")


@dataclass(frozen=True)
class ConsoleResult:
    """A console query's rows (Arrow dtypes: NULL is ``<NA>``, distinct from a NaN value) and whether they were cut."""

    frame: pd.DataFrame
    truncated: bool = False

    def cut_note(self, limits: ConsoleLimits) -> str:
        """Why the result stops where it does, or '' when it is whole."""
        if not self.truncated:
            return ""
        return (
            f"result cut at {len(self.frame):,} rows (the limit is {limits.max_rows:,} rows or "
            f"{limits.max_bytes / 2**20:g} MiB): add a LIMIT or aggregate"
        )


@dataclass(frozen=True)
class CsvExport:
    """What ``write_console_csv`` wrote: rows and CSV bytes, whether the limits cut the result, and then how many
    rows the whole result has (None when the time limit ran out while counting them)."""

    rows: int
    bytes: int
    truncated: bool = False
    total: int | None = None

    def __post_init__(self) -> None:
        if not self.truncated and self.total is None:
            object.__setattr__(self, "total", self.rows)


def console_examples(text: str, *, timeline: int, first: int, last: int, recent: int) -> dict[str, str]:
    """Example queries by title from ``text`` (each after a ``-- example:`` line), with the run's numbers in."""
    examples: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("-- example: "):
            title = line.removeprefix("-- example: ").strip()
        elif title and line.strip():
            examples[title] = line.format(timeline=int(timeline), first=int(first), last=int(last), recent=int(recent))
    return examples


def console_views(store: Store) -> list[str]:
    """The views a console query may read: those our migrations define for the store's schemas (each documented in
    docs/schema.md); a view someone else added to the file is never read."""
    return store.view_names()


def run_console_query(store: Store, query: str, limits: ConsoleLimits | None = None) -> ConsoleResult:
    """Run a user's read-only query over ``store``'s documented views in a sandbox; QueryError names any problem."""
    limits = limits or ConsoleLimits()
    with console_reader(store, query, limits) as reader:
        return _capped(reader, limits)


def write_console_csv(store: Store, query: str, out: BinaryIO, limits: ConsoleLimits | None = None) -> CsvExport:
    """Write a user's read-only query's result to ``out`` as CSV (a header, then the rows), batch by batch as the
    sandbox produces them: memory holds one batch, not the result. Stops at the last whole row within
    ``limits`` (rows, CSV bytes), says so, and counts the rows of the rest without writing them."""
    limits = limits or ConsoleLimits()
    rows = size = 0
    buffer = io.BytesIO()  # one batch's CSV, written on to ``out`` once it is known to fit

    def drained() -> bytes:
        chunk = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return chunk

    with console_reader(store, query, limits, flat=True) as reader, pa_csv.CSVWriter(buffer, reader.schema) as writer:
        header = drained()
        out.write(header)
        size = len(header)
        for batch in reader:
            kept = min(batch.num_rows, limits.max_rows - rows)
            writer.write_batch(batch.slice(0, kept))
            chunk = drained()
            if size + len(chunk) > limits.max_bytes:
                kept, chunk = _rows_in_budget(batch.slice(0, kept), limits.max_bytes - size)
            out.write(chunk)
            rows, size = rows + kept, size + len(chunk)
            if kept < batch.num_rows:
                return CsvExport(rows, size, truncated=True, total=_rows_left(reader, rows + batch.num_rows - kept))
    return CsvExport(rows, size)


def _rows_in_budget(batch: pa.RecordBatch, budget: int) -> tuple[int, bytes]:
    """The most leading rows of ``batch`` whose CSV fits in ``budget`` bytes, and that CSV (a binary search: a
    value may hold newlines, so the rows cannot be found in the text)."""
    fits, chunk, over = 0, b"", batch.num_rows
    while over - fits > 1:
        middle = (fits + over) // 2
        out = io.BytesIO()
        pa_csv.write_csv(
            pa.Table.from_batches([batch.slice(0, middle)]), out, pa_csv.WriteOptions(include_header=False)
        )
        if len(out.getvalue()) <= budget:
            fits, chunk = middle, out.getvalue()
        else:
            over = middle
    return fits, chunk


def _rows_left(reader: pa.RecordBatchReader, counted: int) -> int | None:
    """``counted`` plus the rows ``reader`` still holds; None if the time limit interrupts the count."""
    try:
        for batch in reader:
            counted += batch.num_rows
    except duckdb.InterruptException:
        return None
    return counted


@contextmanager
def console_reader(
    store: Store, query: str, limits: ConsoleLimits, *, flat: bool = False
) -> Iterator[pa.RecordBatchReader]:
    """The result of a user's query, checked and run in a fresh sandbox, as a stream of Arrow batches; the sandbox
    is interrupted after ``limits.timeout_s`` and closed when the block ends. ``flat``: nested values (a map, a
    list, a struct) as their text, as a CSV holds them. QueryError names any problem."""
    views = console_views(store)
    sandbox = open_sandbox()
    cursors: list[duckdb.DuckDBPyConnection] = []
    timer = threading.Timer(limits.timeout_s, sandbox.interrupt)
    try:
        counts = check_statement(sandbox, query, views)
        timer.start()
        for view in sorted(counts):
            cursors.append(_stream_view(store, sandbox, view, materialize=counts[view] > 1))
        result = sandbox.sql(query)
        yield (_flattened(result) if flat else result).to_arrow_reader(BATCH_ROWS)
    except duckdb.InterruptException as exc:
        raise QueryError(f"query stopped after {limits.timeout_s:g} s") from exc
    except duckdb.Error as exc:
        raise QueryError(f"SQL error: {exc}") from exc
    finally:
        timer.cancel()
        for cursor in cursors:
            cursor.close()
        sandbox.close()


def _flattened(result: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """The result with each ``AS_TEXT_TYPES`` column cast to its text (in order, under its own name)."""
    columns = []
    for name, kind in zip(result.columns, result.types):
        quoted = '"' + name.replace('"', '""') + '"'
        columns.append(f"CAST({quoted} AS VARCHAR) AS {quoted}" if kind.id in AS_TEXT_TYPES else quoted)
    return result.select(", ".join(columns)) if columns else result


def check_statement(sandbox: duckdb.DuckDBPyConnection, query: str, views: list[str]) -> dict[str, int]:
    """The second wall: one SELECT that only reads documented views; how often it names each view."""
    try:
        statements = sandbox.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(f"SQL error: {exc}") from exc
    if len(statements) != 1:
        raise QueryError(f"expected exactly one SQL statement, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise QueryError(f"only SELECT queries are allowed here, got {statements[0].type.name}")
    tree = json.loads(sandbox.execute(sql("console_parse"), [query]).fetchall()[0][0])
    if tree.get("error"):
        raise QueryError(f"only a plain SELECT is allowed here: {tree.get('error_message', 'it does not parse')}")
    ctes = {key for node in _nodes(tree) for key in _cte_names(node)}
    counts: dict[str, int] = {}
    for node in _nodes(tree):
        kind = node.get("type")
        if isinstance(kind, str) and kind.endswith("_NODE") and kind not in READING_NODES:
            raise QueryError(f"a console query may only read, and this one holds {kind.removesuffix('_NODE')}")
        if kind == "BASE_TABLE":
            name = _table_name(node, views, ctes)
            counts[name] = counts.get(name, 0) + 1
        if kind == "TABLE_FUNCTION":
            _check_table_function(node)
    return {name: n for name, n in counts.items() if name in views}


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    """Every object in a parse tree, depth first."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _cte_names(node: dict[str, Any]) -> list[str]:
    cte_map = node.get("cte_map")
    if not isinstance(cte_map, dict):
        return []
    return [entry["key"].lower() for entry in cte_map.get("map", []) if isinstance(entry, dict) and "key" in entry]


def _table_name(node: dict[str, Any], views: list[str], ctes: set[str]) -> str:
    """The view a table reference names; QueryError for anything else (a base table, another catalog)."""
    name = str(node.get("table_name", ""))
    qualifier = ".".join(part for part in (node.get("catalog_name"), node.get("schema_name")) if part)
    if qualifier and qualifier.lower() not in ("main", "memory", "memory.main"):
        raise QueryError(f"{qualifier}.{name}: the console reads only the documented views, unqualified")
    if name.lower() in ctes:
        return name
    canonical = {view.lower(): view for view in views}.get(name.lower())  # SQL names ignore case
    if canonical:
        return canonical
    close = difflib.get_close_matches(name, views, n=1)
    hint = f' Did you mean "{close[0]}"?' if close else ""
    raise QueryError(
        f"no view named {name!r}.{hint} The console reads only the documented views "
        f"({', '.join(views)}; docs/schema.md)"
    )


def _check_table_function(node: dict[str, Any]) -> None:
    function = node.get("function") or {}
    name = str(function.get("function_name", "")).lower()
    if name in SQL_RUNNING_FUNCTIONS:
        raise QueryError(f"{name}() runs SQL from a string, which the console does not allow")
    if name in FILE_FUNCTIONS or name.startswith(FILE_FUNCTION_PREFIXES):
        raise QueryError(f"{name}() reads files, which the console does not allow: it reads only the views")


def _stream_view(
    store: Store, sandbox: duckdb.DuckDBPyConnection, view: str, *, materialize: bool
) -> duckdb.DuckDBPyConnection:
    """Make ``view`` readable in the sandbox from a cursor of the store; the cursor (close it after the query).

    A view the query names once is streamed; one named more than once is read whole, since
    a stream can be scanned only once.
    """
    cursor = store.cursor()
    reader = cursor.sql(f'SELECT * FROM "{view}"').to_arrow_reader(BATCH_ROWS)
    sandbox.register(view, reader.read_all() if materialize else reader)
    return cursor


def _capped(reader: pa.RecordBatchReader, limits: ConsoleLimits) -> ConsoleResult:
    """At most ``max_rows`` rows and about ``max_bytes`` of the result."""
    batches: list[pa.RecordBatch] = []
    rows = size = 0
    truncated = False
    for batch in reader:
        if rows + batch.num_rows > limits.max_rows or size + batch.nbytes > limits.max_bytes:
            keep = min(limits.max_rows - rows, _rows_within(batch, limits.max_bytes - size))
            batches.append(batch.slice(0, keep))
            truncated = True
            break
        batches.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
    table = pa.Table.from_batches(batches, schema=reader.schema)
    return ConsoleResult(table.to_pandas(types_mapper=pd.ArrowDtype), truncated)


def _rows_within(batch: pa.RecordBatch, budget: int) -> int:
    """How many leading rows of ``batch`` fit in ``budget`` bytes (by the batch's mean row size)."""
    if budget <= 0 or batch.num_rows == 0:
        return 0
    return min(batch.num_rows, budget * batch.num_rows // max(batch.nbytes, 1))
