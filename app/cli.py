"""The ``bedside`` command line."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bedside.collectors.errors import BedsideError
from bedside.collectors.follow import DEFAULT_RESCAN_EVERY_S
from bedside.collectors.importers import import_csv, import_jsonl
from bedside.collectors.ingest import DEFAULT_BATCH_BYTES, Collector
from bedside.collectors.layout import RunLayout, require_run_dir
from bedside.collectors.query import run_query
from bedside.collectors.runs import find_runs, summarize_run
from bedside.collectors.store import DatabaseError, Store, move_aside
from bedside.collectors.store.console import ConsoleLimits
from bedside.detectors.errors import DetectorError

from . import action, alert, audit, demo, detect, serve, simulate, train, watch
from .output import FORMATS, Progress, integer_in, positive_seconds, print_frame, warn
from .service.owner import OwnerSettings, RunOwner
from .service.schema import SCHEMAS

MAX_BATCH_MB = 1024


def build_parser() -> argparse.ArgumentParser:
    """The ``bedside`` parser: one sub-command each, its handler set as ``handler``."""
    parser = argparse.ArgumentParser(prog="bedside", description="Telemetry and triage desk for large training runs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_collect(commands)
    _add_import(commands)
    _add_query(commands)
    _add_runs(commands)
    train.add_parser(commands)
    action.add_parser(commands)
    audit.add_parser(commands)
    demo.add_parser(commands)
    detect.add_parser(commands)
    simulate.add_parser(commands)
    watch.add_parser(commands)
    alert.add_parser(commands)
    serve.add_parser(commands)
    return parser


def _add_collect(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("collect", help="ingest a run's telemetry into its store (RUN/bedside.duckdb)",
                            description="Ingest every rank file of RUN into RUN/bedside.duckdb, exactly once.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--follow", action="store_true", help="keep ingesting as the run writes (file events + rescans)")
    p.add_argument("--until-finished", action="store_true",
                   help="with --follow: exit once every rank has written run_end and all is ingested")
    p.add_argument("--rescan-every", type=positive_seconds, default=DEFAULT_RESCAN_EVERY_S, metavar="S",
                   help=f"with --follow: seconds (> 0) between safety-net rescans "
                        f"(default {DEFAULT_RESCAN_EVERY_S:g})")
    p.add_argument("--batch-mb", type=integer_in(1, MAX_BATCH_MB), default=DEFAULT_BATCH_BYTES >> 20, metavar="MB",
                   help=f"most megabytes ingested per transaction, 1 to {MAX_BATCH_MB} "
                        f"(default {DEFAULT_BATCH_BYTES >> 20})")
    p.add_argument("--rebuild", action="store_true",
                   help="move the store aside (to bedside.duckdb.damaged-TIME) and ingest the telemetry again: the "
                        "recovery for a damaged store (docs/cli.md says what is rebuilt and what is lost)")
    p.add_argument("--no-detect", dest="detect", action="store_false",
                   help="with --follow: do not run the detectors (by default they run after every batch)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=cmd_collect)


def _add_import(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("import", help="convert a foreign run (CSV, JSONL) into a bedside run",
                            description="Convert a foreign metrics file into a bedside run directory and ingest it.")
    p.add_argument("format", choices=("csv", "jsonl"), help="input format (see docs/import.md)")
    p.add_argument("file", type=Path, help="file to import")
    p.add_argument("--out", type=Path, required=True, help="run directory to create")
    p.add_argument("--topology", type=Path, help="JSON file: each rank's host and dp/tp/pp coordinates")
    p.add_argument("--name", help="run name (default: the output folder's name)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=cmd_import)


def _add_query(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("query", help="run read-only SQL over a run's views",
                            description="Run one read-only SELECT over the documented views of RUN "
                                        "(docs/schema.md). Works while another process holds the store.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("sql", help='one SELECT statement, e.g. "SELECT * FROM run"')
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    defaults = ConsoleLimits()
    p.add_argument("--timeout", type=positive_seconds, default=defaults.timeout_s, metavar="S",
                   help=f"stop the query after S seconds, S > 0 (default {defaults.timeout_s:g})")
    p.add_argument("--max-rows", type=integer_in(1, 10**9), default=defaults.max_rows, metavar="N",
                   help=f"print at most N rows, and say so when the result is cut (default {defaults.max_rows:,})")
    p.set_defaults(handler=cmd_query)


def _add_runs(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("runs", help="list the runs in a directory with their status",
                            description="List the runs in DIR (or DIR itself) from their files.")
    p.add_argument("dir", type=Path, help="a runs directory, or one run")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.set_defaults(handler=cmd_runs)


def cmd_collect(args: argparse.Namespace) -> int:
    """``bedside collect``: ingest what the run holds now, or follow it until stopped or finished."""
    if args.until_finished and not args.follow:
        raise BedsideError("--until-finished needs --follow")
    layout = RunLayout(require_run_dir(args.run))
    progress = Progress(quiet=args.quiet)
    if args.rebuild and (aside := move_aside(layout.store)):
        warn(f"moved the store aside to {aside.name}; rebuilding it from the telemetry")
    if args.follow:
        settings = OwnerSettings(rescan_every_s=args.rescan_every, batch_bytes=args.batch_mb << 20,
                                 detect=args.detect, quiet=args.quiet, restart=False)
        owner = RunOwner(layout.root, settings, warn=warn, on_pass=progress.update)
        try:
            owner.follow_until_signalled(until_finished=args.until_finished)
        finally:
            owner.close()
    else:
        with Store.open(layout.store, schemas=SCHEMAS) as store:
            Collector(layout.root, store, batch_bytes=args.batch_mb << 20, warn=warn).ingest_available(
                on_pass=progress.update)
    progress.report("done:")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """``bedside import``: convert a foreign file into a run and ingest it; an error if a line is rejected."""
    importer = import_csv if args.format == "csv" else import_jsonl
    summary = importer(args.file, args.out, topology=args.topology, name=args.name)
    kinds = ", ".join(f"{n} {kind}" for kind, n in summary.records.items())
    print(f"imported {summary.rows} rows of {args.file} ({summary.format}) into {args.out}: {kinds} records, "
          f"{summary.ranks} ranks, {summary.steps} steps", file=sys.stderr)
    progress = Progress(quiet=args.quiet)
    with Store.open(RunLayout(args.out).store, schemas=SCHEMAS) as store:
        result = Collector(args.out, store, warn=warn).ingest_available(on_pass=progress.update)
    progress.report("done:")
    if result.rejected:
        lines = "line was" if result.rejected == 1 else "lines were"
        raise BedsideError(f"{result.rejected} imported {lines} rejected by the collector; "
                           f'see: bedside query {args.out} "SELECT * FROM rejected"')
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    """``bedside query``: one read-only SELECT over the run's views, printed in the chosen format."""
    limits = ConsoleLimits(timeout_s=args.timeout, max_rows=args.max_rows)
    result, view = run_query(args.run, args.sql, limits, schemas=SCHEMAS)
    if view.note:
        warn(view.note)
    print_frame(result.frame, args.format)
    if result.truncated:
        warn(result.cut_note(limits))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    """``bedside runs``: list the runs in a directory with their status, from their files."""
    import pandas as pd

    if not args.dir.is_dir():
        raise BedsideError(f"no such directory: {args.dir}")
    runs = [summarize_run(path) for path in find_runs(args.dir)]
    if not runs:
        raise BedsideError(f"no runs found in {args.dir}")
    frame = pd.DataFrame([vars(r) for r in runs])
    frame["last_seen"] = pd.to_datetime(frame["last_seen"], unit="s", utc=True).dt.floor("s")
    frame["path"] = frame["path"].astype(str)
    print_frame(frame, args.format)
    return 0


def _one_line(exc: BaseException) -> str:
    """An error in one line: DuckDB's message and hint, without its excerpt of the SQL and caret."""
    kept = []
    for line in str(exc).strip().splitlines():
        if not line.strip() or line.startswith("LINE "):
            break
        kept.append(line.strip())
    return " ".join(kept) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Run one ``bedside`` command; errors are one line on stderr with exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (BedsideError, DetectorError, OSError) as exc:
        print(f"bedside: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except DatabaseError as exc:  # damage found after the store opened, a full disk: the store said no
        print(f"bedside: error: the store failed: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
