"""The ``bedside`` command line."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from bedside.collectors.errors import BedsideError
from bedside.collectors.follow import DEFAULT_RESCAN_EVERY_S, Follower
from bedside.collectors.importers import import_csv, import_jsonl

from bedside.collectors.ingest import DEFAULT_BATCH_BYTES, Collector
from bedside.collectors.layout import RunLayout, require_run_dir
from bedside.collectors.query import run_query
from bedside.collectors.runs import find_runs, summarize_run
from bedside.collectors.store import DEFAULT_QUERY_TIMEOUT_S, Store

from . import demo
from .output import FORMATS, Progress, print_frame


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bedside", description="Telemetry and triage desk for large training runs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_collect(commands)
    _add_import(commands)
    _add_query(commands)
    _add_runs(commands)
    demo.add_parser(commands)
    return parser


def _add_collect(commands) -> None:
    p = commands.add_parser("collect", help="ingest a run's telemetry into its store (RUN/bedside.duckdb)",
                            description="Ingest every rank file of RUN into RUN/bedside.duckdb, exactly once.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--follow", action="store_true", help="keep ingesting as the run writes (file events + rescans)")
    p.add_argument("--until-finished", action="store_true",
                   help="with --follow: exit once every rank has written run_end and all is ingested")
    p.add_argument("--rescan-every", type=float, default=DEFAULT_RESCAN_EVERY_S, metavar="S",
                   help=f"with --follow: seconds between safety-net rescans (default {DEFAULT_RESCAN_EVERY_S:g})")
    p.add_argument("--batch-mb", type=int, default=DEFAULT_BATCH_BYTES >> 20, metavar="MB",
                   help=f"most bytes ingested per transaction (default {DEFAULT_BATCH_BYTES >> 20})")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=cmd_collect)


def _add_import(commands) -> None:
    p = commands.add_parser("import", help="convert a foreign run (CSV, JSONL) into a bedside run",
                            description="Convert a foreign metrics file into a bedside run directory and ingest it.")
    p.add_argument("format", choices=("csv", "jsonl"), help="input format (see docs/import.md)")
    p.add_argument("file", type=Path, help="file to import")
    p.add_argument("--out", type=Path, required=True, help="run directory to create")
    p.add_argument("--topology", type=Path, help="JSON file: each rank's host and dp/tp/pp coordinates")
    p.add_argument("--name", help="run name (default: the output folder's name)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=cmd_import)


def _add_query(commands) -> None:
    p = commands.add_parser("query", help="run read-only SQL over a run's views",
                            description="Run one read-only SELECT over the documented views of RUN "
                                        "(docs/schema.md). Works while another process holds the store.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("sql", help='one SELECT statement, e.g. "SELECT * FROM run"')
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--timeout", type=float, default=DEFAULT_QUERY_TIMEOUT_S, metavar="S",
                   help=f"stop the query after S seconds (default {DEFAULT_QUERY_TIMEOUT_S:g})")
    p.set_defaults(handler=cmd_query)


def _add_runs(commands) -> None:
    p = commands.add_parser("runs", help="list the runs in a directory with their status",
                            description="List the runs in DIR (or DIR itself) from their files.")
    p.add_argument("dir", type=Path, help="a runs directory, or one run")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.set_defaults(handler=cmd_runs)


def cmd_collect(args: argparse.Namespace) -> int:
    if args.until_finished and not args.follow:
        raise BedsideError("--until-finished needs --follow")
    layout = RunLayout(require_run_dir(args.run))
    progress = Progress(quiet=args.quiet)
    with Store.open(layout.store) as store:
        collector = Collector(layout.root, store, batch_bytes=args.batch_mb << 20, warn=_warn)
        if args.follow:
            _follow(collector, progress, args)
        else:
            collector.ingest_available(on_pass=progress.update)
        progress.report("done:")
    return 0


def _follow(collector: Collector, progress: Progress, args: argparse.Namespace) -> None:
    stop = threading.Event()
    follower = Follower(collector, rescan_every_s=args.rescan_every, on_pass=progress.update)

    def request_stop(signum, frame) -> None:
        stop.set()
        follower.wake()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    follower.run(stop, until_finished=args.until_finished)


def cmd_import(args: argparse.Namespace) -> int:
    importer = import_csv if args.format == "csv" else import_jsonl
    summary = importer(args.file, args.out, topology=args.topology, name=args.name)
    kinds = ", ".join(f"{n} {kind}" for kind, n in summary.records.items())
    print(f"imported {summary.rows} rows of {args.file} ({summary.format}) into {args.out}: {kinds} records, "
          f"{summary.ranks} ranks, {summary.steps} steps", file=sys.stderr)
    progress = Progress(quiet=args.quiet)
    with Store.open(RunLayout(args.out).store) as store:
        Collector(args.out, store, warn=_warn).ingest_available(on_pass=progress.update)
    progress.report("done:")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    frame, view = run_query(args.run, args.sql, timeout_s=args.timeout)
    if view.note:
        _warn(view.note)
    print_frame(frame, args.format)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
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


def _warn(message: str) -> None:
    print(f"bedside: warning: {message}", file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    """An error in one line: DuckDB's message and hint, without its excerpt of the SQL and caret."""
    kept = []
    for line in str(exc).strip().splitlines():
        if not line.strip() or line.startswith("LINE "):
            break
        kept.append(line.strip())
    return " ".join(kept) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (BedsideError, OSError) as exc:
        print(f"bedside: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
