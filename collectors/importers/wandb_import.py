"""Reading W&B exports: the UI's CSV, a history as JSONL or Parquet, or offline run directories.

- **CSV** (a panel's "Export CSV"): a ``Step`` column and one column per run and metric, ``<run> - <metric>``
  (a column without `` - `` is a metric of one unnamed run); the ``__MIN``/``__MAX`` band columns are left out.
- **JSONL / Parquet**: one row per history row, as ``run.history()`` or ``run.scan_history()`` give them:
  ``_step`` (required), ``_timestamp`` (unix seconds, the time), other ``_`` fields (``_runtime``,
  ``_wandb``) left out. A run whose rows carry ``train/global_step`` (``STEP_KEY``) is stepped by it.
- **Offline runs**: a ``run-ID.wandb`` file (``wandb_records.py``), a run directory holding one, or a directory
  whose ``offline-run-*`` / ``run-*`` subdirectories (also under ``wandb/``) hold one each.

Nested values are named by their keys joined with ``.``, as W&B shows them; media, histograms and tables
(objects with ``_type``) and lists are counted and left out; an empty value is "not logged". Each W&B run is one
writer for the whole job (``scalars.py``). Every file is opened as a regular file only; a run file is read up to ``MAX_BYTES``, a Parquet history up to
``MAX_PARQUET_ROWS`` rows and ``MAX_PARQUET_BYTES`` decompressed (checked in its metadata before any data is read,
and again as its rows are read).
"""

from __future__ import annotations

import csv
import fnmatch
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..bounded import MAX_JSON_DEPTH, BoundedInputError
from ..errors import ImportFormatError, MissingExtraError
from .csv_import import csv_cells
from .jsonl_import import Parsed, blank, integer, json_object, json_value, time_value
from .names import NameMap
from .scalars import Scalar, Source, add_rows
from .source import FolderScan, Listing, open_source, read_source, text_lines
from .wandb_records import read_wandb_records

MAX_BYTES = 4 << 30
"""The largest W&B run file read (4 GiB)."""
MAX_PARQUET_ROWS = 1_000_000
"""The most rows of a Parquet history read: a few kilobytes of Parquet can decompress to millions of rows."""
MAX_PARQUET_BYTES = 512 << 20
"""The most bytes a Parquet history may decompress to (its row groups' uncompressed size, 512 MiB)."""
PARQUET_BATCH_ROWS = 65_536
CSV_STEP = "Step"
CSV_RUN_SEPARATOR = " - "
CSV_BANDS = ("__MIN", "__MAX")
RUN_FILE = re.compile(r"^run-.+\.wandb$")
RUN_DIRS = ("offline-run-*", "run-*")
STEP_KEY = "train/global_step"
"""The training step of a run that logs it (the Hugging Face Trainer's W&B callback logs it in every call and makes
it the x axis; its ``_step`` counts log calls)."""


class _Rows:
    """History rows of one run, read into one source at the end, counting what was left out."""

    def __init__(self, fmt: str) -> None:
        self.rows: list[tuple[dict[str, Any], str]] = []
        self.parsed = Parsed(fmt)
        self.other = 0

    def add(self, row: dict[str, Any], where: str) -> None:
        self.rows.append((row, where))

    def finish(self, names: NameMap, where: Path) -> Parsed:
        """The run's rows as import rows: each history row at its step (``_step``, or ``STEP_KEY`` when the
        run logs it), metrics flattened."""
        step_key = STEP_KEY if any(not blank(row.get(STEP_KEY)) for row, _ in self.rows) else "_step"
        source, unplaced = Source(None, True), 0
        for row, at in self.rows:
            if blank(row.get(step_key)):
                if step_key != "_step":
                    unplaced += 1
                    continue
                raise ImportFormatError(f"{at}: no _step (a W&B history row has one)")
            step, time = integer(row[step_key], at, step_key), time_value(row.get("_timestamp"), at)
            source.scalars += [Scalar(n, step, v, at, time) for n, v in self._flat(row, "") if n != step_key]
        add_rows(self.parsed, [source], names)
        if not self.parsed.rows:
            raise ImportFormatError(f"{where}: no scalar metrics in its history")
        if self.other:
            self.parsed.warnings.append(f"{self.other} media, histogram, table or list values not imported")
        if unplaced:
            self.parsed.warnings.append(f"{where}: {unplaced} history rows without {STEP_KEY} left out")
        return self.parsed

    def _flat(self, values: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for key, value in values.items():
            if (not prefix and key.startswith("_")) or value is None:
                continue
            if isinstance(value, dict) and "_type" not in value:
                yield from self._flat(value, f"{prefix}{key}.")
            elif isinstance(value, (dict, list)):
                self.other += 1
            else:
                yield f"{prefix}{key}", value


def read_wandb(src: Path, names: NameMap) -> dict[str, Parsed]:
    """The runs of ``src`` by name (``"."``: one run of the source itself), each read and checked."""
    if src.is_dir():
        return {name: _offline(path, names) for name, path in _run_files(src).items()}
    suffix = src.suffix.lower()
    if suffix == ".csv":
        return _csv(src, names)
    if suffix in (".jsonl", ".json", ".parquet"):
        rows = _Rows("wandb-parquet" if suffix == ".parquet" else "wandb-jsonl")
        for number, row in enumerate(_parquet(src) if suffix == ".parquet" else _jsonl(src), start=1):
            rows.add(row, f"{src}, {'row' if suffix == '.parquet' else 'line'} {number}")
        return {".": rows.finish(names, src)}
    if RUN_FILE.match(src.name):
        return {".": _offline(src, names)}
    raise ImportFormatError(
        f"{src}: not a W&B export this reads (a .csv, .jsonl, .parquet or run-ID.wandb file, or a run directory)"
    )


def _run_files(folder: Path) -> dict[str, Path]:
    """The ``run-ID.wandb`` file of ``folder`` (as run ``"."``), else of each run directory in it (or in its
    ``wandb/``), by the directory's name; listed by ``FolderScan``, a symbolic link to a run directory refused."""
    scan = FolderScan(folder)
    top = scan.listing(folder)
    if own := _run_file(top):
        return {".": own}
    parents = [top, *(scan.listing(folder / name, 1) for name in _folders_named(top, "wandb"))]
    found = {
        name: path
        for parent in parents
        for pattern in RUN_DIRS
        for name in _folders_named(parent, pattern)
        if (path := _run_file(scan.listing(parent.folder / name, parent.depth + 1)))
    }
    if not found:
        raise ImportFormatError(f"{folder}: no W&B run file (run-ID.wandb) in it or in its run directories")
    return found


def _folders_named(parent: Listing, pattern: str) -> list[str]:
    """The folders of ``parent`` named like ``pattern``; a symbolic link so named is refused (not followed)."""
    if link := next((name for name in parent.links if fnmatch.fnmatchcase(name, pattern)), None):
        raise ImportFormatError(
            f"{parent.folder / link}: a symbolic link to a directory, not followed: refused "
            "(import the directory it points to)"
        )
    return [name for name in parent.folders if fnmatch.fnmatchcase(name, pattern)]


def _run_file(listing: Listing) -> Path | None:
    files = [name for name in listing.files if RUN_FILE.match(name)]
    if len(files) > 1:
        raise ImportFormatError(f"{listing.folder}: holds {len(files)} run files ({files[0]}, ...); a run has one")
    return listing.folder / files[0] if files else None


def _offline(path: Path, names: NameMap) -> Parsed:
    """The history of one ``run-ID.wandb`` file."""
    record_type = _record_type()
    framed = read_wandb_records(read_source(path, MAX_BYTES), str(path))
    if isinstance(framed, str):
        raise ImportFormatError(f"{path}: {framed}")
    rows, exited = _Rows("wandb-offline"), False
    for number, data in enumerate(framed.records):
        where = f"{path}, record {number}"
        try:
            record = record_type.FromString(data)
        except Exception as exc:  # protobuf's DecodeError: a chunk that passed its checksum but is no record
            raise ImportFormatError(f"{where}: not a W&B record ({type(exc).__name__})") from None
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.add(_history_row(record.history, where), where)
        elif kind == "run" and record.run.display_name:
            rows.parsed.run_name = record.run.display_name
        exited = exited or kind == "exit"
    if framed.lost:
        rows.parsed.warnings.append(framed.lost)
    elif not exited:  # cut at a record's end: nothing is torn, but the run's last record is missing
        rows.parsed.warnings.append(
            f"{path}: the run file is incomplete: it ends without the run's exit record (the run is still going, "
            f"its writer stopped, or the file was cut); {len(framed.records)} records before it were read"
        )
    if framed.damaged:
        chunks = "1 damaged chunk" if framed.damaged == 1 else f"{framed.damaged} damaged chunks"
        rows.parsed.warnings.append(f"{path}: {chunks} skipped, with the records they held")
    return rows.finish(names, path)


def _history_row(history: Any, where: str) -> dict[str, Any]:
    """A history record's items as the nested row ``wandb.log`` was given."""
    row: dict[str, Any] = {}
    for item in history.item:
        keys = list(item.nested_key) or [item.key]
        if len(keys) > MAX_JSON_DEPTH:
            raise BoundedInputError(f"{where}: a key nested {len(keys)} deep, more than {MAX_JSON_DEPTH}")
        value = json_value(item.value_json, f"{where}, {'.'.join(keys)[:80]}")
        here = row
        for depth, key in enumerate(keys[:-1], start=1):
            here = here.setdefault(key, {})
            if not isinstance(here, dict):
                raise ImportFormatError(
                    f"{where}: {'.'.join(keys)[:80]} is nested under {'.'.join(keys[:depth])[:80]}, a value"
                )
        here[keys[-1]] = value
    row.setdefault("_step", history.step.num)  # wandb writes _step as an item too; the record's own step else
    return row


def _csv(path: Path, names: NameMap) -> dict[str, Parsed]:
    """The runs of a W&B CSV export, by run name."""
    with open_source(path) as fh:
        return _csv_runs(path, csv.reader(text_lines(fh, path, bom=True)), names)


def _csv_runs(path: Path, reader: Any, names: NameMap) -> dict[str, Parsed]:
    header = [c.strip() for c in csv_cells(reader, path) or []]
    if CSV_STEP not in header:
        raise ImportFormatError(
            f"{path}, line 1: no {CSV_STEP} column (export a chart's data from W&B; its CSV has one)"
        )
    columns = {i: _csv_column(c) for i, c in enumerate(header) if c != CSV_STEP and not c.endswith(CSV_BANDS)}
    bare = [header[i] for i, (run, _) in columns.items() if run == "."]
    if len(bare) < len(columns):  # columns name their runs: a bare one is another axis (time), not a metric
        columns = {i: column for i, column in columns.items() if column[0] != "."}
    runs = {run: _Rows("wandb-csv") for run, _ in columns.values()}
    while (cells := csv_cells(reader, path)) is not None:
        where = f"{path}, line {reader.line_num}"
        if len(cells) != len(header):
            raise ImportFormatError(f"{where}: {len(cells)} cells, but the header has {len(header)} columns")
        per_run: dict[str, dict[str, Any]] = {run: {"_step": cells[header.index(CSV_STEP)]} for run in runs}
        for i, (run, metric) in columns.items():
            per_run[run][metric] = cells[i].strip() or None
        for run, row in per_run.items():
            if any(v is not None for k, v in row.items() if k != "_step"):
                runs[run].add(row, where)
    parsed = {run: rows.finish(names, path) for run, rows in runs.items()}
    if bare and "." not in runs:
        for each in parsed.values():
            each.warnings.append(f"{path}: columns not of a run left out: {', '.join(bare)}")
    return parsed


def _csv_column(column: str) -> tuple[str, str]:
    """(run, metric) of a CSV column: ``"dainty-sun-3 - train/loss"``, or ``"."`` for a bare metric."""
    run, separator, metric = column.partition(CSV_RUN_SEPARATOR)
    return (run.strip(), metric.strip()) if separator else (".", column)


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open_source(path) as fh:
        for number, line in enumerate(text_lines(fh, path), start=1):
            if line.strip():
                yield json_object(line, f"{path}, line {number}")


def _parquet(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a Parquet history, its size checked in its metadata first and counted as it is read."""
    import pyarrow.parquet as pq

    with open_source(path) as fh:
        try:
            history = pq.ParquetFile(fh)
        except Exception as exc:  # pyarrow's ArrowInvalid, OSError, ...: bytes that are no Parquet file
            raise ImportFormatError(f"{path}: not a Parquet file ({_first_line(exc)})") from None
        _check_parquet_size(path, history.metadata)
        read = 0
        for rows in _parquet_batches(path, history):
            read += len(rows)
            if read > MAX_PARQUET_ROWS:
                raise BoundedInputError(f"{path}: more than {MAX_PARQUET_ROWS} rows (the limit): refused")
            yield from rows


def _check_parquet_size(path: Path, metadata: Any) -> None:
    """Refuse a Parquet file whose metadata declares more rows or decompressed bytes than the limits."""
    if metadata.num_rows > MAX_PARQUET_ROWS:
        raise BoundedInputError(f"{path}: {metadata.num_rows} rows, more than {MAX_PARQUET_ROWS}: refused unread")
    size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    if size > MAX_PARQUET_BYTES:
        raise BoundedInputError(f"{path}: decompresses to {size} bytes, more than {MAX_PARQUET_BYTES}: refused unread")


def _parquet_batches(path: Path, history: Any) -> Iterator[list[dict[str, Any]]]:
    """The rows of ``history`` a batch at a time; pyarrow's error on a damaged page, a wrong length, ... named."""
    batches = history.iter_batches(batch_size=PARQUET_BATCH_ROWS)
    while True:
        try:
            batch = next(batches, None)
            rows = None if batch is None else batch.to_pylist()
        except Exception as exc:
            raise ImportFormatError(f"{path}: a damaged Parquet file ({_first_line(exc)})") from None
        if rows is None:
            return
        yield rows


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__


def _record_type() -> Any:
    """W&B's ``Record`` message; a named error when wandb is not installed."""
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError as exc:
        raise MissingExtraError(
            f"reading W&B run files needs the wandb package ({exc.name} is missing): pip install 'bedside[wandb]'"
        ) from exc
    return wandb_internal_pb2.Record  # type: ignore[attr-defined]  # generated code without stubs
