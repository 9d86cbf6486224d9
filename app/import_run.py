"""``bedside import``: convert a foreign run (CSV, JSONL, Megatron log) into a bedside run and ingest it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside import``."""
    p = commands.add_parser(
        "import",
        help="convert a foreign run (CSV, JSONL, Megatron log) into a bedside run",
        description="Convert a foreign metrics file into a bedside run directory and ingest it.",
    )
    p.add_argument("format", choices=("csv", "jsonl", "megatron"), help="input format (see docs/import.md)")
    p.add_argument("file", type=Path, help="file to import")
    p.add_argument("--out", type=Path, required=True, help="run directory to create")
    p.add_argument("--topology", type=Path, help="JSON file: each rank's host and dp/tp/pp coordinates")
    p.add_argument("--name", help="run name (default: the output folder's name)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    """Convert a foreign file into a run and ingest it; an error if a line is rejected."""
    from bedside.collectors.importers import import_csv, import_jsonl, import_megatron
    from bedside.collectors.ingest import Collector
    from bedside.collectors.store import Store

    from .output import Progress, warn
    from .service.schema import SCHEMAS

    importer = {"csv": import_csv, "jsonl": import_jsonl, "megatron": import_megatron}[args.format]
    summary = importer(args.file, args.out, topology=args.topology, name=args.name)
    kinds = ", ".join(f"{n} {kind}" for kind, n in summary.records.items())
    print(
        f"imported {summary.rows} rows of {args.file} ({summary.format}) into {args.out}: {kinds} records, "
        f"{summary.ranks} ranks, {summary.steps} steps",
        file=sys.stderr,
    )
    progress = Progress(quiet=args.quiet)
    with Store.open(RunLayout(args.out).store, schemas=SCHEMAS) as store:
        result = Collector(args.out, store, warn=warn).ingest_available(on_pass=progress.update)
    progress.report("done:")
    if result.rejected:
        lines = "line was" if result.rejected == 1 else "lines were"
        raise BedsideError(
            f"{result.rejected} imported {lines} rejected by the collector; "
            f'see: bedside query {args.out} "SELECT * FROM rejected"'
        )
    return 0
