"""``bedside import``: convert a foreign run (CSV, JSONL, Megatron log, TensorBoard, W&B) into bedside runs and
ingest them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout

if TYPE_CHECKING:
    from bedside.collectors.importers import ImportSummary

FORMATS = ("csv", "jsonl", "megatron", "tensorboard", "wandb")
MAPPED = ("tensorboard", "wandb")
"""The formats whose foreign names ``--map`` renames (the others name their metrics as bedside does)."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside import``."""
    p = commands.add_parser(
        "import",
        help="convert a foreign run (CSV, JSONL, Megatron log, TensorBoard, W&B) into a bedside run",
        description="Convert a foreign run's metrics into a bedside run directory and ingest it.",
    )
    p.add_argument("format", choices=FORMATS, help="input format (see docs/import.md)")
    p.add_argument("source", type=Path, help="file or directory to import")
    p.add_argument("--out", type=Path, required=True, help="run directory to create (several runs: one each inside)")
    p.add_argument("--topology", type=Path, help="JSON file: each rank's host and dp/tp/pp coordinates")
    p.add_argument("--name", help="run name, for a source of one run (default: its own name, else the output folder's)")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="SRC=DST",
        help="import metric SRC as DST (SRC= leaves it out); repeatable; tensorboard and wandb",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    """Convert a foreign run into runs and ingest them; an error if a line is rejected."""
    from bedside.collectors import importers

    from .output import warn

    if args.map and args.format not in MAPPED:
        raise BedsideError(f"--map applies to {' and '.join(MAPPED)} imports, not {args.format}")
    names = importers.NameMap.parse(args.map).mapping
    if args.format in MAPPED:
        run = importers.import_tensorboard if args.format == "tensorboard" else importers.import_wandb
        summaries = run(args.source, args.out, names=names, topology=args.topology, name=args.name)
    else:
        one = {"csv": importers.import_csv, "jsonl": importers.import_jsonl, "megatron": importers.import_megatron}
        summaries = [one[args.format](args.source, args.out, topology=args.topology, name=args.name)]
    for summary in summaries:
        kinds = ", ".join(f"{n} {kind}" for kind, n in summary.records.items())
        print(
            f"imported {summary.rows} rows of {args.source} ({summary.format}) into {summary.out}: {kinds} records, "
            f"{summary.ranks} ranks, {summary.steps} steps",
            file=sys.stderr,
        )
        for line in summary.warnings:
            warn(line)
    for summary in summaries:
        _ingest(summary, args.quiet)
    return 0


def _ingest(summary: ImportSummary, quiet: bool) -> None:
    """Ingest what the import of ``summary`` did not already (the import checks a run by ingesting it into its
    store); an error naming the rejected lines, if any."""
    from bedside.collectors.ingest import Collector
    from bedside.collectors.store import Store

    from .output import Progress, warn
    from .service.schema import SCHEMAS

    out = summary.out
    progress = Progress(quiet=quiet)
    if summary.ingested is not None:
        progress.total.add(summary.ingested)
    with Store.open(RunLayout(out).store, schemas=SCHEMAS) as store:
        result = Collector(out, store, warn=warn).ingest_available(on_pass=progress.update)
    progress.report("done:")
    if result.rejected:
        lines = "line was" if result.rejected == 1 else "lines were"
        raise BedsideError(
            f"{result.rejected} imported {lines} rejected by the collector; "
            f'see: bedside query {out} "SELECT * FROM rejected"'
        )
